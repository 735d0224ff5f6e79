"""New items without a reload: server-sent events fed by the same Notifier as `wait`.

`GET /console/events` holds one stream per open page. It waits on the notifier under the keys a
person's `list_inbox` with `wait` waits on (`bot.items.inbox.wait_keys`: their own box), plus
their agents' box (the "Your agents are handling" history) and their principal (a chat's
answer). Each wake-up sends `change` with the inbox's version and badge; the page's script
fetches its live parts again when the version differs from the one it was rendered with, so
the first event also covers anything that landed between the page and the stream.

Each round (a wake-up or a heartbeat) asks again who is looking, as a page request would: a
session signed out or expired, a token revoked, a person taken out of the office ends the
stream before anything more is sent. A person holds at most `PER_PERSON` streams in each office
(another office's streams of the same principal are not theirs to count); that cap counts only
streams whose connection is still open, asked at the moment of counting, so a page view right
after another is never refused for the stream the page before closed; the closed stream's
handler lets it go within half a second, not at the next heartbeat. Each stream is also a long
poll held (`bot.tools.polls.LongPolls`, the one owner of those limits): it counts against its
office and every office's total, past which an office holding its share is refused, as the MCP
long polls are (not against the principal's long polls: the person's cap above bounds theirs,
counting only streams still open). One over a cap is answered 429 with `Retry-After`
(`RETRY_AFTER`); the page's script (static/console.js) tries again then, and after any other end
of its stream with a backoff, saying it is reconnecting.

Streams one wake-up ends for the same person in the same office share one look at their inbox
(`Notifier.together`, keyed by the wake-up, office and principal, as `list_inbox`'s woken polls
are): a thousand pages woken together cost a look per person, not per page.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any, cast

from aiohttp import web

from bot.app.notify import Wake
from bot.console.frame import badge_of, error_page, signed_in, tool
from bot.console.visitor import NotSignedIn, Visitor, not_for_a_part, visitor
from bot.errors import TooManyRequests, VaultmailError
from bot.items import inbox
from bot.office.visibility import viewer_for
from bot.store import chats
from bot.tools.http import client_gone
from bot.tools.polls import LongPolls

HEARTBEAT = 15.0  # seconds between comments on an idle stream (and between looks at who it is)
PER_PERSON = 8  # streams one person may hold at once in one office (a tab each)
RETRY_AFTER = 5  # seconds a page refused a stream (at the cap) waits before it tries again


class Streams:
    """The live streams open, per person in their office; each is also held as a long poll
    (`LongPolls.holding`), which caps the office and the total.

    Each stream is held with a way to ask whether its connection is still open: the person's
    cap counts only those, so a page view right after another is not refused for the stream
    its predecessor closed a moment ago (the closed stream's handler lets it go on its next
    look, within `client_gone`'s half second)."""

    def __init__(self, per_person: int = PER_PERSON) -> None:
        self.per_person = per_person
        self._held: dict[tuple[str, str], list[Callable[[], bool]]] = {}
        self._watchers: list[tuple[tuple[str, str], int, asyncio.Future[None]]] = []

    def held(self, org: str, principal: str) -> int:
        """How many of the person's streams are open now."""
        return sum(1 for is_open in self._held.get((org.lower(), principal), ()) if is_open())

    def check(self, polls: LongPolls, org: str, principal: str) -> None:
        """Refuse one more stream to a person who holds as many open as they may, or where
        the long polls' limits refuse one more (`LongPolls.check`)."""
        if self.held(org, principal) >= self.per_person:
            raise TooManyRequests(f"{principal} already holds {self.per_person} live streams in "
                                  f"the office of {org} (one per open console page): close a "
                                  "tab", code="too_many_streams")
        polls.check([], (org, None), *_ASKING)

    @contextlib.contextmanager
    def hold(self, polls: LongPolls, org: str, principal: str,
             is_open: Callable[[], bool] = lambda: True) -> Iterator[None]:
        self.check(polls, org, principal)
        key = (org.lower(), principal)
        with polls.holding([], (org, None), *_ASKING):
            self._held.setdefault(key, []).append(is_open)
            self._wake()
            try:
                yield
            finally:
                mine = self._held[key]
                mine.remove(is_open)
                if not mine:
                    del self._held[key]
                self._wake()

    async def until(self, org: str, principal: str, n: int) -> None:
        """Return once the person holds `n` streams (tests meet here, not in a sleep)."""
        key = (org.lower(), principal)
        if len(self._held.get(key, ())) == n:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.append((key, n, future))
        await future

    def _wake(self) -> None:
        keep = []
        for key, n, future in self._watchers:
            if not future.done() and len(self._held.get(key, ())) == n:
                future.set_result(None)
            elif not future.done():
                keep.append((key, n, future))
        self._watchers = keep


STREAMS = web.AppKey("console_streams", Streams)
# how a stream the long polls' limits refuse is told so (`LongPolls.check`)
_ASKING = ("a live stream: ", "the page shows what is new when reloaded", "too_many_streams")


async def delivery_stamp(v: Visitor) -> str:
    """What moves whenever something reaches the person or their agents (read marks aside),
    and when one of their chats is answered."""
    owner = inbox.Whose.of(v.call.office, v.principal).owner
    # one on an item the person may not see (their agent's) is not shown: it moves nothing
    seq = await inbox.latest_seen(v.services.store, v.call.office, owner,
                                  viewer_for(v.call).visible)
    chat = await chats.answered_stamp(v.services.store, v.principal, org=v.call.office.org)
    return f"{seq}:{chat['n'] if chat else 0}:{chat['at'] if chat else 0}"


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


async def _together(v: Visitor, woken: Wake | bool) -> tuple[str, int]:
    """`current`, shared by the person's streams in this office that `woken` ended (it marks
    nothing read: any of them may take another's look)."""
    if not isinstance(woken, Wake):
        return await current(v)
    key = (woken, v.call.office.org.lower(), v.principal, "console")
    answer, _ = await v.services.notifier.together.once(key, lambda: current(v),
                                                         lambda _: True)
    return cast(tuple[str, int], answer)


def _keys(v: Visitor) -> set[str]:
    who = inbox.Whose.of(v.call.office, v.principal)
    return {*inbox.wait_keys(v.call.office, v.principal), v.principal,
            inbox.wake_key(who.owner, "agents")}


async def _still(request: web.Request, v: Visitor) -> Visitor | None:
    """Who is looking now, asked as a page request asks (the session or token, and the office
    config), or None when it is no longer the person and office the stream was opened for."""
    try:
        now = await visitor(request)
    except (NotSignedIn, VaultmailError):
        return None
    same = now.principal == v.principal and now.call.office.org == v.call.office.org
    return now if same else None


def _open(request: web.Request) -> Callable[[], bool]:
    def is_open() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()
    return is_open


@not_for_a_part  # (an image of it held a stream)
@signed_in
async def events(request: web.Request, v: Visitor) -> web.StreamResponse:
    streams, polls = request.app[STREAMS], v.services.long_polls
    try:
        streams.check(polls, v.call.office.org, v.principal)
    except TooManyRequests as exc:
        refused = error_page(request, exc, v)
        refused.headers["Retry-After"] = str(RETRY_AFTER)  # the page's script honours it
        return refused
    with streams.hold(polls, v.call.office.org, v.principal, _open(request)):
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-store",
            "X-Accel-Buffering": "no"})
        await response.prepare(request)
        gone = asyncio.ensure_future(client_gone(request))  # the page closed it
        try:
            await response.write(b"retry: 3000\n\n")
            await _send_changes(request, response, v, gone)
        except ConnectionResetError:
            pass  # the page went away
        finally:
            gone.cancel()
    return response


async def _send_changes(request: web.Request, response: web.StreamResponse, v: Visitor,
                        gone: asyncio.Future[None]) -> None:
    notifier = v.services.notifier
    last: str | None = None
    woken: Wake | bool | None = True  # (the first round looks, woken by nothing)
    while not notifier.closed and not gone.done():
        waiter = asyncio.ensure_future(notifier.wait_woken(_keys(v), HEARTBEAT,
                                                           org=v.call.office.org))
        await asyncio.sleep(0)  # registered before looking: nothing slips between
        try:
            still = await _still(request, v)
            if still is None:
                return  # signed out, or no longer the office's: not one more event
            v = still
            if woken:
                now, count = await _together(v, woken)
                if now != last:
                    data = json.dumps({"version": now, "badge": count})
                    await response.write(f"event: change\ndata: {data}\n\n".encode())
                    last = now
            else:
                await response.write(b": idle\n\n")
            either: set[asyncio.Future[Any]] = {waiter, gone}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            woken = waiter.result() if waiter.done() else None
        finally:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
