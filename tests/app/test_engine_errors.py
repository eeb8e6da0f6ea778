"""Engine errors keep their kind: a request the engine rejects as the client's fault
(``EngineError`` code ``invalid_prompt``, as vLLM raises for a prompt it cannot take) is a 400
with that code; an engine fault stays a 500 ``server_error``. Through the openai SDK against the
running app (scripted engine turns ``REF-REJECT`` and ``SDK-FAIL``).
"""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from tests.support import MODEL


def test_a_request_the_engine_rejects_is_a_400_with_its_code(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="REF-REJECT: take this prompt")
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "message": "The prompt cannot be processed: REF-REJECT.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_prompt",
    }


def test_a_streamed_rejection_ends_with_response_failed_and_its_code(client: OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="REF-REJECT: take this prompt") as stream:
        events = list(stream)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    error = events[-1].response.error
    assert error.code == "invalid_prompt"
    assert error.message == "The prompt cannot be processed: REF-REJECT."


def test_an_engine_fault_stays_a_500_server_error(client: OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        client.responses.create(model=MODEL, input="SDK-FAIL: break")
    assert caught.value.status_code == 500
    assert caught.value.body["type"] == "server_error"
    assert caught.value.body["code"] == "server_error"
    assert "simulated engine fault" in caught.value.body["message"]
