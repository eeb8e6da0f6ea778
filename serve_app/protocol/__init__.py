"""The Responses API surface: request models, errors, Response builders, stream events, SSE
framing, JSON-schema resolving. No harmony, no Ray (``lint-imports`` checks both)."""
