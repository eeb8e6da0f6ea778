"""What every HTTP request passes before its route (pure ASGI middlewares: API keys, body
limits, content encoding), and what the routes share (the caller's owner, pagination)."""
