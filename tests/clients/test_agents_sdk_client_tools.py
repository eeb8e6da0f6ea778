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
    """An ApplyPatchEditor on ``folder``, applying V4A diffs with the SDK's own apply_diff;
    each operation answers ``says``."""

    def __init__(self, folder: Path, says: str = "patch-done-4711") -> None:
        self.folder, self.says = folder, says
        self.operations: list[tuple[str, str]] = []

    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.operations.append((operation.type, operation.path))
        (self.folder / operation.path).write_text(apply_diff("", operation.diff or "", "create"))
        return ApplyPatchResult(status="completed", output=self.says)

    def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.operations.append((operation.type, operation.path))
        path = self.folder / operation.path
        path.write_text(apply_diff(path.read_text(), operation.diff or ""))
        return ApplyPatchResult(status="completed", output=self.says)

    def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.operations.append((operation.type, operation.path))
        (self.folder / operation.path).unlink()
        return ApplyPatchResult(status="completed", output=self.says)


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


async def test_a_codex_style_loop_reads_a_file_patches_it_and_answers(
    app_url: str, tmp_path: Path
) -> None:
    """Three model turns in one agent run, two client-run calls between them: ``cat`` through
    the shell, an ``update_file`` patch made from what it printed, then the answer."""
    (tmp_path / "notes.txt").write_text("loop-notes-4711\n")
    ran: list[str] = []
    editor = FolderEditor(tmp_path, says="loop-patched-4711")
    tools = [ShellTool(executor=shell_in(tmp_path, ran)), ApplyPatchTool(editor=editor)]
    result = await Runner.run(
        agent(app_url, tools), "CLIENT-LOOP-TASK", auto_previous_response_id=True
    )
    assert ran == ["cat notes.txt"]
    assert editor.operations == [("update_file", "notes.txt")]
    assert (tmp_path / "notes.txt").read_text() == "loop-fixed-4711\n"
    assert result.final_output == "Fixed: notes.txt now says loop-fixed-4711."
    assert len(result.raw_responses) == 3
