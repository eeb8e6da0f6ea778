"""serve_app: the OpenAI Responses API for gpt-oss, served by Ray Serve.

Layers, bottom to top; a module imports from its own layer and the layers below it, never above,
and no imports go round in a cycle (``lint-imports`` checks it: pyproject.toml's
``[tool.importlinter]``):

- ``values``, ``config`` and ``telemetry``: values several layers share (sampling defaults,
  token logprobs), the typed application arguments (``AppArgs``), and the metrics facade
  (each metric defined once, on Ray's metrics export and prometheus-client's registry).
- ``protocol``: request and response models, errors, stream events, SSE framing, JSON-schema
  resolving (no harmony, no Ray).
- ``harmony``: Responses items <-> harmony token ids (rendering, stream translation).
- ``constraints``: what a completion must obey, as a grammar; the data an engine gets
  (``spec``) apart from its construction from a request (``build``).
- ``engines``: token ids in, token ids out (vLLM, and a simulated CPU stand-in); the engine
  contract (``engines.base``) knows nothing of the Responses API or harmony.
- ``routing`` and ``store`` (neither imports the other): which engine replica serves a
  request; the stored responses and conversations.
- ``serving``: the Ray Serve deployments, HTTP and WebSocket routes, the turn.
- ``app``: ``build_app``, what ``serve run`` imports.
"""
