"""Metrics of the ingress and engine replicas (``serve_app.telemetry``: on Ray's metrics export
as ``ray_serve_app_...``, tagged with the replica; on the ingress replica's own ``/metrics`` as
``serve_app_...``).

Names carry our own prefix, next to vLLM's ``vllm_`` ones (``ray_vllm_...`` on Ray's export).
"""

from __future__ import annotations

from serve_app.telemetry import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "serve_app_requests",
    "Responses requests by final status (completed, incomplete, failed, or rejected).",
    ["status"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "serve_app_time_to_first_token_seconds",
    "From request arrival to the first completion token from the engine.",
    buckets=_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "serve_app_time_per_output_token_seconds",
    "Mean time between output tokens of a request, after the first.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1),
)
E2E_LATENCY = Histogram(
    "serve_app_e2e_request_latency_seconds",
    "From request arrival to the terminal event.",
    buckets=_LATENCY_BUCKETS,
)
# Per service tier (issue 49): the tier a request was served at (or asked for and refused).
TIER_REQUESTS = Counter(
    "serve_app_tier_requests",
    "Responses requests by the service tier they were served at and final status (completed, "
    "incomplete, failed; rejected: the tier was refused to the request's API key).",
    ["tier", "status"],
)
TIER_TIME_TO_FIRST_TOKEN = Histogram(
    "serve_app_tier_time_to_first_token_seconds",
    "From request arrival to the first completion token from the engine, by service tier.",
    buckets=_LATENCY_BUCKETS,
    labels=["tier"],
)
PROMPT_TOKENS = Counter("serve_app_prompt_tokens", "Prompt tokens sent to engines.")
CACHED_PROMPT_TOKENS = Counter(
    "serve_app_prompt_cached_tokens", "Prompt tokens served from the engines' prefix caches."
)
GENERATION_TOKENS = Counter("serve_app_generation_tokens", "Completion tokens generated.")
ROUTING_KEYS = Counter(
    "serve_app_routing_keys",
    "Requests by where their routing key came from (prompt_cache_key or derived prefix).",
    ["source"],
)
TOOLS_OMITTED = Counter(
    "serve_app_tools_omitted",
    "Requests served without a tool the client sent that this deployment cannot run (a "
    "web_search with no browser tool server), by the tool's type.",
    ["tool"],
)
UNKNOWN_TOOL_CALLS = Counter(
    "serve_app_unknown_tool_calls",
    "Calls the model addressed to a recipient no tool of the request resolves to (an invented "
    "`repo_browser.search`, an undeclared function): never shown to the client, answered inside "
    "the response with an error the model reads (serve_app/serving/tools/unknown.py).",
)
WEBSOCKET_CONNECTIONS = Gauge(
    "serve_app_websocket_connections", "WebSocket connections open on this ingress replica."
)
WEBSOCKET_RESPONSES = Counter(
    "serve_app_websocket_responses", "Responses created over WebSocket connections."
)
COMPACTIONS = Counter(
    "serve_app_compactions", "Histories summarized by POST /v1/responses/compact."
)
ENGINE_STREAMS = Counter(
    "serve_app_engine_streams",
    "Engine requests by how their chunks came: over this ingress replica's channel to the "
    "engine replica, or on their own stream (no channel open yet).",
    ["path"],
)
ENGINE_STREAMS_ON_CHANNEL = ENGINE_STREAMS.labels("channel")
ENGINE_STREAMS_OWN = ENGINE_STREAMS.labels("own")
ENGINE_CHANNELS = Gauge(
    "serve_app_engine_channels", "Channels open from this ingress replica to engine replicas."
)

# Recorded in the engine replicas (serve_app/serving/engine/deployment.py): each one's own view.
ENGINE_REQUESTS = Counter(
    "serve_app_engine_requests", "Engine requests this engine replica received."
)
ENGINE_QUEUE_WAIT = Histogram(
    "serve_app_engine_queue_wait_seconds",
    "Engine requests' wait in the engine before their prefill started (behind other prefills, "
    "or for a decode slot), by service tier: the engine's own figure (the simulated engine's "
    "time model; vLLM's scheduled less queued time, when it keeps stats).",
    buckets=_LATENCY_BUCKETS,
    labels=["tier"],
)
ENGINE_RUNNING_BY_TIER = Gauge(
    "serve_app_engine_running_requests_by_tier",
    "Engine requests this engine replica is serving now, by service tier (what the autoscaling "
    "policy may leave out: serve_app/serving/engine/autoscaling.py).",
    ["tier"],
)
ENGINE_RUNNING = Gauge(
    "serve_app_engine_running_requests",
    "Engine requests this engine replica is serving now (Serve's own ongoing count also holds "
    "the open channels, which generate nothing).",
)
MODERATION_JUDGEMENTS = Counter(
    "serve_app_moderation_judgements",
    "Judgements of the moderation model (a request's `moderation`), by side (input or output) "
    "and outcome (passed, flagged, or the error result's code).",
    ["side", "outcome"],
)
MODERATION_SECONDS = Histogram(
    "serve_app_moderation_judgement_seconds",
    "One judgement of the moderation model, from the ingress: its prefill, reasoning and answer.",
    buckets=_LATENCY_BUCKETS,
)
