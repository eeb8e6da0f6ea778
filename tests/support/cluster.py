"""A Ray cluster of several nodes on this machine, the app deployed on it from its Serve config.

Ray's own multi-node harness, ``ray.cluster_utils.Cluster``: a head node and worker nodes, each
its own raylet, as separate Ray nodes are (one machine, so one IP). Placed as the RayService
places the app (k8s/rayservice.yaml): the head runs Serve's controller and proxy and the ingress
replicas (CPU only); the worker nodes stand for the GPU nodes: they have no CPU for Ray to give
out, only ``ENGINE_SLOTS`` of a custom resource, ``engine``, and each engine replica asks one
(as a GPU node's replicas ask its GPUs). So engine replicas run on worker nodes only, and a
worker node lost takes engine replicas with it, never an ingress replica.

The app is deployed as ``serve deploy`` (and ``serve run`` of a config file) deploy it: its
Serve config to the controller (``deploy_apps``), so a changed config is a new version the
controller rolls out. Its store is PostgreSQL: an ingress replica refuses SQLite on a cluster
of more than one node.

Used by the cluster stage (tests/cluster/) and by loadtests/scaling.py (run with the
repository's root on ``sys.path``). The replicas import the app from this checkout
(``PYTHONPATH`` in every node's environment), never from an installed copy.

Stopping: ``Cluster.shutdown()`` ends the processes this cluster started, and nothing else
(never ``ray stop``, which would stop every Ray process of this user on the machine). The
cluster's temp folder (sessions, sockets and the ``ray_current_cluster`` file that
``ray.init()`` reads) is its own (``RAY_TMPDIR``): no one else's ``ray.init()`` joins it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from serve_app.routing.directory import REPORT_KEY
from tests.support import API_KEY, ENGINE_SCRIPT, OTHER_API_KEY, REPO, postgres, serve_run

APP = "serve_app"
INGRESS = "ResponsesIngress"
ENGINE = "EngineDeployment"
ENGINE_RESOURCE = "engine"  # a worker node's stand-in for its GPUs: one per engine replica
ENGINE_SLOTS = 3  # engine replicas a worker node can hold
HEAD_CPUS = 4  # logical CPUs the head gives out (two ingress replicas take 0.5 each)
START_TIMEOUT_S = 240  # the app RUNNING after a deploy (replicas start slowly here)
# The engine's answer to a turn the script does not match, in tokens, and its decode rate: two
# seconds a turn, so that turns overlap, a replica's generating count means something, and a
# replica stopped under load has turns to drain.
OUTPUT_TOKENS = 200
DECODE_TOKENS_PER_S = 100
# A conversation an engine replica served this recently counts as on it (engine_sample).
RECENT_S = 30.0


def app_config(port: int, store_url: str, engine: Mapping[str, Any] | None = None) -> dict:
    """configs/local.yaml as the cluster runs it: the proxy on the head at ``port``, the scripted
    engine turns (tests/fixtures/engine_script.yaml), the store at ``store_url``, two ingress
    replicas on the head, engine replicas on worker nodes (one ``engine`` slot each) and room
    for a few times the load the tests send (no turn is refused for capacity). ``engine``: the
    engine deployment's options to set (``num_replicas`` or ``autoscaling_config``...)."""
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    options = app["args"]["engine"]["options"]
    options["script"] = str(ENGINE_SCRIPT)
    options["default_output_tokens"] = OUTPUT_TOKENS
    options["decode_tokens_per_s"] = DECODE_TOKENS_PER_S
    app["args"]["store"] = {"url": store_url}
    for deployment in app["deployments"]:
        if deployment["name"] == INGRESS:
            deployment["num_replicas"] = 2
            deployment["ray_actor_options"] = {"num_cpus": 0.5}
        elif deployment["name"] != ENGINE:
            # Another model's deployment (the ModerationEngine, when the config has one): no
            # CPU asked (as tests/conftest.py gives it), so the head's CPUs are the ingress
            # replicas' only, and no engine slot.
            deployment["ray_actor_options"] = {"num_cpus": 0}
        else:
            deployment["ray_actor_options"] = {"num_cpus": 0, "resources": {ENGINE_RESOURCE: 1}}
            # 16 generations, plus each ingress replica's channel (as the configs count them).
            deployment["max_ongoing_requests"] = 16 + 2
            deployment["max_queued_requests"] = 64
            deployment.update(engine or {"num_replicas": 2})
            if "autoscaling_config" in deployment:
                deployment.pop("num_replicas", None)
    return config


def engine_options(config: dict) -> dict:
    """The engine deployment's entry of ``config`` (to change it)."""
    (engine,) = [d for d in config["applications"][0]["deployments"] if d["name"] == ENGINE]
    return engine


@dataclass
class Replica:
    """A replica actor as the GCS lists it: its actor name, state and node."""

    deployment: str
    name: str
    state: str  # ALIVE, PENDING_CREATION, RESTARTING, DEAD...
    node: str


@dataclass
class ClusterApp:
    """The cluster and the app on it (``deploy``), seen through Ray (``replicas``, ``status``)."""

    cluster: Any  # ray.cluster_utils.Cluster
    url: str
    port: int
    store_url: str
    folder: Path
    workers: list[Any] = field(default_factory=list)  # ray._private.node.Node, in order added
    config: dict = field(default_factory=dict)  # the config deployed last

    def add_worker(self) -> Any:
        """A worker node with ``ENGINE_SLOTS`` engine slots and no CPU to give out; returns it
        once it has joined."""
        node = self.cluster.add_node(num_cpus=0, resources={ENGINE_RESOURCE: ENGINE_SLOTS})
        self.cluster.wait_for_nodes()
        self.workers.append(node)
        return node

    def remove_worker(self, node: Any) -> None:
        """The node lost: every process of it killed at once (SIGKILL), as a machine that
        dies or drops off the network; the cluster learns it from its heartbeats."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)

    def deploy(self, config: dict) -> None:
        """``config`` (a whole Serve config) to the controller, as ``serve deploy`` sends it;
        returns at once: the controller rolls it out."""
        from ray.serve._private.api import serve_start
        from ray.serve.schema import ServeDeploySchema

        schema = ServeDeploySchema.model_validate(config)
        client = serve_start(
            http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location
        )
        client.deploy_apps(schema)
        self.config = config

    def wait_running(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the app and each deployment are RUNNING (a rollout ended)."""
        deadline = time.monotonic() + timeout_s
        while True:
            app = self.status()
            healthy = app is not None and all(
                d.status == "HEALTHY" for d in app.deployments.values()
            )
            if app is not None and app.status == "RUNNING" and healthy:
                return
            if app is not None and app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"the deploy failed: {app.message}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not RUNNING after {timeout_s} s: {app}")
            time.sleep(0.5)

    def set_engine(self, **options: Any) -> None:
        """The engine deployment's options set (``num_replicas`` replaces autoscaling), deployed,
        and RUNNING with that many replicas."""
        engine = engine_options(self.config)
        if "num_replicas" in options:
            engine.pop("autoscaling_config", None)
        if "autoscaling_config" in options:
            engine.pop("num_replicas", None)
        engine.update(options)
        self.deploy(self.config)
        self.wait_rolled(engine.get("num_replicas"))

    def wait_rolled(
        self, engines: int | None = None, old: Collection[str] = (), timeout_s: float = 240
    ) -> None:
        """Until the app is RUNNING with ``engines`` engine replicas alive (any number if None)
        and two ingress replicas, none of them named in ``old`` (a rollout ended: the
        controller may say RUNNING before it has begun one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            alive = {r.name for r in self.replicas(ENGINE) + self.replicas(INGRESS)}
            counts = len(self.replicas(ENGINE)), len(self.replicas(INGRESS))
            app = self.status()
            done = (
                app is not None
                and app.status == "RUNNING"
                and all(d.status == "HEALTHY" for d in app.deployments.values())
                and not alive & set(old)
                and (engines is None or counts[0] == engines)
                and counts[1] == 2
                and set(self.replica_states(ENGINE)) <= {"RUNNING"}
            )
            if done:
                return
            if app is not None and app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"the deploy failed: {app.message}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not rolled out after {timeout_s} s: {app}, {counts}")
            time.sleep(0.5)

    def engine_nodes(self) -> dict[str, int]:
        """How many engine replicas each node holds (node id to count)."""
        nodes: dict[str, int] = {}
        for replica in self.replicas(ENGINE):
            nodes[replica.node] = nodes.get(replica.node, 0) + 1
        return nodes

    @staticmethod
    def status() -> Any:
        """Serve's status of the app (``serve status``), or None before it exists."""
        from ray import serve

        return serve.status().applications.get(APP)

    @staticmethod
    def replica_states(deployment: str = ENGINE) -> dict[str, int]:
        """Serve's count of the deployment's replicas by state (RUNNING, STARTING, STOPPING...)."""
        app = ClusterApp.status()
        if app is None or deployment not in app.deployments:
            return {}
        states = app.deployments[deployment].replica_states
        return {getattr(state, "value", state): n for state, n in states.items() if n}

    @staticmethod
    def replicas(deployment: str = ENGINE, alive: bool = True) -> list[Replica]:
        """The deployment's replica actors (alive ones only, unless told), with their nodes:
        one call to the GCS's actor table (no dashboard needed)."""
        import ray

        prefix = f"SERVE_REPLICA::{APP}#{deployment}#"
        found = []
        for actor in ray._private.state.actors().values():
            if not actor["Name"].startswith(prefix):
                continue
            if alive and actor["State"] != "ALIVE":
                continue
            node = actor["Address"]["NodeID"]
            found.append(Replica(deployment, actor["Name"], actor["State"], node))
        return found


@contextlib.contextmanager
def holding_slots(node_id: str, count: int) -> Iterator[None]:
    """``count`` engine slots of the node taken by an actor that does nothing, for the block:
    a GPU node whose GPUs something else holds, so that new engine replicas go elsewhere."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if count <= 0:
        yield
        return

    @ray.remote(num_cpus=0)
    class Placeholder:
        def ready(self) -> bool:
            return True

    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    holder = Placeholder.options(
        resources={ENGINE_RESOURCE: count}, scheduling_strategy=strategy
    ).remote()
    try:
        ray.get(holder.ready.remote(), timeout=60)
        yield
    finally:
        ray.kill(holder)


@contextlib.contextmanager
def cluster_app(
    workers: int = 1,
    engine: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[ClusterApp]:
    """A PostgreSQL server, a cluster of a head and ``workers`` worker nodes, the app deployed
    and RUNNING (``engine``: its engine deployment's options); all stopped after the block.

    The nodes inherit this process's environment, with the API keys (``API_KEY`` and
    ``OTHER_API_KEY``: the app runs closed, as on a cluster), this checkout first on
    ``PYTHONPATH``, the cluster's own temp folder and ``env``; restored after."""
    import ray
    from ray.cluster_utils import Cluster

    # Short: Unix sockets live under it (107 bytes at most).
    folder = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    node_env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "RAY_TMPDIR": str(folder),
        "SERVE_APP_API_KEYS": f"{API_KEY},{OTHER_API_KEY}",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    saved = {name: os.environ.get(name) for name in node_env}
    os.environ.update(node_env)
    cluster = data = None
    try:
        store_url, data = postgres.start()
        cluster = _start_head(Cluster, folder)
        port = serve_run.free_port()
        config = app_config(port, store_url, engine)
        url = f"http://127.0.0.1:{port}"
        running = ClusterApp(cluster, url, port, store_url, folder, config=config)
        for _ in range(workers):
            running.add_worker()
        ray.init(
            address=cluster.address, namespace="serve", log_to_driver=False, logging_level="ERROR"
        )
        running.deploy(running.config)
        running.wait_running()
        yield running
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        end_ours(folder)
        if data is not None:
            postgres.stop(data)
            shutil.rmtree(data, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)


def _start_head(cluster_class: Any, folder: Path, attempts: int = 3) -> Any:
    """The cluster with its head node. Ray gives a node 30 s to register with its GCS (a
    constant of ``ray._private.node``): on this shared machine, loaded by other runs, a head
    has missed it; then what it started is ended and it is started again."""
    for attempt in range(attempts):
        try:
            return cluster_class(
                initialize_head=True,
                head_node_args={
                    "num_cpus": HEAD_CPUS,
                    "include_dashboard": False,
                    "dashboard_port": serve_run.free_port(),
                },
            )
        except Exception as error:
            if "timed out during startup" not in str(error) or attempt == attempts - 1:
                raise
            print(f"the head node did not start ({error}); again", file=sys.stderr)
            end_ours(folder)
            time.sleep(5)
    raise AssertionError("unreachable")


def end_ours(folder: Path) -> list[str]:
    """Kills the processes of this cluster still running (their command lines name its temp
    folder, which is this cluster's alone), and says which on stderr."""
    left = []
    for pid, argv in serve_run.processes():
        command = b" ".join(argv)
        if pid != os.getpid() and str(folder).encode() in command:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                left.append(command.decode(errors="replace")[:200])
    if left:
        print(f"the cluster left {len(left)} process(es) running; killed:", file=sys.stderr)
        for command in left:
            print(f"  {command}", file=sys.stderr)
    return left


@dataclass
class Sampler:
    """Samples, every ``period_s`` in a thread of its own, what ``sample`` returns (with the
    time, ``at``), until stopped: the engine's replicas over time."""

    sample: Callable[[], dict[str, Any]]
    period_s: float = 1.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.time()
            with contextlib.suppress(Exception):  # a sample missed, not the run
                self.samples.append({"at": at, **self.sample()})
            self._stop.wait(self.period_s)


def engine_sample() -> dict[str, Any]:
    """The engine's replicas by Serve's state, and each alive replica's node, requests
    generating and conversations served in the last ``RECENT_S`` (``replicas``: actor name to
    ``[node, generating, conversations]``; None where a replica did not answer within a second:
    starting, or gone). The conversations are what the replica reports to the routers (its
    routing stats, as Serve's controller collects them)."""
    import ray

    states = ClusterApp.replica_states(ENGINE)
    alive = ClusterApp.replicas(ENGINE)
    calls = {}
    for replica in alive:
        actor = ray.get_actor(replica.name, namespace="serve")
        calls[replica.name] = (
            actor.__ray_call__.remote(_generating),
            actor.record_routing_stats.remote(),
        )
    pending = [call for pair in calls.values() for call in pair]
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=1.0)
    answered = set(ready)
    replicas: dict[str, list[Any]] = {}
    for replica in alive:
        generating_call, stats_call = calls[replica.name]
        generating = conversations = None
        with contextlib.suppress(ray.exceptions.RayError):
            if generating_call in answered:
                generating = ray.get(generating_call)
            if stats_call in answered:
                stats = ray.get(stats_call)
                seen = (stats.get(REPORT_KEY) or {}).values()
                conversations = sum(1 for last in seen if last > time.time() - RECENT_S)
        replicas[replica.name] = [replica.node, generating, conversations]
    return {
        "running": states.get("RUNNING", 0),
        "starting": states.get("STARTING", 0) + states.get("PENDING_MIGRATION", 0),
        "stopping": states.get("STOPPING", 0),
        "replicas": replicas,
    }


def stopping(samples: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """Each of ``samples`` (`engine_sample`'s) in which Serve reported an engine replica
    stopping, with the replica that was: of those alive then, the first gone from a later
    sample (a rollout stops them one at a time here; a downscale, with one stopping, too)."""
    found = []
    for index, sample in enumerate(samples):
        if not sample["stopping"]:
            continue
        alive = set(sample["replicas"])
        for later in samples[index + 1 :]:
            if gone := alive - set(later["replicas"]):
                found.append((sample, min(gone)))
                break
    return found


def _generating(_replica_actor: object) -> int:
    """Run in an engine replica (``__ray_call__``): the requests its engine holds."""
    from ray import serve  # imported where it runs

    return serve.get_replica_context().servable_object.num_ongoing_requests()


@dataclass
class BackgroundRuns:
    """Background responses (``background: true``) of a scripted long turn (CLUSTER-BACKGROUND
    in tests/fixtures/engine_script.yaml: about 5 s), one started every ``every_s`` in a thread of
    its own until ``stop``; ``finish`` polls each to its end. Each run: its id, the ingress
    replica that runs it (``x-serve-app-replica``), when it was created, and its final state (or
    why it could not be created)."""

    url: str
    every_s: float = 2.0
    runs: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> BackgroundRuns:
        self._thread = threading.Thread(target=self._run, name="background runs", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import httpx

        headers = {"authorization": f"Bearer {API_KEY}"}
        while not self._stop.is_set():
            number = len(self.runs)
            body = {
                "model": "gpt-oss-120b",
                "input": f"CLUSTER-BACKGROUND: job {number}",
                "background": True,
                "prompt_cache_key": f"background-{number}-{time.time()}",
            }
            run: dict[str, Any] = {"created_at": time.time()}
            try:
                answer = httpx.post(
                    f"{self.url}/v1/responses", json=body, headers=headers, timeout=30
                )
                run["status_code"] = answer.status_code
                if answer.status_code == 200:
                    run["id"] = answer.json()["id"]
                    run["runner"] = answer.headers.get("x-serve-app-replica")
                else:
                    run["error"] = answer.text[:300]
            except httpx.HTTPError as error:
                run["error"] = repr(error)
            self.runs.append(run)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def finish(self, timeout_s: float = 120) -> list[dict[str, Any]]:
        """Each run polled until it has ended (its ``response``), at most ``timeout_s`` in all."""
        import httpx

        headers = {"authorization": f"Bearer {API_KEY}"}
        deadline = time.monotonic() + timeout_s
        for run in self.runs:
            while "id" in run and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    answer = httpx.get(
                        f"{self.url}/v1/responses/{run['id']}", headers=headers, timeout=30
                    )
                    if answer.status_code == 200:
                        run["response"] = answer.json()
                        if run["response"]["status"] not in ("queued", "in_progress"):
                            break
                time.sleep(1)
        return self.runs
