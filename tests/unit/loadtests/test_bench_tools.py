"""loadtests/bench_tools.py: its script plays the tool-using turns it means, and a tiny run of
the whole benchmark (the app, a test MCP server, both modes) prints every number it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from serve_app.engines.simulated.script import EngineScript
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import bench_tools

MS = r"[0-9]+"
MODE_LINE = re.compile(
    rf"^ *(?P<mode>server|client): 2 streams, (?P<calls>[0-9]+) calls in [0-9.]+ s; "
    rf"ingress CPU {MS} ms, (?P<per_call>[0-9.]+) ms per call; "
    rf"call to next token p50 / p90 (?P<p50>{MS}) / (?P<p90>{MS}) ms; "
    r"load average [0-9.]+ [0-9.]+ [0-9.]+$"
)
TOOL_LINE = re.compile(
    rf"^ +tool: no-op call_tool p50 / p90 {MS} / {MS} ms on an open session; "
    rf"opening and initializing a session {MS} / {MS} ms$"
)
RATIO_LINE = re.compile(
    r"^ +ratio: server / client ingress CPU per call [0-9.]+; call to next token p50 [0-9.]+$"
)


def turn_for(script: EngineScript, last_message: str) -> list[str]:
    """What the scripted model says after ``last_message``: each item as JSON."""
    index = script.turn_index(last_message)
    assert index is not None, last_message
    return [item.model_dump_json(exclude_none=True) for item in script.turns[index].items]


def test_each_mode_calls_its_tool_step_by_step_then_answers() -> None:
    script = EngineScript.load(bench_tools.bench_script(calls=2, answer_words=3))
    first = turn_for(script, "<|start|>user<|message|>BENCH-MCP-TASK stream 0<|end|>")
    assert '"namespace":"bench"' in first[1] and "MCP-RESULT 1." in first[1]
    second = turn_for(script, "<|start|>bench.echo to=assistant<|message|>MCP-RESULT 1.<|end|>")
    assert "MCP-RESULT 2." in second[1]
    answer = turn_for(script, "<|start|>bench.echo to=assistant<|message|>MCP-RESULT 2.<|end|>")
    assert answer[1] == '{"text":"word word word"}'
    # The client mode calls a top-level function with the same arguments.
    first = turn_for(script, "<|start|>user<|message|>BENCH-FN-TASK stream 0<|end|>")
    assert '"namespace"' not in first[1] and "FN-RESULT 1." in first[1]
    answer = turn_for(script, "<|start|>functions.echo to=assistant<|message|>FN-RESULT 2.")
    assert answer[1] == '{"text":"word word word"}'


def test_a_tiny_run_prints_each_mode_the_tool_and_the_ratio() -> None:
    command = [sys.executable, str(REPO / "loadtests" / "bench_tools.py")]
    command += ["--streams", "2", "--calls", "2", "--tokens-per-s", "2000"]
    command += ["--instructions-words", "50"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("2 streams x 2 tool calls;"), done.stdout
    assert TOOL_LINE.match(lines[1]), done.stdout
    modes = {m["mode"]: m for line in lines if (m := MODE_LINE.match(line))}
    assert set(modes) == {"server", "client"}, done.stdout
    for mode in modes.values():
        # Two streams of two calls each, every one timed; nothing failed.
        assert int(mode["calls"]) == 4, done.stdout
        assert float(mode["per_call"]) > 0 and int(mode["p50"]) <= int(mode["p90"])
    assert "failed" not in done.stdout, done.stdout
    assert "CPU per call (ms): MCP server" in done.stdout, done.stdout
    assert RATIO_LINE.match(lines[-1]), done.stdout
