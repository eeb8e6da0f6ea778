"""Each conversation lands on the replica that holds its prefix (two engine replicas)."""

from __future__ import annotations

import re
import uuid

from openai import OpenAI

from tests.helpers import scrape_metrics, wait_for

MODEL = "gpt-oss-120b"


def routing_decisions(app_url: str) -> dict[str, float]:
    """Decisions summed over the ingress replicas (each routes its own requests)."""
    pattern = r'serve_app:routing_decisions_total\{decision="(\w+)"\} ([0-9.e+]+)'
    totals: dict[str, float] = {}
    for text in scrape_metrics(app_url).values():
        for name, value in re.findall(pattern, text):
            totals[name] = totals.get(name, 0) + float(value)
    return totals


def test_every_conversation_hits_its_prefix_cache_on_the_next_turn(app_url: str) -> None:
    client = OpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    before = routing_decisions(app_url)
    conversations = 8
    for index in range(conversations):
        key = f"routing-{uuid.uuid4()}"
        # A long, conversation-specific first message: only its own replica has it cached.
        history = [{"role": "user", "content": f"SDK-TEXT conversation {index} " + key * 40}]
        first = client.responses.create(model=MODEL, input=history, prompt_cache_key=key)
        history += [item.model_dump(exclude_none=True) for item in first.output]
        history.append({"role": "user", "content": "SDK-TEXT again"})
        second = client.responses.create(model=MODEL, input=history, prompt_cache_key=key)
        cached = second.usage.input_tokens_details.cached_tokens
        # With two replicas, random routing misses about half the time.
        assert cached >= first.usage.input_tokens - 16, (index, cached, first.usage.input_tokens)
    after = routing_decisions(app_url)
    assert after.get("owner", 0) - before.get("owner", 0) >= 2 * conversations


def reported_conversations(app_url: str) -> list[dict[str, float]]:
    """Per ingress replica: the conversations each engine replica reported, as its router
    received the reports."""
    pattern = r'serve_app:engine_replica_reported_conversations\{replica="(\w+)"\} ([0-9.e+]+)'
    return [
        {replica: float(value) for replica, value in re.findall(pattern, text)}
        for text in scrape_metrics(app_url).values()
    ]


def test_every_ingress_replica_learns_where_the_engine_replicas_serve_conversations(
    app_url: str,
) -> None:
    client = OpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    for index in range(4):
        key = f"reported-{uuid.uuid4()}"
        client.responses.create(model=MODEL, input=f"SDK-TEXT {index}", prompt_cache_key=key)

    def both_routers_hold_the_same_reports() -> bool:
        views = reported_conversations(app_url)
        return len(views) == 2 and views[0] == views[1] and sum(views[0].values()) >= 4

    # The engine replicas report every second (configs/local.yaml); Ray Serve's controller
    # hands the reports to each ingress replica's router.
    assert wait_for(both_routers_hold_the_same_reports, timeout_s=30), reported_conversations(
        app_url
    )
    assert all(len(view) == 2 for view in reported_conversations(app_url))  # both engines
