"""Chain of thought that survives stateless clients.

Codex sends ``store: false`` and strips reasoning text from what it sends back, but it returns
a reasoning item's ``encrypted_content`` untouched. We seal the analysis text there with
AES-GCM under a server key, so the next turn of a tool loop can render it again. A blob that
was tampered with or sealed under another key is ignored (the turn goes on without it).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

logger = logging.getLogger(__name__)

_VERSION = b"sa1"  # bumped if the blob layout ever changes
_NONCE_BYTES = 12


def _derive_key(secret: str) -> bytes:
    # Any secret string becomes a 256-bit key; domain-separated from other uses of the secret.
    return hashlib.sha256(b"serve_app reasoning vault\x00" + secret.encode()).digest()


class ReasoningVault:
    def __init__(self, secret: str) -> None:
        self._aead = AESGCM(_derive_key(secret))

    @classmethod
    def from_env(cls, variable: str = "SERVE_APP_REASONING_KEY") -> ReasoningVault:
        """The key from the environment; a random one if unset.

        Every ingress replica must share the key for blobs to open on any replica: a random
        key only suits a single replica (blobs from before a restart are then ignored).
        """
        secret = os.environ.get(variable)
        if not secret:
            logger.warning(
                "%s is not set: using a random key; encrypted reasoning will not survive a "
                "restart or open on other ingress replicas",
                variable,
            )
            secret = secrets.token_hex(32)
        return cls(secret)

    def seal(self, text: str, purpose: bytes = b"") -> str:
        """``purpose`` is bound to the blob: it opens only for the same purpose, so a sealed
        reasoning text cannot be passed off as a compaction summary."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode(), _VERSION + purpose)
        return base64.urlsafe_b64encode(_VERSION + nonce + sealed).decode()

    def open(self, blob: str, purpose: bytes = b"") -> str | None:
        """The sealed text, or None for a blob this server did not seal for ``purpose``."""
        try:
            raw = base64.urlsafe_b64decode(blob.encode())
        except (ValueError, UnicodeEncodeError):
            return None
        if not raw.startswith(_VERSION) or len(raw) <= len(_VERSION) + _NONCE_BYTES:
            return None
        nonce = raw[len(_VERSION) : len(_VERSION) + _NONCE_BYTES]
        try:
            sealed = raw[len(_VERSION) + _NONCE_BYTES :]
            return self._aead.decrypt(nonce, sealed, _VERSION + purpose).decode()
        except (InvalidTag, UnicodeDecodeError):
            logger.info("An encrypted blob this server cannot open (purpose %r)", purpose)
            return None
