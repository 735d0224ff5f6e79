"""New items without a reload: server-sent events fed by the same Notifier as `wait`.

`GET /console/events` holds one stream per open page. It waits on the notifier under the keys a
person's `list_inbox` with `wait` waits on (`bot.items.inbox.wait_keys`: their own box), plus
their agents' box (the "Your agents are handling" history) and their principal (a chat's
answer). Each wake-up sends `change` with the inbox's version and badge; the page's script
fetches its live parts again when the version differs from the one it was rendered with, so
the first event also covers anything that landed between the page and the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import Any

from aiohttp import web

from bot.console.frame import badge_of, signed_in, tool
from bot.console.visitor import Visitor
from bot.errors import TooManyRequests
from bot.items import inbox
from bot.store import chats, comments

HEARTBEAT = 15.0  # seconds between comments on an idle stream (finds a client that left)
PER_PERSON = 8  # streams one principal may hold at once (a tab each)
STREAMS = web.AppKey("console_streams", dict[str, int])


async def delivery_stamp(v: Visitor) -> str:
    """What moves whenever something reaches the person or their agents (read marks aside),
    and when one of their chats is answered."""
    owner = inbox.Whose.of(v.call.office, v.principal).owner
    row = await comments.latest_delivery_seq(v.services.store, owner)
    chat = await chats.answered_stamp(v.services.store, v.principal)
    return f"{row['seq'] if row else 0}:{chat['n'] if chat else 0}:{chat['at'] if chat else 0}"


async def version(v: Visitor, look: dict[str, Any], stamp: str) -> str:
    """The inbox as a page shows it: the cards and questions (not their read marks), and the
    updates on the person's outcomes (which reach no box: their own cursors tell them)."""
    def ids(box: dict[str, Any], key: str) -> list[Any]:
        return [(t.get("thread"), t.get("turn"), t.get("waitingOn"),
                 (t.get("answer") or {}).get("comment"), t.get("resolved"))
                for t in box.get(key, [])]
    parts = [stamp, ids(look["you"], "yourTurn"), ids(look["you"], "waitingOnOthers"),
             ids(look["agents"], "yourTurn"), ids(look["agents"], "waitingOnOthers"),
             [u.get("cursor") for u in look.get("updates", [])]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


async def current(v: Visitor) -> tuple[str, int]:
    stamp = await delivery_stamp(v)
    look = await tool(v, "list_inbox", markRead=False)
    return await version(v, look, stamp), badge_of(look)


def _keys(v: Visitor) -> set[str]:
    who = inbox.Whose.of(v.call.office, v.principal)
    return {*inbox.wait_keys(v.call.office, v.principal), v.principal,
            inbox.wake_key(who.owner, "agents")}


@signed_in
async def events(request: web.Request, v: Visitor) -> web.StreamResponse:
    streams = request.app[STREAMS]
    if streams.get(v.principal, 0) >= PER_PERSON:
        raise TooManyRequests(f"{v.principal} already holds {PER_PERSON} live streams (one per "
                              "open console page): close a tab", code="too_many_streams")
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-store",
        "X-Accel-Buffering": "no"})
    await response.prepare(request)
    notifier = v.services.notifier
    streams[v.principal] = streams.get(v.principal, 0) + 1
    last, woken = None, True
    try:
        await response.write(b"retry: 3000\n\n")
        while not notifier.closed:
            waiter = asyncio.create_task(notifier.wait_any(_keys(v), HEARTBEAT))
            await asyncio.sleep(0)  # registered before looking: nothing slips between
            try:
                if woken:
                    now, count = await current(v)
                    if now != last:
                        data = json.dumps({"version": now, "badge": count})
                        await response.write(f"event: change\ndata: {data}\n\n".encode())
                        last = now
                else:
                    await response.write(b": idle\n\n")
                woken = await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter
            if request.transport is None or request.transport.is_closing():
                break
    except ConnectionResetError:
        pass  # the page went away
    finally:
        streams[v.principal] -= 1
        if not streams[v.principal]:
            del streams[v.principal]
    return response
