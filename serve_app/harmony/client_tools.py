"""The client-run tools (``shell``, ``local_shell``, ``apply_patch``) as gpt-oss sees them.

gpt-oss was trained on JSON function calls in the ``functions`` namespace, not on these tool
types, so each is shown as a function named after its type whose parameters are exactly the
fields of the call item's ``action`` (``operation`` for apply_patch), with a description that
teaches it. A call the model writes to ``functions.shell`` is then the ``shell_call`` item
field for field, and a ``shell_call`` from the history renders back as the same call.

apply_patch is a function whose arguments are the ``operation`` (``type``, ``path``, ``diff``),
not a freeform tool taking a whole ``*** Begin Patch`` envelope: the ``apply_patch_call`` item
carries one operation on one file, so one call is one item and nothing is parsed out of prose;
its arguments are strict JSON that constrained decoding enforces; and gpt-oss writes JSON
function calls, which it was trained on, more reliably than freeform input.

All parameters are required (optional ones nullable), so the schemas are in OpenAI's strict
subset and every call parses into its item.
"""

from __future__ import annotations

import json
from typing import Any

from serve_app.protocol.client_tools import (
    ApplyPatchCallOutputItem,
    ClientOutputItem,
    LocalShellCallOutputItem,
)

_NULLABLE_INT = {"type": ["integer", "null"]}

SHELL_DESCRIPTION = (
    "Runs shell commands on the user's machine, in the current working directory, and returns "
    "each command's stdout, stderr and exit code (or that it timed out). The commands run in "
    "order, each as its own shell command line (pipes, redirections and `&&` work). Use it to "
    "inspect files (`ls`, `cat`, `rg`), run programs and tests. Set `timeout_ms` for commands "
    "that may run long and `max_output_length` to cap the characters returned per command; "
    "null leaves the client's default."
)
SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "commands": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The shell command lines to run, in order.",
        },
        "timeout_ms": {**_NULLABLE_INT, "description": "Time limit for the commands, in ms."},
        "max_output_length": {
            **_NULLABLE_INT,
            "description": "The most characters of output to return per command.",
        },
    },
    "required": ["commands", "timeout_ms", "max_output_length"],
    "additionalProperties": False,
}

LOCAL_SHELL_DESCRIPTION = (
    "Runs one command on the user's machine and returns its output. `command` is the argv "
    'array, e.g. ["bash", "-lc", "ls -la"]; `env` adds environment variables ({} for none); '
    "`working_directory`, `timeout_ms` and `user` may be null for the defaults."
)
LOCAL_SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The argv."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "timeout_ms": _NULLABLE_INT,
        "user": {"type": ["string", "null"]},
        "working_directory": {"type": ["string", "null"]},
    },
    "required": ["command", "env", "timeout_ms", "user", "working_directory"],
    "additionalProperties": False,
}

APPLY_PATCH_DESCRIPTION = """\
Creates, updates or deletes one file on the user's machine; call it once per file.
`type` is create_file, update_file or delete_file; `path` is relative to the working directory.
`diff` is in the V4A diff format:
- create_file: every line of the new file, each prefixed with `+`.
- update_file: one or more hunks. A hunk starts with `@@` (optionally followed by a line of
  the file, such as a `def` or `class` line, that locates it), then about three lines of
  unchanged context each prefixed with a space, the lines to remove prefixed with `-`, the
  lines to add prefixed with `+`, and about three lines of context after. Context lines must
  match the file exactly.
- delete_file: an empty string.
Example update_file diff:
@@ def greet():
-    print("hi")
+    print("hello")
     return None"""
APPLY_PATCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
        "path": {"type": "string", "description": "The file's path."},
        "diff": {"type": "string", "description": "The V4A diff (empty for delete_file)."},
    },
    "required": ["type", "path", "diff"],
    "additionalProperties": False,
}

# Each client-run tool type: the function the model is shown (named after the type).
SHOWN: dict[str, tuple[str, dict[str, Any]]] = {
    "shell": (SHELL_DESCRIPTION, SHELL_PARAMETERS),
    "local_shell": (LOCAL_SHELL_DESCRIPTION, LOCAL_SHELL_PARAMETERS),
    "apply_patch": (APPLY_PATCH_DESCRIPTION, APPLY_PATCH_PARAMETERS),
}


def call_arguments(arguments: dict[str, Any]) -> str:
    """A call item's fields as the JSON arguments the model wrote (compact, in the schema's
    order, as the model writes them), for its harmony message in the history."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def output_text(item: ClientOutputItem) -> str:
    """What the model reads of a client tool's output: a shell call's per-command stdout,
    stderr and exit code (or timeout) as JSON; a local shell's output as the client sent it;
    an apply_patch's status and message."""
    if isinstance(item, LocalShellCallOutputItem):
        return item.output
    if isinstance(item, ApplyPatchCallOutputItem):
        return json.dumps({"status": item.status, "output": item.output or ""}, ensure_ascii=False)
    results = []
    for entry in item.output:
        result: dict[str, Any] = {"stdout": entry.stdout, "stderr": entry.stderr}
        if entry.outcome.type == "timeout":
            result["timed_out"] = True
        else:
            result["exit_code"] = entry.outcome.exit_code
        results.append(result)
    return json.dumps(results, ensure_ascii=False)
