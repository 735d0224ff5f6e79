"""list_changes: the ledger as events since a sequence number, as far as the caller may see.

Each entry is shown only to who may see what it is about (`bot.office.visibility`): an event
about an item to those whose forge account can see its repository, one about mail to its
sender, its recipient, the recipient's person and editors. `next` moves on over the entries
that are not shown, so paging with it always ends."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from bot.office.visibility import viewer_for
from bot.store import ledger
from bot.tools import outputs
from bot.tools.registry import MAX_ID, READS_INDEX, Args, Call, tool

BATCH = 500
MAX_SCANNED = 20_000  # entries looked at per call; `next` says where to go on from


class ChangesArgs(Args):
    since: int = Field(default=0, ge=0, le=MAX_ID,
                       description="`seq` of the last event seen (the office's own "
                                   "numbering)")
    limit: int = Field(default=200, ge=1, le=1000, description="at most this many events")


@tool("list_changes", ChangesArgs, "Events from the office's ledger after `since` that you may "
      "see, oldest first; pass `next` back as `since` for the next page (the same `next` "
      "means nothing newer).", title="Changes in the ledger", hints=READS_INDEX,
      output=outputs.ChangesResult)
async def list_changes(call: Call, args: ChangesArgs) -> dict[str, Any]:
    store, viewer = call.services.store, viewer_for(call)
    events: list[dict[str, Any]] = []
    cursor, scanned = args.since, 0
    while len(events) < args.limit and scanned < MAX_SCANNED:
        batch = await ledger.entries(store, since=cursor, limit=BATCH, org=call.office.org,
                                     shown=True)
        async for entry, seen in viewer.entries_seen(batch, store):
            cursor, scanned = entry.number, scanned + 1
            if seen:
                # subjects, answers, reasons: text people wrote, data to an agent
                events.append({**entry.as_json(), "contentIsData": True})
                if len(events) == args.limit:
                    break
        if len(batch) < BATCH:
            break
    return {"events": events, "next": cursor}
