"""Each conversation lands on the replica that holds its prefix (two engine replicas)."""

from __future__ import annotations

import re
import uuid

from openai import OpenAI

from tests.helpers import scrape_metrics

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
