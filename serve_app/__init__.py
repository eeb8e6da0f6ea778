"""serve_app: the OpenAI Responses API for gpt-oss, served by Ray Serve.

Layers, each a subpackage with one job:

- ``protocol``: request and response models, errors, SSE framing (no harmony, no Ray).
- ``harmony``: Responses items <-> harmony token ids (rendering, stream translation).
- ``engines``: token ids in, token ids out (vLLM, and a simulated CPU stand-in).
- ``routing``: which engine replica serves a request.
- ``serving``: the Ray Serve deployments and app builder.
"""
