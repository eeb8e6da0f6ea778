"""The rules on gpt-oss's own tools in a request: ``web_search`` (``web_search_preview``) and
``code_interpreter`` run only where the operator named a tool server for them (``tools.
browser_server_url``, ``tools.python_server_url`` in AppArgs); elsewhere they are a 400 naming
``tools[i].type``, as OpenAI answers for a model that lacks the tool. A ``code_interpreter``
names the one container this server has, ``auto``: any other container id is a 400 naming
``tools[i].container``."""

from __future__ import annotations

from serve_app.protocol.builtin_tools import AUTO_CONTAINER, CodeInterpreterTool, WebSearchTool
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest


def check_builtin_tools(
    request: ResponsesRequest, *, browser_server: str | None, python_server: str | None
) -> None:
    """Each web_search / code_interpreter tool has a tool server to run it; a container is
    ``auto``. ``browser_server``, ``python_server``: the operator's tool server URLs."""
    for index, tool in enumerate(request.tools):
        if isinstance(tool, WebSearchTool) and not browser_server:
            raise _not_served(tool.type, index, "browser")
        if isinstance(tool, CodeInterpreterTool):
            if not python_server:
                raise _not_served(tool.type, index, "python")
            container = tool.container_id
            if container is not None and container != AUTO_CONTAINER:
                raise InvalidRequest(
                    f"Container with id '{container}' not found. This server runs code in one "
                    f'container: use {{"type": "auto"}}.',
                    param=f"tools[{index}].container",
                    code="invalid_value",
                )


def _not_served(tool_type: str, index: int, server: str) -> InvalidRequest:
    return InvalidRequest(
        f"Tool type '{tool_type}' is not supported on this server: it has no {server} tool "
        f"server (the operator sets tools.{server}_server_url).",
        param=f"tools[{index}].type",
        code="invalid_value",
    )
