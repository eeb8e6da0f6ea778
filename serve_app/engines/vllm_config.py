"""The vLLM engine's settings (``engine.options`` when ``engine.kind`` is ``vllm``) and the
``VllmConfig`` built from them: in the replica, or for the Ray executor on a GPU of the
replica's placement group (docs/vllm.md)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.engines.vllm_kv_events import kv_events_config

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup
    from vllm.config import VllmConfig

# Enough of a GPU to make it visible to the config-building task, not enough to block workers.
_CONFIG_TASK_GPUS = 0.001
# vLLM's StructuredOutputsConfig: llguidance (it reads our Lark grammars over harmony's special
# tokens), applied from the completion's first token, analysis included (docs/vllm.md).
_STRUCTURED_OUTPUTS: dict[str, Any] = {"backend": "guidance", "enable_in_reasoning": True}
# A reasoning parser may be set (enable_in_reasoning makes it irrelevant to our grammars).
_OWNED_ENGINE_ARGS = frozenset({"structured_outputs_config", "kv_events_config"})


class VLLMEngineConfig(BaseModel):
    """What the engine deployment's ``engine.options`` hold when ``engine.kind`` is ``vllm``."""

    model_config = ConfigDict(extra="forbid")

    model: str = "openai/gpt-oss-120b"
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_model_len: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = Field(default=None, gt=0)
    # vLLM's scheduling policy (its --scheduling-policy). "priority": waiting requests by their
    # priority, then arrival, which the engine sets to each request's deadline (its tier's:
    # serve_app/engines/vllm_engine.py, docs/vllm.md), so tiers are scheduled as the simulated
    # engine schedules them. "fcfs": arrival order, tiers reported but not scheduled.
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    # The tokenizer is loaded for vLLM's structured outputs only (token ids stay in and out).
    # True: for a model directory without tokenizer files; constrained requests are then
    # refused (an engine error), never generated unconstrained.
    skip_tokenizer_init: bool = False
    # Caps each free message (analysis, preamble) of a constrained completion at this many
    # tokens (llguidance ends it there: <|end|> comes next). None: the model reasons as long as
    # it likes, as gpt-oss was trained. A reasoning budget under a constraint; the vLLM test
    # stage sets it because random weights end a free message by chance only (1 in ~200k).
    constraint_max_free_tokens: int | None = Field(default=None, gt=0)
    # None: "ray" when tensor_parallel_size > 1 (workers on the replica's placement group, see
    # engines/placement.py), else vLLM's in-process executor on the replica's own GPU.
    distributed_executor_backend: Literal["ray", "mp", "uni"] | None = None
    # vLLM publishes its KV-cache events and the replica reads them, to tell the routers what
    # its prefix cache holds per conversation (serve_app.engines.vllm_kv_events).
    kv_cache_events: bool = True
    # vLLM's KVTransferConfig, as vLLM spells it (its --kv-transfer-config): the CPU tier behind
    # the GPU prefix cache (OffloadingConnector, configs/gpt-oss.yaml) or a tier the replicas
    # share (LMCacheConnectorV1, configs/gpt-oss-shared-kv.yaml); docs/vllm.md. None: the GPU
    # prefix cache alone.
    kv_transfer_config: dict[str, Any] | None = None
    # How fast the CPU tier loads a prefix back into the GPU, tokens/s: what the replica reports
    # (kv_load_tokens_per_s) for the placer to price a turn whose prefix is held only on CPU.
    kv_load_tokens_per_s: float | None = Field(default=None, gt=0)
    # Any other AsyncEngineArgs field, passed as is (e.g. async_scheduling, kv_cache_dtype).
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_shadowed_fields(self) -> VLLMEngineConfig:
        shadowed = sorted(set(self.engine_kwargs) & set(type(self).model_fields))
        if shadowed:
            raise ValueError(f"set {shadowed} as options of their own, not in engine_kwargs")
        owned = sorted(set(self.engine_kwargs) & _OWNED_ENGINE_ARGS)
        if owned:
            # Our grammars need the guidance backend applied from the first token.
            raise ValueError(f"{owned} is set by serve_app for constrained decoding")
        if self.kv_transfer_config is not None and not self.kv_transfer_config.get("kv_connector"):
            raise ValueError("kv_transfer_config names no kv_connector")
        return self

    @property
    def constrains(self) -> bool:
        """Whether the engine can enforce a request's constraint (it has a tokenizer)."""
        return not self.skip_tokenizer_init

    @property
    def executor_backend(self) -> str | None:
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "ray" if self.tensor_parallel_size > 1 else None

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's ``AsyncEngineArgs``."""
        args: dict[str, Any] = {
            "model": self.model,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.enable_prefix_caching,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "scheduling_policy": self.scheduling_policy,
        }
        optional = {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "distributed_executor_backend": self.executor_backend,
            "kv_transfer_config": self.kv_transfer_config,
        }
        args.update({name: value for name, value in optional.items() if value is not None})
        if self.constrains:
            args["structured_outputs_config"] = dict(_STRUCTURED_OUTPUTS)
        args.update(self.engine_kwargs)
        return args

    def engine_args_with_events(self, endpoint: str | None) -> dict[str, Any]:
        """`engine_args`, with vLLM's KV-event publisher on ``endpoint`` if given."""
        args = self.engine_args()
        if endpoint is not None:
            args["kv_events_config"] = kv_events_config(endpoint)
        return args


async def engine_config(args: dict[str, Any]) -> VllmConfig:
    """The ``VllmConfig``; for the Ray executor, built on a GPU of the replica's group."""
    if args.get("distributed_executor_backend") != "ray":
        return _build_vllm_config(args)
    placement_group = _current_placement_group()
    if placement_group is None:
        raise RuntimeError(
            "the Ray executor needs the replica's placement group: deploy the engine with "
            "serve_app.engines.placement.engine_placement(tensor_parallel_size)"
        )
    vllm_config = await _build_vllm_config_in(placement_group, args)
    # The engine core runs in a child process that is not part of the group: pass it along.
    vllm_config.parallel_config.placement_group = placement_group
    _forget_device_capability()
    return vllm_config


def _build_vllm_config(args: dict[str, Any]) -> VllmConfig:
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = dict(args)
    structured = args.get("structured_outputs_config")
    if isinstance(structured, dict):  # a plain dict until here: it crosses Ray pickled
        args["structured_outputs_config"] = StructuredOutputsConfig(**structured)
    events = args.get("kv_events_config")
    if isinstance(events, dict):
        from vllm.config import KVEventsConfig

        args["kv_events_config"] = KVEventsConfig(**events)
    transfer = args.get("kv_transfer_config")
    if isinstance(transfer, dict):  # a KV tier's connector (docs/vllm.md)
        from vllm.config import KVTransferConfig

        args["kv_transfer_config"] = KVTransferConfig(**copy.deepcopy(transfer))
    return AsyncEngineArgs(**args).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER
    )


async def _build_vllm_config_in(
    placement_group: PlacementGroup, args: dict[str, Any]
) -> VllmConfig:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    task = ray.remote(_build_vllm_config).options(
        num_cpus=0,
        num_gpus=_CONFIG_TASK_GPUS,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=placement_group),
    )
    return await task.remote(args)


def _current_placement_group() -> PlacementGroup | None:
    import ray
    from ray.util import get_current_placement_group

    return get_current_placement_group() if ray.is_initialized() else None


def _forget_device_capability() -> None:
    # vLLM caches the device capability per process; a value computed before the GPU setup was
    # right would stick (vLLM issues 7890, 8402). Ray Serve LLM clears it the same way.
    from vllm.platforms import current_platform

    cache_clear = getattr(current_platform.get_device_capability, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()
