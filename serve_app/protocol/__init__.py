"""The Responses API surface: request models, errors, Response builders, stream events, SSE
framing. No harmony, no Ray."""
