"""The locust replay of multi-turn Codex traces against the app on a Ray cluster of several
nodes while its engine autoscales (issue 47): the load-test mode, and the replay the cluster
stage's tests run (tests/cluster/).

``Replay`` runs loadtests/locustfile.py in a process of its own on sessions from
loadtests/traces.py, tagged so that no two replays share a conversation's prefix (each session's
id and environment line carry the tag; Codex's instructions and tools stay shared, as they are),
with a load shape (LOAD_SHAPE: users by stage) and each turn's outcome recorded
(loadtests/outcomes.py; with its TTFT and tokens).

The load-test mode (``autoscale``) starts a cluster (tests/support/cluster.py: a head and a
worker node, PostgreSQL), then replays the same shape twice: once autoscaled by the project's
policy (serve_app/serving/engine/autoscaling.py) with short delays, from its minimum, waiting
after the load until the engine is back at its minimum; then on a fixed-size engine
deployment (``--fixed`` replicas). It writes, at ``--out``: ``.csv`` (the autoscaled
run, one row per window: loadtests/timeline.py), ``-fixed.csv``, ``.svg`` (the picture:
load, replicas, TTFT p90 and hit rate over time, the fixed-size run dashed beside) and
``-turns.jsonl`` (every turn), and prints the figures.

    PYTHONPATH=. python loadtests/scaling.py autoscale --out /tmp/autoscale
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import outcomes
import timeline
from load_shape import changes, end_of, parse_shape
from traces import generate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support import API_KEY, API_KEY_ENV  # noqa: E402

# The autoscaled engine of the load-test mode and the cluster stage: the project's policy on
# each replica's generating requests, with delays of seconds, not the GPU config's 30 s up and
# 600 s down (configs/gpt-oss.yaml).
POLICY = "serve_app.serving.engine.autoscaling:generating_requests_policy"
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 3,
    "target_ongoing_requests": 3,
    "upscale_delay_s": 3,
    "downscale_delay_s": 6,
    "look_back_period_s": 4,
    # How often replicas push their metric (Ray 2.60 still reads it; 10 s by default).
    "metrics_interval_s": 1,
    "policy": {"policy_function": POLICY},
}
# Users by stage (end in seconds, users): some load, a rise to four times it, a lower load
# (replicas drain while it goes on: 30 s, since the first stopped 16-21 s into it, the
# high stage's turns ending and the look-back and down-scale delays passing first), then none.
SHAPE = "3:3,24:12,54:5"
# The fixed-size run the autoscaled one is compared with: as many replicas as the rolling
# upgrade's first case runs next in the cluster stage (no replica to start between them).
FIXED_REPLICAS = 2
TIME_SCALE = 0.1  # think time between turns, a tenth of the traces'
TURN_TIMEOUT_S = 90.0  # a turn without its terminal event by then is hung


def write_traces(path: Path, tag: str, sessions: int = 200, seed: int = 47) -> Path:
    """``sessions`` generated Codex sessions (loadtests/traces.py), each tagged: its id and its
    environment line, so no other replay's sessions share its prefix past Codex's own."""
    lines = []
    for session in generate(sessions, 2.0, seed=seed):
        session.session_id = f"{tag}-{session.session_id}"
        environment = session.turns[0]["new_items"][1]["content"][0]
        environment["text"] = environment["text"].replace("<cwd>", f"<cwd>/{tag}")
        lines.append(session.to_json())
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Replay:
    """loadtests/locustfile.py against ``url``, headless, in a process of its own: ``shape``
    (LOAD_SHAPE) or ``users`` for ``seconds``. ``turns()``: each turn's outcome so far."""

    url: str
    folder: Path
    name: str
    shape: str | None = None
    users: int = 0
    seconds: float = 0
    store_share: float = 0.0
    time_scale: float = TIME_SCALE
    turn_timeout_s: float = TURN_TIMEOUT_S
    process: subprocess.Popen | None = None
    started: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def outcomes_file(self) -> Path:
        return self.folder / f"{self.name}-turns.jsonl"

    def start(self) -> Replay:
        traces = write_traces(self.folder / f"{self.name}-traces.jsonl", self.name)
        locust = Path(sys.executable).parent / "locust"
        command = [str(locust), "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless"]
        command += ["--host", self.url, "--only-summary", "--stop-timeout", "120"]
        if self.shape is None:
            command += ["-u", str(self.users), "-r", str(self.users), "-t", f"{self.seconds}s"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            API_KEY_ENV: os.environ.get(API_KEY_ENV, API_KEY),
            "TRACE_FILE": str(traces),
            "TRACE_TIME_SCALE": str(self.time_scale),
            "STORE_SHARE": str(self.store_share),
            "OUTCOMES_FILE": str(self.outcomes_file),
            "TURN_TIMEOUT_S": str(self.turn_timeout_s),
            **({"LOAD_SHAPE": self.shape} if self.shape else {}),
            **self.env,
        }
        self.outcomes_file.unlink(missing_ok=True)
        self.started = time.time()
        with self.log().open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def wait(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Until locust has ended (every user's turn ended or timed out); its turns."""
        assert self.process is not None
        try:
            self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return self.turns()

    def stop(self) -> None:
        """Locust told to stop (SIGTERM: its users end their turns, then it exits)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def turns(self) -> list[dict[str, Any]]:
        return outcomes.read(self.outcomes_file)

    def log_tail(self) -> str:
        return self.log().read_text(errors="replace")[-3000:]

    def log(self) -> Path:
        return self.folder / f"{self.name}-locust.log"

    def errors(self) -> list[str]:
        """Errors locust logged: a user's code that raised (its turn then recorded nothing)."""
        lines = self.log().read_text(errors="replace").splitlines()
        return [line for line in lines if "/ERROR/" in line]


def shape_end(shape: str) -> float:
    return end_of(parse_shape(shape))


def shape_marks(shape: str) -> list[tuple[float, str]]:
    """The times the load changes (after the start), labelled with the users from then on."""
    return [(at, f"{users} users") for at, users in changes(parse_shape(shape))[1:]]


def failures(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [turn for turn in turns if turn["outcome"] != "acked"]


@dataclass
class Run:
    """A replay's turns and the engine's replicas over it (``samples``), from ``start``."""

    name: str
    turns: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    start: float
    end: float
    errors: list[str] = field(default_factory=list)  # what locust logged as errors

    def rows(self, window_s: float = 5.0) -> list[timeline.Row]:
        return timeline.rows(self.turns, self.samples, self.start, self.end, window_s)

    def summary(self) -> dict[str, Any]:
        running = [sample["running"] for sample in self.samples]
        outcomes_seen: dict[str, int] = {}
        for turn in self.turns:
            outcomes_seen[turn["outcome"]] = outcomes_seen.get(turn["outcome"], 0) + 1
        ttfts = [t["ttft_ms"] for t in timeline.acked(self.turns) if t.get("ttft_ms") is not None]
        return {
            "run": self.name,
            "turns": len(self.turns),
            "outcomes": outcomes_seen,
            "hit_rate": timeline.hit_rate(self.turns),
            "ttft_p50_ms": timeline.percentile(ttfts, 0.5),
            "ttft_p90_ms": timeline.percentile(ttfts, 0.9),
            "replicas_max": max(running, default=0),
            "replicas_last": running[-1] if running else 0,
            "seconds": round(self.end - self.start, 1),
        }


def replay_and_sample(
    app: Any,
    name: str,
    folder: Path,
    shape: str,
    settle: Any = None,
    settle_timeout_s: float = 120,
) -> Run:
    """The replay of ``shape`` against ``app`` (a tests.support.cluster.ClusterApp) with the
    engine's replicas sampled every second; after it, until ``settle(sample)`` holds (e.g. the
    engine back at its minimum), at most ``settle_timeout_s``."""
    from tests.support.cluster import Sampler, engine_sample

    replay = Replay(app.url, folder, name, shape=shape).start()
    with Sampler(engine_sample) as sampler:
        turns = replay.wait(timeout_s=shape_end(shape) + TURN_TIMEOUT_S + 120)
        deadline = time.monotonic() + settle_timeout_s
        while settle is not None and time.monotonic() < deadline:
            if sampler.samples and settle(sampler.samples[-1]):
                break
            time.sleep(1)
    # The load shape's time starts as locust's first users start (seconds after its process
    # does, under load): at the first turn.
    start = min((turn["started_at"] for turn in turns), default=replay.started)
    return Run(name, turns, sampler.samples, start, time.time(), replay.errors())


def at_minimum(sample: dict[str, Any]) -> bool:
    """The engine at its minimum, nothing starting or stopping."""
    return (
        sample["running"] == AUTOSCALING["min_replicas"]
        and not sample["starting"]
        and not sample["stopping"]
    )


def autoscale_runs(app: Any, folder: Path, fixed: int, shape: str = SHAPE) -> tuple[Run, Run]:
    """The same load twice: autoscaled from the engine's minimum, then on ``fixed`` replicas.
    Returns (fixed, autoscaled)."""
    app.set_engine(autoscaling_config=AUTOSCALING)
    wait_until(lambda: at_minimum(_sample()), 120, "the engine did not come down to its minimum")
    scaled_run = replay_and_sample(app, "autoscaled", folder, shape, settle=at_minimum)
    app.set_engine(num_replicas=fixed)
    fixed_run = replay_and_sample(app, "fixed", folder, shape)
    return fixed_run, scaled_run


def _sample() -> dict[str, Any]:
    from tests.support.cluster import engine_sample

    return engine_sample()


def wait_until(predicate: Any, timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(1)


def write_outputs(out: Path, fixed_run: Run, scaled_run: Run, shape: str = SHAPE) -> None:
    """``out``.csv, ``out``-fixed.csv, ``out``.svg and ``out``-turns.jsonl."""
    scaled_rows, fixed_rows = scaled_run.rows(), fixed_run.rows()
    timeline.write_csv(scaled_rows, out.with_suffix(".csv"))
    timeline.write_csv(fixed_rows, out.with_name(out.name + "-fixed.csv"))
    figures = scaled_run.summary()
    title = (
        f"Engine autoscaled under the Codex replay: {figures['turns']} turns, "
        f"{len(failures(scaled_run.turns))} failed, hit rate {figures['hit_rate']:.3f} "
        f"(fixed size: {fixed_run.summary()['hit_rate']:.3f})"
    )
    picture = timeline.picture(
        scaled_rows,
        title,
        marks=shape_marks(shape),
        reference=fixed_rows,
        reference_name=f"fixed, {fixed_run.summary()['replicas_max']} replicas",
    )
    out.with_suffix(".svg").write_text(picture)
    with out.with_name(out.name + "-turns.jsonl").open("w") as handle:
        for run in (fixed_run, scaled_run):
            for turn in run.turns:
                handle.write(json.dumps({"run": run.name, **turn}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["autoscale"])
    parser.add_argument("--out", type=Path, required=True, help="path prefix of what it writes")
    parser.add_argument("--shape", default=SHAPE, help="users by stage: end_s:users,...")
    parser.add_argument("--fixed", type=int, default=FIXED_REPLICAS)
    args = parser.parse_args()
    from tests.support.cluster import cluster_app

    args.out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with cluster_app(workers=1, engine={"autoscaling_config": AUTOSCALING}) as app:
        print(f"cluster up in {time.monotonic() - began:.0f} s", flush=True)
        fixed_run, scaled_run = autoscale_runs(app, app.folder, args.fixed, args.shape)
        write_outputs(args.out, fixed_run, scaled_run, args.shape)
    for run in (fixed_run, scaled_run):
        print(json.dumps(run.summary()))
        for turn in failures(run.turns)[:10]:
            print("   ", turn["outcome"], turn["detail"])
    print(f"wrote {args.out}.csv, {args.out}.svg ({time.monotonic() - began:.0f} s in all)")


if __name__ == "__main__":
    main()
