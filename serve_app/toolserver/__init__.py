"""The reference tool server, for tests and laptops: gpt-oss's `browser` tool over a local
document folder and its `python` tool in a bubblewrap sandbox per call (sandbox.py; no python
tool where none can be made, unless told to run it unsandboxed), as one MCP server.

A package of its own beside the app's layers: it imports nothing of serve_app's layers and the
app imports nothing of it (`lint-imports` checks both); the app reaches it as it reaches any MCP
tool server, over HTTP. `serve-app-tools --docs DIR --port N` (cli.py) starts it; docs/tools.md
says what it is, and what it is not: a production sandbox.
"""
