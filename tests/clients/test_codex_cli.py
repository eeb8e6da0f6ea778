"""The real Codex CLI (from npm) runs a tool-call turn against the app and finishes, set up as
a new user would: the minimal provider block, no line turning its web search off, with and
without the gpt-oss model catalog, over HTTP and over a WebSocket.

The scripted engine plays the model: a first turn that calls Codex's shell tool, and a final
answer once the command's output comes back. Codex runs the command for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import API_KEY
from tests.support.helpers import REPO, scrape_metrics

CODEX_DIR = REPO / "tests" / "codex"
CATALOG = REPO / "configs" / "codex" / "gpt_oss_catalog.json"  # the copy users are told to use
pytestmark = pytest.mark.codex


def codex_binary(version: str) -> Path:
    binary = CODEX_DIR / "node_modules" / f"codex-{version}" / "bin" / "codex.js"
    if not binary.exists():
        # scripts/test.sh installs it; this keeps a bare `pytest` working too.
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=CODEX_DIR, check=True)
    return binary


def write_codex_home(home: Path, app_url: str, websockets: bool = False) -> None:
    """A new user's config: the model, what Codex may do in the test's folder, and the minimal
    provider block (its base URL, the Responses wire API, the key's variable). Nothing turns
    Codex's web search off: its default `web_search` tool reaches the app, which names no
    browser tool server and serves the request without it."""
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-oss-120b"\n'
        'model_provider = "local"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n\n'
        "[model_providers.local]\n"
        'name = "serve_app"\n'
        f'base_url = "{app_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCAL_API_KEY"\n' + ("supports_websockets = true\n" if websockets else "")
    )


def run_codex(
    version: str, app_url: str, tmp_path: Path, task: str, *extra: str, websockets: bool = False
):
    home, work = tmp_path / "codex_home", tmp_path / "work"
    write_codex_home(home, app_url, websockets)
    work.mkdir()
    command = [
        shutil.which("node") or "node",
        str(codex_binary(version)),
        "exec",
        "--skip-git-repo-check",
        "--json",
        *extra,
        task,
    ]
    env = {**os.environ, "CODEX_HOME": str(home), "LOCAL_API_KEY": API_KEY, "NO_COLOR": "1"}
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


def agent_messages(stdout: str) -> list[str]:
    texts = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        item = event.get("item") or {}
        if item.get("type") == "agent_message":
            texts.append(item.get("text", ""))
    return texts


def counted(app_url: str, sample: str) -> float:
    """A counter's sample (``name{labels}``) summed over the ingress replicas."""
    pattern = rf"^{re.escape(sample)} ([0-9.e+]+)$"
    pages = scrape_metrics(app_url).values()
    return sum(float(value) for page in pages for value in re.findall(pattern, page, re.M))


WEBSOCKET_RESPONSES = "serve_app_websocket_responses_total"
WEB_SEARCH_OMITTED = 'serve_app_tools_omitted_total{tool="web_search"}'


@pytest.mark.parametrize("catalog", [False, True], ids=["no-catalog", "catalog"])
@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
def test_codex_0169_runs_exec_command_and_finishes(
    app_url: str, tmp_path: Path, websockets: bool, catalog: bool
) -> None:
    before = {name: counted(app_url, name) for name in (WEBSOCKET_RESPONSES, WEB_SEARCH_OMITTED)}
    result, work = run_codex(
        "0.169",
        app_url,
        tmp_path,
        "E2E-EXEC-TASK: create the marker file",
        *(["-c", f'model_catalog_json="{CATALOG}"'] if catalog else []),
        websockets=websockets,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    assert (work / "marker.txt").read_text().strip() == "e2e-marker-169"
    assert "Done: marker.txt holds e2e-marker-169." in agent_messages(result.stdout)
    # Over a WebSocket both turns (the tool call and the answer) went over the socket; over
    # HTTP none did.
    over_socket = counted(app_url, WEBSOCKET_RESPONSES) - before[WEBSOCKET_RESPONSES]
    assert over_socket >= 2 if websockets else over_socket == 0
    # Both turns carried Codex's default web_search tool, served without it.
    assert counted(app_url, WEB_SEARCH_OMITTED) - before[WEB_SEARCH_OMITTED] >= 2


def test_codex_063_runs_shell_and_finishes(app_url: str, tmp_path: Path) -> None:
    result, work = run_codex("0.63", app_url, tmp_path, "E2E-SHELL-TASK: create the marker file")
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    assert (work / "marker.txt").read_text().strip() == "e2e-marker-063"
    assert "Done: marker.txt holds e2e-marker-063." in agent_messages(result.stdout)
