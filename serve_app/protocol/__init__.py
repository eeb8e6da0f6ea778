"""The Responses API surface: request models, errors, SSE framing. No harmony, no Ray."""
