"""Ray Serve deployment options for one vLLM engine replica.

Tensor parallel (``tensor_parallel_size > 1``): one placement group per replica, one bundle per
GPU, ``STRICT_PACK`` so every shard shares a node (NVLink, and vLLM's Ray executor warns when a
TP group spans nodes). The replica actor holds no GPU; vLLM's Ray executor (``RayExecutorV2``)
starts one worker actor per GPU bundle (``num_cpus=0``, one GPU each; docs/vllm.md).

Single GPU: no placement group; the replica actor itself holds the GPU and vLLM runs its model in
the engine-core process (``uni`` executor), which inherits the replica's ``CUDA_VISIBLE_DEVICES``.

``max_replicas_per_node`` cannot be combined with ``placement_group_bundles`` (Ray Serve).
"""

from __future__ import annotations

from typing import Any

# vLLM's Ray workers each ask for this many GPUs (default 1.0). A bundle holding less than one
# GPU is only usable when the engine-core process (a child of the replica) inherits this value.
_PER_WORKER_GPUS_ENV = "VLLM_RAY_PER_WORKER_GPUS"


def engine_placement(
    tensor_parallel_size: int, *, gpus_per_bundle: float = 1, cpus_for_replica: float = 1
) -> dict[str, Any]:
    """Deployment options (``ray_actor_options`` and, for TP, the placement group) of a replica.

    ``cpus_for_replica`` is the replica actor's CPU reservation; the engine-core process it
    spawns runs on the same node outside Ray's accounting, so reserve 2 when the node can spare
    them. ``gpus_per_bundle`` may be a fraction (GPU sharing), never more than 1: vLLM refuses
    placement-group bundles with more than one GPU (``vllm/v1/executor/ray_utils.py``).
    """
    _check(tensor_parallel_size, gpus_per_bundle, cpus_for_replica)
    if tensor_parallel_size == 1:
        return {"ray_actor_options": {"num_cpus": cpus_for_replica, "num_gpus": gpus_per_bundle}}

    # The first bundle also carries the replica's CPU: Ray Serve 2.60 pins the replica actor to
    # bundle 0 (``deployment_scheduler.py``: ``placement_group_bundle_index=0``) and rejects
    # options whose ``ray_actor_options`` do not fit in that bundle (``ReplicaConfig``
    # ``_validate_placement_group_options``; ``num_cpus`` defaults to 1 there). Ray Serve LLM
    # does the same: ``_merge_replica_actor_and_child_actor_bundles`` in
    # ``core/server/llm_server.py`` adds the replica actor's resources to the first of its
    # ``{"GPU": 1}`` bundles. The other bundles need no CPU: vLLM's workers ask for none.
    replica_bundle = _nonzero({"CPU": cpus_for_replica, "GPU": gpus_per_bundle})
    worker_bundles = [{"GPU": gpus_per_bundle} for _ in range(tensor_parallel_size - 1)]
    actor_options: dict[str, Any] = {"num_cpus": cpus_for_replica, "num_gpus": 0}
    if gpus_per_bundle != 1:
        env = {_PER_WORKER_GPUS_ENV: str(gpus_per_bundle)}
        actor_options["runtime_env"] = {"env_vars": env}
    return {
        "ray_actor_options": actor_options,
        "placement_group_bundles": [replica_bundle, *worker_bundles],
        "placement_group_strategy": "STRICT_PACK",
    }


def _check(tensor_parallel_size: int, gpus_per_bundle: float, cpus_for_replica: float) -> None:
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}")
    if not 0 < gpus_per_bundle <= 1:
        raise ValueError(f"gpus_per_bundle must be in (0, 1], got {gpus_per_bundle}")
    if cpus_for_replica < 0:
        raise ValueError(f"cpus_for_replica must not be negative, got {cpus_for_replica}")


def _nonzero(bundle: dict[str, float]) -> dict[str, float]:
    # Ray rejects bundles whose resources are all zero; drop zero entries for clean bundles.
    return {name: amount for name, amount in bundle.items() if amount}
