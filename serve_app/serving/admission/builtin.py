"""The rules on gpt-oss's own tools in a request: a ``code_interpreter`` names the one
container this server has, ``auto``: any other container id is a 400 naming
``tools[i].container``. (Without the operator's tool server, ``web_search`` and
``code_interpreter`` are refused by the tool table: serve_app.protocol.tool_types.)"""

from __future__ import annotations

from serve_app.protocol.builtin_tools import AUTO_CONTAINER, CodeInterpreterTool
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest


def check_builtin_tools(request: ResponsesRequest) -> None:
    """A code_interpreter's container is ``auto``."""
    for index, tool in enumerate(request.tools):
        if isinstance(tool, CodeInterpreterTool):
            container = tool.container_id
            if container is not None and container != AUTO_CONTAINER:
                raise InvalidRequest(
                    f"Container with id '{container}' not found. This server runs code in one "
                    f'container: use {{"type": "auto"}}.',
                    param=f"tools[{index}].container",
                    code="invalid_value",
                )
