"""Each conversation lands on the replica that holds its prefix (two engine replicas)."""

from __future__ import annotations

import re
import uuid

import pytest
from openai import OpenAI
from openai.types.responses import Response

from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.routing import metrics
from serve_app.routing.directory import REPORT_KEY
from serve_app.routing.keys import cache_salt, routing_key
from serve_app.routing.ring import stable_hash
from tests.support import MODEL
from tests.support.helpers import scrape_metrics, wait_for
from tests.support.replicas import caller_owner, engine_replica_actors, routing_stats


def routing_decisions(app_url: str) -> dict[str, float]:
    """Decisions summed over the ingress replicas (each routes its own requests)."""
    pattern = r'serve_app_routing_decisions_total\{decision="(\w+)"\} ([0-9.e+]+)'
    totals: dict[str, float] = {}
    for text in scrape_metrics(app_url).values():
        for name, value in re.findall(pattern, text):
            totals[name] = totals.get(name, 0) + float(value)
    return totals


def first_turn(client: OpenAI, key: str) -> tuple[Response, list[dict]]:
    """A conversation's first turn, and the input of its second (the whole history)."""
    # A long, conversation-specific first message: only its own replica has it cached.
    history = [{"role": "user", "content": "SDK-TEXT conversation " + key * 40}]
    first = client.responses.create(model=MODEL, input=history, prompt_cache_key=key)
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": "SDK-TEXT again"})
    return first, history


def test_every_conversation_hits_its_prefix_cache_on_the_next_turn(app_url: str) -> None:
    client = OpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    before = routing_decisions(app_url)
    conversations = 8
    for index in range(conversations):
        key = f"routing-{uuid.uuid4()}"
        first, history = first_turn(client, key)
        second = client.responses.create(model=MODEL, input=history, prompt_cache_key=key)
        cached = second.usage.input_tokens_details.cached_tokens
        # With two replicas, random routing misses about half the time.
        assert cached >= first.usage.input_tokens - 16, (index, cached, first.usage.input_tokens)
    after = routing_decisions(app_url)
    # Every turn went home or, new, where the placement put it: none was moved off its home.
    placed = ("owner", "balanced")
    assert sum(after.get(name, 0) - before.get(name, 0) for name in placed) >= 2 * conversations
    assert after.get("spilled", 0) == before.get("spilled", 0)


def reported_conversations(app_url: str) -> list[dict[str, float]]:
    """Per ingress replica: the conversations each engine replica reported, as its router
    received the reports."""
    pattern = (
        r'serve_app_engine_replica_reported_conversations\{engine_replica="(\w+)"\} ([0-9.e+]+)'
    )
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


def test_a_router_that_placed_nothing_sends_the_next_turn_where_the_conversation_is(
    app_url: str, engine_handle
) -> None:
    """The next turn reaching an ingress replica that has not seen the conversation, before
    the engine replicas' reports name it: this test process's handle has a router of its own
    that places nothing but these turns, so only the reports can tell it where each went."""
    client = OpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    # Asked as the ingress asks for sk-test's turns: its conversation, its cache salt.
    owner = caller_owner(app_url, "sk-test")
    outcomes = ("found", "unknown", "timed_out")
    before = {outcome: waits_for_reports(outcome) for outcome in outcomes}
    for index in range(6):
        key = f"follow-{uuid.uuid4()}"
        first, history = first_turn(client, key)
        request = ResponsesRequest.model_validate(
            {"model": MODEL, "input": history, "prompt_cache_key": key}
        )
        token_ids = render_request(request).token_ids
        session = routing_key(key, token_ids, owner=owner)
        generate = GenerateRequest(
            request_id=f"follow-{uuid.uuid4()}",
            prompt_token_ids=token_ids,
            sampling=SamplingSettings(max_tokens=8),
            session_id=session,
            cache_salt=cache_salt(owner),
        )
        stream = engine_handle.options(session_id=session, stream=True).generate.remote(generate)
        # The replica's stream carries heartbeats (Heartbeat) beside the chunks.
        chunks = [chunk for chunk in stream if isinstance(chunk, GenerateChunk)]
        cached = chunks[0].num_cached_tokens
        assert cached >= first.usage.input_tokens - 16, (index, cached, first.usage.input_tokens)
    # Sent at once, most of these turns beat the next report (one a second) and waited for it;
    # each wait found the conversation.
    after = {outcome: waits_for_reports(outcome) for outcome in outcomes}
    assert after["found"] > before["found"], after
    assert after["unknown"] == before["unknown"] and after["timed_out"] == before["timed_out"]


def waits_for_reports(outcome: str) -> float:
    """This process's router's waits (its metrics live here, not on the app's /metrics)."""
    return metrics.REPORT_WAITS.labels(outcome).value


def test_one_tenants_prompt_is_no_cache_hit_for_another(app_url: str, app_cluster: None) -> None:
    """Two API keys send the same long prompt under the same ``prompt_cache_key`` (issue 38:
    without a salt the second key's first turn reported nearly the whole prompt cached). Each
    key's turns are a conversation of their own to the routers, and cached under the key's own
    salt: the second key's first turn finds at most the head all its prompts share (the system
    message), never the first key's prompt, even on the engine replica that holds it; each
    key's next turn is a hit. The routers place a new conversation by balance, so the second
    key's conversations go round in another order than the first's: some land beside the first
    key's, which is the case the salt is for (checked, or the test would prove nothing)."""
    owners = {api_key: caller_owner(app_url, api_key) for api_key in ("sk-test", "sk-test-2")}
    if None in owners.values():
        pytest.skip("the app is open (no API keys): every caller is one tenant")
    keys = [f"tenants-{uuid.uuid4()}" for _ in range(8)]
    orders = {"sk-test": keys, "sk-test-2": keys[1::2] + keys[::2]}
    for api_key, order in orders.items():
        client = OpenAI(base_url=f"{app_url}/v1", api_key=api_key, max_retries=0)
        for key in order:
            first, history = first_turn(client, key)  # the same prompt for both keys
            tokens = first.usage.input_tokens
            cached = first.usage.input_tokens_details.cached_tokens
            assert cached < tokens // 2, (key, api_key, cached, tokens)
            second = client.responses.create(model=MODEL, input=history, prompt_cache_key=key)
            cached = second.usage.input_tokens_details.cached_tokens
            assert cached >= tokens - 16, (key, api_key, cached, tokens)

    # Two conversations per key, one per owner, as the engine replicas report them.
    served = {
        actor["name"]: set(routing_stats(actor).get(REPORT_KEY, {}))
        for actor in engine_replica_actors()
    }
    beside = 0
    for key in keys:
        scoped = [stable_hash(routing_key(key, (), owner=owner)) for owner in owners.values()]
        assert len(set(scoped)) == 2 and stable_hash(key) not in scoped
        where = [{name for name, held in served.items() if one in held} for one in scoped]
        assert all(len(replicas) == 1 for replicas in where), (key, where)
        beside += where[0] == where[1]
    assert beside >= 1, "no conversation of the second key landed beside the first key's"


def pushed_loads(app_url: str) -> list[dict[str, float]]:
    """Per ingress replica: the loads its routers took from the engine replicas' channels."""
    pattern = r'serve_app_routing_pushed_loads_total\{outcome="(\w+)"\} ([0-9.e+]+)'
    return [
        {outcome: float(value) for outcome, value in re.findall(pattern, text)}
        for text in scrape_metrics(app_url).values()
    ]


def test_the_engine_replicas_push_their_load_to_the_ingress_routers(app_url: str) -> None:
    """Each engine replica pushes its load over its channel to each ingress replica as its
    prefill queue changes; the routers apply those newer than the replica's report."""
    client = OpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    before = sum(view.get("applied", 0) for view in pushed_loads(app_url))
    for index in range(12):  # through the proxy: both ingress replicas, both engine replicas
        key = f"pushed-{uuid.uuid4()}"
        client.responses.create(model=MODEL, input=f"SDK-TEXT {index}", prompt_cache_key=key)
    after = sum(view.get("applied", 0) for view in pushed_loads(app_url))
    assert after > before, pushed_loads(app_url)
