"""The HTTP face: the ingress deployment and its FastAPI routes (`ingress`), and the
middlewares every request passes first (API keys, body limits, content encoding), pagination."""
