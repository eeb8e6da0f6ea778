"""What one routing-stats report costs, end to end, at its largest: the engine replica making it
(``record_routing_stats``: ``serve_app.routing.replica_report``), Ray moving it (pickled by the
replica, unpickled and compared by the controller, pickled again for each router that listens),
and each router taking every replica's (``ConversationPlacer.set_reports``).

The replica reports as many conversations as it is allowed (``max_reported``, 4,096): served
recently, held on the GPU (the newest, as many as ``--gpu-tokens`` hold) and only in the CPU
tier (the rest, up to ``--cpu-tokens``). Printed: CPU milliseconds of each step (process time,
median of ``--repeat``), the pickled size, and what one second of reports costs at each
period for ``--replicas`` engine replicas and ``--routers`` ingress replicas.

    PYTHONPATH=. python loadtests/bench_report.py [--replicas 4 --routers 4]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

from serve_app.engines.kv_events import BlockRemoved, BlockStored
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.directory import DEFAULT_MAX_REPORTED
from serve_app.routing.replica_report import ReplicaReporter

BLOCK_SIZE = 16
CONTROL_LOOP_INTERVAL_S = 0.1  # Ray Serve's controller loop (RAY_SERVE_CONTROL_LOOP_INTERVAL_S)


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


def full_reporter(
    name: str, conversations: int, gpu_tokens: int, cpu_tokens: int, clock: Clock
) -> ReplicaReporter:
    """A replica that served ``conversations`` and holds the newest on its GPU, the rest (and
    a copy of every block, as vLLM's offloading connector writes them) in its CPU tier. With
    no CPU tokens, no CPU-tier events (LMCache sends none: configs/gpt-oss-shared-kv.yaml) and
    every conversation on the GPU."""
    reporter = ReplicaReporter(name, clock, kv_load_tokens_per_s=500_000.0)
    blocks = max(1, (cpu_tokens or gpu_tokens) // BLOCK_SIZE // conversations)  # each's
    on_gpu = max(1, gpu_tokens // (blocks * BLOCK_SIZE))  # the newest this many
    for conversation in range(conversations):
        session = f"{name}-conversation-{conversation}"
        clock.now += 0.001
        reporter.arrived(f"{session}/0", session, blocks * BLOCK_SIZE)
        hashes = tuple(hash((name, conversation, block)) for block in range(blocks))
        reporter.held([BlockStored(hashes, None, BLOCK_SIZE, session)])
        if cpu_tokens:
            reporter.held([BlockStored(hashes, None, BLOCK_SIZE, None, medium="CPU")])
        reporter.first_token(f"{session}/0", blocks * BLOCK_SIZE, clock.now)
        reporter.ended(f"{session}/0")
    # The GPU evicts all but the newest `on_gpu` conversations; their CPU copies stay.
    for conversation in range(conversations - on_gpu):
        hashes = tuple(hash((name, conversation, block)) for block in range(blocks))
        reporter.held([BlockRemoved(hashes)])
    return reporter


def cpu_ms(step: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4, help="engine replicas")
    parser.add_argument("--routers", type=int, default=4, help="ingress replicas (routers)")
    parser.add_argument("--conversations", type=int, default=DEFAULT_MAX_REPORTED)
    parser.add_argument("--gpu-tokens", type=int, default=2_000_000, help="a replica's GPU")
    parser.add_argument(
        "--cpu-tokens",
        type=int,
        default=5_800_000,
        help="its CPU tier (0: no CPU-tier events, as LMCache: the shared config)",
    )
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    clock = Clock()
    reporters = {
        f"replica-{index}": full_reporter(
            f"replica-{index}", args.conversations, args.gpu_tokens, args.cpu_tokens, clock
        )
        for index in range(args.replicas)
    }
    reporter = next(iter(reporters.values()))
    report = reporter.report()
    wire = pickle.dumps(report, protocol=5)
    reports = {name: each.report() for name, each in reporters.items()}
    everything = pickle.dumps(reports, protocol=5)
    placer = ConversationPlacer(clock=clock)
    placer.set_members(reports)
    replica_ms = cpu_ms(reporter.report, args.repeat) + cpu_ms(
        lambda: pickle.dumps(report, protocol=5), args.repeat
    )
    other = pickle.loads(wire)
    controller_ms = cpu_ms(lambda: pickle.loads(wire) != other, args.repeat)
    # A broadcast builds each running replica's `RunningReplicaInfo`, which hashes the str of
    # its routing stats, then pickles them all for each listening router.
    broadcast_ms = cpu_ms(
        lambda: [hash(str(each)) for each in reports.values()], args.repeat
    ) + args.routers * cpu_ms(lambda: pickle.dumps(reports, protocol=5), args.repeat)
    router_ms = cpu_ms(
        lambda: placer.set_reports(pickle.loads(everything)), max(3, args.repeat // 4)
    )
    sizes = (
        f"held {len(report.get('held_tokens', {})):,}, "
        f"CPU-held {len(report.get('cpu_held_tokens', {})):,}"
    )
    print(
        f"one replica's report ({sizes} conversations): {len(wire) / 1e3:,.0f} kB pickled\n"
        f"  replica: make it and pickle it {replica_ms:6.2f} ms CPU\n"
        f"  controller: unpickle and compare it {controller_ms:6.2f} ms CPU; a broadcast "
        f"(hash all {args.replicas}, pickle them for each of {args.routers} routers) "
        f"{broadcast_ms:6.2f} ms CPU\n"
        f"  router: unpickle all {args.replicas} and set_reports {router_ms:6.2f} ms CPU"
    )
    # The controller broadcasts at most once a control-loop tick, after any report changed:
    # the replicas' periods are jittered apart, so up to one broadcast per report.
    print(
        "\nCPU per second, by the period (each replica; the controller; each router), with "
        f"up to {1 / CONTROL_LOOP_INTERVAL_S:.0f} broadcasts a second (one each control loop):"
    )
    for period in (1.0, 0.5, 0.25, 0.1):
        per_s = 1 / period
        broadcasts = min(1 / CONTROL_LOOP_INTERVAL_S, args.replicas * per_s)
        controller = per_s * args.replicas * controller_ms + broadcasts * broadcast_ms
        print(
            f"  {period:4} s: replica {replica_ms * per_s / 10:5.2f}%, controller "
            f"{controller / 10:5.2f}%, router {router_ms * broadcasts / 10:5.2f}% of a core; "
            f"{len(everything) * args.routers * broadcasts / 1e6:5.2f} MB/s to the routers"
        )


if __name__ == "__main__":
    main()
