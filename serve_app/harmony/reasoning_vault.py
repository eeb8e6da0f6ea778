"""Chain of thought that survives stateless clients.

Codex sends ``store: false`` and strips reasoning text from what it sends back, but it returns
a reasoning item's ``encrypted_content`` untouched. We seal the analysis text there with
AES-GCM under a server key, so the next turn of a tool loop can render it again. A blob that
was tampered with or sealed under another key is ignored (the turn goes on without it).

Each blob is bound (as AES-GCM associated data) to its purpose and to its owner, the digest of
the API key it was sealed for (None when the API is open): a blob sealed for one key does not
open for another, so one tenant cannot have another's reasoning or summary rendered for them.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

logger = logging.getLogger(__name__)

# Bumped whenever the blob layout or its associated data changes, so older blobs fail to open
# (sa1 was bound to the purpose only; sa2 to the purpose and the owner).
_VERSION = b"sa2"
_NONCE_BYTES = 12


def _derive_key(secret: str) -> bytes:
    # Any secret string becomes a 256-bit key; domain-separated from other uses of the secret.
    return hashlib.sha256(b"serve_app reasoning vault\x00" + secret.encode()).digest()


class ReasoningVault:
    def __init__(self, secret: str) -> None:
        self._key = _derive_key(secret)
        self._aead = AESGCM(self._key)

    # Pickled as its key: the ingress's render workers (serve_app/serving/turn/render_pool.py,
    # child processes of the replica on the same host) open sealed items as the replica does.
    def __getstate__(self) -> bytes:
        return self._key

    def __setstate__(self, key: bytes) -> None:
        self._key = key
        self._aead = AESGCM(key)

    @classmethod
    def from_secret(cls, secret: str | None) -> ReasoningVault:
        """The vault of ``secret`` (the app's ``secrets.reasoning_key``, which
        $SERVE_APP_REASONING_KEY overrides); a random key when there is none.

        Every ingress replica must share the key for blobs to open on any replica: a random
        key only suits a single replica (blobs from before a restart are then ignored).
        """
        if not secret:
            logger.warning(
                "no reasoning key is set (secrets.reasoning_key or $SERVE_APP_REASONING_KEY): "
                "using a random key; encrypted reasoning will not survive a restart or open on "
                "other ingress replicas"
            )
            secret = secrets.token_hex(32)
        return cls(secret)

    def seal(self, text: str, purpose: bytes = b"", owner: str | None = None) -> str:
        """``purpose`` and ``owner`` are bound to the blob: it opens only for the same, so a
        sealed reasoning text cannot be passed off as a compaction summary, nor opened for
        another API key."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode(), _associated_data(purpose, owner))
        return base64.urlsafe_b64encode(_VERSION + nonce + sealed).decode()

    def open(self, blob: str, purpose: bytes = b"", owner: str | None = None) -> str | None:
        """The sealed text, or None for a blob this server did not seal for ``purpose`` and
        ``owner``."""
        try:
            raw = base64.urlsafe_b64decode(blob.encode())
        except (ValueError, UnicodeEncodeError):
            return None
        if not raw.startswith(_VERSION) or len(raw) <= len(_VERSION) + _NONCE_BYTES:
            return None
        nonce = raw[len(_VERSION) : len(_VERSION) + _NONCE_BYTES]
        try:
            sealed = raw[len(_VERSION) + _NONCE_BYTES :]
            return self._aead.decrypt(nonce, sealed, _associated_data(purpose, owner)).decode()
        except (InvalidTag, UnicodeDecodeError):
            logger.info("An encrypted blob this server cannot open (purpose %r)", purpose)
            return None


def _associated_data(purpose: bytes, owner: str | None) -> bytes:
    # Length-prefixed, so no two (purpose, owner) pairs give the same bytes; an open API's
    # blobs (no owner) are marked apart from any key's.
    owner_part = b"\x00" if owner is None else b"\x01" + owner.encode()
    return _VERSION + len(purpose).to_bytes(4, "big") + purpose + owner_part
