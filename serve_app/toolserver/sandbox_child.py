"""Run in the python tool's child process, before the model's code: its limits, then the code.

`python -I -u sandbox_child.py LIMITS_JSON SCRIPT`. The limits are set as hard limits, so the
code cannot raise them again. With `uid` (a root server's bubblewrap sandbox: sandbox.py) it
becomes that user, which drops the two capabilities bwrap left it for that: the process limit
binds no root. With `block_network` (when no network namespace could be made)
an audit hook refuses sockets other than Unix ones and new processes, which could run without
the hook; an audit hook is not a security boundary (ctypes reaches libc without one): see
docs/tools.md. Standard library only: this file runs outside the server's environment.
"""

import json
import os
import resource
import runpy
import sys
import traceback

_PROCESS_EVENTS = {
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
}
_NAME_EVENTS = {
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
}


def set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_seconds"])
    # SIGXCPU at the soft limit (the process may print that it stopped), SIGKILL a second on.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    files = int(limits["file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (files, files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = int(limits["open_files"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    processes = int(limits["processes"])
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def become(uid: int, gid: int) -> None:
    """Run as ``uid``:``gid`` from here on, with no supplementary group and no capability."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _refuse(event: str, args: tuple) -> None:
    if event in _NAME_EVENTS:
        raise PermissionError(f"network access is disabled in this sandbox ({event})")
    if event == "socket.__new__" and len(args) > 1 and args[1] not in (1, -1):  # 1: AF_UNIX
        raise PermissionError("network access is disabled in this sandbox (socket)")
    if event in _PROCESS_EVENTS:
        raise PermissionError(f"starting processes is disabled in this sandbox ({event})")


def become_init_of_namespace() -> None:
    """As PID 1 of a new PID namespace (`unshare --pid`): fork the code's process and wait.

    The kernel ignores the default-action signals RLIMIT_CPU sends to a namespace's init, and
    kills every process of the namespace when its init exits; so the code runs as PID 2 and
    this init exits with its status, a signal as 128 + its number, as a shell reports it.
    """
    child = os.fork()
    if child == 0:
        return
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def main() -> None:
    if os.getpid() == 1:
        become_init_of_namespace()
    limits = json.loads(sys.argv[1])
    script = sys.argv[2]
    set_limits(limits)
    if "uid" in limits:
        become(int(limits["uid"]), int(limits["gid"]))
    if limits.get("block_network"):
        sys.addaudithook(_refuse)
    sys.argv = [script]
    sys.path.insert(0, ".")
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as error:  # the model reads its own traceback, not this file's frames
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        sys.exit(1)


if __name__ == "__main__":
    main()
