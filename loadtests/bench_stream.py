"""Benchmark: the CPU each process spends per streamed token, at the engine's pace, on Ray.

Deploys ``configs/local.yaml`` with ``serve run`` (its own local Ray cluster, stopped at the
end: tests/support/serve_run.py, as the tests start the app) with one ingress replica and one
engine replica, the simulated engine decoding at ``--decode-tokens-per-s`` (100) per stream
with no batch slowdown and ``--output-tokens`` (300) per answer. Then, for each stream count (32
and 128) and each transport (HTTP SSE, WebSocket as Codex uses it), it runs that many
concurrent streams and prints:

- per process (the HTTP proxy, each ingress replica, each engine replica, and Ray's
  controller, GCS and raylet): CPU ms per 1,000 streamed tokens (user + system time from
  /proc, so the other tenants of a shared machine do not count), which is also CPU µs per
  token;
- the engine alone: the simulated engine run in this process without Ray, the same streams:
  its own work, which the engine replica's figure includes;
- delivered tokens/s per stream (median) against the engine's rate;
- time to first token p50/p90 (request sent to the first delta event) and the gap between
  deliveries of delta events p50/p99, as the client sees them (a delivery may carry several
  tokens once they are coalesced; tokens per delivery is printed too).

The clients are light on purpose (raw HTTP/1.1 on asyncio streams, no JSON parsing but for the
terminal event) so the client process takes as little of the shared CPU as it can.

    PYTHONPATH=. python loadtests/bench_stream.py                     # 32 and 128, SSE and WS
    PYTHONPATH=. python loadtests/bench_stream.py --streams 32 --transports sse --repeat 2
    PYTHONPATH=. python loadtests/bench_stream.py --ray-env RAY_SERVE_ENABLE_DIRECT_INGRESS=1
    PYTHONPATH=. python loadtests/bench_stream.py --py-spy /tmp/profiles  # collapsed stacks too
    PYTHONPATH=. python loadtests/bench_stream.py --translator  # the translator alone, no Ray

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODEL, free_port, percentile

from serve_app.protocol.sse import TERMINAL_EVENT_TYPES
from tests.support import serve_run  # the repository's root on PYTHONPATH, as the usage says

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "local.yaml"
APP = "serve_app"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROMPT = "Benchmark prompt: tell me a story about streaming tokens."


# --- the app on its own Ray cluster -----------------------------------------------------------


def bench_config(source: Path, port: int, tokens_per_s: float, output_tokens: int) -> dict:
    """``source`` (configs/local.yaml) with one replica each, the engine at a fixed rate and
    room for every stream (128 must not queue behind the engine's ``max_ongoing_requests``)."""
    config = yaml.safe_load(source.read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"]["default_max_output_tokens"] = output_tokens * 2
    app["args"]["engine"]["options"].update(
        decode_tokens_per_s=tokens_per_s, default_output_tokens=output_tokens, batch_slowdown=0
    )
    for deployment in app["deployments"]:
        deployment["num_replicas"] = 1
        if deployment["name"] == "EngineDeployment":
            deployment["max_ongoing_requests"] = 512
            deployment["max_queued_requests"] = 1024
    return config


# --- processes and their CPU time -------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (its threads included)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return float("nan")
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cluster_processes(run: serve_run.ServeRun) -> dict[str, int]:
    """Our cluster's processes by role: the raylet and the GCS that this ``serve run`` started,
    and the raylet's workers (the proxy, the controller and each replica, by their process
    titles)."""
    raylet, _ = serve_run.raylet(run)
    found = {"raylet": raylet}
    for pid, argv in serve_run.children(run.process.pid):
        if argv and argv[0].endswith(b"gcs_server"):
            found["gcs"] = pid
    counts: dict[str, int] = {}
    for pid, argv in serve_run.children(raylet):
        title = b" ".join(argv).decode(errors="replace")
        for marker, role in (
            ("ProxyActor", "proxy"),
            ("ServeController", "controller"),
            (f"ServeReplica:{APP}:ResponsesIngress", "ingress"),
            (f"ServeReplica:{APP}:EngineDeployment", "engine"),
        ):
            if marker in title:
                counts[role] = counts.get(role, 0) + 1
                name = role if role in ("proxy", "controller") else f"{role}-{counts[role]}"
                found[name] = pid
    return found


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` listens on (its socket inodes matched in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in _read(table).splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def direct_ingress_port(run: serve_run.ServeRun, timeout_s: float = 120) -> int:
    """With RAY_SERVE_ENABLE_DIRECT_INGRESS=1 the ingress replica serves HTTP itself, on a port
    the controller hands it (30000-31000 by default): found among the replica's sockets."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(RuntimeError, KeyError):
            pid = cluster_processes(run)["ingress-1"]
            ports = [port for port in listening_ports(pid) if 30000 <= port < 31000]
            if ports:
                return min(ports)
        time.sleep(1)
    raise TimeoutError("no direct-ingress port found on the ingress replica")


# --- clients ----------------------------------------------------------------------------------


@dataclass
class Stream:
    """What one client saw of one response."""

    sent_at: float = 0.0
    first_at: float = 0.0
    last_at: float = 0.0
    tokens: int = 0
    deliveries: int = 0  # reads (SSE) or messages (WebSocket) that carried delta events
    gaps_s: list[float] = field(default_factory=list)
    status: str = ""

    def delivered(self, now: float) -> None:
        if self.first_at:
            self.gaps_s.append(now - self.last_at)
        else:
            self.first_at = now
        self.last_at = now
        self.deliveries += 1

    def finished(self, event: dict) -> None:
        self.status = event["response"]["status"]
        usage = event["response"].get("usage") or {}
        self.tokens = usage.get("output_tokens", 0)


def _body() -> dict:
    # store: false, as Codex sends it: the stream is measured, not the response store.
    return {"model": MODEL, "input": PROMPT, "store": False, "prompt_cache_key": str(uuid.uuid4())}


async def sse_stream(port: int) -> Stream:
    body = json.dumps({**_body(), "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    stream = Stream(sent_at=time.perf_counter())
    writer.write(head + body)
    pending = b""
    try:
        while data := await reader.read(1 << 16):
            now = time.perf_counter()
            pending += data
            end = pending.rfind(b"\n\n")
            if end < 0:
                continue
            complete, pending = pending[: end + 2], pending[end + 2 :]
            if b"delta\ndata: " in complete:
                stream.delivered(now)
            for name in TERMINAL_EVENT_TYPES:
                marker = f"event: {name}\ndata: ".encode()
                if marker in complete:
                    data_line = complete.split(marker, 1)[1].split(b"\n", 1)[0]
                    stream.finished(json.loads(data_line))
                    return stream
    finally:
        writer.close()
    return stream


async def websocket_stream(port: int) -> Stream:
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None) as socket:
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


CLIENTS = {"sse": sse_stream, "ws": websocket_stream}


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


def translator_report(tokens: int) -> str:
    translator_us_per_token(2_000, 1, None)  # warm-up: imports and harmony's encoding
    lines = [f"translator alone, about {tokens:,} tokens per case, CPU µs per token:"]
    lines.append(f"   {'chunk':>5} {'logprobs':>8} {'translator':>10} {'+ SSE':>8}")
    for chunk, top in TRANSLATOR_CASES:
        alone, framed = translator_us_per_token(tokens, chunk, top)
        shown = "-" if top is None else f"top {top}"
        lines.append(f"   {chunk:>5} {shown:>8} {alone:>10.1f} {framed:>8.1f}")
    return "\n".join(lines)


# --- reporting --------------------------------------------------------------------------------


@dataclass
class Round:
    transport: str
    count: int
    streams: list[Stream]
    cpu_s: dict[str, float]
    alone: EngineAlone

    @property
    def tokens(self) -> int:
        return sum(stream.tokens for stream in self.streams)


def run_round(
    transport: str, port: int, count: int, processes: dict[str, int], alone: EngineAlone
) -> Round:
    before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    client = time.process_time()
    streams = asyncio.run(run_streams(transport, port, count))
    after = {name: cpu_seconds(pid) for name, pid in processes.items()}
    cpu = {name: after[name] - before[name] for name in processes}
    cpu["client"] = time.process_time() - client  # this process: the clients
    return Round(transport, count, streams, cpu, alone)


def report(result: Round, tokens_per_s: float) -> str:
    tokens = max(result.tokens, 1)
    streams = result.streams
    ok = sum(stream.status == "completed" for stream in streams)
    ttft = [(s.first_at - s.sent_at) * 1000 for s in streams if s.first_at]
    gaps = [gap * 1000 for s in streams for gap in s.gaps_s]
    rates = [
        s.tokens / (s.last_at - s.first_at) for s in streams if s.last_at > s.first_at and s.tokens
    ]
    deliveries = sum(s.deliveries for s in streams)
    alone_p50 = percentile(result.alone.gaps_ms, 0.5)
    alone_p99 = percentile(result.alone.gaps_ms, 0.99)
    lines = [
        f"\n== {result.transport} x {result.count} streams: {ok}/{len(streams)} completed, "
        f"{result.tokens} tokens ({tokens / max(deliveries, 1):.2f} per delivery)",
        f"   delivered tokens/s per stream p50 {statistics.median(rates or [0]):.1f} "
        f"(engine {tokens_per_s:g}); TTFT p50 {percentile(ttft, 0.5):.1f} ms, "
        f"p90 {percentile(ttft, 0.9):.1f} ms; gap p50 {percentile(gaps, 0.5):.1f} ms, "
        f"p99 {percentile(gaps, 0.99):.1f} ms (the engine alone: p50 {alone_p50:.1f}, "
        f"p99 {alone_p99:.1f}; added at p99 {percentile(gaps, 0.99) - alone_p99:.1f})",
        f"   {'process':<14} {'CPU ms / 1k tokens':>19}",
    ]
    for name, seconds in result.cpu_s.items():
        lines.append(f"   {name:<14} {seconds / tokens * 1e6:>19.0f}")
    ingress = sum(v for k, v in result.cpu_s.items() if k.startswith("ingress"))
    front = (ingress + result.cpu_s.get("proxy", 0.0)) / tokens * 1e6
    engine = sum(v for k, v in result.cpu_s.items() if k.startswith("engine"))
    lines.append(f"   {'ingress+proxy':<14} {front:>19.0f}")
    lines.append(f"   {'engine alone':<14} {result.alone.us_per_token:>19.0f}")
    wrapper = engine / tokens * 1e6 - result.alone.us_per_token
    lines.append(f"   {'engine wrapper':<14} {wrapper:>19.0f}  (engine replica - engine alone)")
    return "\n".join(lines)


# --- profiles ---------------------------------------------------------------------------------


def start_profiles(folder: Path, processes: dict[str, int], seconds: int) -> list[subprocess.Popen]:
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
                str(folder / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in processes.items()
        if name == "proxy" or name.startswith(("ingress", "engine"))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="the Serve config to deploy")
    parser.add_argument("--streams", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--transports", nargs="+", choices=sorted(CLIENTS), default=["sse", "ws"])
    parser.add_argument("--decode-tokens-per-s", type=float, default=100)
    parser.add_argument("--output-tokens", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=1, help="rounds per stream count")
    parser.add_argument(
        "--ray-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the cluster (Ray Serve options), repeatable",
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

    for setting in args.ray_env:
        name, _, value = setting.partition("=")
        os.environ[name] = value
    port = free_port()
    config = bench_config(args.config, port, args.decode_tokens_per_s, args.output_tokens)
    alone = {count: engine_alone(config, count) for count in args.streams}
    folder = Path(tempfile.mkdtemp(prefix="bench_stream_", dir="/tmp"))
    print(f"starting the app with serve run ({folder}, port {port}) ...", flush=True)
    run = serve_run.start(config, folder)
    try:
        if os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") == "1":
            port = direct_ingress_port(run)  # no proxy in the way: the replica's own port
            run = serve_run.ServeRun(run.process, f"http://127.0.0.1:{port}", run.log)
            print(f"direct ingress: the ingress replica serves {run.url}", flush=True)
        serve_run.wait_healthy(run, timeout_s=300)
        processes = cluster_processes(run)
        print("processes:", ", ".join(f"{name} {pid}" for name, pid in processes.items()))
        for transport in args.transports:  # warm-up: imports and first-request costs
            asyncio.run(run_streams(transport, port, 4))
        profiled = args.py_spy is None
        for count in args.streams:
            for transport in args.transports:
                for _ in range(args.repeat):
                    spies = []
                    if not profiled:
                        spies, profiled = start_profiles(args.py_spy, processes, 8), True
                    result = run_round(transport, port, count, processes, alone[count])
                    print(report(result, args.decode_tokens_per_s), flush=True)
                    for spy in spies:
                        spy.wait()
    finally:
        serve_run.stop(run)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # Ray shut down on a kill too
    main()
