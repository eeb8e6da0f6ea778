"""Replay Codex-like traces against /v1/responses with streaming, as Codex sends them.

Each locust user plays whole sessions from the trace, one at a time: every turn re-sends the
session's history with its `prompt_cache_key`, `store: false`, waiting the trace's think time
(scaled by TRACE_TIME_SCALE) between turns. Besides the HTTP request itself it records, as
custom locust events (their "response time" column holds the value):

- TTFT: milliseconds to the first output delta;
- TOKENS_PER_S: output tokens per second after the first token;
- INPUT_TOKENS and CACHED_TOKENS: per turn, for the token-weighted prefix-cache hit rate.

    locust -f loadtests/locustfile.py --headless -u 8 -r 8 -t 60s --host http://127.0.0.1:8000 \\
        --csv /tmp/run && python loadtests/report.py /tmp/run
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

from locust import HttpUser, events, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from traces import SAMPLE, load_traces

from serve_app.protocol.sse import TERMINAL_EVENT_TYPES

SESSIONS = load_traces(os.environ.get("TRACE_FILE", SAMPLE))
TIME_SCALE = float(os.environ.get("TRACE_TIME_SCALE", "0.1"))
MODEL = os.environ.get("MODEL", "gpt-oss-120b")
# Seconds a turn may wait for the server's next bytes: a hung stream ends in an error.
TURN_TIMEOUT_S = float(os.environ.get("TURN_TIMEOUT_S", "600"))
_next_session = itertools.cycle(SESSIONS)


def record(kind: str, value: float) -> None:
    events.request.fire(
        request_type=kind, name="turn", response_time=value, response_length=0, exception=None
    )


def error_code(body: dict) -> str | None:
    """The code of an OpenAI-shaped error body or of a failed Response."""
    return (body.get("error") or {}).get("code")


class CodexSession(HttpUser):
    @task
    def play_session(self) -> None:
        session = next(_next_session)
        for index, turn in enumerate(session.turns):
            time.sleep(turn["think_s"] * TIME_SCALE)
            body = {
                "model": MODEL,
                "input": session.turn_input(index),
                "tools": session.tools,
                "stream": True,
                "store": False,
                "prompt_cache_key": session.session_id,
                "max_output_tokens": turn["max_output_tokens"],
            }
            if not self._turn(body):
                return  # a failed turn ends the session, as it would for Codex

    def _turn(self, body: dict) -> bool:
        started = time.perf_counter()
        first_token = None
        final = None
        with self.client.post(
            "/v1/responses",
            json=body,
            stream=True,
            catch_response=True,
            name="responses",
            timeout=TURN_TIMEOUT_S,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {error_code(response.json())}")
                return False
            for line in response.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if first_token is None and event["type"].endswith(".delta"):
                    first_token = time.perf_counter()
                if event["type"] in TERMINAL_EVENT_TYPES:
                    final = event
                    break
            if final is None or final["type"] != "response.completed":
                ended_with = final and final["type"]
                code = final and error_code(final["response"])
                response.failure(f"turn ended with {ended_with}: {code}")
                return False
            response.success()
        usage = final["response"]["usage"]
        ended = time.perf_counter()
        if first_token is not None:
            record("TTFT", (first_token - started) * 1000)
            if ended > first_token and usage["output_tokens"] > 1:
                record("TOKENS_PER_S", (usage["output_tokens"] - 1) / (ended - first_token))
        record("INPUT_TOKENS", usage["input_tokens"])
        record("CACHED_TOKENS", usage["input_tokens_details"]["cached_tokens"])
        return True
