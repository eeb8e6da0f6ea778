"""The Codex-like traces replayed with locust, and the store soak, against the running app."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import API_KEY, API_KEY_ENV, AUTH
from tests.support.helpers import REPO, run_locust

sys.path.insert(0, str(REPO / "loadtests"))
import outcomes
import soak_store
from report import report


def test_a_short_locust_replay_completes_with_cache_hits(app_url: str, tmp_path: Path) -> None:
    prefix = tmp_path / "run"
    result = run_locust(app_url, prefix, users=2, seconds=15, TRACE_TIME_SCALE="0.01")
    assert prefix.with_name("run_stats.csv").exists(), result.stderr[-3000:]
    table = report(str(prefix)).splitlines()[-1]
    requests, failures, _, _, share = [cell.strip() for cell in table.strip("|").split("|")]
    assert int(requests) >= 4 and int(failures) == 0, result.stderr[-3000:]
    assert float(share) > 0.5  # later turns re-send earlier ones: mostly from cache


def test_a_short_stored_replay_records_outcomes_and_every_acknowledged_turn_is_kept(
    app_url: str, tmp_path: Path
) -> None:
    """The soak's replay (STORE_SHARE, OUTCOMES_FILE): stored sessions chain by
    previous_response_id, and each acknowledged stored turn can be fetched."""
    recorded = tmp_path / "outcomes.jsonl"
    result = run_locust(
        app_url,
        tmp_path / "run",
        users=2,
        seconds=15,
        TRACE_TIME_SCALE="0.01",
        STORE_SHARE="1",
        OUTCOMES_FILE=str(recorded),
    )
    turns = outcomes.read(recorded)
    acked = [turn for turn in turns if turn["outcome"] == "acked"]
    assert len(acked) >= 4 and any(turn["chained"] for turn in acked), result.stderr[-3000:]
    assert {turn["outcome"] for turn in turns} <= {"acked", "refused"}, turns
    for turn in acked:
        assert turn["op"] == "stored"
        reply = httpx.get(f"{app_url}/v1/responses/{turn['id']}", headers=AUTH, timeout=30)
        assert reply.status_code == 200 and reply.json()["id"] == turn["id"]


def test_a_small_soak_of_writes_keeps_every_acknowledged_one(
    app_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's writers and its check against the test app: every kind of write, each
    acknowledged one found again (a 429 from the test app's small engine is a proper refusal)."""
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    args = argparse.Namespace(
        responses=24, appends=16, writers=4, ws_share=0.25, stream_bound=60.0, prompt="codex"
    )
    results, _ = asyncio.run(soak_store.run_writes(app_url, args))
    assert len(results) == 40
    assert {o.outcome for o in results} <= {"acked", "refused"}, [o.detail for o in results]
    acked = [o for o in results if o.outcome == "acked"]
    assert {o.op for o in acked} >= {"sse", "json", "ws", "items", "sse+conversation"}
    verdicts = asyncio.run(soak_store.check(app_url, acked))
    assert set(verdicts.values()) == {"kept"}
    # A write the store never kept is found lost: a response id and an item id it never saw.
    conversation = next(o.conversation for o in acked if o.conversation)
    missing = [
        soak_store.Outcome("json", "acked", response_id="resp_" + "0" * 48),
        soak_store.Outcome("items", "acked", conversation=conversation, items=["msg_missing"]),
    ]
    assert asyncio.run(soak_store.check(app_url, missing)) == {0: "lost", 1: "lost"}
