"""What the tests share, in one place (the load tests and scripts/gpu_smoke.py use some of it).

- here: the constants every kind of test needs (``MODEL``, ``REPO``, ``ENGINE_SCRIPT``),
  importable without the app;
- ``helpers``: the app in-process (``in_process_api``, ``sdk_client``, ``on_uvicorn``), Codex's
  captured requests, the tools the scripted turns call, harmony decoding, metrics, locust;
- ``serve_run``: ``serve run`` started as users start it, awaited, joined and stopped: the
  session app of the serve tier (tests/conftest.py), loadtests/soak_store.py,
  loadtests/bench_stream.py and scripts/gpu_smoke.py (it imports nothing of serve_app);
- ``postgres``: a throwaway PostgreSQL server; ``replicas``: the session app's replicas seen
  through Ray; ``open_responses``: the Open Responses specification's schemas;
  ``client_schemas``: the schemas real clients send for structured outputs.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The model name clients send; the app serves gpt-oss under it (configs/).
MODEL = "gpt-oss-120b"
# The scripted engine turns (tests/fixtures/engine_script.yaml): the session app, local_app and
# in-process apps that need the scripted turns play them.
ENGINE_SCRIPT = REPO / "tests" / "fixtures" / "engine_script.yaml"
# The turns the simulated engine plays as the moderation model (gpt-oss-safeguard).
MODERATION_SCRIPT = REPO / "tests" / "fixtures" / "moderation_script.yaml"
# The session app's API keys (tests/conftest.py gives `serve run` both, and `python -m
# tests.local_app` takes them too): the app runs closed, as on a cluster, so every serve-tier
# test sends one; two tenants are two keys. ``AUTH``: the header for ``API_KEY``.
API_KEY = "sk-test"
OTHER_API_KEY = "sk-test-2"
AUTH = {"authorization": f"Bearer {API_KEY}"}
# The environment variable the load tests and scripts (and Codex's provider) read their key from.
API_KEY_ENV = "SERVE_APP_API_KEY"
# The test app's MCP bounds: a server that hangs fails its call within seconds (the allowlist
# comes from $SERVE_APP_MCP_ALLOW: tests/support/mcp_app.py).
MCP_TEST_BOUNDS = {"mcp_connect_timeout_s": 5, "mcp_list_timeout_s": 10, "mcp_call_timeout_s": 5}
