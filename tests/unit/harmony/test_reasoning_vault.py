import base64
import pickle
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


def test_a_key_list_seals_with_the_first_and_opens_with_every_one() -> None:
    before = ReasoningVault("old")
    old_blob = before.seal("sealed before the rotation", b"compaction", owner="alice")
    rotated = ReasoningVault("new", "old")
    new_blob = rotated.seal("sealed after", b"compaction", owner="alice")
    assert rotated.open(old_blob, b"compaction", owner="alice") == "sealed before the rotation"
    assert rotated.open(new_blob, b"compaction", owner="alice") == "sealed after"
    # The first key seals: the new blob opens under the new key alone, not under the old.
    assert ReasoningVault("new").open(new_blob, b"compaction", owner="alice") == "sealed after"
    assert before.open(new_blob, b"compaction", owner="alice") is None
    # Binding holds under every key of the list.
    assert rotated.open(old_blob, b"compaction", owner="bob") is None
    assert rotated.open(old_blob, b"", owner="alice") is None


def test_a_key_removed_from_the_list_no_longer_opens_its_blobs() -> None:
    old_blob = ReasoningVault("old").seal("plan")
    assert ReasoningVault("newer", "new", "old").open(old_blob) == "plan"
    assert ReasoningVault("newer", "new").open(old_blob) is None
    # The layout did not change with key lists: a blob of a one-key vault is the same kind.
    assert base64.urlsafe_b64decode(old_blob)[:3] == b"sa2"


def test_a_vault_sent_to_a_render_worker_keeps_its_whole_key_list() -> None:
    """The render workers (serve_app/serving/turn/render_pool.py) get the vault pickled: a
    rotated-out key must still open there, and the first still seal."""
    old, new = ReasoningVault("old"), ReasoningVault("new", "old")
    copy = pickle.loads(pickle.dumps(new))
    assert copy.open(old.seal("from before the rotation")) == "from before the rotation"
    assert ReasoningVault("new").open(copy.seal("after")) == "after"
    assert old.open(copy.seal("after")) is None
