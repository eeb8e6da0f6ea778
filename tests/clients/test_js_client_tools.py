"""The Agents JS SDK's shellTool and applyPatchTool against the app
(tests/js/client_tools_scenarios.mjs): the model's call comes back as a ``shell_call`` /
``apply_patch_call``, the SDK's Shell and Editor really run it in a temporary directory, and
the model's next turn reads the output (the scripted turns ``CLIENT-*``). And a run with a
function tool that survives the model's call of a tool the agent does not have."""

from __future__ import annotations

from tests.support import js_scenarios


def test_the_js_shell_tool_runs_the_models_commands(app_url: str) -> None:
    output = js_scenarios.run("client_tools_scenarios.mjs", "shell", app_url)
    result = output["result"]
    assert result["ran"] == ["echo shell-out-4711 > shell.txt", "cat shell.txt"]
    assert result["file"] == "shell-out-4711\n"
    assert result["finalOutput"] == "The shell printed shell-out-4711."
    assert result["itemTypes"][1:3] == ["shell_call", "shell_call_output"]
    assert [request["status"] for request in output["requests"]] == [200, 200]


def test_the_js_apply_patch_tool_edits_a_file(app_url: str) -> None:
    output = js_scenarios.run("client_tools_scenarios.mjs", "apply-patch", app_url)
    result = output["result"]
    assert result["file"] == "patched-hello-4711"
    assert result["finalOutput"] == "Patched: hello.txt holds patched-hello-4711."
    assert result["itemTypes"][1:3] == ["apply_patch_call", "apply_patch_call_output"]


def test_a_js_run_survives_the_models_call_of_a_tool_the_agent_does_not_have(
    app_url: str,
) -> None:
    """``echo`` is no tool of the agent's: the app answers that call inside the response (the
    SDK, shown it as a ``function_call``, threw "Tool echo not found"), then the model calls
    ``get_weather``, which the SDK runs, and answers."""
    output = js_scenarios.run("client_tools_scenarios.mjs", "unknown-tool", app_url)
    result = output["result"]
    assert result["cities"] == ["Paris"]
    assert result["called"] == ["get_weather"]
    assert result["finalOutput"] == "It is sunny in Paris."
    assert [request["status"] for request in output["requests"]] == [200, 200]
