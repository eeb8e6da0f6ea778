from serve_app.harmony.reasoning_vault import ReasoningVault


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
