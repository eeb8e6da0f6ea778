"""The GPU smoke test: serve_app on vLLM with CUDA, checked end to end in a few minutes.

``scripts/gpu_smoke.sh`` runs this on a GPU machine with no internet: it writes the tiny random
gpt-oss checkpoint the tests use (``scripts/tiny_gpt_oss.py``), starts the app with
``serve run`` on vLLM (tensor parallel 1, and 2 when two GPUs are visible), and prints one row
per check:

- placement: where the engine runs (TP 1: the replica holds one GPU; TP > 1: one vLLM worker
  per GPU, all in the replica's placement group);
- a streamed engine turn ends in ``<|return|>`` or ``<|call|>`` (the harmony stop token is in
  the output);
- a repeated prefix comes back with ``cached_tokens > 0``;
- a strict ``json_schema`` answer and a ``tool_choice: required`` call validate;
- a client leaving mid-stream leaves no request running in vLLM;
- ``top_logprobs`` come back with the alternatives asked for;
- an engine replica killed is replaced cleanly: its engine-core process is gone (its GPU memory
  freed), the new replica serves.

The weights are random, so every check that needs the model to end an answer uses a strict
format or tool (the engine's grammar ends it) and the engine caps free messages at 16 tokens.

``run_checks`` is the check logic alone, against an app already running with this process
joined to its Ray cluster: the vLLM CPU stage runs it against its CPU app
(``tests/vllm_cpu/test_gpu_smoke.py``), where only the placement row is skipped.

    scripts/gpu_smoke.sh [--tp 1 2] [--workdir DIR] [--eager]   (or, from the repository's root:
    PYTHONPATH=. python scripts/gpu_smoke.py ...)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import yaml
from openai import OpenAI

# The repository's root is on sys.path (scripts/gpu_smoke.sh exports it as PYTHONPATH).
from tests.support import MODEL, REPO, serve_run

APP_NAME = "serve_app"
ENGINE_DEPLOYMENT = "EngineDeployment"
MAX_FREE_TOKENS = 16  # the engine's constraint_max_free_tokens (random weights)
MAX_MODEL_LEN = 8192
STARTUP_TIMEOUT_S = 300
REPLACE_TIMEOUT_S = 300
LONG_PROMPT = "Summarize the following notes. " + " ".join(f"note {n}: ok." for n in range(300))
# Bounded everywhere random tokens would not end by themselves, within OpenAI's strict subset.
TRIP: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
        "mode": {"type": "string", "enum": ["train", "plane", "bike"]},
        "refundable": {"type": "boolean"},
    },
    "required": ["city", "days", "mode", "refundable"],
    "additionalProperties": False,
}
TRIP_FORMAT = {"format": {"type": "json_schema", "name": "trip", "strict": True, "schema": TRIP}}
TOOLS = [{"type": "function", "name": "book_trip", "parameters": TRIP, "strict": True}]

Status = Literal["pass", "FAIL", "skip"]
# vLLM's Ray worker actors: RayExecutorV2's (the "ray" backend's default since 0.32, the only
# one in 0.33) and the older RayDistributedExecutor's.
_VLLM_WORKER_CLASSES = frozenset({"RayWorkerProc", "RayWorkerWrapper"})


@dataclass
class Row:
    check: str
    status: Status
    detail: str


class Skip(Exception):
    """A check this machine cannot do (e.g. placement without a GPU)."""


@dataclass
class Target:
    """The running app, with this process joined to its Ray cluster."""

    url: str
    tensor_parallel_size: int
    gpus: bool
    # The bearer key (an app with API keys, as the test suite's, answers 401 without one).
    api_key: str = "unused"

    @property
    def client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key, timeout=300, max_retries=0)


# --- the checks --------------------------------------------------------------------------------


def check_placement(target: Target) -> str:
    if not target.gpus:
        raise Skip("no GPU: the CPU engine runs in the replica's own process")
    (replica,) = _engine_replicas()
    where = _call_in(replica, _replica_placement)
    workers = _vllm_workers()
    if target.tensor_parallel_size == 1:
        assert len(where["gpu_ids"]) == 1, f"the replica holds GPUs {where['gpu_ids']}"
        assert not workers, f"{len(workers)} vLLM worker actors with TP 1"
        return f"replica holds GPU {where['gpu_ids'][0]}, engine in its own process"
    group = where["placement_group"]
    assert group is not None, "the replica is in no placement group"
    groups = {worker["placement_group_id"] for worker in workers}
    assert len(workers) == target.tensor_parallel_size and groups == {group}, (
        f"{len(workers)} vLLM workers in groups {groups}, the replica's is {group}"
    )
    return f"{len(workers)} vLLM workers in the replica's placement group {group[:12]}"


def check_stream_ends_in_a_stop_token(target: Target) -> str:
    from ray import serve

    from serve_app.constraints.spec import Body, CompletionConstraint
    from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
    from serve_app.harmony.encoding import STOP_TOKENS, get_encoding

    text = "<|start|>user<|message|>Plan a trip.<|end|><|start|>assistant"
    request = GenerateRequest(
        request_id=f"smoke-{uuid.uuid4().hex}",
        prompt_token_ids=get_encoding().encode(text, allowed_special="all"),
        sampling=SamplingSettings(max_tokens=2000, stop_token_ids=STOP_TOKENS),
        constraint=CompletionConstraint(final=Body.json_schema(TRIP)),
    )
    handle = serve.get_deployment_handle(ENGINE_DEPLOYMENT, app_name=APP_NAME)
    chunks = [
        chunk
        for chunk in handle.options(stream=True).generate.remote(request)
        if isinstance(chunk, GenerateChunk)
    ]
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    finish = chunks[-1].finish_reason if chunks else None
    assert finish == "stop" and tokens and tokens[-1] in STOP_TOKENS, (
        f"finish {finish}, last tokens {tokens[-5:]}"
    )
    stop = get_encoding().decode([tokens[-1]])
    return f"{len(tokens)} tokens in {len(chunks)} chunks, ends in {stop}"


def check_prefix_cache(target: Target) -> str:
    key = f"smoke-cache-{uuid.uuid4().hex}"
    client = target.client
    usages = [
        client.responses.create(
            model=MODEL, input=LONG_PROMPT, max_output_tokens=4, prompt_cache_key=key
        ).usage
        for _ in range(2)
    ]
    assert all(usage is not None for usage in usages)
    cached = usages[1].input_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached > 0, f"no cached tokens on the repeat: {usages[1]}"
    return f"cached_tokens {cached} of {usages[1].input_tokens}"  # type: ignore[union-attr]


def check_strict_json_schema(target: Target) -> str:
    response = target.client.responses.create(
        model=MODEL,
        input="Plan a trip.",
        text=TRIP_FORMAT,  # type: ignore[arg-type]
        max_output_tokens=1000,
    )
    assert response.status == "completed", (response.status, response.incomplete_details)
    answer = json.loads(response.output_text)
    jsonschema.validate(answer, TRIP)
    return f"valid: {response.output_text[:60]}"


def check_tool_choice_required(target: Target) -> str:
    response = target.client.responses.create(
        model=MODEL,
        input="Book a trip.",
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        max_output_tokens=1000,
    )
    assert response.status == "completed", (response.status, response.incomplete_details)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "book_trip", response.output
    jsonschema.validate(json.loads(calls[0].arguments), TRIP)
    return f"valid call: book_trip({calls[0].arguments[:50]})"


def check_cancel(target: Target) -> str:
    body = {
        "model": MODEL,
        "input": LONG_PROMPT,
        "stream": True,
        "max_output_tokens": MAX_MODEL_LEN // 2,
        "prompt_cache_key": f"smoke-cancel-{uuid.uuid4().hex}",
    }
    running = None
    auth = {"authorization": f"Bearer {target.api_key}"}
    url = f"{target.url}/v1/responses"
    with httpx.stream("POST", url, json=body, headers=auth, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and ".delta" in line:
                running = _engine_ongoing()
                break  # leaving the block closes the connection mid-stream
    assert running, f"no request running in the engine mid-stream ({running})"
    left = _wait(lambda: _engine_ongoing() == 0, timeout_s=60)
    assert left is not None, f"{_engine_ongoing()} requests still running 60 s after the cancel"
    return f"{running} running mid-stream, none {left:.1f} s after the client left"


def check_top_logprobs(target: Target) -> str:
    response = target.client.responses.create(
        model=MODEL,
        input="Plan a trip.",
        text=TRIP_FORMAT,  # type: ignore[arg-type]
        max_output_tokens=1000,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    assert response.status == "completed", (response.status, response.incomplete_details)
    parts = [
        part
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    ]
    entries = [entry for part in parts for entry in part.logprobs or []]
    assert entries, "no logprobs on the answer's text"
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs or []) == 2, entry
    return f"{len(entries)} tokens, 2 alternatives each"


def check_engine_replaced(target: Target) -> str:
    import ray

    (victim,) = _engine_replicas()
    before = _call_in(victim, _replica_processes)
    assert before["children"], "the replica has no engine-core process"
    killed = time.monotonic()
    ray.kill(_actor(victim), no_restart=True)

    def replaced() -> bool:
        alive = _engine_replicas()
        return len(alive) == 1 and alive[0]["name"] != victim["name"]

    assert _wait(replaced, REPLACE_TIMEOUT_S) is not None, "the killed replica was not replaced"
    orphans = _wait(lambda: not _alive(before["children"]), timeout_s=60)
    assert orphans is not None, f"the killed replica's processes live on: {before}"
    served = _wait(lambda: _serves(target), REPLACE_TIMEOUT_S)
    assert served is not None, "the app does not serve after the replacement"
    if target.tensor_parallel_size > 1:  # the dead engine's workers are gone
        workers = len(_vllm_workers())
        assert workers == target.tensor_parallel_size, f"{workers} vLLM workers alive"
    return (
        f"served again {time.monotonic() - killed:.0f} s after the kill; the engine core "
        f"({len(before['children'])} processes under the replica) exited"
    )


CHECKS: list[tuple[str, Callable[[Target], str]]] = [
    ("placement", check_placement),
    ("stream ends in <|return|>/<|call|>", check_stream_ends_in_a_stop_token),
    ("prefix cache: cached_tokens > 0", check_prefix_cache),
    ("strict json_schema valid", check_strict_json_schema),
    ("tool_choice required valid", check_tool_choice_required),
    ("cancel leaves none running", check_cancel),
    ("top_logprobs", check_top_logprobs),
    ("engine replica killed, replaced", check_engine_replaced),
]


def run_checks(
    url: str, *, tensor_parallel_size: int = 1, gpus: bool = True, api_key: str = "unused"
) -> list[Row]:
    """Every check, in order, against the app at ``url`` (with ``api_key``): this process must
    be joined to the app's Ray cluster. The replica kill comes last (it leaves the app serving)."""
    target = Target(url.rstrip("/"), tensor_parallel_size, gpus, api_key)
    rows = []
    for name, check in CHECKS:
        try:
            rows.append(Row(name, "pass", check(target)))
        except Skip as skip:
            rows.append(Row(name, "skip", str(skip)))
        except Exception as exc:  # a failed check is a row, the others still run
            rows.append(Row(name, "FAIL", f"{type(exc).__name__}: {exc}"[:300]))
    return rows


def format_table(rows: list[Row], title: str = "") -> str:
    width = max(len(row.check) for row in rows)
    lines = [title] if title else []
    lines += [f"{row.check:<{width}}  {row.status:<4}  {row.detail}" for row in rows]
    return "\n".join(lines)


# --- Ray: the engine replicas and vLLM's workers ------------------------------------------------


def _engine_replicas() -> list[dict]:
    import ray

    return [
        actor
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if ENGINE_DEPLOYMENT in actor["name"]
    ]


def _actor(replica: dict) -> Any:
    import ray

    return ray.get_actor(replica["name"], namespace=replica["namespace"])


def _call_in(replica: dict, function: Callable[[Any], Any]) -> Any:
    """``function(replica actor)`` run in the replica's process (Ray's ``__ray_call__``)."""
    import ray
    from ray import cloudpickle

    if __name__ != "__main__":  # imported by path (the vLLM stage): the replica cannot import it
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray.get(_actor(replica).__ray_call__.remote(function), timeout=30)


def _engine_ongoing() -> int:
    """Requests vLLM holds, summed over the engine replicas."""
    return sum(_call_in(replica, _replica_ongoing) for replica in _engine_replicas())


def _replica_ongoing(_actor: object) -> int:
    from ray import serve

    return serve.get_replica_context().servable_object.num_ongoing_requests()


def _replica_placement(_actor: object) -> dict[str, Any]:
    import ray
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    return {
        "gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()],
        "placement_group": group.id.hex() if group is not None else None,
    }


def _replica_processes(_actor: object) -> dict[str, Any]:
    import psutil

    me = psutil.Process()
    return {"pid": me.pid, "children": [child.pid for child in me.children(recursive=True)]}


def _vllm_workers() -> list[dict]:
    from ray.util.state import list_actors

    actors = list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=10000)
    return [
        {"placement_group_id": actor.placement_group_id}
        for actor in actors
        if actor.class_name in _VLLM_WORKER_CLASSES
    ]


def _alive(pids: list[int]) -> bool:
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return any(running(pid) for pid in pids)


def _serves(target: Target) -> bool:
    try:
        response = target.client.responses.create(model=MODEL, input="Hi", max_output_tokens=8)
    except Exception:  # the proxy may still route to the dead replica for a moment
        return False
    return response.status in ("completed", "incomplete") and response.error is None


def _wait(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``condition()`` held, or None if it did not within ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(0.5)
    return None


# --- the app on a GPU machine -------------------------------------------------------------------


def serve_config(checkpoint: Path, tensor_parallel_size: int, port: int, eager: bool) -> dict:
    """configs/local.yaml with the vLLM engine on ``checkpoint``, one replica each, the engine
    on ``tensor_parallel_size`` GPUs (``serve_app.engines.placement``)."""
    from serve_app.engines.placement import engine_placement

    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "port": port}
    app = config["applications"][0]
    options: dict[str, Any] = {
        "model": str(checkpoint),
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": MAX_MODEL_LEN,
        "constraint_max_free_tokens": MAX_FREE_TOKENS,
    }
    if eager:
        options["engine_kwargs"] = {"enforce_eager": True}
    app["args"]["engine"] = {"kind": "vllm", "options": options}
    for deployment in app["deployments"]:
        deployment["num_replicas"] = 1
        if deployment["name"] == ENGINE_DEPLOYMENT:
            deployment.pop("ray_actor_options", None)
            deployment.update(engine_placement(tensor_parallel_size))
    return config


@contextlib.contextmanager
def running_app(config: dict, workdir: Path) -> Iterator[str]:
    """``serve run`` on ``config`` (its own Ray cluster), this process joined to it; yields the
    app's URL and stops it (Ctrl-C, as users do) afterwards."""
    import ray

    with serve_run.running(config, workdir, startup_timeout_s=STARTUP_TIMEOUT_S) as run:
        try:
            serve_run.join(run)
            yield run.url
        finally:
            ray.shutdown()


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tp", type=int, nargs="+", help="tensor parallel sizes (default: 1, and 2 on 2+ GPUs)"
    )
    parser.add_argument("--workdir", type=Path, help="checkpoint and logs (default: a temp dir)")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs nor torch.compile")
    args = parser.parse_args()
    gpus = _visible_gpus()
    if gpus == 0:
        print("no GPU visible (CUDA): the CPU checks run in the vLLM CPU stage", file=sys.stderr)
        return 2
    sizes = args.tp or ([1, 2] if gpus >= 2 else [1])
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / "tiny-gpt-oss"
    if not (checkpoint / "tokenizer.json").is_file():
        script = REPO / "scripts" / "tiny_gpt_oss.py"
        subprocess.run([sys.executable, str(script), str(checkpoint), "--tokenizer"], check=True)
    tables, failed = [], False
    for size in sizes:
        started = time.monotonic()
        run_dir = workdir / f"tp{size}"
        run_dir.mkdir(exist_ok=True)
        config = serve_config(checkpoint, size, serve_run.free_port(), args.eager)
        try:
            with running_app(config, run_dir) as url:
                rows = run_checks(url, tensor_parallel_size=size, gpus=True)
        except RuntimeError as exc:
            rows = [Row("app start", "FAIL", str(exc)[-2000:])]
        title = f"TP {size} ({time.monotonic() - started:.0f} s, logs in {run_dir}):"
        tables.append(format_table(rows, title))
        print(tables[-1], flush=True)
        failed = failed or any(row.status == "FAIL" for row in rows)
    print("\n" + "\n\n".join(tables))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
