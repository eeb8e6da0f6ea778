"""`serve-app-tools` (and `python -m serve_app.toolserver`): the reference tool server.

    serve-app-tools --docs DIR --port 8101 [--host 127.0.0.1] [--tools browser,python]

Loopback by default: the python tool runs whatever code it is sent, so listening anywhere else
takes `--allow-remote` as well. Its runs are sandboxed with bubblewrap, or the tool does not
start (`--python-sandbox none` runs them unsandboxed, on purpose).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from serve_app.toolserver.documents import DEFAULT_BASE_URL
from serve_app.toolserver.python_runner import (
    Isolation,
    NoSandbox,
    PythonLimits,
    resolve_isolation,
)
from serve_app.toolserver.server import ToolServerConfig, build_app

TOOLS = ("browser", "python")


def parser() -> argparse.ArgumentParser:
    defaults = PythonLimits()
    p = argparse.ArgumentParser(
        prog="serve-app-tools",
        description="gpt-oss's browser (over a local folder) and python tools as one MCP server "
        "(streamable HTTP at /mcp, SSE at /sse). For tests and laptops: NOT a production sandbox.",
    )
    p.add_argument("--docs", type=Path, help="the folder the browser searches (text, md, html)")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--allow-remote", action="store_true", help="listen on a non-loopback host")
    p.add_argument("--tools", default=",".join(TOOLS), help="browser,python (default), or one")
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="the URL the documents are at")
    p.add_argument("--python-cpu-seconds", type=int, default=defaults.cpu_seconds)
    p.add_argument("--python-wall-seconds", type=float, default=defaults.wall_seconds)
    p.add_argument("--python-memory-mb", type=int, default=defaults.memory_bytes // 2**20)
    p.add_argument("--python-output-bytes", type=int, default=defaults.output_bytes)
    p.add_argument("--python-concurrency", type=int, default=defaults.concurrency)
    p.add_argument(
        "--python-sandbox",
        choices=["bwrap", "none"],
        default="bwrap",
        help="bwrap (default): each run in a bubblewrap sandbox (only its work directory and "
        "the interpreter, read-only but the former; no network, no host Unix socket, a process "
        "limit); refuse to start the python tool where it cannot be made. none: run the code "
        "UNSANDBOXED, as this server's user (tests and laptops only; logged as a warning)",
    )
    p.add_argument(
        "--python-network",
        choices=["auto", "netns", "hook"],
        default="auto",
        help="with --python-sandbox none only: netns: a new network namespace (unshare), refuse "
        "to start without; hook: only an audit hook in the child; auto (default): netns when "
        "this machine can make one",
    )
    p.add_argument("--python-processes", type=int, default=defaults.processes)
    p.add_argument("--python-executable", help="the interpreter the code runs in (default: this)")
    return p


def config_from(args: argparse.Namespace, p: argparse.ArgumentParser) -> ToolServerConfig:
    tools = tuple(dict.fromkeys(name.strip() for name in args.tools.split(",") if name.strip()))
    if not tools or any(name not in TOOLS for name in tools):
        p.error(f"--tools: a comma-separated choice of {', '.join(TOOLS)}")
    if "browser" in tools and (args.docs is None or not args.docs.is_dir()):
        p.error("--docs DIR (an existing folder) is needed for the browser tool")
    if not args.allow_remote and not _is_loopback(args.host):
        p.error(
            f"--host {args.host} is not loopback: the python tool runs any code it is sent "
            "(add --allow-remote to listen there anyway)"
        )
    limits = PythonLimits(
        cpu_seconds=args.python_cpu_seconds,
        wall_seconds=args.python_wall_seconds,
        memory_bytes=args.python_memory_mb * 2**20,
        output_bytes=args.python_output_bytes,
        processes=args.python_processes,
        concurrency=args.python_concurrency,
    )
    isolation: Isolation = "hook"
    if "python" in tools:
        python = args.python_executable or sys.executable
        try:
            isolation = resolve_isolation(args.python_sandbox, args.python_network, python)
        except NoSandbox as refused:
            p.error(str(refused))
    return ToolServerConfig(
        tools=tools,  # type: ignore[arg-type]
        docs=args.docs,
        base_url=args.base_url,
        python_limits=limits,
        python_isolation=isolation,
        python_executable=args.python_executable,
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = config_from(args, p)
    logging.getLogger(__name__).info(
        "serve-app-tools: %s on http://%s:%d/mcp (python network isolation: %s)",
        ",".join(config.tools),
        args.host,
        args.port,
        config.python_isolation,
    )
    uvicorn.run(
        build_app(config, host=args.host), host=args.host, port=args.port, log_level="warning"
    )
