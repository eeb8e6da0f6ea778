import base64
import secrets

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from serve_app.harmony.reasoning_vault import ReasoningVault, _derive_key


def test_sealed_reasoning_opens_with_the_same_key_only() -> None:
    vault = ReasoningVault("key-one")
    blob = vault.seal("step 1: look at the file")
    assert "look at the file" not in blob
    assert vault.open(blob) == "step 1: look at the file"
    assert ReasoningVault("key-one").open(blob) == "step 1: look at the file"
    assert ReasoningVault("key-two").open(blob) is None


def test_tampered_or_garbage_blobs_are_ignored() -> None:
    vault = ReasoningVault("key")
    blob = vault.seal("secret plan")
    flipped = blob[:-4] + ("AAAA" if not blob.endswith("AAAA") else "BBBB")
    for bad in (flipped, "", "%%%", "c2ExAAAA", blob[:20]):
        assert vault.open(bad) is None


def test_each_seal_uses_a_fresh_nonce() -> None:
    vault = ReasoningVault("key")
    assert vault.seal("same") != vault.seal("same")


def test_a_blob_opens_for_its_owner_and_purpose_only() -> None:
    vault = ReasoningVault("key")
    blob = vault.seal("alice's plan", b"compaction", owner="alice-digest")
    assert vault.open(blob, b"compaction", owner="alice-digest") == "alice's plan"
    for purpose, owner in [
        (b"compaction", "bob-digest"),
        (b"compaction", None),  # the API opened up: no owner is not any owner
        (b"", "alice-digest"),
        (b"compactio", "nalice-digest"),  # the same bytes run together: still refused
    ]:
        assert vault.open(blob, purpose, owner=owner) is None
    open_api = vault.seal("anyone's", owner=None)
    assert vault.open(open_api, owner=None) == "anyone's"
    assert vault.open(open_api, owner="alice-digest") is None


def test_blobs_of_the_layout_before_owners_do_not_open() -> None:
    # "sa1": bound to the purpose alone, so it names no owner and opens for nobody now.
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(_derive_key("key")).encrypt(nonce, b"old plan", b"sa1")
    old = base64.urlsafe_b64encode(b"sa1" + nonce + sealed).decode()
    vault = ReasoningVault("key")
    assert vault.open(old, owner=None) is None
    assert vault.open(old, owner="alice-digest") is None
