"""The Codex-like traces (loadtests/traces.py): deterministic for a seed, every turn a valid request
extending the one before. Their locust replay against the app: tests/app/test_loadtests.py."""

from __future__ import annotations

import sys

from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.admission import responses as validation
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from traces import SAMPLE, generate, load_traces

from tests.support import MODEL


def test_generation_is_deterministic_for_a_seed() -> None:
    first = [session.to_json() for session in generate(5, 2.0, seed=3)]
    assert first == [session.to_json() for session in generate(5, 2.0, seed=3)]
    assert first != [session.to_json() for session in generate(5, 2.0, seed=4)]


def test_every_turn_extends_the_previous_one_and_is_a_valid_request() -> None:
    sessions = load_traces(SAMPLE)
    assert len(sessions) >= 5
    for session in sessions:
        previous: list = []
        for index in range(len(session.turns)):
            items = session.turn_input(index)
            assert items[: len(previous)] == previous  # a prefix extension: cacheable
            previous = items
            body = {"model": MODEL, "input": items, "tools": session.tools}
            request = ResponsesRequest.model_validate(body)
            validation.check_items(request)  # pairs checked
            render_request(request)  # renders
