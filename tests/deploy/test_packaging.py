"""The environment the tests run in is what the project documents: one distribution owns
harmony's module (`openai_harmony`: oss-harmony, never also openai-harmony), and `pip check`
finds nothing broken. The vLLM stage checks its own environment (tests/vllm_cpu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from serve_app.harmony.distribution import module_owners


def pip_check_problems() -> list[str]:
    """What `pip check` reports for this interpreter's environment (empty: nothing)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        return []
    return [line for line in result.stdout.splitlines() if line.strip()]


def test_one_distribution_owns_openai_harmony() -> None:
    assert module_owners() == ["oss-harmony"]


def test_pip_check_is_clean() -> None:
    assert pip_check_problems() == []


def _dist(site: Path, name: str, version: str, files: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{file},,\n" for file in files))


def test_two_distributions_of_the_module_are_both_found(tmp_path: Path) -> None:
    # The environment `pip install -e '.[vllm]'` made when this project pinned openai-harmony.
    _dist(tmp_path, "openai-harmony", "0.0.8", ["openai_harmony/__init__.py"])
    _dist(tmp_path, "oss-harmony", "0.0.11", ["openai_harmony/openai_harmony.abi3.so"])
    _dist(tmp_path, "openai", "3.50.0", ["openai/__init__.py", "openai_harmonyless.txt"])
    assert module_owners(path=[str(tmp_path)]) == ["openai-harmony", "oss-harmony"]
