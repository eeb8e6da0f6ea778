"""Multi-turn Codex-like traces, stored as JSONL (one session a line).

A session is what Codex does in one conversation: a long developer prompt shared by every user,
an environment message and a task, then a tool loop in which every turn re-sends the whole
history with the same ``prompt_cache_key`` (a function call and its output appended each turn,
sometimes a new user message). Arrivals are a Poisson process; think times model the client
running tools.

    python loadtests/traces.py --sessions 200 --rate 2 --out loadtests/traces/codex_200.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A real Codex request: its base instructions and tools start every generated session.
CODEX_CAPTURE = (
    Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "codex" / "tool" / "req_001.json"
)
SAMPLE = Path(__file__).resolve().parent / "traces" / "sample.jsonl"
WORDS = [
    "the",
    "a",
    "file",
    "test",
    "build",
    "error",
    "fix",
    "run",
    "check",
    "module",
    "function",
    "value",
    "list",
    "cache",
]


@dataclass
class Session:
    session_id: str
    start_s: float
    tools: list[dict[str, Any]]
    turns: list[dict[str, Any]] = field(default_factory=list)

    def turn_input(self, turn: int) -> list[dict[str, Any]]:
        """What turn ``turn`` (0-based) sends: every item of turns 0..turn, in order."""
        return [item for earlier in self.turns[: turn + 1] for item in earlier["new_items"]]

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def load_traces(path: str | Path = SAMPLE) -> list[Session]:
    return [Session(**json.loads(line)) for line in Path(path).read_text().splitlines() if line]


def _base_prompt_and_tools() -> tuple[str, list[dict[str, Any]]]:
    """Codex's real base prompt and function tools, from the captured request."""
    body = json.loads(CODEX_CAPTURE.read_text())["body"]
    tools = [tool for tool in body["tools"] if tool["type"] == "function"]
    return body["input"][0]["content"][0]["text"], tools


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def _tool_round(rng: random.Random) -> list[dict[str, Any]]:
    call_id = f"call_{uuid.UUID(int=rng.getrandbits(128)).hex[:24]}"
    command = f"rg -n {rng.choice(WORDS)} src/ && pytest -q tests/test_{rng.choice(WORDS)}.py"
    # Tool outputs are log-normal: mostly a few hundred tokens, sometimes thousands.
    output_words = min(int(rng.lognormvariate(5.5, 0.9)), 6000)
    return [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "exec_command",
            "arguments": json.dumps({"cmd": command}),
        },
        {"type": "function_call_output", "call_id": call_id, "output": _words(rng, output_words)},
    ]


def generate(
    sessions: int, rate: float, seed: int, min_turns: int = 3, max_turns: int = 12
) -> list[Session]:
    rng = random.Random(seed)
    base_prompt, tools = _base_prompt_and_tools()
    clock, out = 0.0, []
    for _ in range(sessions):
        clock += rng.expovariate(rate)
        session = Session(str(uuid.UUID(int=rng.getrandbits(128))), round(clock, 3), tools)
        first = [
            _message("developer", base_prompt),
            _message(
                "user",
                f"<environment_context><cwd>/repo/{rng.randrange(10**6)}</cwd>"
                "</environment_context>",
            ),
            _message("user", f"Task: {_words(rng, rng.randint(10, 60))}"),
        ]
        session.turns.append({"think_s": 0.0, "new_items": first, "max_output_tokens": 256})
        for _turn in range(rng.randint(min_turns, max_turns) - 1):
            new_items = _tool_round(rng)
            if rng.random() < 0.15:  # the user steps in: an answer and a new request
                new_items += [
                    _message("assistant", _words(rng, 30)),
                    _message("user", _words(rng, 20)),
                ]
            think_s = round(rng.lognormvariate(0.5, 0.8), 3)
            session.turns.append(
                {"think_s": think_s, "new_items": new_items, "max_output_tokens": 256}
            )
        out.append(session)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=2.0, help="sessions started per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sessions = generate(args.sessions, args.rate, args.seed)
    args.out.write_text("".join(session.to_json() + "\n" for session in sessions))
    turns = sum(len(session.turns) for session in sessions)
    print(f"{len(sessions)} sessions, {turns} turns -> {args.out}")


if __name__ == "__main__":
    main()
