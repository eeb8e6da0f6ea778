"""Chain of thought that survives stateless clients.

Codex sends ``store: false`` and strips reasoning text from what it sends back, but it returns
a reasoning item's ``encrypted_content`` untouched. We seal the analysis text there with
AES-GCM under a server key, so the next turn of a tool loop can render it again. A blob that
was tampered with or sealed under another key is ignored (the turn goes on without it).

Each blob is bound (as AES-GCM associated data) to its purpose and to its owner, the digest of
the API key it was sealed for (None when the API is open): a blob sealed for one key does not
open for another, so one tenant cannot have another's reasoning or summary rendered for them.

A vault holds a list of keys, for rotation: the first seals, every one opens. Which keys, and
how every ingress replica comes to hold the same ones, is the serving layer's business
(serve_app/serving/reasoning_keys.py): this module knows keys, not where they are kept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
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
    def __init__(self, secret: str, *older: str) -> None:
        """``secret`` seals; it and each of ``older`` open (a rotated-out key keeps the blobs
        sealed under it opening until it is dropped from the list)."""
        self.__setstate__([_derive_key(key) for key in (secret, *older)])

    # Pickled as its keys: the ingress's render workers (serve_app/serving/turn/render_pool.py,
    # child processes of the replica on the same host) open sealed items as the replica does.
    def __getstate__(self) -> list[bytes]:
        return self._keys

    def __setstate__(self, keys: list[bytes]) -> None:
        self._keys = keys
        self._open_with = [AESGCM(key) for key in keys]
        self._seal_with = self._open_with[0]
        # Signing keys (`sign`): derived apart from the sealing keys.
        self._mac_keys = [hashlib.sha256(b"serve_app tags\x00" + key).digest() for key in keys]

    def seal(self, text: str, purpose: bytes = b"", owner: str | None = None) -> str:
        """``purpose`` and ``owner`` are bound to the blob: it opens only for the same, so a
        sealed reasoning text cannot be passed off as a compaction summary, nor opened for
        another API key."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._seal_with.encrypt(nonce, text.encode(), _associated_data(purpose, owner))
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
        sealed = raw[len(_VERSION) + _NONCE_BYTES :]
        associated = _associated_data(purpose, owner)
        # The blob does not name its key (the layout is the same as before key lists): each key
        # is tried, the sealing one first; a wrong key costs one tag check over the blob.
        for aead in self._open_with:
            try:
                return aead.decrypt(nonce, sealed, associated).decode()
            except (InvalidTag, UnicodeDecodeError):
                continue
        logger.info("An encrypted blob this server cannot open (purpose %r)", purpose)
        return None

    def sign(self, data: bytes, purpose: bytes, owner: str | None = None) -> str:
        """A tag saying this server vouches for ``data`` (for ``purpose`` and ``owner``), so
        a copy brought back can be checked unchanged (`verify`) without keeping it: an MCP
        listing the client sends back (serve_app/serving/tools/mcp_trust.py). HMAC-SHA256
        under a key derived from the sealing key, unpadded URL-safe base64."""
        tag = hmac.new(self._mac_keys[0], _signed(data, purpose, owner), hashlib.sha256)
        return base64.urlsafe_b64encode(tag.digest()).decode().rstrip("=")

    def verify(self, tag: str, data: bytes, purpose: bytes, owner: str | None = None) -> bool:
        """Whether ``tag`` is this server's (`sign`, under any of its keys) for ``data``."""
        signed = _signed(data, purpose, owner)
        for key in self._mac_keys:
            expected = hmac.new(key, signed, hashlib.sha256).digest()
            given = base64.urlsafe_b64encode(expected).decode().rstrip("=")
            if hmac.compare_digest(given, tag):
                return True
        return False


def _signed(data: bytes, purpose: bytes, owner: str | None) -> bytes:
    return _associated_data(purpose, owner) + data


def _associated_data(purpose: bytes, owner: str | None) -> bytes:
    # Length-prefixed, so no two (purpose, owner) pairs give the same bytes; an open API's
    # blobs (no owner) are marked apart from any key's.
    owner_part = b"\x00" if owner is None else b"\x01" + owner.encode()
    return _VERSION + len(purpose).to_bytes(4, "big") + purpose + owner_part
