"""The OpenAI Agents SDK's own ShellTool, LocalShellTool and ApplyPatchTool against the app: the
model's call comes back as a ``shell_call`` / ``local_shell_call`` / ``apply_patch_call``, the
SDK's executor really runs it in a temporary directory, and the model's next turn reads its
output (the scripted turns ``CLIENT-*`` answer only once they see what the tool printed). A
Codex-style loop: run a command, patch a file, answer."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agents import (
    Agent,
    ApplyPatchTool,
    LocalShellTool,
    OpenAIResponsesModel,
    Runner,
    ShellTool,
    set_tracing_disabled,
)
from agents.apply_diff import apply_diff
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.tool import (
    LocalShellCommandRequest,
    ShellCallOutcome,
    ShellCommandOutput,
    ShellCommandRequest,
    ShellResult,
)
from openai import AsyncOpenAI

from tests.support import API_KEY, MODEL


def agent(app_url: str, tools: list) -> Agent:
    set_tracing_disabled(True)  # no trace upload: nothing leaves this machine
    client = AsyncOpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, max_retries=0)
    return Agent(
        name="coder",
        instructions="Work in the current directory with your tools.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        tools=tools,
    )


def shell_in(folder: Path, ran: list[str]):
    """A ShellTool executor: each command through bash in ``folder``."""

    def run(request: ShellCommandRequest) -> ShellResult:
        outputs = []
        for command in request.data.action.commands:
            ran.append(command)
            done = subprocess.run(
                ["bash", "-c", command], cwd=folder, capture_output=True, text=True, timeout=10
            )
            outcome = ShellCallOutcome(type="exit", exit_code=done.returncode)
            outputs.append(
                ShellCommandOutput(stdout=done.stdout, stderr=done.stderr, outcome=outcome)
            )
        return ShellResult(output=outputs)

    return run


class FolderEditor:
    """An ApplyPatchEditor on ``folder``, applying V4A diffs with the SDK's own apply_diff."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        (self.folder / operation.path).write_text(apply_diff("", operation.diff or "", "create"))
        return ApplyPatchResult(status="completed", output="patch-done-4711")

    def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        path = self.folder / operation.path
        path.write_text(apply_diff(path.read_text(), operation.diff or ""))
        return ApplyPatchResult(status="completed", output="patch-done-4711")

    def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        (self.folder / operation.path).unlink()
        return ApplyPatchResult(status="completed", output="patch-done-4711")


async def test_the_shell_tool_runs_the_models_commands_and_the_model_reads_their_output(
    app_url: str, tmp_path: Path
) -> None:
    ran: list[str] = []
    shell = ShellTool(executor=shell_in(tmp_path, ran))
    result = await Runner.run(
        agent(app_url, [shell]), "CLIENT-SHELL-TASK", auto_previous_response_id=True
    )
    assert ran == ["echo shell-out-4711 > shell.txt", "cat shell.txt"]
    assert (tmp_path / "shell.txt").read_text() == "shell-out-4711\n"
    assert result.final_output == "The shell printed shell-out-4711."
    assert [item.type for item in result.new_items].count("tool_call_item") == 1


async def test_the_apply_patch_tool_edits_a_file_and_the_model_reads_the_result(
    app_url: str, tmp_path: Path
) -> None:
    # No previous_response_id: the SDK resends the whole history, the call included.
    patch = ApplyPatchTool(editor=FolderEditor(tmp_path))
    result = await Runner.run(agent(app_url, [patch]), "CLIENT-PATCH-TASK")
    assert (tmp_path / "hello.txt").read_text() == "patched-hello-4711"  # V4A: no last newline
    assert result.final_output == "Patched: hello.txt holds patched-hello-4711."


async def test_the_local_shell_tool_runs_the_models_argv(app_url: str, tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def run(request: LocalShellCommandRequest) -> str:
        action = request.data.action
        seen.append(list(action.command))
        done = subprocess.run(action.command, cwd=tmp_path, capture_output=True, text=True)
        return done.stdout

    result = await Runner.run(
        agent(app_url, [LocalShellTool(executor=run)]),
        "CLIENT-LSHELL-TASK",
        auto_previous_response_id=True,
    )
    assert seen == [["bash", "-lc", "echo localrun-4711"]]
    assert result.final_output == "The local shell printed localrun-4711."
