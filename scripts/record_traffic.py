"""Records the corpus of real clients' traffic, tests/fixtures/traffic/, in one command.

    python scripts/record_traffic.py                     # every test of tests/clients/
    python scripts/record_traffic.py tests/clients/test_codex_cli.py -k websocket   # some

It serves the Ray-free app as tests/local_app.py builds it (the scripted engine of
tests/fixtures/engine_script.yaml, the test API keys, the MCP test bounds, and
$SERVE_APP_MCP_ALLOW, set here when unset, for it and the tests alike) inside the recording
middleware (tests/support/traffic_recorder.py), on uvicorn on a free loopback port, and runs
the tests given (pytest's arguments; default tests/clients/) against it
(``SERVE_APP_TEST_URL``) with the plugin that tells the recorder which test runs
(tests/support/traffic_plugin.py). Then, for each test that passed, it writes the corpus file
of the client that sent its first request, ``<client>-<version>/<scenario>.json``, replacing
the files that test made before; with no arguments, files whose test no longer exists go too.
A test that failed keeps its old file and the command exits 1. The bodies are never edited:
to change what a client sends, change its test.

Last it writes the replay's table (client and version x transport x config: what
tests/deploy/test_traffic_replay.py expects, from tests/fixtures/traffic/expected.yaml) into
docs/testing.md; ``--table`` writes only that, after an edit of expected.yaml.

``--browser-server-url`` / ``--python-server-url``: gpt-oss's browser and python tool servers
for the app (tests/support/toolserver.py starts the reference one), as ``tests.local_app``
takes them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serve_app.config import ToolArgs  # noqa: E402
from tests.local_app import local_api  # noqa: E402
from tests.support.helpers import on_uvicorn  # noqa: E402
from tests.support.mcp_app import PORTS  # noqa: E402  (sets $SERVE_APP_MCP_ALLOW when unset)
from tests.support.traffic import (  # noqa: E402
    CORPUS,
    DOCS,
    corpus_files,
    docs_with_table,
    load,
    replay_table,
)
from tests.support.traffic_plugin import RECORDER_ENV  # noqa: E402
from tests.support.traffic_recorder import (  # noqa: E402
    Scenario,
    TrafficRecorder,
    dumps,
    left_out,
    recording_files,
)

DEFAULT_TESTS = ["tests/clients/"]


async def record(pytest_args: list[str], tools: ToolArgs) -> tuple[list[Scenario], int]:
    """Run the tests against the recording app: every test's traffic, and pytest's exit code."""
    async with local_api(decode_tokens_per_s=2000, tools=tools) as api:
        recorder = TrafficRecorder(api)
        async with on_uvicorn(recorder) as url:
            env = {**os.environ, "SERVE_APP_TEST_URL": url, RECORDER_ENV: url}
            command = [sys.executable, "-m", "pytest", "-p", "tests.support.traffic_plugin"]
            tests = await asyncio.create_subprocess_exec(
                *command, "-rs", *pytest_args, cwd=REPO, env=env
            )
            code = await tests.wait()
    return recorder.tests, code


def write(traffic: list[Scenario], everything: bool) -> list[str]:
    """Replace the corpus files of the tests that passed; the tests that failed, by node id."""
    roles = {f"http://127.0.0.1:{port}": role for role, port in PORTS.items()}
    today = datetime.date.today().isoformat()
    passed = {test.test for test in traffic if test.passed}
    ran = {test.test for test in traffic}
    for path in corpus_files():
        # A full run ran every test there is: a file no test of it made is a test gone (or
        # renamed, or a parameter's id changed).
        if load(path)["test"] in passed or (everything and load(path)["test"] not in ran):
            path.unlink()
    written: dict[Path, str] = {}
    for test in traffic:
        if not test.passed:
            continue
        for path, recording in recording_files(test, roles, today).items():
            if path in written:
                raise SystemExit(f"{test.test} and {written[path]} both make {path}")
            written[path] = test.test
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dumps(recording))
            print(f"{path.relative_to(REPO)}: {len(recording['exchanges'])} exchanges")
        if plumbing := Counter(left_out(test)):
            print(f"  left out of {test.test} (no client): {dict(plumbing)}")
    for folder in CORPUS.iterdir():
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return [test.test for test in traffic if not test.passed]


def write_table() -> None:
    DOCS.write_text(docs_with_table(DOCS.read_text(), replay_table(corpus_files())))
    print(f"the replay table in {DOCS.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--browser-server-url")
    parser.add_argument("--python-server-url")
    parser.add_argument("--table", action="store_true", help="only write the docs' table")
    args, pytest_args = parser.parse_known_args()
    if args.table:
        write_table()
        return
    tools = ToolArgs(
        browser_server_url=args.browser_server_url, python_server_url=args.python_server_url
    )
    traffic, code = asyncio.run(record(pytest_args or DEFAULT_TESTS, tools))
    failed = write(traffic, everything=not pytest_args)
    write_table()
    if failed or code:
        print(f"not recorded (pytest exit {code}): {', '.join(failed) or 'none'}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
