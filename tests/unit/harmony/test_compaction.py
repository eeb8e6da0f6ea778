"""Compaction without Ray: the compaction item sent back in a later input renders as the summary in
place of the history it replaced, and /v1/responses/compact (on the in-process app) counts only
the client's items against max_input_items. Through the session app:
tests/app/test_compaction.py."""

from __future__ import annotations

import openai
import pytest

from serve_app.config import AppArgs, Limits
from serve_app.harmony import compaction
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import render_request
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.admission import responses as validation
from tests.support import MODEL
from tests.support.helpers import decode, in_process_api, sdk_client

QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def test_a_compaction_item_renders_as_its_summary() -> None:
    vault = ReasoningVault("test")
    item = {"type": "compaction", "encrypted_content": compaction.seal_summary(vault, "SUMMARY-X")}
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": [QUESTION, item, {"role": "user", "content": "go on"}]}
    )
    text = decode(render_request(request, vault=vault).token_ids)
    assert compaction.SUMMARY_PREFIX + "SUMMARY-X" in text
    assert text.index("SUMMARY-X") < text.index("go on")
    # A reasoning blob sealed by the same server is not a summary.
    item["encrypted_content"] = vault.seal("not a summary")
    forged = ResponsesRequest.model_validate({"model": MODEL, "input": [item]})
    with pytest.raises(InvalidRequest, match="could not be opened"):
        validation.check_items(forged, vault=vault)


async def test_compact_counts_the_clients_items_against_max_input_items(tmp_path) -> None:
    # The model is asked with the history plus one summary request, and with a stored chain
    # folded into its input: neither is the client's to keep within the limit.
    args = AppArgs(limits=Limits(max_input_items=4))
    async with in_process_api(tmp_path / "compact.db", args) as api:
        client = sdk_client(api)
        four = [{"role": "user", "content": f"message {index}"} for index in range(4)]
        compacted = await client.responses.compact(model=MODEL, input=four)
        assert [item.type for item in compacted.output] == ["message"] * 4 + ["compaction"]
        stored = await client.responses.create(model=MODEL, input=four, store=True)
        chained = await client.responses.compact(
            model=MODEL, previous_response_id=stored.id, input=four
        )
        assert chained.output[-1].type == "compaction"
        with pytest.raises(openai.BadRequestError, match="at most 4"):
            await client.responses.compact(model=MODEL, input=[*four, four[0]])
