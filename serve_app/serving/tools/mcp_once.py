"""An approved MCP call runs once (issue 46): whichever replica, and however many requests send
its ``mcp_approval_response`` (a client retrying, two at once), the call runs for the first to
claim it in the store (`ResponseStore.claim_tool_call`, an insert-if-absent keyed by the owner
and the approval request's id), and every other one answers with that run's result.

- The claimant runs the call and records its result (`settle_tool_call`); a call cancelled
  under it (the client went away) is recorded as cancelled: it may have reached the server, so
  it is never run again.
- Another claimant waits for the result (reading the claim every ``POLL_S``) for as long as the
  claimant's own call may take (`ToolArgs`'s connect and call timeouts, and a margin to record
  it); past that (the claimant's replica died mid-call) the outcome is unknown, and it says so:
  still never a second run.
- The store unreachable when claiming: the call is not run (it could not be made once), and the
  model reads why; a retry claims it then.

At most once, then, and exactly once whenever the claimant lives to record the result.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from openai.types.responses.mcp_tool_call_error import McpToolCallError
from pydantic import TypeAdapter

from serve_app.config import ToolArgs
from serve_app.protocol.tool_items import ToolResult
from serve_app.store.base import ResponseStore, ToolClaim

logger = logging.getLogger(__name__)

POLL_S = 0.1
# Beyond the claimant's own bounds on the call: time for it to record the result.
SETTLE_MARGIN_S = 5.0
NOT_CLAIMED = (
    "The approved call was not run: the server could not record that it runs it (so that it "
    "runs once). Send the approval again."
)
CANCELLED = "The approved call was cancelled while it ran: it may have run, and is not run again."
UNKNOWN = (
    "The approved call was started by another request, which did not record its result in "
    "time: it may have run, and is not run again."
)
_MCP_ERROR: TypeAdapter[McpToolCallError] = TypeAdapter(McpToolCallError)


def encode(result: ToolResult) -> str:
    """What the store keeps of a call's result: its output, its error and the MCP error
    object an ``mcp_call`` item carries."""
    error = result.data.get("mcp_error")
    return json.dumps(
        {
            "output": result.output,
            "error": result.error,
            "mcp_error": _MCP_ERROR.dump_python(error, mode="json") if error else None,
        }
    )


def decode(text: str) -> ToolResult:
    data = json.loads(text)
    found: dict[str, Any] = {}
    if data.get("mcp_error") is not None:
        found["mcp_error"] = _MCP_ERROR.validate_python(data["mcp_error"])
    return ToolResult(output=data.get("output") or "", error=data.get("error"), data=found)


class OnceCalls:
    """The approved calls of one ingress replica's turns, each run once (the store decides)."""

    def __init__(self, store: ResponseStore, args: ToolArgs) -> None:
        self._store = store
        # How long a claimant may take: its connect and call timeouts, and recording.
        self._budget_s = args.mcp_connect_timeout_s + args.mcp_call_timeout_s + SETTLE_MARGIN_S
        # Results recorded after their call was cancelled (kept until written).
        self._settling: set[asyncio.Task[None]] = set()

    async def run(
        self,
        owner: str | None,
        claim_id: str,
        claimant: str,
        call: Callable[[], Awaitable[ToolResult]],
    ) -> ToolResult:
        """``call``'s result if ``claimant`` is the first to claim ``claim_id``, else the
        result of the run the first claimant made. Never raises but for cancellation."""
        try:
            claim = await self._store.claim_tool_call(owner, claim_id, claimant)
        except Exception:
            logger.exception("approved call %s: not claimed; not run", claim_id)
            return ToolResult(error=NOT_CLAIMED)
        if claim.claimant != claimant or claim.settled:
            logger.info("approved call %s: ran for %s; its result reused", claim_id, claim.claimant)
            return await self._result_of(owner, claim_id, claim)
        try:
            result = await call()
        except asyncio.CancelledError:
            self._settle_later(owner, claim_id, claimant, ToolResult(error=CANCELLED))
            raise
        except Exception as error:  # a runner's bug: a failed call, recorded as one
            logger.exception("approved call %s failed", claim_id)
            result = ToolResult(error=f"The call failed ({type(error).__name__}).")
        await self._settle(owner, claim_id, claimant, result)
        return result

    async def _result_of(self, owner: str | None, claim_id: str, claim: ToolClaim) -> ToolResult:
        """The settled result of another claimant's run, waited for within its budget."""
        deadline = claim.claimed_at + self._budget_s
        found: ToolClaim | None = claim
        while found is not None and not found.settled and time.time() < deadline:
            await asyncio.sleep(POLL_S)
            try:
                found = await self._store.tool_claim(owner, claim_id)
            except Exception:  # a read that failed: the next one may not
                logger.warning("approved call %s: its claim not read", claim_id)
        if found is None or found.result is None:
            logger.warning("approved call %s: no result from %s in time", claim_id, claim.claimant)
            return ToolResult(error=UNKNOWN)
        return decode(found.result)

    async def _settle(
        self, owner: str | None, claim_id: str, claimant: str, result: ToolResult
    ) -> None:
        try:
            if not await self._store.settle_tool_call(owner, claim_id, claimant, encode(result)):
                logger.error("approved call %s: its claim was gone when settled", claim_id)
        except Exception:  # waiters then read the outcome as unknown: never a second run
            logger.exception("approved call %s: its result not recorded", claim_id)

    def _settle_later(
        self, owner: str | None, claim_id: str, claimant: str, result: ToolResult
    ) -> None:
        """Record ``result`` on a task of its own (the caller is being cancelled)."""
        task = asyncio.ensure_future(self._settle(owner, claim_id, claimant, result))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
