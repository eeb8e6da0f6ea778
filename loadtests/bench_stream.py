"""Benchmark: the CPU each process spends per streamed token, at the engine's pace, on Ray.

Runs the app with ``serve run`` as a user does (a subprocess; its own local Ray cluster, its
dashboard, its replicas' logs streamed to its output; Ctrl-C at the end) on
``configs/local.yaml`` with one ingress replica and one engine replica, the simulated engine
decoding at ``--decode-tokens-per-s`` (100) per stream with no batch slowdown and
``--output-tokens`` (300) per answer, once behind each front (``--fronts``, all by default):

- ``proxy``: Serve's Python HTTP proxy (the default);
- ``haproxy``: Ray's fast path, configs/fast-path.env (HAProxy in front, direct ingress) on
  Ray's actor calls between deployments (``RAY_SERVE_USE_GRPC_BY_DEFAULT=0``);
- ``haproxy+grpc``: the same with the inter-deployment gRPC transport
  (``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``: the ingress's engine handle over gRPC).

Then, for each stream count (32 and 128) and each transport (HTTP SSE, WebSocket as Codex uses
it; ``--transports ws-plain``: WebSocket without permessage-deflate), it runs that many
concurrent streams and prints:

- per role, every process of the cluster counted (the descendants of `serve run`, found in
  /proc): CPU ms per 1,000 streamed tokens (user + system time from /proc, so the other tenants
  of a shared machine do not count), which is also CPU µs per token. Roles: ``ingress``,
  ``engine``, ``proxy`` (Serve's Python proxy; in HAProxy mode the fallback proxy it keeps on the
  head node), ``haproxy`` (HAProxy's own processes) and ``haproxy-manager`` (the actor that runs
  it), ``controller``, ``serve-run`` (the driver, which prints the replicas' logs), ``ray`` (the
  rest: raylet, GCS, dashboard and its agents, log monitor) and ``client`` (this process);
  ``front`` is what fronts the engine: ingress + proxy + haproxy + haproxy-manager;
- the engine alone: the simulated engine run in this process without Ray, the same streams:
  its own work, which the engine replica's figure includes;
- delivered tokens/s per stream (median) against the engine's rate;
- time to first token p50/p90 (request sent to the first delta event) and the gap between
  deliveries of delta events p50/p99, as the client sees them (a delivery may carry several
  tokens once they are coalesced; tokens per delivery is printed too), and the gap p99 the
  serving path adds (the client's less the engine's own);

and at the end every round side by side as a Markdown table.

The clients are light on purpose (raw HTTP/1.1 on asyncio streams, no JSON parsing but for the
terminal event) so the client process takes as little of the shared CPU as it can.

    PYTHONPATH=. python loadtests/bench_stream.py                  # 3 fronts x 32, 128 x SSE, WS
    PYTHONPATH=. python loadtests/bench_stream.py --fronts haproxy --streams 32 --repeat 2
    PYTHONPATH=. python loadtests/bench_stream.py --ray-env SERVE_APP_ENGINE_CHANNELS=0
    PYTHONPATH=. python loadtests/bench_stream.py --py-spy /tmp/profiles  # collapsed stacks too
    PYTHONPATH=. python loadtests/bench_stream.py --translator  # the translator alone, no Ray

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODEL, free_port, percentile
from procs import cpu_seconds, descendants, process_table, role_of
from stream_client import Stream, sse_stream

from serve_app.fast_path import haproxy_isolation, read_env_file
from serve_app.protocol.sse import TERMINAL_EVENT_TYPES
from tests.support import serve_run  # the repository's root on PYTHONPATH, as the usage says

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "local.yaml"
PROMPT = "Benchmark prompt: tell me a story about streaming tokens."


# --- the app, as `serve run` runs it --------------------------------------------------------

# What fronts the app, each on a cluster of its own: Serve's Python HTTP proxy (the default);
# Ray's fast path (configs/fast-path.env: HAProxy in front, direct ingress); the same with the
# inter-deployment gRPC transport (the ingress's engine handle over gRPC, not Ray's actor calls).
FRONTS = {
    "proxy": {},
    "haproxy": {**read_env_file(), "RAY_SERVE_USE_GRPC_BY_DEFAULT": "0"},
    "haproxy+grpc": {**read_env_file(), "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1"},
}


def bench_config(
    source: Path, port: int, tokens_per_s: float, output_tokens: int, as_configured: bool = False
) -> dict:
    """``source`` (configs/local.yaml) with one replica each, the engine at a fixed rate and
    room for every stream (128 must not queue behind the engine's ``max_ongoing_requests``).
    ``as_configured``: the engine's slowdown with the batch and its limits as ``source`` has
    them (only the rate and the answers' length set), as a user who edits the rate runs it."""
    config = yaml.safe_load(source.read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"]["default_max_output_tokens"] = output_tokens * 2
    options = app["args"]["engine"]["options"]
    options.update(decode_tokens_per_s=tokens_per_s, default_output_tokens=output_tokens)
    if as_configured:
        for deployment in app["deployments"]:
            deployment["num_replicas"] = 1
        return config
    options["batch_slowdown"] = 0  # the rate asked is the rate each stream gets
    for deployment in app["deployments"]:
        deployment["num_replicas"] = 1
        if deployment["name"] == "EngineDeployment":
            deployment["max_ongoing_requests"] = 512
            deployment["max_queued_requests"] = 1024
    return config


# --- processes and their CPU time -------------------------------------------------------------


# A process's role by its title (Ray names a worker after its actor): what fronts the replicas
# (Serve's Python proxy; HAProxy and the actor that manages it; the fallback proxy that HAProxy
# mode keeps on the head node), the replicas, Serve's controller.
ROLES = (
    ("ServeReplica:serve_app:ResponsesIngress", "ingress"),
    ("ServeReplica:serve_app:EngineDeployment", "engine"),
    ("HAProxyManager", "haproxy-manager"),
    ("ProxyActor", "proxy"),
    ("ServeController", "controller"),
    ("haproxy", "haproxy"),
)
FRONT = ("ingress", "proxy", "haproxy", "haproxy-manager")


def cluster_processes(serve_run_pid: int) -> dict[str, list[int]]:
    """Every process of the cluster ``serve run`` started (its descendants: the raylet, the
    GCS, the dashboard and its agents, the workers, HAProxy), by role; ``serve run`` itself
    as ``serve-run``; the rest of Ray as ``ray``."""
    table = process_table()
    found: dict[str, list[int]] = {"serve-run": [serve_run_pid]}
    for pid in descendants(serve_run_pid, table)[1:]:
        found.setdefault(role_of(table[pid][1], ROLES, "ray"), []).append(pid)
    return found


# --- clients ----------------------------------------------------------------------------------


def _body() -> dict:
    # store: false, as Codex sends it: the stream is measured, not the response store.
    return {"model": MODEL, "input": PROMPT, "store": False, "prompt_cache_key": str(uuid.uuid4())}


async def http_stream(port: int) -> Stream:
    return await sse_stream(port, {**_body(), "stream": True})


async def websocket_stream(port: int, compression: str | None = "deflate") -> Stream:
    """A WebSocket stream; ``compression``: permessage-deflate offered, as websockets' client
    (and a browser, and Codex's Rust client, whose binary carries it) offers it by default;
    None for none (``ws-plain``: what the server's per-message deflate costs)."""
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/v1/responses"
    async with connect(url, max_size=None, compression=compression) as socket:
        stream = Stream(sent_at=time.perf_counter())
        await socket.send(json.dumps({"type": "response.create", **_body()}))
        async for message in socket:
            now = time.perf_counter()
            head = message[:64]
            if '.delta"' in head:
                stream.delivered(now)
            elif any(f'"type":"{name}"' in head for name in TERMINAL_EVENT_TYPES):
                stream.finished(json.loads(message))
                return stream
    return stream


async def plain_websocket_stream(port: int) -> Stream:
    return await websocket_stream(port, compression=None)


CLIENTS = {"sse": http_stream, "ws": websocket_stream, "ws-plain": plain_websocket_stream}


async def run_streams(transport: str, port: int, count: int) -> list[Stream]:
    client = CLIENTS[transport]
    return await asyncio.gather(*(client(port) for _ in range(count)))


# --- the engine alone -------------------------------------------------------------------------


@dataclass
class EngineAlone:
    """The simulated engine itself on the same streams: its CPU per token, and the gaps
    between its chunks (what a client would see with nothing in between)."""

    us_per_token: float
    gaps_ms: list[float]


async def _engine_alone(config: dict, count: int) -> tuple[int, list[float]]:
    """Every stream through the simulated engine itself, in this process: its own work, and
    the gaps between each stream's chunks."""
    from serve_app.engines.base import GenerateRequest, SamplingSettings
    from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
    from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN
    from serve_app.harmony.render import render_request
    from serve_app.protocol.requests import ResponsesRequest

    options = config["applications"][0]["args"]["engine"]["options"]
    engine = SimulatedEngine(SimulatedEngineConfig(**options))
    await engine.start()
    request = ResponsesRequest.model_validate({"model": MODEL, "input": PROMPT})
    prompt = render_request(request).token_ids
    gaps_ms: list[float] = []

    async def one(index: int) -> int:
        generate = GenerateRequest(
            request_id=f"alone-{index}",
            prompt_token_ids=prompt,
            sampling=SamplingSettings(
                max_tokens=100_000, stop_token_ids=(RETURN_TOKEN, CALL_TOKEN)
            ),
            session_id=str(uuid.uuid4()),
        )
        tokens, last = 0, None
        async for chunk in engine.generate(generate):
            if chunk.token_ids:
                now = time.monotonic()
                if last is not None:
                    gaps_ms.append((now - last) * 1000)
                tokens, last = tokens + len(chunk.token_ids), now
        return tokens

    tokens = sum(await asyncio.gather(*(one(index) for index in range(count))))
    await engine.shutdown()
    return tokens, gaps_ms


def engine_alone(config: dict, count: int) -> EngineAlone:
    asyncio.run(_engine_alone(config, 4))  # warm-up: imports and harmony's encoding
    before = time.process_time()
    tokens, gaps_ms = asyncio.run(_engine_alone(config, count))
    return EngineAlone((time.process_time() - before) / tokens * 1e6, gaps_ms)


# --- the translator alone ---------------------------------------------------------------------

# One turn as gpt-oss writes it: reasoning, a tool call, then the answer.
TRANSLATOR_TURN = (
    "<|channel|>analysis<|message|>"
    + "The user wants the files listed; ls will do, then a short summary. " * 12
    + "<|end|><|start|>assistant<|channel|>commentary to=functions.exec_command "
    '<|constrain|>json<|message|>{"cmd":"ls -la /tmp && echo \\"done\\""}<|call|>'
    "<|start|>assistant<|channel|>final<|message|>"
    + "Here are the files: a.txt, b.txt (Ünïcødé 日本語 🎉). " * 12
    + "<|return|>"
)
TRANSLATOR_CASES = [(1, None), (4, None), (16, None), (4, 5)]  # (tokens per chunk, top logprobs)


def translator_us_per_token(tokens: int, chunk: int, top: int | None) -> tuple[float, float]:
    """CPU µs per token of `ResponseStreamTranslator` alone (token ids -> events), then with
    the SSE encoding too, over about ``tokens`` tokens of `TRANSLATOR_TURN` turns, in this
    process (no Ray): ``chunk`` tokens per engine chunk, with ``top`` logprobs or none."""
    from serve_app.harmony.encoding import get_encoding
    from serve_app.harmony.stream import ResponseStreamTranslator
    from serve_app.harmony.tools import ToolRegistry
    from serve_app.protocol.requests import ResponsesRequest
    from serve_app.protocol.responses import initial_response
    from serve_app.protocol.sse import encode_event

    body = {
        "model": MODEL,
        "input": PROMPT,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
    }
    request = ResponsesRequest.model_validate(body)
    tools = ToolRegistry.from_request(request)
    ids = get_encoding().encode(TRANSLATOR_TURN, allowed_special="all")
    chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    entries = None
    if top is not None:
        entry = (-0.5, tuple((token, -1.0 - n) for n, token in enumerate(ids[:top])))
        entries = [[entry] * len(part) for part in chunks]
    turns = max(1, tokens // len(ids))
    seconds = []
    for encode in (False, True):
        before = time.process_time()
        for _ in range(turns):
            response = initial_response(request, response_id="resp_bench", model=MODEL)
            translator = ResponseStreamTranslator(response, tools)
            events = translator.start()
            for index, part in enumerate(chunks):
                events += translator.feed(part, None if entries is None else entries[index])
            events += translator.finish("stop", prompt_tokens=len(ids), cached_tokens=0)
            if encode:
                for event in events:
                    encode_event(event)
        seconds.append(time.process_time() - before)
    return seconds[0] / (turns * len(ids)) * 1e6, seconds[1] / (turns * len(ids)) * 1e6


# Messages of these many tokens (a long reasoning, then as long an answer), one token a chunk:
# a message's cost per token must not grow with its length.
TRANSLATOR_LENGTHS = (200, 2_000, 8_000, 32_000)


def translator_length_us_per_token(length: int) -> float:
    """CPU µs per token of `ResponseStreamTranslator` alone over one turn of two messages
    (reasoning, then the answer) of about ``length`` tokens together, one token a chunk."""
    from serve_app.harmony.encoding import get_encoding
    from serve_app.harmony.stream import ResponseStreamTranslator
    from serve_app.harmony.tools import ToolRegistry
    from serve_app.protocol.requests import ResponsesRequest
    from serve_app.protocol.responses import initial_response

    request = ResponsesRequest.model_validate({"model": MODEL, "input": PROMPT})
    sentence = "Here are the files: a.txt, b.txt (Ünïcødé 日本語 🎉). "  # 21 tokens
    text = sentence * max(1, length // 42)
    ids = get_encoding().encode(
        f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant<|channel|>final"
        f"<|message|>{text}<|return|>",
        allowed_special="all",
    )
    response = initial_response(request, response_id="resp_bench", model=MODEL)
    translator = ResponseStreamTranslator(response, ToolRegistry.from_request(request))
    translator.start()
    before = time.process_time()
    for token in ids:
        translator.feed([token])
    translator.finish("stop", prompt_tokens=1, cached_tokens=0)
    return (time.process_time() - before) / len(ids) * 1e6


def translator_report(tokens: int) -> str:
    translator_us_per_token(2_000, 1, None)  # warm-up: imports and harmony's encoding
    lines = [f"translator alone, about {tokens:,} tokens per case, CPU µs per token:"]
    lines.append(f"   {'chunk':>5} {'logprobs':>8} {'translator':>10} {'+ SSE':>8}")
    for chunk, top in TRANSLATOR_CASES:
        alone, framed = translator_us_per_token(tokens, chunk, top)
        shown = "-" if top is None else f"top {top}"
        lines.append(f"   {chunk:>5} {shown:>8} {alone:>10.1f} {framed:>8.1f}")
    lines += ["", "one turn of two messages, one token a chunk, CPU µs per token:"]
    lines.append(f"   {'tokens':>7} {'translator':>10}")
    for length in TRANSLATOR_LENGTHS:
        lines.append(f"   {length:>7,} {translator_length_us_per_token(length):>10.1f}")
    return "\n".join(lines)


# --- reporting --------------------------------------------------------------------------------


@dataclass
class Round:
    front: str
    transport: str
    count: int
    streams: list[Stream]
    cpu_s: dict[str, float]  # by role (processes of a role summed)
    alone: EngineAlone

    @property
    def tokens(self) -> int:
        return sum(stream.tokens for stream in self.streams)

    def us_per_token(self, *roles: str) -> float:
        return sum(self.cpu_s.get(role, 0.0) for role in roles) / max(self.tokens, 1) * 1e6

    @property
    def completed(self) -> int:
        return sum(stream.status == "completed" for stream in self.streams)

    def ttft_ms(self, share: float) -> float:
        return percentile(
            [(s.first_at - s.sent_at) * 1000 for s in self.streams if s.first_at], share
        )

    @property
    def added_gap_p99_ms(self) -> float:
        gaps = [gap * 1000 for s in self.streams for gap in s.gaps_s]
        return percentile(gaps, 0.99) - percentile(self.alone.gaps_ms, 0.99)


def _cpu(processes: dict[str, list[int]]) -> dict[int, float]:
    return {pid: cpu_seconds(pid) for pids in processes.values() for pid in pids}


def run_round(
    front: str, transport: str, port: int, count: int, serve_run_pid: int, alone: EngineAlone
) -> Round:
    """One round; each role's CPU is its processes': those alive at both ends of the round,
    and those started during it (all their CPU). The processes are found again at each end:
    Serve reloads HAProxy (a new process, ``-sf <old>``) after the app starts and as replicas
    come and go, so a list taken once at start-up would count an HAProxy that no longer runs."""
    before = _cpu(cluster_processes(serve_run_pid))
    client = time.process_time()
    streams = asyncio.run(run_streams(transport, port, count))
    processes = cluster_processes(serve_run_pid)
    after = _cpu(processes)
    cpu = {
        role: sum(
            spent for pid in pids if not math.isnan(spent := after[pid] - before.get(pid, 0.0))
        )
        for role, pids in processes.items()
    }
    cpu["client"] = time.process_time() - client  # this process: the clients
    return Round(front, transport, count, streams, cpu, alone)


def report(result: Round, tokens_per_s: float) -> str:
    tokens = max(result.tokens, 1)
    streams = result.streams
    gaps = [gap * 1000 for s in streams for gap in s.gaps_s]
    rates = [
        s.tokens / (s.last_at - s.first_at) for s in streams if s.last_at > s.first_at and s.tokens
    ]
    deliveries = sum(s.deliveries for s in streams)
    alone_p50 = percentile(result.alone.gaps_ms, 0.5)
    alone_p99 = percentile(result.alone.gaps_ms, 0.99)
    lines = [
        f"\n== {result.front}: {result.transport} x {result.count} streams: "
        f"{result.completed}/{len(streams)} completed, "
        f"{result.tokens} tokens ({tokens / max(deliveries, 1):.2f} per delivery)",
        f"   delivered tokens/s per stream p50 {statistics.median(rates or [0]):.1f} "
        f"(engine {tokens_per_s:g}); TTFT p50 {result.ttft_ms(0.5):.1f} ms, "
        f"p90 {result.ttft_ms(0.9):.1f} ms; gap p50 {percentile(gaps, 0.5):.1f} ms, "
        f"p99 {percentile(gaps, 0.99):.1f} ms (the engine alone: p50 {alone_p50:.1f}, "
        f"p99 {alone_p99:.1f}; added at p99 {result.added_gap_p99_ms:.1f})",
        f"   {'process':<16} {'CPU ms / 1k tokens':>19}",
    ]
    for name, seconds in result.cpu_s.items():
        lines.append(f"   {name:<16} {seconds / tokens * 1e6:>19.0f}")
    lines.append(f"   {'front':<16} {result.us_per_token(*FRONT):>19.0f}  ({' + '.join(FRONT)})")
    lines.append(f"   {'engine alone':<16} {result.alone.us_per_token:>19.0f}")
    wrapper = result.us_per_token("engine") - result.alone.us_per_token
    lines.append(f"   {'engine wrapper':<16} {wrapper:>19.0f}  (engine replica - engine alone)")
    return "\n".join(lines)


def summary(rounds: list[Round]) -> str:
    """All rounds side by side, as a Markdown table (µs of CPU per streamed token)."""
    lines = [
        "| front | streams | completed | front (all) | ingress | proxy | HAProxy + its manager "
        "| engine wrapper | Ray's rest + serve run | TTFT p50 / p90 (ms) | added gap p99 (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rounds:
        wrapper = r.us_per_token("engine") - r.alone.us_per_token
        lines.append(
            f"| {r.front} | {r.transport.upper()} x {r.count} | {r.completed}/{len(r.streams)} "
            f"| {r.us_per_token(*FRONT):.0f} | {r.us_per_token('ingress'):.0f} "
            f"| {r.us_per_token('proxy'):.0f} "
            f"| {r.us_per_token('haproxy', 'haproxy-manager'):.0f} | {wrapper:.0f} "
            f"| {r.us_per_token('ray', 'controller', 'serve-run'):.0f} "
            f"| {r.ttft_ms(0.5):.0f} / {r.ttft_ms(0.9):.0f} | {r.added_gap_p99_ms:.0f} |"
        )
    return "\n".join(lines)


# --- profiles ---------------------------------------------------------------------------------


def start_profiles(
    folder: Path, processes: dict[str, list[int]], seconds: int
) -> list[subprocess.Popen]:
    """py-spy collapsed stacks of the proxy, ingress and engine replicas for ``seconds``."""
    folder.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                str(pid),
                "-d",
                str(seconds),
                "-r",
                "250",
                "--nonblocking",
                "-f",
                "raw",
                "-o",
                str(folder / f"{role}-{pid}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role in ("proxy", "ingress", "engine")
        for pid in processes.get(role, [])
    ]


def bench_front(
    front: str, args: argparse.Namespace, alone: dict[int, EngineAlone], extra_env: dict[str, str]
) -> list[Round]:
    """Every round on a new `serve run` of the app behind ``front``."""
    port = free_port()
    config = bench_config(
        args.config, port, args.decode_tokens_per_s, args.output_tokens, args.as_configured
    )
    env = {**FRONTS[front], **extra_env}
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        env.update(haproxy_isolation(free_port))
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench_stream_") as folder:
        print(f"\n#### {front}: serve run on port {port} with {FRONTS[front]}", flush=True)
        # serve run as users start it (tests/support/serve_run.py), with the front's env.
        # PYTHONPATH absolute: the replicas run elsewhere than `.`, and must import this tree.
        pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": pythonpath, **env}
        with serve_run.running(config, Path(folder), env, startup_timeout_s=300) as run:
            processes = cluster_processes(run.process.pid)
            print("processes:", {role: pids for role, pids in processes.items() if role != "ray"})
            for transport in args.transports:  # warm-up: imports and first-request costs
                asyncio.run(run_streams(transport, port, 4))
            profiled = args.py_spy is None
            for count in args.streams:
                for transport in args.transports:
                    for _ in range(args.repeat):
                        spies = []
                        if not profiled:
                            spies = start_profiles(args.py_spy / front, processes, 8)
                            profiled = True
                        result = run_round(
                            front, transport, port, count, run.process.pid, alone[count]
                        )
                        rounds.append(result)
                        print(report(result, args.decode_tokens_per_s), flush=True)
                        for spy in spies:
                            spy.wait()
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="the Serve config to deploy")
    parser.add_argument("--fronts", nargs="+", choices=list(FRONTS), default=list(FRONTS))
    parser.add_argument("--streams", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--transports", nargs="+", choices=sorted(CLIENTS), default=["sse", "ws"])
    parser.add_argument("--decode-tokens-per-s", type=float, default=100)
    parser.add_argument("--output-tokens", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=1, help="rounds per stream count")
    parser.add_argument(
        "--as-configured",
        action="store_true",
        help="the engine's batch slowdown and limits as the config has them (only the rate set)",
    )
    parser.add_argument(
        "--ray-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for every front's cluster (Ray Serve options), repeatable",
    )
    parser.add_argument("--py-spy", type=Path, help="record py-spy stacks of the first round here")
    parser.add_argument(
        "--translator",
        action="store_true",
        help="only the stream translator's CPU per token, in this process (no Ray), then exit",
    )
    parser.add_argument("--translator-tokens", type=int, default=100_000)
    args = parser.parse_args()
    if args.translator:
        print(translator_report(args.translator_tokens), flush=True)
        return

    extra_env = dict(setting.partition("=")[::2] for setting in args.ray_env)
    config = bench_config(
        args.config, 0, args.decode_tokens_per_s, args.output_tokens, args.as_configured
    )
    alone = {count: engine_alone(config, count) for count in args.streams}
    rounds = [
        result for front in args.fronts for result in bench_front(front, args, alone, extra_env)
    ]
    print("\nµs of CPU per streamed token, by front:\n" + summary(rounds), flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # serve run stopped on a kill too
    main()
