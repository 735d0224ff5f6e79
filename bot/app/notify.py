"""Wake-ups for long polls: `list_inbox` with `wait` sleeps here until something is new for it.

No busy loop and no task per waiter: each waiting call owns one future (`Watch`), registered
under every key it waits for; whoever makes something new under a key calls `notify`, which
sets the futures registered under it. A key is a principal (an agent's mail and chats, a
chat's answer) or an inbox box (`you:<owner>`, `agents:<owner>`: see
`bot.items.inbox.wait_keys`), so that a person's long poll wakes for their own box only, never
for their agents'. Keys are an office's: `notify` and `wait_any` take the org and key under
it, so one office's `agent:scout` never wakes (or cuts short the long poll of) another's.

Each wake-up is one object (`Wake`), which `wait_woken` (or `woken`) hands to every wait it
ends: polls of one viewer ended by the same wake-up may share one answer (`Together`), never
polls ended by another, nor another viewer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from bot import jsontext, metrics

T = TypeVar("T")

log = logging.getLogger("vaultmail.notify")


def _scoped(org: str, key: str) -> str:
    return f"{org.lower()}/{key}"


class Wake:
    """One wake-up (one `notify`, one message from another replica): what the waits it ended
    have in common. Compared by identity."""

    __slots__ = ()


class Watch:
    """One waiting call, registered under its keys (`Notifier.watch`): the future it sleeps
    on, and the wake-up that ended it first. A plain future rather than an `asyncio.Event`:
    the wake-up resumes the waiting call itself, with no event's waiters to go through."""

    __slots__ = ("future", "keys", "wake")

    def __init__(self, future: asyncio.Future[None], keys: set[str] | None) -> None:
        self.future = future
        self.keys = keys  # None: registered nowhere (ended, or made while shutting down)
        self.wake: Wake | None = None

    def set(self, wake: Wake | None) -> None:
        if self.wake is None:
            self.wake = wake
        if not self.future.done():
            self.future.set_result(None)


class Notifier:
    def __init__(self) -> None:
        self._waiting: defaultdict[str, set[Watch]] = defaultdict(set)
        # answers shared by one viewer's polls that one wake-up ended (bot.tools.comment_tools)
        self.together: Together[Any] = Together()
        self.closed = False  # shutting down: every wait answers at once with what is there
        # tells the other replicas (bot.app.replica: PostgreSQL's NOTIFY); None when alone
        self.publish: Callable[[list[str]], Awaitable[None]] | None = None
        self._outgoing: set[str] = set()  # keys for the next message to the other replicas
        self._sender: asyncio.Task[None] | None = None

    def close(self) -> None:
        """On SIGTERM: wake every long poll now, and let no new one wait."""
        self.closed = True
        for watches in self._waiting.values():
            for watch in watches:
                watch.set(None)

    def notify(self, principals: Iterable[str], *, org: str) -> None:
        """Something is new under these keys of `org`'s office: wake who waits here and on
        every replica."""
        keys = {_scoped(org, p) for p in principals}
        self.wake(keys)
        if self.publish is not None and keys:
            self._outgoing |= keys
            if self._sender is None:
                self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        """One message at a time to the other replicas, each with every key made new since
        the last was sent: each NOTIFY's commit takes PostgreSQL's one notify-queue lock,
        shared by every office (and every database of the server), so under load one message
        carries many wake-ups rather than each wake-up taking the lock."""
        try:
            await asyncio.sleep(0)  # wake-ups made in this turn of the loop go together
            while self._outgoing and self.publish is not None:
                keys, self._outgoing = sorted(self._outgoing), set()
                try:
                    await self.publish(keys)
                except Exception as exc:  # the other replicas' polls answer at their timeout
                    log.warning("wake-up not sent to other replicas: %r", exc)
        finally:
            self._sender = None

    def wake(self, principals: Iterable[str]) -> None:
        """Wake who waits here under these keys (what another replica told us, too): one
        wake-up, the same `Wake` for every wait it ends."""
        wake = Wake()
        for principal in set(principals):
            for watch in self._waiting.pop(principal, ()):
                watch.set(wake)

    def wake_everyone(self) -> None:
        """Wake every wait here (wake-ups from other replicas may have been missed: each
        looks again)."""
        self.wake(list(self._waiting))

    async def wait(self, principal: str, timeout: float, *, org: str) -> bool:
        """True when woken by something new, False on timeout (or cancellation upstream)."""
        return await self.wait_any([principal], timeout, org=org)

    async def wait_any(self, principals: Iterable[str], timeout: float, *, org: str) -> bool:
        """Like `wait`, woken by something new for any of `principals` of `org`'s office."""
        return await self.wait_woken(principals, timeout, org=org) is not None

    async def wait_woken(self, principals: Iterable[str], timeout: float, *,
                         org: str) -> Wake | None:
        """Like `wait_any`: the wake-up that ended the wait, None on timeout or shutdown."""
        watch = self.watch(principals, org=org)
        try:
            return await self.woken(watch, timeout)
        finally:
            self.unwatch(watch)

    def watch(self, principals: Iterable[str], *, org: str) -> Watch:
        """Register a wait now, under these keys of `org`'s office, to sleep on later
        (`woken`): a wake-up in between ends it, so a caller may look at what is there
        first and miss nothing. Each watch is ended by `unwatch` (at once, or after `woken`)."""
        future = asyncio.get_running_loop().create_future()
        if self.closed:  # shutting down: over at once, registered nowhere
            watch = Watch(future, None)
            watch.set(None)
            return watch
        keys = {_scoped(org, p) for p in principals}
        watch = Watch(future, keys)
        for key in keys:
            self._waiting[key].add(watch)
        metrics.LONG_POLLS.inc()
        return watch

    async def woken(self, watch: Watch, timeout: float) -> Wake | None:
        """Sleep on `watch` (`watch`) until woken: the wake-up, None on timeout or shutdown."""
        if self.closed:
            return None
        try:
            async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                await watch.future
            return None if self.closed else watch.wake
        except TimeoutError:
            return None

    def unwatch(self, watch: Watch) -> None:
        """The end of a watch: no longer registered (again: nothing)."""
        if watch.keys is None:
            return
        metrics.LONG_POLLS.dec()
        for key in watch.keys:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.discard(watch)
                if not waiting:
                    del self._waiting[key]
        watch.keys = None
        if not watch.future.done():
            watch.future.cancel()

    def waiting(self) -> int:
        """How many principal registrations are waiting (a wait on two counts twice)."""
        return sum(len(events) for events in self._waiting.values())


_ALONE = object()  # what a follower gets when it must compute its own answer
_AGAIN = object()  # ... when the first's answer was not to share: the next to look shares


class Together(Generic[T]):
    """Single flight: the first caller of a key computes, callers of the same key meanwhile
    get its answer. The key names everything the answer depends on, and the wake-up that
    ended the waits (`Wake`): answers are shared only by polls one wake-up ended, and only
    while the first is computing (nothing is kept). A follower computes its own when the
    first fails or is cancelled; when `shareable` refuses the first's answer (it consumed
    something: unread comments shown once), the followers start again, one of them first."""

    def __init__(self) -> None:
        # each flight's followers, each on a future of its own: a follower cancelled cancels
        # only its own, and the answer resumes each follower itself (a future shared by all,
        # shielded for each, took two turns of the loop a follower, through the shield)
        self._flights: dict[Hashable, list[asyncio.Future[object]]] = {}
        self.shared = 0  # answers handed to a follower (for tests and benches)

    async def once(self, key: Hashable, compute: Callable[[], Awaitable[T]],
                   shareable: Callable[[T], bool]) -> tuple[T, bool]:
        """(the answer, whether it is another caller's)."""
        while (followers := self._flights.get(key)) is not None:
            mine: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            followers.append(mine)
            got = await mine
            if got is _AGAIN:
                continue  # a loop, not a call: rounds of it stack no frames
            if got is not _ALONE:
                self.shared += 1
                return got, True  # type: ignore[return-value]
            return await compute(), False
        followers = self._flights[key] = []
        answer: object = _ALONE
        try:
            result = await compute()
            answer = result if shareable(result) else _AGAIN
            return result, False
        finally:
            del self._flights[key]
            for follower in followers:
                if not follower.done():  # (done: cancelled, its caller gone)
                    follower.set_result(answer)


class SharedAnswer:
    """An answer that a single flight (`Together`) hands to each of its callers, and its JSON
    text, made once for all of them (`AnswerCopy.json_bytes`): 1,000 polls of three people
    woken together encoded three answers, not 1,000. What is under its top level is every
    caller's: nobody changes it once made (as for any answer `Together` shares)."""

    __slots__ = ("_text", "answer")

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self._text: bytes | None = None

    def copy(self) -> AnswerCopy:
        """A caller's own: its top level is its own to add to (its JSON is then its own)."""
        return AnswerCopy(self)

    def text(self) -> bytes:
        """The answer's JSON text, as `bodies.json_response` sends it."""
        if self._text is None:
            self._text = jsontext.dumps(self.answer)
        return self._text


class AnswerCopy(dict[str, Any]):
    """One caller's copy of a `SharedAnswer`."""

    __slots__ = ("_shared",)

    def __init__(self, shared: SharedAnswer) -> None:
        super().__init__(shared.answer)
        self._shared = shared

    def json_bytes(self) -> bytes:
        """This copy's JSON text: the shared text while its top level is still the shared
        answer's (the same keys, in the same order, with the same values)."""
        answer = self._shared.answer
        if len(self) == len(answer) and all(
                k == key and v is value
                for (k, v), (key, value) in zip(self.items(), answer.items(), strict=True)):
            return self._shared.text()
        return jsontext.dumps(self)
