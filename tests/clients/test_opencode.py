"""The real OpenCode CLI (npm, tests/opencode) runs a task against the app.

The scripted engine plays the model (the turns marked OPENCODE- in
tests/fixtures/engine_script.yaml): OpenCode's `write` tool writes notes.txt, its `bash` tool
reads it back, and the answer quotes what bash printed. OpenCode runs both tools for real.

The app is a custom provider of OpenCode's, on the AI SDK's OpenAI provider (`@ai-sdk/openai`,
which OpenCode bundles), so it speaks the Responses API; the model is marked `reasoning`, so
OpenCode asks for `reasoning.encrypted_content` and sends it back with each tool step (its
requests are `store: false`). Nothing leaves the machine:
- `OPENCODE_DISABLE_MODELS_FETCH`: OpenCode fetches its model catalog from the internet
  (models.dev) at start-up otherwise; a custom provider needs none of it;
- its config folder holds tests/opencode's install: at start-up OpenCode installs its plugin
  SDK (`@opencode-ai/plugin`) into each config folder from npm, in the background, unless the
  folder's package-lock.json already names it and node_modules exists;
- `autoupdate` and `share` off, and the `title` agent off: it asks the same model for a title
  with the user's task as the last message, so the scripted engine would play the task's turn
  there too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import API_KEY, API_KEY_ENV, MODEL, REPO

OPENCODE_DIR = REPO / "tests" / "opencode"
# Its Linux x64 builds, for CPUs with AVX2 and without (as opencode-ai's postinstall picks one).
BUILDS = ("opencode-linux-x64", "opencode-linux-x64-baseline")
PACKAGE = json.loads((OPENCODE_DIR / "package.json").read_text())
VERSION = PACKAGE["optionalDependencies"][BUILDS[0]]
pytestmark = pytest.mark.opencode


def opencode_binary() -> Path:
    """The first of OpenCode's builds installed in tests/opencode that runs here."""
    if not (OPENCODE_DIR / "node_modules").is_dir():
        # scripts/test.sh installs it; this keeps a bare `pytest` working too.
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=OPENCODE_DIR, check=True)
    binaries = [OPENCODE_DIR / "node_modules" / build / "bin" / "opencode" for build in BUILDS]
    installed = [binary for binary in binaries if binary.exists()]
    if not installed:  # npm installs them on Linux x64 only (optional dependencies)
        pytest.skip(f"no OpenCode build for this platform in tests/opencode: {BUILDS}")
    runs = []
    for binary in installed:
        run = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
        if run.returncode == 0 and run.stdout.strip() == VERSION:
            return binary
        runs.append(run)
    pytest.fail(f"no OpenCode {VERSION} build runs here: {runs}")


def opencode_config(app_url: str) -> dict[str, Any]:
    return {
        "model": f"serve-app/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
        "agent": {"title": {"disable": True}},
        "provider": {
            "serve-app": {
                "npm": "@ai-sdk/openai",
                "name": "serve_app (gpt-oss)",
                "options": {"baseURL": f"{app_url}/v1", "apiKey": f"{{env:{API_KEY_ENV}}}"},
                "models": {MODEL: {"name": MODEL, "reasoning": True}},
            }
        },
    }


def run_opencode(
    app_url: str, tmp_path: Path, task: str, *options: str
) -> tuple[subprocess.CompletedProcess, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    config_home = home / ".config"
    # OpenCode's global config folder, with its plugin SDK already installed (tests/opencode).
    config_dir = config_home / "opencode"
    config_dir.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(OPENCODE_DIR / name, config_dir / name)
    (config_dir / "node_modules").symlink_to(OPENCODE_DIR / "node_modules")
    config = tmp_path / "opencode.json"
    config.write_text(json.dumps(opencode_config(app_url), indent=1))
    work.mkdir()
    env = {
        **os.environ,
        # OpenCode takes its project folder from $PWD, not from the process's working folder.
        "PWD": str(work),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(config_home),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_CONFIG": str(config),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        API_KEY_ENV: API_KEY,
        "NO_COLOR": "1",
    }
    command = [opencode_binary(), "run", "--format", "json", "--print-logs", *options, task]
    result = subprocess.run(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return result, work


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


# The chain of thought of each scripted step (tests/fixtures/engine_script.yaml).
CHAIN_OF_THOUGHT = [
    "I should write the notes file with the write tool.",
    "Written; now read it back with bash.",
    "bash printed the marker: the file is right.",
]


@pytest.mark.parametrize("variant", [None, "high"], ids=["default", "variant-high"])
def test_opencode_writes_a_file_reads_it_with_bash_and_answers(
    app_url: str, tmp_path: Path, variant: str | None
) -> None:
    """`--thinking` shows reasoning parts; OpenCode fills them from summaries only, which it
    asks for with a reasoning variant (`reasoning: {effort: "high", summary: "auto"}`)."""
    options = ["--thinking", *(["--variant", variant] if variant else [])]
    task = "OPENCODE-WRITE-TASK: write the notes"
    result, work = run_opencode(app_url, tmp_path, task, *options)
    shown = f"{result.stderr[-4000:]}\n{result.stdout[-4000:]}"
    assert result.returncode == 0, shown
    assert (work / "notes.txt").read_text() == "opencode-written-4711\n"
    parts = [event["part"] for event in events(result.stdout)]
    tools = [(part["tool"], part["state"]["status"]) for part in parts if part["type"] == "tool"]
    assert tools == [("write", "completed"), ("bash", "completed")], shown
    bash = next(part for part in parts if part["type"] == "tool" and part["tool"] == "bash")
    assert bash["state"]["output"] == "opencode-written-4711\n"
    texts = [part["text"] for part in parts if part["type"] == "text"]
    assert texts == ["Done: notes.txt holds opencode-written-4711."]
    # Three model steps: two ended in tool calls, the last in the answer.
    finishes = [part["reason"] for part in parts if part["type"] == "step-finish"]
    assert finishes == ["tool-calls", "tool-calls", "stop"]
    reasoning = [part.get("text", "") for part in parts if part["type"] == "reasoning"]
    assert reasoning == (CHAIN_OF_THOUGHT if variant else ["", "", ""])
    # Offline as set up: no failed models.dev fetch nor any other error in OpenCode's log.
    assert "level=ERROR" not in result.stderr, shown
