"""What a turn's MCP tools do before the model runs (the plan: list each server once per
context, run the calls the client approved; the stage that does it) and the runner of the
`mcp` kinds, over a recording fake of the MCP client (tests/app/test_mcp.py runs the real one
against real servers; tests/unit/serving/tools/test_mcp_once.py the whole app)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openai.types.responses.mcp_tool_call_error import McpProtocolError
from openai.types.responses.response_output_item import McpListToolsTool

from serve_app.config import AppArgs, ToolArgs
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry, ToolSpec
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.tools.bounds import OutputBounds
from serve_app.serving.tools.contract import CancelScope, ToolCall
from serve_app.serving.tools.mcp.client import CallOutcome, ListOutcome, McpClient, McpServer
from serve_app.serving.tools.mcp_once import OnceCalls
from serve_app.serving.tools.mcp_trust import TrustedMcp
from serve_app.serving.tools.mcp_turn import McpDone, McpRunner, McpTurns, plan
from serve_app.serving.turn.state import Context
from serve_app.store.base import ToolClaim
from tests.support import MODEL
from tests.unit.protocol.test_stream_events import new_writer, wire

ECHO = McpListToolsTool(name="echo", input_schema={"type": "object"}, description="Echo.")
WIPE = McpListToolsTool(name="wipe", input_schema={"type": "object"}, description="Wipe.")


class FakeServers:
    """Answers every listing with echo and wipe, every call with its arguments; records
    what it was asked (and the headers it was given)."""

    def __init__(self, *, list_error: str | None = None) -> None:
        self.listed: list[McpServer] = []
        self.calls: list[tuple[McpServer, str, Any]] = []
        self.list_error = list_error

    async def list_tools(self, server: McpServer) -> ListOutcome:
        self.listed.append(server)
        if self.list_error:
            return ListOutcome(error=self.list_error)
        return ListOutcome(tools=[ECHO, WIPE])

    async def call_tool(
        self, server: McpServer, name: str, arguments: str | Mapping[str, Any]
    ) -> CallOutcome:
        self.calls.append((server, name, arguments))
        if name == "fail":
            code, message = -32603, "it broke"
            return CallOutcome(
                error=McpProtocolError(type="mcp_protocol_error", code=code, message=message)
            )
        return CallOutcome(output=f"{name} ran with {arguments}")


def mcp(**fields: object) -> dict:
    return {"type": "mcp", "server_label": "docs", "server_url": "http://127.0.0.1:9/mcp", **fields}


def context(items: list[dict], history: list[dict] = (), **tool: object) -> Context:
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": items, "tools": [mcp(**tool)]}
    )
    past = ResponsesRequest.model_validate({"model": MODEL, "input": list(history) or "x"})
    return Context(request, past.input_items if history else [])


class MemoryClaims:
    """The store's claims (`ResponseStore.claim_tool_call` and its kin), in memory."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str | None, str], ToolClaim] = {}

    async def claim_tool_call(self, owner: str | None, claim_id: str, claimant: str) -> ToolClaim:
        return self.claims.setdefault((owner, claim_id), ToolClaim(claimant, time.time()))

    async def settle_tool_call(self, owner, claim_id: str, claimant: str, result: str) -> bool:
        claim = self.claims[(owner, claim_id)]
        if claim.claimant != claimant or claim.settled:
            return False
        self.claims[(owner, claim_id)] = ToolClaim(claimant, claim.claimed_at, result)
        return True

    async def tool_claim(self, owner: str | None, claim_id: str) -> ToolClaim | None:
        return self.claims.get((owner, claim_id))


@dataclass
class StagedTurn:
    request: ResponsesRequest
    translator: ResponseStreamTranslator
    owner: str | None = None
    server_calls: int = 0

    @property
    def response(self):
        return self.translator.response


def every_item(ctx: Context) -> TrustedMcp:
    """The context's MCP items all trusted (as the door finds the ones the server issued)."""
    items = [*ctx.history, *ctx.request.input_items]
    return TrustedMcp(
        listings=frozenset(i.id for i in items if i.type == "mcp_list_tools" and i.id),
        approvals=frozenset(i.id for i in items if i.type == "mcp_approval_request"),
    )


def stage(
    servers: FakeServers,
    ctx: Context,
    claims: MemoryClaims | None = None,
    trusted: TrustedMcp | None = None,
    bounds: OutputBounds | None = None,
):
    """The plan of ``ctx`` and its stage run on a fresh response: (the tools the model is
    then shown, the stage's events as the client reads them, what it did). ``trusted``: the
    context's items the server issued (default: all)."""
    trusted = every_item(ctx) if trusted is None else trusted
    planned = plan(ctx.request, [*ctx.history, *ctx.request.input_items], trusted)
    once = OnceCalls(claims or MemoryClaims(), ToolArgs())
    writer = new_writer()
    translator = ResponseStreamTranslator(writer.response, ToolRegistry())
    events = translator.start()
    done = McpDone()

    turns = McpTurns(servers, once, 64, ReasoningVault("k"), bounds)

    async def run() -> None:
        async for batch in turns.stage(StagedTurn(ctx.request, translator), planned, done):
            events.extend(batch)

    asyncio.run(run())
    return planned.specs(done), wire(Written(events)), done, planned


@dataclass
class Written:
    """Events as `wire` reads them off a writer."""

    events: list

    def take_events(self) -> list:
        return self.events


def test_a_server_is_listed_once_and_its_tools_join_the_registry_with_credentials_sent() -> None:
    servers = FakeServers()
    specs, events, _, planned = stage(
        servers,
        context(
            [{"role": "user", "content": "hi"}],
            headers={"X-Key": "k1"},
            authorization="tok",
            require_approval={"never": {"tool_names": ["echo"]}},
        ),
    )
    assert planned.specs() == []  # nothing shown before the listing
    (server,) = servers.listed
    assert server.headers == {"X-Key": "k1", "Authorization": "Bearer tok"}
    assert [(spec.recipient, spec.kind) for spec in specs] == [
        ("docs.echo", "mcp"),
        ("docs.wipe", "mcp_approval"),
    ]
    assert [event["type"] for event in events][2:] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
    ]
    assert [tool["name"] for tool in events[-1]["item"]["tools"]] == ["echo", "wipe"]


def test_a_listing_in_the_context_is_reused_without_asking_the_server() -> None:
    listing = {
        "type": "mcp_list_tools",
        "id": "mcpl_1",
        "server_label": "docs",
        "tools": [ECHO.model_dump()],
    }
    for history, items in (
        ([listing], [{"role": "user", "content": "again"}]),
        ([], [listing, {"role": "user", "content": "again"}]),
    ):
        servers = FakeServers()
        specs, events, _, planned = stage(servers, context(items, history))
        assert servers.listed == [] and not planned
        assert [spec.name for spec in specs] == [spec.name for spec in planned.specs()] == ["echo"]
        assert len(events) == 2  # created, in_progress: no item of its own


def test_items_the_server_did_not_issue_are_neither_reused_nor_run() -> None:
    servers = FakeServers()
    approve = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    ctx = context([approve], history=[LISTED, ASKED])
    specs, _, done, planned = stage(servers, ctx, trusted=TrustedMcp())
    assert planned.listings == {} and planned.approved == []
    assert len(servers.listed) == 1 and servers.calls == [] and done.approved == []
    assert [spec.name for spec in specs] == ["echo", "wipe"]  # from the fresh listing


def test_a_failed_listing_is_a_failed_item_and_shows_no_tools() -> None:
    servers = FakeServers(list_error="could not reach the MCP server")
    specs, events, _, _ = stage(servers, context([{"role": "user", "content": "hi"}]))
    assert specs == []
    assert events[-2]["type"] == "response.mcp_list_tools.failed"
    assert events[-1]["item"]["error"] == "could not reach the MCP server"


ASKED = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "server_label": "docs",
    "name": "wipe",
    "arguments": '{"all": true}',
}
LISTED = {
    "type": "mcp_list_tools",
    "id": "mcpl_1",
    "server_label": "docs",
    "tools": [ECHO.model_dump(), WIPE.model_dump()],
}


def test_an_approved_call_runs_before_the_model_and_is_rendered_after_the_input() -> None:
    servers = FakeServers()
    approve = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    _, events, done, _ = stage(servers, context([approve], history=[LISTED, ASKED]))
    assert [(name, args) for _, name, args in servers.calls] == [("wipe", '{"all": true}')]
    (shown,) = done.rendered_items()
    assert shown.type == "mcp_call" and shown.approval_request_id == "mcpr_1"
    assert [event["type"] for event in events][2:] == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    item = events[-1]["item"]
    assert item["approval_request_id"] == "mcpr_1" and item["output"].startswith("wipe ran")
    # Run once: a context that holds its mcp_call does not run it again; a denial never runs.
    ran = {**item, "status": "completed"}
    servers = FakeServers()
    stage(servers, context([approve, ran], history=[LISTED, ASKED]))
    deny = {**approve, "approve": False}
    stage(servers, context([deny], history=[LISTED, ASKED]))
    assert servers.calls == []


def test_an_approval_claimed_already_answers_with_that_runs_result_without_a_call() -> None:
    claims = MemoryClaims()
    approve = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    first, second = FakeServers(), FakeServers()
    _, ran, _, _ = stage(first, context([approve], history=[LISTED, ASKED]), claims)
    _, again, _, _ = stage(second, context([approve], history=[LISTED, ASKED]), claims)
    assert len(first.calls) == 1 and second.calls == []
    assert again[-1]["item"]["output"] == ran[-1]["item"]["output"]


class HugeServers(FakeServers):
    """Answers every call with ``output``."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self.output = output

    async def call_tool(
        self, server: McpServer, name: str, arguments: str | Mapping[str, Any]
    ) -> CallOutcome:
        await super().call_tool(server, name, arguments)
        return CallOutcome(output=self.output)


def test_an_approved_calls_output_is_held_to_the_same_bounds_before_it_is_rendered() -> None:
    """An approved call's result joins the prompt the render pool tokenizes: a run of one
    letter (minutes of a worker's CPU) or an output past `tools.max_output_tokens` fails the
    call there, and the model reads why."""
    approve = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    bounds = OutputBounds(AppArgs.model_validate({"tools": {"max_output_tokens": 200}}))
    for output, why in (("a" * 700_000, "700,000 characters"), ("word " * 2000, "tokens")):
        ctx = context([approve], history=[LISTED, ASKED])
        _, _, done, _ = stage(HugeServers(output), ctx, bounds=bounds)
        (shown,) = done.rendered_items()
        assert shown.type == "mcp_call" and shown.output is None
        assert why in (shown.error or "") and "not passed on" in (shown.error or "")
        assert len(shown.model_dump_json()) < 2000


def call_of(kind: str, name: str, arguments: str, **tool: object) -> ToolCall:
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": "x", "tools": [mcp(**tool)]}
    )
    spec = ToolSpec(name=name, kind=kind, namespace="docs")  # type: ignore[arg-type]
    return ToolCall(spec, arguments, None, request, "mcp_1", "call_1", CancelScope())


def test_the_runner_calls_the_server_or_awaits_approval_and_a_failure_is_a_result() -> None:
    servers = FakeServers()
    runner = McpRunner(servers)
    result = asyncio.run(runner.run(call_of("mcp", "echo", '{"text": "hi"}')))
    assert result.output == 'echo ran with {"text": "hi"}' and not result.failed
    failed = asyncio.run(runner.run(call_of("mcp", "fail", "{}")))
    assert failed.error == "it broke" and failed.data["mcp_error"].code == -32603
    waits = asyncio.run(runner.run(call_of("mcp_approval", "wipe", "{}")))
    assert waits.awaits_client and len(servers.calls) == 2
    refused = asyncio.run(runner.run(call_of("mcp", "wipe", "{}", allowed_tools=["echo"])))
    assert refused.failed and len(servers.calls) == 2


async def test_credentials_reach_their_server_only_never_a_log_line_the_echo_nor_the_store(
    tmp_path, caplog
) -> None:
    """The whole app in this process, a real MCP server that refuses requests without the
    token: the listing and the call work (the server got it), and the token is in no log
    record (every logger at DEBUG), no echoed or stored response, no byte of the store's file;
    a wrong token is a failed listing whose error does not repeat it."""
    import logging

    from serve_app.config import AppArgs
    from serve_app.engines.simulated import SimulatedEngineConfig
    from tests.support import ENGINE_SCRIPT
    from tests.support.helpers import in_process_api, sdk_client
    from tests.support.mcp_servers import mcp_server

    token, header = "tok-5b1e7d2c9a", "hdr-8f3c1a6e4d"
    caplog.set_level(logging.DEBUG)
    with mcp_server("good", token=token) as server:
        args = AppArgs.model_validate({"tools": {"mcp_allow": [server.origin]}})
        engine = SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=50_000)
        async with in_process_api(tmp_path / "s.db", args, engine=engine) as api:
            client = sdk_client(api)
            tool = mcp(
                server_url=server.url,
                authorization=token,
                headers={"X-Extra": header},
                require_approval="never",
            )
            response = await client.responses.create(
                model=MODEL, input="MCP-ECHO-TASK", tools=[tool]
            )
            stored = await client.responses.retrieve(response.id)
            wrong = await client.responses.create(
                model=MODEL, input="SDK-TEXT", tools=[{**tool, "authorization": token[::-1]}]
            )
    assert [item.type for item in response.output][::2] == ["mcp_list_tools", "mcp_call", "message"]
    assert response.output[2].output == "MCP-ECHOED-7"
    assert wrong.output[0].error and wrong.status == "completed"
    for secret in (token, header, token[::-1]):
        assert secret not in caplog.text
        for shown in (response, stored, wrong):
            assert secret not in shown.model_dump_json()
        for path in tmp_path.iterdir():
            assert secret.encode() not in path.read_bytes(), path.name


async def test_a_request_cannot_pick_the_virtual_host_of_an_allowed_server(tmp_path) -> None:
    """`headers: {"Host": "admin.internal"}` on an allowed server is a 400 naming the header,
    and nothing with that Host reaches the server (its recorder sees every Host but its own)."""
    from openai import BadRequestError

    from serve_app.config import AppArgs
    from serve_app.engines.simulated import SimulatedEngineConfig
    from tests.support import ENGINE_SCRIPT
    from tests.support.helpers import in_process_api, sdk_client
    from tests.support.mcp_servers import mcp_server

    with mcp_server("good") as server:
        args = AppArgs.model_validate({"tools": {"mcp_allow": [server.origin]}})
        engine = SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=50_000)
        async with in_process_api(tmp_path / "s.db", args, engine=engine) as api:
            client = sdk_client(api)
            tool = mcp(server_url=server.url, require_approval="never")
            refused = None
            try:
                await client.responses.create(
                    model=MODEL,
                    input="MCP-ECHO-TASK",
                    tools=[{**tool, "headers": {"Host": "admin.internal"}}],
                )
            except BadRequestError as error:
                refused = error
        seen = await McpClient(args.tools).call_tool(McpServer(server.url), "seen_headers", {})
    assert refused is not None and refused.body["param"] == "tools[0].headers.Host"
    assert seen.output == "[]"  # no Host but its own, no x-* header, ever reached it
