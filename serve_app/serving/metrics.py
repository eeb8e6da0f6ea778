"""Prometheus metrics of the ingress (exposed on ``/metrics``).

Names follow vLLM's ``vllm:`` style with our own prefix, so dashboards built for vLLM read
naturally next to them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "serve_app:requests",
    "Responses requests by final status (completed, incomplete, failed, or rejected).",
    ["status"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "serve_app:time_to_first_token_seconds",
    "From request arrival to the first completion token from the engine.",
    buckets=_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "serve_app:time_per_output_token_seconds",
    "Mean time between output tokens of a request, after the first.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1),
)
E2E_LATENCY = Histogram(
    "serve_app:e2e_request_latency_seconds",
    "From request arrival to the terminal event.",
    buckets=_LATENCY_BUCKETS,
)
PROMPT_TOKENS = Counter("serve_app:prompt_tokens", "Prompt tokens sent to engines.")
CACHED_PROMPT_TOKENS = Counter(
    "serve_app:prompt_cached_tokens", "Prompt tokens served from the engines' prefix caches."
)
GENERATION_TOKENS = Counter("serve_app:generation_tokens", "Completion tokens generated.")
ROUTING_KEYS = Counter(
    "serve_app:routing_keys",
    "Requests by where their routing key came from (prompt_cache_key or derived prefix).",
    ["source"],
)
WEBSOCKET_CONNECTIONS = Gauge(
    "serve_app:websocket_connections", "WebSocket connections open on this ingress replica."
)
WEBSOCKET_RESPONSES = Counter(
    "serve_app:websocket_responses", "Responses created over WebSocket connections."
)
COMPACTIONS = Counter(
    "serve_app:compactions", "Histories summarized by POST /v1/responses/compact."
)
ENGINE_STREAMS = Counter(
    "serve_app:engine_streams",
    "Engine requests by how their chunks came: over this ingress replica's channel to the "
    "engine replica, or on their own stream (no channel open yet).",
    ["path"],
)
ENGINE_STREAMS_ON_CHANNEL = ENGINE_STREAMS.labels("channel")
ENGINE_STREAMS_OWN = ENGINE_STREAMS.labels("own")
ENGINE_CHANNELS = Gauge(
    "serve_app:engine_channels", "Channels open from this ingress replica to engine replicas."
)
