"""list_changes: the ledger as events since a sequence number."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from bot.store import ledger
from bot.tools.registry import Args, Call, tool


class ChangesArgs(Args):
    since: int = Field(default=0, ge=0, description="sequence number of the last event seen")
    limit: int = Field(default=200, ge=1, le=1000)


@tool("list_changes", ChangesArgs, "Events from the office's ledger after `since`, oldest "
      "first; pass the last `seq` back as `since` for the next page.")
async def list_changes(call: Call, args: ChangesArgs) -> dict[str, Any]:
    entries = await ledger.entries(call.services.store, since=args.since, limit=args.limit)
    events = [e.as_json() for e in entries]
    return {"events": events, "next": events[-1]["seq"] if events else args.since}
