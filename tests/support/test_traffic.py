"""The corpus's recorder and replay (tests/support/traffic.py, traffic_recorder.py) on a toy
app: what is kept of a request, and a recorded chain of ids replayed against a server that
mints others."""

from __future__ import annotations

import uuid

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.support.helpers import on_uvicorn
from tests.support.traffic import Replay, Seen, Substitutions, blob_digest
from tests.support.traffic_recorder import TrafficRecorder, recording_files

AGENT = {"user-agent": "OpenAI/Python 9.9.9"}


def toy_app() -> FastAPI:
    """``POST /toy`` mints a response id and a sealed blob; a body naming an id it did not mint
    is a 400 (as a previous_response_id of another server's would be)."""
    app = FastAPI()
    minted: set[str] = set()

    @app.post("/toy")
    async def toy(request: Request) -> JSONResponse:
        body = await request.json()
        previous = body.get("previous_response_id")
        if previous is not None and previous not in minted:
            return JSONResponse({"error": {"message": "unknown", "param": "previous"}}, 400)
        new = f"resp_{uuid.uuid4().hex}"
        minted.add(new)
        return JSONResponse({"id": new, "encrypted_content": uuid.uuid4().hex, "status": "ok"})

    return app


def test_an_answer_pairs_its_new_ids_by_prefix_and_place() -> None:
    seen = Seen()
    seen.sent('{"previous_response_id": "resp_' + "0" * 32 + '"}')
    echoed = "resp_" + "0" * 32
    replayed = f"fc_{'b' * 32} call_{'c' * 24} {echoed} resp_{'a' * 32}"
    minted, sealed = seen.answered(replayed)
    assert minted == [f"fc_{'b' * 32}", f"call_{'c' * 24}", f"resp_{'a' * 32}"]  # not the echo
    subs = Substitutions()
    recorded = {"minted": [f"resp_{'1' * 32}", f"call_{'2' * 24}", f"fc_{'3' * 32}"]}
    subs.learn(recorded, minted, sealed)
    sent = f'{{"previous_response_id":"resp_{"1" * 32}","call_id":"call_{"2" * 24}"}}'
    assert (
        subs.apply(sent)
        == f'{{"previous_response_id":"resp_{"a" * 32}","call_id":"call_{"c" * 24}"}}'
    )


def test_a_sealed_blob_and_an_mcp_origin_are_the_replays() -> None:
    subs = Substitutions(origins={"http://127.0.0.1:4123": "http://127.0.0.1:5000"})
    subs.learn({"sealed": [blob_digest("old-blob")]}, [], ["new-blob"])
    body = '{"encrypted_content": "old-blob", "a": "http://127.0.0.1:4123/mcp", "b": "http://127.0.0.1:41234/mcp"}'
    assert subs.apply(body) == (
        '{"encrypted_content": "new-blob", "a": "http://127.0.0.1:5000/mcp", '
        '"b": "http://127.0.0.1:41234/mcp"}'
    )


async def test_a_recorded_chain_replays_against_a_server_that_mints_other_ids() -> None:
    recorder = TrafficRecorder(toy_app())
    async with on_uvicorn(recorder) as url, httpx.AsyncClient(base_url=url) as client:
        await client.post("/_traffic/begin", json={"test": "tests/x.py::test_chain", "imports": {}})
        headers = {**AGENT, "authorization": "Bearer secret", "x-custom": "kept"}
        first = (await client.post("/toy", content=b'{"a": 1}', headers=headers)).json()
        chained = f'{{"previous_response_id": "{first["id"]}"}}'.encode()
        await client.post("/toy", content=chained, headers=headers)
        await client.get("/toy", headers={"user-agent": "python-httpx"})  # not a client
        await client.post("/_traffic/end", json={"passed": True})
    ((path, recording),) = recording_files(recorder.tests[0], {}, "2026-01-01").items()
    assert path.parts[-2:] == ("openai-python-9.9.9", "chain.json")
    first_sent, second_sent = recording["exchanges"]
    assert first_sent["body"] == '{"a": 1}'
    names = [name for name, _ in first_sent["headers"]]
    assert "x-custom" in names and not {"authorization", "host", "content-length"} & set(names)
    assert first_sent["answer"]["minted"] == [first["id"]]
    assert second_sent["answer"]["status"] == 200

    async with on_uvicorn(toy_app()) as fresh:  # another server: other ids
        assert await Replay(recording, fresh, "key").run() is None
        recording["exchanges"][0]["answer"]["minted"] = []  # the pairing lost
        deviation = await Replay(recording, fresh, "key").run()
    assert deviation is not None and (deviation.at, deviation.status) == ("1", 400)
    assert deviation.param == "previous"
