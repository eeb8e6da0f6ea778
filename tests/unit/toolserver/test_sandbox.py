"""The python tool's sandbox (serve_app/toolserver/sandbox.py), attacked: code that tries to
reach Ray's Unix sockets, rewrite the sandbox's own code, fork without end, reach the network
or read the host's files. Each run is a bubblewrap sandbox; where bubblewrap cannot make one
the tool refuses to start unless told to run unsandboxed (test_server.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.toolserver import sandbox
from serve_app.toolserver.python_runner import CHILD, PythonLimits, PythonRunner
from tests.support import REPO

pytestmark = pytest.mark.skipif(
    not sandbox.bwrap_works(sys.executable),
    reason="bubblewrap cannot make a sandbox on this machine (scripts/test.sh installs it)",
)

LIMITS = PythonLimits(cpu_seconds=5, wall_seconds=30, processes=16)
RAY = Path("/tmp/ray")


@pytest.fixture(scope="module")
def runner() -> PythonRunner:
    return PythonRunner(LIMITS, isolation="bwrap")


@contextlib.contextmanager
def listening(address: str) -> Iterator[socket.socket]:
    """A Unix socket listening at ``address`` (a path, or ``\\0name``: an abstract one)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen()
    listener.setblocking(False)
    try:
        yield listener
    finally:
        listener.close()


def connects(*addresses: str) -> str:
    """Code that tries each Unix socket address and says what happened."""
    return (
        "import os, socket\n"
        f"print('ray visible:', os.path.exists({str(RAY)!r}))\n"
        f"for address in {list(addresses)!r}:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(address)\n"
        "        print('CONNECTED', repr(address))\n"
        "    except OSError as error:\n"
        "        print('refused:', type(error).__name__)\n"
    )


async def test_rays_unix_sockets_are_out_of_reach(runner: PythonRunner) -> None:
    """A socket under /tmp/ray (where Ray keeps its raylet's and plasma store's) and an
    abstract one (they cross mount namespaces; only a network namespace hides them)."""
    folder = RAY / f"serve-app-sandbox-test-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    path, abstract = str(folder / "raylet.sock"), f"\0serve-app-sandbox-test-{os.getpid()}"
    try:
        with listening(path) as on_disk, listening(abstract) as hidden:
            output = await runner.run(connects(path, abstract))
            for listener in (on_disk, hidden):
                with pytest.raises(BlockingIOError):
                    listener.accept()  # nothing ever connected
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert "CONNECTED" not in output
    assert output.startswith("ray visible: False\n")
    assert output.count("refused:") == 2


async def test_the_sandboxs_own_code_cannot_be_rewritten(tmp_path: Path) -> None:
    """Even where the code's user could write the sandbox's files (a user-owned venv; here a
    copy of the child made writable by anyone), the run sees them read-only."""
    child = tmp_path / "sandbox_child.py"
    shutil.copy(CHILD, child)
    child.chmod(0o666)
    before = child.read_bytes()
    runner = PythonRunner(LIMITS, isolation="bwrap", child=child)
    code = (
        "import os, sys\n"
        f"for path in [{str(child)!r}, os.__file__, os.path.join(sys.prefix, 'pwned.pth')]:\n"
        "    try:\n"
        "        with open(path, 'a') as handle:\n"
        "            handle.write('import os  # rewritten')\n"
        "        print('WROTE', path)\n"
        "    except OSError as error:\n"
        "        print('refused:', error.strerror)\n"
    )
    output = await runner.run(code)
    assert "WROTE" not in output, output
    assert "refused: Read-only file system" in output.splitlines()[0]
    assert child.read_bytes() == before
    assert not (Path(sys.prefix) / "pwned.pth").exists()


async def test_a_fork_bomb_is_bounded(runner: PythonRunner) -> None:
    code = (
        "import os, signal\n"
        "started = 0\n"
        "try:\n"
        "    while started < 10_000:\n"
        "        if os.fork() == 0:\n"
        "            signal.pause()\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "except OSError as error:\n"
        "    print('stopped after', started, error.strerror)\n"
    )
    output = await runner.run(code)
    assert output.startswith("stopped after ")
    assert int(output.split()[2]) < LIMITS.processes
    assert await runner.run("print('next run')") == "next run\n"  # nothing left holding slots


async def test_no_network_at_all(runner: PythonRunner) -> None:
    with socket.create_server(("127.0.0.1", 0)) as host_server:
        port = host_server.getsockname()[1]
        code = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=3)\n"
            "        print('CONNECTED', address)\n"
            "    except OSError as error:\n"
            "        print('refused:', error.strerror or error)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80)\n"
            "    print('RESOLVED')\n"
            "except OSError as error:\n"
            "    print('no names:', type(error).__name__)\n"
        )
        output = await runner.run(code)
        host_server.setblocking(False)
        with pytest.raises(BlockingIOError):
            host_server.accept()  # the host's loopback was never reached
    assert "CONNECTED" not in output and "RESOLVED" not in output
    # Its own loopback (bwrap brings it up) has nothing listening; beyond it, no route.
    assert output.splitlines()[:2] == [
        "refused: Connection refused",
        "refused: Network is unreachable",
    ]


async def test_only_its_work_directory_and_the_interpreter_are_there(
    runner: PythonRunner,
) -> None:
    code = (
        "import os\n"
        "print(sorted(os.listdir('/')))\n"
        f"for path in ['/etc/passwd', {str(REPO / 'pyproject.toml')!r}, '/home', '/var', '/sys']:\n"
        "    print(path, os.path.exists(path))\n"
        "open('mine.txt', 'w').write('x')\n"
        "print('wrote here:', os.listdir('.'))\n"
        "try:\n"
        "    open('/usr/evil', 'w')\n"
        "except OSError as error:\n"
        "    print('elsewhere:', error.strerror)\n"
    )
    output = await runner.run(code)
    lines = output.splitlines()
    top = set(eval(lines[0]))  # the listing the code printed
    system = {"bin", "lib", "lib32", "lib64", "sbin", "usr", "dev", "proc", "etc", "tmp"}
    # What the sandbox binds besides, by their top folder: the interpreter's folders (a venv's,
    # wherever the checkout lives: /check in CI), the sandbox's own code, the work directory.
    bound = [*sandbox.interpreter_dirs(sys.executable), str(CHILD), tempfile.gettempdir()]
    assert top <= system | {Path(path).parts[1] for path in bound}, top
    assert all(line.endswith(" False") for line in lines[1:6]), output
    assert "'mine.txt'" in lines[6] and "script.py" in lines[6]
    assert lines[7] in ("elsewhere: Read-only file system", "elsewhere: Permission denied")


async def test_the_code_holds_no_capability_and_is_not_root(runner: PythonRunner) -> None:
    """Its user holds no capability, may gain none, and is not root when the server is."""
    code = (
        "import os\n"
        "print(os.getuid())\n"
        "for line in open('/proc/self/status'):\n"
        "    if line.startswith(('CapEff', 'CapPrm', 'NoNewPrivs')):\n"
        "        print(line.strip())\n"
    )
    uid, *status = (await runner.run(code)).splitlines()
    assert int(uid) != 0
    assert status == ["CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "NoNewPrivs:\t1"]
