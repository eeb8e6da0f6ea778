"""The vLLM engine's mapping of vLLM's DELTA logprobs, on stand-ins shaped like vllm.outputs
(vLLM 0.32/0.33), and the prompt it hands vLLM's renderer; the real engine: tests/vllm_cpu."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from serve_app.engines import vllm_engine
from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.engines.vllm_config import VLLMEngineConfig
from serve_app.engines.vllm_engine import (
    VLLMEngine,
    _queue_s,
    _render,
    _StopTokenGuard,
    _to_chunk,
    deadline_priority,
)
from serve_app.harmony.encoding import RETURN_TOKEN


def vllm_output(
    token_ids: list[int],
    logprobs: list[dict[int, tuple[float, int]]] | None,
    finish_reason: str | None = None,
    stop_reason: object = None,
) -> SimpleNamespace:
    """A ``RequestOutput`` with one ``CompletionOutput``; ``logprobs`` as vLLM's list of
    ``{token id: Logprob(logprob, rank)}``, one per new token."""
    positions = None
    if logprobs is not None:
        positions = [
            {
                tid: SimpleNamespace(logprob=lp, rank=rank, decoded_token=None)
                for tid, (lp, rank) in p.items()
            }
            for p in logprobs
        ]
    completion = SimpleNamespace(
        token_ids=token_ids,
        logprobs=positions,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    return SimpleNamespace(
        outputs=[completion], finished=finish_reason is not None, num_cached_tokens=0
    )


def test_vllm_logprobs_map_to_ids_and_values() -> None:
    output = vllm_output(
        [5, 9],
        [
            # The sampled token is the best: its entry and the top 2 (it among them).
            {5: (-0.1, 1), 7: (-2.5, 2)},
            # The sampled token is not in the top 2: one entry more, first in vLLM's dict.
            {9: (-3.0, 5), 5: (-0.2, 1), 7: (-1.9, 2)},
        ],
    )
    chunk = _to_chunk(output, 10, _StopTokenGuard(), 2)
    assert chunk is not None and chunk.token_ids == [5, 9]
    assert chunk.logprobs == [(-0.1, ((5, -0.1), (7, -2.5))), (-3.0, ((5, -0.2), (7, -1.9)))]


def test_vllm_logprobs_with_no_alternatives_and_a_restored_stop_token() -> None:
    output = vllm_output([4], [{4: (-0.7, 3)}], finish_reason="stop", stop_reason=RETURN_TOKEN)
    chunk = _to_chunk(output, 10, _StopTokenGuard(), 0)
    # The guard re-appends the stop token vLLM left out: a placeholder keeps them aligned.
    assert chunk is not None and chunk.token_ids == [4, RETURN_TOKEN]
    assert chunk.logprobs == [(-0.7, ()), (0.0, ())]


def test_vllm_output_without_logprobs_gives_none() -> None:
    chunk = _to_chunk(vllm_output([4, 5], None), 10, _StopTokenGuard())
    assert chunk is not None and chunk.logprobs is None


async def test_the_cache_salt_rides_on_the_prompt_vllm_renders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM takes ``cache_salt`` on the prompt (``TokensPrompt``, a TypedDict), and its renderer
    copies it into the engine input (vllm/renderers/base.py ``_process_tokens``, 0.32 and 0.33):
    what the engine hands the renderer, with a stand-in for it (vLLM itself: tests/vllm_cpu)."""
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(TokensPrompt=dict))
    given: list[dict] = []

    class Renderer:
        async def render_cmpl_async(self, prompts: Sequence[dict]) -> list[dict]:
            given.extend(prompts)
            return list(prompts)

    engine = SimpleNamespace(renderer=Renderer())
    assert await _render(engine, (1, 2, 3), "tenant-a") == {
        "prompt_token_ids": [1, 2, 3],
        "cache_salt": "tenant-a",
    }
    await _render(engine, [4], None)
    assert given[1] == {"prompt_token_ids": [4]}  # unsalted: no key at all, as before


# -- Scheduling (issue 49) ----------------------------------------------------------------------


def test_a_deadline_is_vllms_priority_in_milliseconds_so_vllm_schedules_earliest_first() -> None:
    """vLLM's priority queue orders by (priority, arrival_time), lower first (vllm/v1/request.py
    ``Request.__lt__``, 0.32 and 0.33): a request's deadline as its priority makes it serve
    earliest deadline first. A flex request (60 s) goes after a priority one (0 s) arriving
    up to 60 s later, and before one arriving after that: its wait counts, which a priority
    fixed at submission could not otherwise do (vLLM never changes a request's priority)."""
    epoch = 1_000.0
    flex = deadline_priority(60.0, now=epoch + 5.0, epoch=epoch)
    assert flex == 65_000
    assert deadline_priority(0.0, now=epoch + 64.9, epoch=epoch) < flex
    assert deadline_priority(0.0, now=epoch + 65.1, epoch=epoch) > flex
    assert deadline_priority(5.0, now=epoch, epoch=epoch) == 5_000


async def test_the_engine_hands_vllm_the_deadline_as_the_requests_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(TokensPrompt=dict))
    monkeypatch.setattr(vllm_engine, "_sampling_params", lambda *args, **kwargs: None)
    asked: list[dict] = []

    class Renderer:
        async def render_cmpl_async(self, prompts: Sequence[dict]) -> list[dict]:
            return list(prompts)

    class AsyncLLM:
        renderer = Renderer()

        async def generate(self, prompt: dict, params: object, request_id: str, **kwargs):
            asked.append(kwargs)
            queued = SimpleNamespace(queued_ts=10.0, scheduled_ts=10.25)
            yield SimpleNamespace(**vars(vllm_output([7], None, "stop", 7)), metrics=queued)

    engine = VLLMEngine(VLLMEngineConfig(model="m", skip_tokenizer_init=True))
    engine._engine = AsyncLLM()  # type: ignore[assignment]
    engine._epoch = time.monotonic() - 2.0  # the engine started 2 s ago
    request = GenerateRequest("r", [1, 2], SamplingSettings(4), priority=1, deadline_s=60.0)
    chunks = [chunk async for chunk in engine.generate(request)]
    assert 62_000 <= asked[0]["priority"] < 62_000 + 500
    # vLLM's own queue time (scheduled less queued, RequestStateStats) rides the first chunk.
    assert chunks[0].engine_queue_s == pytest.approx(0.25)


def test_vllms_queue_time_is_none_without_its_stats() -> None:
    """vLLM fills ``RequestOutput.metrics`` only when it logs stats (``disable_log_stats``)."""
    assert _queue_s(SimpleNamespace(metrics=None)) is None
    assert (
        _queue_s(SimpleNamespace(metrics=SimpleNamespace(queued_ts=3.0, scheduled_ts=0.0))) is None
    )
    assert _queue_s(SimpleNamespace()) is None


def test_the_priority_scheduler_is_vllms_default_here_and_may_be_turned_off() -> None:
    assert VLLMEngineConfig(model="m").engine_args()["scheduling_policy"] == "priority"
    fcfs = VLLMEngineConfig(model="m", scheduling_policy="fcfs")
    assert fcfs.engine_args()["scheduling_policy"] == "fcfs"
    with pytest.raises(ValueError, match="scheduling_policy"):
        VLLMEngineConfig(model="m", engine_kwargs={"scheduling_policy": "priority"})
