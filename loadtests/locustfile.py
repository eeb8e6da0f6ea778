"""Replay Codex-like traces against /v1/responses with streaming, as Codex sends them.

Each locust user plays whole sessions from the trace, one at a time: every turn re-sends the
session's history with its `prompt_cache_key`, `store: false`, waiting the trace's think time
(scaled by TRACE_TIME_SCALE) between turns. With STORE_SHARE (0..1) that share of sessions is
played as a stateful client plays it instead: `store: true`, each later turn sending only its new
items with `previous_response_id` (a lost response breaks its session's next turn). With
OUTCOMES_FILE each turn's outcome (loadtests/outcomes.py: acknowledged, refused properly, hung,
improper) is appended there, with the id of each acknowledged stored response, for
loadtests/soak_store.py to check. Besides the HTTP request itself it records, as custom locust
events (their "response time" column holds the value):

- TTFT: milliseconds to the first output delta;
- TOKENS_PER_S: output tokens per second after the first token;
- INPUT_TOKENS and CACHED_TOKENS: per turn, for the token-weighted prefix-cache hit rate.

Each acknowledged turn's outcome also carries those figures (``ttft_ms``, ``input_tokens``,
``cached_tokens``), its session and turn, and when it started: loadtests/timeline.py turns them
into figures over time. With LOAD_SHAPE (``"end_s:users,..."``, e.g. ``"20:4,60:12,100:4"``: 4
users until 20 s, then 12 until 60 s, then 4 until 100 s, then the end) the user count follows
those stages instead of ``-u``/``-t``, users added or stopped LOAD_SPAWN_RATE (default 2) a
second; a user being stopped ends its session before its next turn, never in one.

With $SERVE_APP_API_KEY set, each request carries it as its bearer key (an app with API keys
answers 401 without one). With TURNS_FILE, every turn is appended there as a JSON line (its
session and turn, its outcome, TTFT in ms, input, cached and output tokens): exact percentiles,
where locust's CSV rounds response times. With TRACE_ONCE=1 every session of the trace is
played once (the users take them in order) and locust quits when the last one ends: the same
work for every server a benchmark compares (loadtests/bench_peer.py).

    locust -f loadtests/locustfile.py --headless -u 8 -r 8 -t 60s --host http://127.0.0.1:8000 \\
        --csv /tmp/run && python loadtests/report.py /tmp/run
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import requests
from locust import HttpUser, LoadTestShape, events, task
from locust.exception import StopUser
from locust.user.users import LOCUST_STATE_STOPPING

sys.path.insert(0, str(Path(__file__).resolve().parent))
import outcomes
from load_shape import parse_shape, users_at
from traces import SAMPLE, load_traces

from serve_app.protocol.sse import TERMINAL_EVENT_TYPES

SESSIONS = load_traces(os.environ.get("TRACE_FILE", SAMPLE))
TIME_SCALE = float(os.environ.get("TRACE_TIME_SCALE", "0.1"))
MODEL = os.environ.get("MODEL", "gpt-oss-120b")
# Seconds a turn may take (and wait for the server's next bytes): a hung stream ends in an error.
TURN_TIMEOUT_S = float(os.environ.get("TURN_TIMEOUT_S", "600"))
STORE_SHARE = float(os.environ.get("STORE_SHARE", "0"))
OUTCOMES_FILE = os.environ.get("OUTCOMES_FILE")
API_KEY = os.environ.get("SERVE_APP_API_KEY")
LOAD_SHAPE = os.environ.get("LOAD_SHAPE")
LOAD_SPAWN_RATE = float(os.environ.get("LOAD_SPAWN_RATE", "2"))
TURNS_FILE = os.environ.get("TURNS_FILE")
TRACE_ONCE = os.environ.get("TRACE_ONCE") == "1"
_next_session = iter(SESSIONS) if TRACE_ONCE else itertools.cycle(SESSIONS)
_playing = 0  # sessions being played (TRACE_ONCE: locust quits once none is left to play)


def record(kind: str, value: float) -> None:
    events.request.fire(
        request_type=kind, name="turn", response_time=value, response_length=0, exception=None
    )


def _turn_line(
    at: tuple[str, int],
    outcome: str,
    detail: str,
    ttft_ms: float | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """One turn as a JSON line in TURNS_FILE (when set)."""
    if not TURNS_FILE:
        return
    line: dict[str, Any] = {"session": at[0], "turn": at[1], "outcome": outcome}
    if detail:
        line["detail"] = detail[:300]
    if usage is not None:
        line.update(
            ttft_ms=ttft_ms,
            input_tokens=usage["input_tokens"],
            cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
            output_tokens=usage["output_tokens"],
        )
    with Path(TURNS_FILE).open("a") as out:
        out.write(json.dumps(line) + "\n")


class CodexSession(HttpUser):
    def on_start(self) -> None:
        if API_KEY:
            self.client.headers["authorization"] = f"Bearer {API_KEY}"

    @task
    def play_session(self) -> None:
        global _playing
        session = next(_next_session, None)
        if session is None:  # TRACE_ONCE and every session taken: the last user out quits
            if _playing == 0:
                gevent.spawn(self.environment.runner.quit)
            raise StopUser
        _playing += 1
        try:
            self._play(session)
        finally:
            _playing -= 1

    def _play(self, session: Any) -> None:
        stored = random.random() < STORE_SHARE
        previous_id = None
        for index, turn in enumerate(session.turns):
            time.sleep(turn["think_s"] * TIME_SCALE)
            if self._state == LOCUST_STATE_STOPPING:
                return  # the load went down: this user leaves between two turns
            body = {
                "model": MODEL,
                "input": session.turn_input(index),
                "tools": session.tools,
                "stream": True,
                "store": stored,
                "prompt_cache_key": session.session_id,
                "max_output_tokens": turn["max_output_tokens"],
            }
            if previous_id is not None:  # the server holds the rest
                body["input"] = turn["new_items"]
                body["previous_response_id"] = previous_id
            final = self._turn(body, (session.session_id, index))
            if final is None:
                return  # a failed turn ends the session, as it would for Codex
            if stored:
                previous_id = final["response"]["id"]

    def _turn(self, body: dict[str, Any], at: tuple[str, int]) -> dict | None:
        """One turn, streamed: its terminal event, or None (a failure, reported to locust).
        ``at``: its session and index, for TURNS_FILE and the outcomes."""
        started = time.perf_counter()
        started_at = time.time()
        first_token = None
        final = None
        where = {"session": body["prompt_cache_key"], "turn": at[1], "started_at": started_at}
        with self.client.post(
            "/v1/responses",
            json=body,
            stream=True,
            catch_response=True,
            name="responses",
            timeout=TURN_TIMEOUT_S,
        ) as response:
            if response.status_code != 200:
                reply = outcomes.json_or_text(response.content or b"")
                kind = outcomes.http_refusal(response.status_code, reply)
                detail = f"HTTP {response.status_code}: {outcomes.error_code(reply) or reply}"
                self._note(body, kind, detail, **where)
                _turn_line(at, kind, detail)
                response.failure(detail)
                return None
            try:
                for line in response.iter_lines():
                    if not line.startswith(b"data: "):
                        continue
                    event = json.loads(line[6:])
                    if first_token is None and event["type"].endswith(".delta"):
                        first_token = time.perf_counter()
                    if event["type"] in TERMINAL_EVENT_TYPES:
                        final = event
                        break
                    if time.perf_counter() - started > TURN_TIMEOUT_S:
                        raise requests.Timeout("no terminal event in time: timed out")
            except requests.RequestException as error:  # cut short, or no bytes in time
                hung = "timed out" in str(error).lower()
                kind = "hung" if hung else "improper"
                self._note(body, kind, f"stream broke: {error}", **where)
                _turn_line(at, kind, f"stream broke: {error}")
                response.failure(f"stream broke: {error}")
                return None
            if final is None or final["type"] == "response.failed":
                failed = final is not None and outcomes.failed_properly(final["response"])
                code = final and outcomes.error_code(final["response"])
                detail = f"turn ended with {final and final['type']}: {code}"
                self._note(body, "refused" if failed else "improper", detail, **where)
                _turn_line(at, "refused" if failed else "improper", detail)
                response.failure(detail)
                return None
            usage = final["response"]["usage"]
            figures = {
                "ttft_ms": None if first_token is None else (first_token - started) * 1000,
                "input_tokens": usage["input_tokens"],
                "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
            }
            self._note(body, "acked", final["type"], final["response"]["id"], **figures, **where)
            if final["type"] != "response.completed":  # stored, but Codex would stop here
                _turn_line(at, "incomplete", final["type"])
                response.failure(f"turn ended with {final['type']}")
                return None
            response.success()
        ended = time.perf_counter()
        if first_token is not None:
            record("TTFT", (first_token - started) * 1000)
            if ended > first_token and usage["output_tokens"] > 1:
                record("TOKENS_PER_S", (usage["output_tokens"] - 1) / (ended - first_token))
        record("INPUT_TOKENS", usage["input_tokens"])
        record("CACHED_TOKENS", usage["input_tokens_details"]["cached_tokens"])
        ttft_ms = None if first_token is None else (first_token - started) * 1000
        _turn_line(at, "completed", "", ttft_ms, usage)
        return final

    @staticmethod
    def _note(
        body: dict[str, Any],
        kind: str,
        detail: str,
        response_id: str | None = None,
        **figures: Any,
    ) -> None:
        outcomes.record(
            OUTCOMES_FILE,
            op="stored" if body["store"] else "unstored",
            outcome=kind,
            detail=detail,
            id=response_id if body["store"] else None,
            chained="previous_response_id" in body,
            at=time.time(),  # to set beside the soak's kills
            **figures,
        )


if LOAD_SHAPE:

    class StagedLoad(LoadTestShape):
        """LOAD_SHAPE's stages: locust uses a shape class it finds in the locustfile."""

        stages = parse_shape(LOAD_SHAPE)

        def tick(self) -> tuple[int, float] | None:
            users = users_at(self.stages, self.get_run_time())
            return None if users is None else (users, LOAD_SPAWN_RATE)
