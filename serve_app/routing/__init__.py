"""Which engine replica serves a request: routing keys and the request router."""
