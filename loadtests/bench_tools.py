"""The added latency and ingress CPU of a server-run tool call (an MCP call the app runs inside
the response) against the same call run by the client (issue 39, Show).

    PYTHONPATH=. python loadtests/bench_tools.py                        # 32 streams, Ray-free
    PYTHONPATH=. python loadtests/bench_tools.py --serve-run            # the same, serve run
    PYTHONPATH=. python loadtests/bench_tools.py --streams 2 --calls 1  # tiny (the unit test)
    PYTHONPATH=. python loadtests/bench_tools.py --rounds 3             # 3 rounds each, in turn

It starts a loopback MCP server (tests/support/mcp_servers.py, kind ``good``: the ``mcp``
SDK's ``MCPServer`` on streamable HTTP, in a process of its own; its ``echo`` tool is the
no-op tool) and the app, with that server allowed (``tools.mcp_allow``): Ray-free, the
ingress's FastAPI app on uvicorn in a process of this script (as ``tests.local_app``: the
simulated engine on the same event loop), or with ``--serve-run`` under ``serve run
configs/local.yaml`` (one ingress and one engine replica, Serve's Python proxy). The simulated
engine decodes at ``--tokens-per-s`` per stream (slower as more decode together, as
engines/simulated/timing.py models it) and prefills uncached tokens at 20,000 tokens/s, one
prefill at a time. Then, through the openai SDK, ``--streams`` concurrent streamed
conversations, each making ``--calls`` tool calls in a row before the answer, in two modes:

- ``server``: the request carries an ``mcp`` tool; the app runs each call (the tool loop) and
  the model continues in the same response;
- ``client``: the request carries a ``function`` tool of the same name and schema; the client
  answers each call with a ``function_call_output`` in a new request (Codex's way: ``store:
  false``, the whole input re-sent with the encrypted reasoning, same ``prompt_cache_key``).

Per mode it prints: the ingress process's CPU time over the run (from /proc, after a warm-up
round) divided by the calls made, and the ratio of the two modes (server / client): what a
server-run call costs the ingress against one the client runs; and from the model's
``<|call|>`` (the ``response.mcp_call_arguments.done`` or ``response.function_call_arguments
.done`` event) to the next token of the continuation (the next text delta), p50 / p90, beside
the no-op tool's own time (one ``call_tool`` on an open session, and opening a session) from
this process with the SDK's client at the same concurrency. Ray-free, the ingress process also
runs the simulated engine: the same tokens in both modes. The machine is shared: read the
ratios, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from common import MODEL, free_port, percentile
from procs import cpu_seconds

SERVER_LABEL = "bench"
# The test MCP server's no-op tool (tests/support/mcp_servers.py, kind "good"): it answers
# the text it is given. The client mode's function tool is the same, answered by the client.
TOOL_NAME = "echo"
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}
MODES = ("server", "client")
# What each mode's call N echoes (the simulated engine's next turn is chosen by it).
RESULT = {"server": "MCP-RESULT {step}.", "client": "FN-RESULT {step}."}
TASK = {"server": "BENCH-MCP-TASK", "client": "BENCH-FN-TASK"}
# The output item a call of each mode is.
CALL_ITEM = {"server": "mcp_call", "client": "function_call"}
DELTAS = frozenset({"response.output_text.delta", "response.reasoning_text.delta"})
CALL_DONE = frozenset({"response.mcp_call_arguments.done", "response.function_call_arguments.done"})


# --- the simulated model's script and the two servers --------------------------------------


def bench_script(calls: int, answer_words: int) -> dict[str, Any]:
    """Each mode's turns: the task calls the tool with step 1; the output of step N calls
    step N + 1, up to ``calls``; the last output is answered (reasoning, then text)."""
    answer = " ".join(["word"] * answer_words)
    turns: list[dict[str, Any]] = []
    for mode, namespace in (("server", SERVER_LABEL), ("client", None)):
        marker = RESULT[mode].split(" ")[0]

        def call(step: int, mode: str = mode, namespace: str | None = namespace) -> dict:
            text = RESULT[mode].format(step=step)
            spec = {"name": TOOL_NAME, "arguments": {"text": text}, "namespace": namespace}
            return {"function_call": spec}

        turns.append(
            {
                "match": rf"{marker} {calls}\.",
                "items": [{"reasoning": "The tool answered; now the answer."}, {"text": answer}],
            }
        )
        for step in range(1, calls):
            turns.append(
                {
                    "match": rf"{marker} {step}\.",
                    "items": [{"reasoning": f"Step {step} done, next."}, call(step + 1)],
                }
            )
        turns.append(
            {
                "match": TASK[mode],
                "items": [{"reasoning": "I call the no-op tool first."}, call(1)],
            }
        )
    return {"turns": turns}


def serve_app(port: int, options: argparse.Namespace) -> None:
    """The app, Ray-free (as tests.local_app), the simulated engine playing the bench script."""
    from pathlib import Path

    import uvicorn

    from serve_app.config import AppArgs, ToolArgs
    from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
    from serve_app.harmony.reasoning_vault import ReasoningVault
    from serve_app.serving.engine.client import InProcessEngineClient
    from serve_app.serving.ingress import app_store, create_api

    async def run() -> None:
        folder = Path(tempfile.mkdtemp(prefix="bench_tools_"))
        tools = {"mcp_allow": [options.mcp_allow]}
        if options.mcp_max_concurrent_calls:
            tools["mcp_max_concurrent_calls"] = options.mcp_max_concurrent_calls
        args = AppArgs(default_max_output_tokens=4096, tools=ToolArgs(**tools))
        store = app_store(f"sqlite+aiosqlite:///{folder / 'responses.db'}", args)
        await store.start()
        engine = SimulatedEngine(
            SimulatedEngineConfig(
                script=bench_script(options.calls, options.answer_words),
                decode_tokens_per_s=options.tokens_per_s,
            )
        )
        await engine.start()
        api = create_api(args, InProcessEngineClient(engine), ReasoningVault("bench"), store)
        api.state.service.warm()  # as the ingress replica does
        config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning")
        try:
            await uvicorn.Server(config).serve()
        finally:
            await api.state.service.aclose()
            await engine.shutdown()
            await store.close()

    asyncio.run(run())


def start(command: list[str], ready_url: str) -> subprocess.Popen:
    """A child process of this script, once ``ready_url`` answers (any HTTP status)."""
    # A session of its own: `stop` ends it with whatever it started (the app's render-pool
    # workers, multiprocessing's resource tracker), which would otherwise outlive it holding
    # this script's stdout, so that a caller reading it to the end waited for them.
    process = subprocess.Popen([sys.executable, __file__, *command], start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {process.returncode}")
        try:
            urllib.request.urlopen(ready_url, timeout=2).read()
            return process
        except urllib.error.HTTPError:
            return process  # it answers
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"{command[0]} did not start")


def stop(process: subprocess.Popen) -> None:
    """Ends a child of `start` and every process of its session."""
    _signal_session(process, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _signal_session(process, signal.SIGKILL)  # what it started and left behind


def _signal_session(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def cpu_by_role(pids: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(cpu_seconds(pid) for pid in found) for role, found in pids.items()}


# --- the streams -----------------------------------------------------------------------------


@dataclass
class Stream:
    """One tool-using conversation: when each call's arguments were done and the next delta
    came, and what went wrong if anything did."""

    calls_done: list[float] = field(default_factory=list)
    next_tokens: list[float] = field(default_factory=list)
    calls: int = 0
    error: str = ""
    # A call's arguments are done and no delta came since.
    waiting: bool = False

    def call_to_token_s(self) -> list[float]:
        return [b - a for a, b in zip(self.calls_done, self.next_tokens, strict=False)]


def tools_for(mode: str, mcp_url: str) -> list[dict[str, Any]]:
    if mode == "server":
        return [
            {
                "type": "mcp",
                "server_label": SERVER_LABEL,
                "server_url": mcp_url,
                "allowed_tools": [TOOL_NAME],
                "require_approval": "never",
            }
        ]
    return [
        {
            "type": "function",
            "name": TOOL_NAME,
            "description": "Answers the text it is given.",
            "parameters": TOOL_SCHEMA,
            "strict": True,
        }
    ]


async def read_stream(events: Any, mode: str, stream: Stream, outputs: list[dict[str, Any]]) -> str:
    """Reads one streamed response: times each call's arguments done and the first delta after
    it; collects the output items; returns the terminal event's type."""
    terminal = ""
    async for event in events:
        kind = event.type
        if kind in CALL_DONE:
            stream.calls_done.append(time.perf_counter())
            stream.waiting = True
        elif kind in DELTAS and stream.waiting:
            stream.next_tokens.append(time.perf_counter())
            stream.waiting = False
        elif kind == "response.output_item.done":
            item = event.item
            outputs.append(item.model_dump(mode="json", exclude_none=True))
            if item.type == CALL_ITEM[mode]:
                stream.calls += 1
            if getattr(item, "error", None):
                stream.error = f"{item.type} error: {item.error}"
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            terminal = kind
            if kind != "response.completed":
                stream.error = stream.error or f"{kind}: {event.response.error}"
    return terminal


async def converse(client: Any, mode: str, index: int, options: argparse.Namespace) -> Stream:
    """One conversation: its task, then (client mode) each call answered in a new request."""
    stream = Stream()
    context: list[dict[str, Any]] = [
        {"role": "developer", "content": options.instructions},
        {"role": "user", "content": f"{TASK[mode]} stream {index}"},
    ]
    for _ in range(options.calls + 1):
        outputs: list[dict[str, Any]] = []
        events = await client.responses.create(
            model=MODEL,
            input=context,
            tools=tools_for(mode, options.mcp_url),
            stream=True,
            store=False,
            include=["reasoning.encrypted_content"],
            prompt_cache_key=f"bench-{mode}-{index}",
        )
        terminal = await read_stream(events, mode, stream, outputs)
        if stream.error or terminal != "response.completed":
            stream.error = stream.error or f"ended with {terminal or 'nothing'}"
            return stream
        calls = [item for item in outputs if item["type"] == "function_call"]
        if mode == "server" and calls:  # the app did not run it: no tool loop for mcp
            stream.error = f"a function_call for {calls[0]['name']}, not an mcp_call"
        if mode == "server" or not calls:
            return stream
        context += [{k: v for k, v in item.items() if k != "status"} for item in outputs]
        for call in calls:
            answer = json.loads(call["arguments"])["text"]  # the client's echo
            context.append(
                {"type": "function_call_output", "call_id": call["call_id"], "output": answer}
            )
    return stream


@dataclass
class Round:
    mode: str
    streams: list[Stream]
    cpu_s: dict[str, float]  # by role: "ingress", "MCP server", "engine replica"
    wall_s: float
    load: tuple[float, float, float]

    @property
    def calls(self) -> int:
        return sum(stream.calls for stream in self.streams)

    @property
    def errors(self) -> list[str]:
        return [stream.error for stream in self.streams if stream.error]

    @property
    def latencies(self) -> list[float]:
        return [s for stream in self.streams for s in stream.call_to_token_s()]


async def run_round(mode: str, pids: dict[str, list[int]], options: argparse.Namespace) -> Round:
    """``streams`` conversations at once; the CPU of each role's processes over them."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{options.url}/v1", api_key="unused", max_retries=0, timeout=300)
    async with client:
        before, started = cpu_by_role(pids), time.perf_counter()
        streams = await asyncio.gather(
            *(converse(client, mode, i, options) for i in range(options.streams))
        )
        wall = time.perf_counter() - started
        after = cpu_by_role(pids)
    cpu = {role: after[role] - before[role] for role in pids}
    return Round(mode, list(streams), cpu, wall, os.getloadavg())


# --- the tool's own time ---------------------------------------------------------------------


async def direct_calls(mcp_url: str, streams: int, repeat: int = 5) -> tuple[list, list]:
    """The no-op tool's own time, at ``streams`` concurrent callers, through the SDK's client:
    (a session opened and initialized, each caller once; ``repeat`` calls on it, each)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def one() -> tuple[float, list[float]]:
        started = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack:
            read, write, *_ = await stack.enter_async_context(streamable_http_client(mcp_url))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            opened_s = time.perf_counter() - started
            calls = []
            for _ in range(repeat):
                call_started = time.perf_counter()
                await session.call_tool(TOOL_NAME, {"text": "MCP-RESULT 1."})
                calls.append(time.perf_counter() - call_started)
        return opened_s, calls

    timed = await asyncio.gather(*(one() for _ in range(streams)))
    return [opened for opened, _ in timed], [call for _, calls in timed for call in calls]


# --- the report ------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def per_call_ms(result: Round, role: str = "ingress") -> float:
    return result.cpu_s[role] / result.calls * 1000 if result.calls else float("nan")


def report_round(result: Round) -> str:
    latencies = result.latencies
    load = " ".join(f"{value:.2f}" for value in result.load)
    line = (
        f"{result.mode:>6}: {len(result.streams)} streams, {result.calls} calls in "
        f"{result.wall_s:.1f} s; ingress CPU {result.cpu_s['ingress'] * 1000:.0f} ms, "
        f"{per_call_ms(result):.2f} ms per call; call to next token p50 / p90 "
        f"{ms(percentile(latencies, 0.5))} / {ms(percentile(latencies, 0.9))} ms; "
        f"load average {load}"
    )
    others = [role for role in result.cpu_s if role != "ingress"]
    if others and result.calls:
        cpu = ", ".join(f"{role} {per_call_ms(result, role):.2f}" for role in others)
        line += f"\n        CPU per call (ms): {cpu}"
    if result.errors:
        line += f"\n        {len(result.errors)} streams failed, e.g. {result.errors[0]}"
    return line


def report_tool(opened: list[float], call: list[float]) -> str:
    return (
        f"  tool: no-op call_tool p50 / p90 {ms(percentile(call, 0.5))} / "
        f"{ms(percentile(call, 0.9))} ms on an open session; opening and initializing a "
        f"session {ms(percentile(opened, 0.5))} / {ms(percentile(opened, 0.9))} ms"
    )


def report_ratio(server: Round, client: Round) -> str:
    p50 = percentile(server.latencies, 0.5), percentile(client.latencies, 0.5)
    return (
        f" ratio: server / client ingress CPU per call "
        f"{per_call_ms(server) / per_call_ms(client):.2f}; "
        f"call to next token p50 {p50[0] / p50[1]:.2f}"
    )


async def measure(pids: dict[str, list[int]], options: argparse.Namespace) -> None:
    await direct_calls(options.mcp_url, min(options.streams, 4), repeat=1)  # warm-up
    opened, call = await direct_calls(options.mcp_url, options.streams)
    print(report_tool(opened, call), flush=True)
    warm = argparse.Namespace(**{**vars(options), "streams": min(options.streams, 4)})
    for mode in options.modes:
        await run_round(mode, pids, warm)  # warm-up: imports, the prefix cache, pools
    rounds: dict[str, list[Round]] = {mode: [] for mode in options.modes}
    for _ in range(options.rounds):  # the modes in turn: a load that drifts falls on both
        for mode in options.modes:
            rounds[mode].append(await run_round(mode, pids, options))
            print(report_round(rounds[mode][-1]), flush=True)
    results = {mode: merged(done) for mode, done in rounds.items()}
    if options.rounds > 1:
        for result in results.values():
            print(report_round(result).replace(f"{result.mode:>6}:", f"{result.mode:>6} (all):"))
    if set(results) == set(MODES) and all(r.calls for r in results.values()):
        print(report_ratio(results["server"], results["client"]))


def merged(rounds: list[Round]) -> Round:
    """Several rounds of one mode as one: their streams, CPU and wall time summed."""
    cpu = {role: sum(r.cpu_s[role] for r in rounds) for role in rounds[0].cpu_s}
    streams = [stream for r in rounds for stream in r.streams]
    return Round(rounds[0].mode, streams, cpu, sum(r.wall_s for r in rounds), rounds[-1].load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--calls", type=int, default=2, help="tool calls in a row per response")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measured rounds per mode, the modes in turn"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--tokens-per-s", type=float, default=100.0, help="decode, per stream")
    parser.add_argument("--answer-words", type=int, default=40)
    parser.add_argument(
        "--instructions-words", type=int, default=1500, help="the developer prompt's length"
    )
    parser.add_argument(
        "--mcp-max-concurrent-calls",
        type=int,
        default=0,
        help="tools.mcp_max_concurrent_calls (default: the app's)",
    )
    parser.add_argument(
        "--serve-run", action="store_true", help="the app under `serve run` (Ray), not uvicorn"
    )
    parser.add_argument("--serve-app", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mcp-allow", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve_app:
        serve_app(options.serve_app, options)
        return
    options.instructions = "You are a coding agent. " + " ".join(
        f"rule{n % 97}" for n in range(options.instructions_words)
    )
    from tests.support.mcp_servers import mcp_server

    where = "serve run (Ray)" if options.serve_run else "Ray-free app (uvicorn)"
    print(
        f"{options.streams} streams x {options.calls} tool calls; simulated engine at "
        f"{options.tokens_per_s:g} tokens/s per stream; {where}",
        flush=True,
    )
    with mcp_server("good") as server:
        options.mcp_url = server.url
        if options.serve_run:
            bench_serve_run(server, options)
        else:
            bench_local(server, options)


def bench_local(server: Any, options: argparse.Namespace) -> None:
    """The app Ray-free, in a process of this script (the engine in it)."""
    app_port = free_port()
    options.url = f"http://127.0.0.1:{app_port}"
    command = ["--serve-app", str(app_port), "--mcp-allow", server.origin]
    command += ["--calls", str(options.calls), "--tokens-per-s", str(options.tokens_per_s)]
    command += ["--answer-words", str(options.answer_words)]
    command += ["--mcp-max-concurrent-calls", str(options.mcp_max_concurrent_calls)]
    app = start(command, f"{options.url}/health")
    try:
        pids = {
            "ingress": [app.pid],
            "MCP server": [server.process.pid],
            "this client": [os.getpid()],
        }
        asyncio.run(measure(pids, options))
    finally:
        stop(app)


def serve_run_config(origin: str, port: int, options: argparse.Namespace) -> dict[str, Any]:
    """configs/local.yaml with one ingress and one engine replica, the engine at the rate
    asked playing the bench script, the MCP server allowed."""
    import yaml

    from tests.support import REPO

    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"]["default_max_output_tokens"] = 4096
    tools: dict[str, Any] = {"mcp_allow": [origin]}
    if options.mcp_max_concurrent_calls:
        tools["mcp_max_concurrent_calls"] = options.mcp_max_concurrent_calls
    app["args"]["tools"] = tools
    engine = app["args"]["engine"]["options"]
    engine["decode_tokens_per_s"] = options.tokens_per_s
    engine["script"] = bench_script(options.calls, options.answer_words)
    for deployment in app["deployments"]:
        deployment["num_replicas"] = 1
        deployment.pop("autoscaling_config", None)
        if deployment["name"] == "EngineDeployment":  # room for every stream
            deployment["max_ongoing_requests"] = 512
            deployment["max_queued_requests"] = 1024
    return config


def bench_serve_run(server: Any, options: argparse.Namespace) -> None:
    """``serve run`` as users start it (tests/support/serve_run.py), Serve's Python proxy in
    front; the CPU of its ingress and engine replica processes (as bench_stream.py finds them)."""
    from pathlib import Path

    from bench_stream import cluster_processes

    from tests.support import REPO, serve_run

    port = free_port()
    options.url = f"http://127.0.0.1:{port}"
    config = serve_run_config(server.origin, port, options)
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": pythonpath}
    with (
        tempfile.TemporaryDirectory(prefix="bench_tools_") as folder,
        serve_run.running(config, Path(folder), env, startup_timeout_s=300) as run,
    ):
        processes = cluster_processes(run.process.pid)
        pids = {
            "ingress": processes.get("ingress", []),
            "MCP server": [server.process.pid],
            "engine replica": processes.get("engine", []),
            "proxy": processes.get("proxy", []),
            "this client": [os.getpid()],
        }
        asyncio.run(measure(pids, options))


if __name__ == "__main__":
    main()
