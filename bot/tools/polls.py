"""Long polls held at once, counted per API token, per principal in its office and per office,
the excess refused at once; and the MCP sessions open per API token (`Sessions`, below).

A long poll (`list_inbox` or `agent_chat` with `wait`, an inbox subscription) holds a request
open for up to 50 s (a subscription's stream, longer). One client opening hundreds would hold
them all; so each token may hold `PER_TOKEN` at a time; a principal, however many tokens it
has (a person gets one at each OAuth consent), `PER_PRINCIPAL`; and an office, however many
principals its config names, `PER_OFFICE`: one office never holds the room every office's
polls share. One more is answered at once with 429 `too_many_long_polls`, naming the cap.
A console page's live stream (bot.console.live) is held here too, against its office and the
total, by the same rule (its person's streams have a cap of their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bot.errors import TooManyRequests

PER_TOKEN = 4  # long polls one API token may hold at once
PER_PRINCIPAL = 16  # ... one principal in its office, all its tokens together
PER_OFFICE = 1_000  # ... one office, all its principals together
# ... every office together, past which only an office holding less than its share (this
# divided among the offices holding any) gets one more: offices at their caps, however many
# (free GitHub orgs), never leave another none
TOTAL = 5_000


def token_key(token: str) -> str:
    """What identifies a token here (never the token itself)."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def is_long_poll(raw: object) -> bool:
    """A call with a positive `wait` may sleep (an invalid one is refused by validation)."""
    wait = raw.get("wait") if isinstance(raw, dict) else None
    if isinstance(wait, bool) or not isinstance(wait, int | float | str):
        return False
    try:
        return float(wait) > 0  # validation takes "5" as 5
    except ValueError:
        return False


_ALL = "all"  # every long poll held


class LongPolls:
    def __init__(self, per_token: int = PER_TOKEN, per_principal: int = PER_PRINCIPAL,
                 per_office: int = PER_OFFICE, total: int = TOTAL) -> None:
        self.per_token, self.per_principal, self.per_office, self.total = \
            per_token, per_principal, per_office, total
        self._held: Counter[str] = Counter()
        self._watchers: list[tuple[str, int, asyncio.Future[None]]] = []

    def held(self, key: str) -> int:
        return self._held[key]

    async def until_held(self, key: str, n: int) -> None:
        """Return once `key` holds at least `n` long polls (tests meet here, not in a sleep)."""
        if self._held[key] >= n:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.append((key, n, future))
        await future

    def _wake(self) -> None:
        keep = []
        for key, n, future in self._watchers:
            if not future.done() and self._held[key] >= n:
                future.set_result(None)
            elif not future.done():
                keep.append((key, n, future))
        self._watchers = keep

    @contextlib.contextmanager
    def hold(self, key: str | None, tool: str, raw: object,
             owner: tuple[str, str] | None = None) -> Iterator[None]:
        """Count this call, if it is a long poll, against its token (`key`) and, with
        `owner` (org, principal), against its principal in its office and that office."""
        if key is None or not is_long_poll(raw):
            yield
            return
        with self.holding([(key, self.per_token, "this API token")], owner, f"{tool}: ",
                          "wait for one to return, or call without `wait`"):
            yield

    def check(self, counted: list[tuple[str, int, str]], owner: tuple[str, str | None] | None,
              asking: str, advice: str, code: str = "too_many_long_polls") -> None:
        """Refuse one more held by `counted`'s keys (each with its cap and whom it names) and,
        with `owner` (org, principal), by its principal in its office (none: not counted
        there) and that office: at any cap, or past the total where its office holds its
        share already."""
        counted = counted + self._owners(owner)
        for counter, cap, who in counted:
            if self._held[counter] >= cap:
                raise TooManyRequests(
                    f"{asking}{who} already holds {self._held[counter]} long polls (`wait`, "
                    f"a console page's live stream), the most it may hold at once is {cap}; "
                    f"{advice}", code=code)
        if owner is not None and self._held[_ALL] >= self.total:
            office = counted[-1][0]
            holding = sum(1 for k in self._held if k.startswith("office:")) + (
                0 if self._held[office] else 1)
            share = self.total // holding
            if self._held[office] >= share:
                raise TooManyRequests(
                    f"{asking}the app holds {self._held[_ALL]} long polls (`wait`, a console "
                    f"page's live stream), as many as it keeps for every office together, "
                    f"and {counted[-1][2]} holds its share ({share}); {advice}", code=code)

    def _owners(self, owner: tuple[str, str | None] | None) -> list[tuple[str, int, str]]:
        if owner is None:
            return []
        org, principal = owner[0].lower(), owner[1]
        mine = [] if principal is None else [(f"principal:{org}/{principal}", self.per_principal,
                                              f"{principal}, all its tokens together,")]
        return [*mine, (f"office:{org}", self.per_office, f"the {org} office")]

    @contextlib.contextmanager
    def holding(self, counted: list[tuple[str, int, str]],
                owner: tuple[str, str | None] | None, asking: str, advice: str,
                code: str = "too_many_long_polls") -> Iterator[None]:
        """Hold one more (`check` first): a long poll, or a console page's live stream
        (bot.console.live), which count against the same office and total."""
        self.check(counted, owner, asking, advice, code)
        keys = [counter for counter, _, _ in counted + self._owners(owner)] + [_ALL]
        for counter in keys:
            self._held[counter] += 1
        self._wake()
        try:
            yield
        finally:
            for counter in keys:
                self._held[counter] -= 1
                if self._held[counter] <= 0:
                    del self._held[counter]


# -- MCP sessions ------------------------------------------------------------------------------
#
# A stateful MCP session lives in the app's memory until its client ends it or it goes unused
# for SESSION_IDLE; the SDK caps them all together (10,000), so one token opening sessions in a
# loop would lock every client out. Each is counted under its API token and under its principal
# in its office (more tokens for one principal buy no more), at most PER_TOKEN_SESSIONS under
# each, and under its office, at most PER_OFFICE_SESSIONS (however many principals an office's
# config names, it holds no more than that of the room every office shares). A key at its cap
# makes room by ending its own least recently used idle session (a client that leaks sessions
# loses its oldest, nobody else anything; an office at its cap, one of its own); only when
# every one is busy (a request in flight, a stream open) is the new one refused, 429, for that
# key alone.

PER_TOKEN_SESSIONS = 32  # a client needs one session, a busy agent host a few: ample room
PER_OFFICE_SESSIONS = 2_000  # a fifth of the SDK's 10,000
# all offices together, below the SDK's 10,000 (so this count, not the SDK's, decides): when
# full, the office holding the most gives way to one holding fewer (free GitHub orgs make
# five offices at their caps cheap), ending its least recently used session, idle or not
TOTAL_SESSIONS = 9_000
SESSION_IDLE = 10 * 60.0  # seconds unused before a session is dropped (its client starts anew)


@dataclass
class _Session:
    keys: tuple[str, ...]  # `session_keys`: its token's, then its principal's in its office
    owner: str  # whom the SDK holds it for (its principal in its office)
    used: float  # when its last request ended (or it opened)
    busy: int = 0  # requests in flight: its opening, a call, an open stream

    def idle(self) -> bool:
        return not self.busy


class Sessions:
    """Which MCP sessions each key holds; ending one (I/O) is the caller's."""

    def __init__(self, per_key: int = PER_TOKEN_SESSIONS, idle: float = SESSION_IDLE,
                 clock: Callable[[], float] = time.monotonic,
                 per_office: int = PER_OFFICE_SESSIONS, total: int = TOTAL_SESSIONS) -> None:
        self.per_key, self.per_office, self.total = per_key, per_office, total
        self.idle = idle
        self.clock = clock
        self._open: dict[str, _Session] = {}  # by session id, or by ticket while it opens
        self._tickets = itertools.count(1)

    def held(self, key: str) -> int:
        return sum(key in s.keys for s in self._open.values())

    def admit(self, keys: tuple[str, ...], owner: str) -> tuple[str, list[tuple[str, str]]]:
        """A ticket holding a place for one new session under each of `keys`, and the sessions
        (id, owner) to end first: any unused for `idle`, then, under a key at its cap, its
        least recently used idle one. TooManyRequests when every session of a full key is busy
        (then nothing changes)."""
        now = self.clock()
        ending = [sid for sid, s in self._open.items() if s.idle() and now - s.used >= self.idle]
        for key in keys:
            mine = sorted((s.used, sid) for sid, s in self._open.items()
                          if key in s.keys and sid not in ending)
            over = len(mine) + 1 - (self.per_office if key.startswith("office:")
                                    else self.per_key)
            idle = [sid for _, sid in mine if self._open[sid].idle()]
            if over > len(idle):
                raise TooManyRequests(
                    f"{len(mine)} MCP sessions are open for {_who(key)}, the most it may keep "
                    "at once, and each has a request in progress: end one (DELETE /mcp with "
                    "its Mcp-Session-Id) or let one finish; a session unused for "
                    f"{self.idle / 60:g} minutes is closed", code="too_many_sessions")
            ending += idle[:max(over, 0)]
        ending += self._room_for(keys, set(ending))
        closing = [(sid, self._open.pop(sid).owner) for sid in dict.fromkeys(ending)]
        ticket = f"opening:{next(self._tickets)}"  # busy: never ended while it opens
        self._open[ticket] = _Session(keys, owner, now, busy=1)
        return ticket, closing

    def _room_for(self, keys: tuple[str, ...], ending: set[str]) -> list[str]:
        """When every office's sessions together fill `total`: the one session to end so
        that `keys`' office gets one, the least recently used (idle first) of the office
        holding the most, which must hold more than the asker's own with this one;
        TooManyRequests when the asker's office is that office (or as big)."""
        staying = {sid: s for sid, s in self._open.items() if sid not in ending}
        if len(staying) + 1 <= self.total:
            return []
        offices = Counter(k for s in staying.values() for k in s.keys if k.startswith("office:"))
        mine = next((k for k in keys if k.startswith("office:")), "")
        biggest, held = offices.most_common(1)[0] if offices else ("", 0)
        victims = sorted((not s.idle(), s.used, sid) for sid, s in staying.items()
                         if biggest in s.keys and not sid.startswith("opening:"))
        if not victims or held <= offices[mine] + 1:
            raise TooManyRequests(
                f"the app keeps {self.total} MCP sessions at most, all of them open, and "
                f"{_who(mine or 'office:(its office)')} holds as many as any other office: "
                "end one (DELETE /mcp with its Mcp-Session-Id), or try again later",
                code="too_many_sessions")
        return [victims[0][2]]

    def opened(self, ticket: str, session_id: str | None) -> None:
        """The opening request is answered: the session it made, or None (nothing was made)."""
        held = self._open.pop(ticket, None)
        if held is not None and session_id is not None:
            self._open[session_id] = _Session(held.keys, held.owner, self.clock())

    def _own(self, session_id: str, keys: tuple[str, ...]) -> _Session | None:
        """The session, if `keys` are its principal's in its office (the SDK answers anyone
        else 404, as for no session: nothing of theirs counts here)."""
        found = self._open.get(session_id)
        return found if found is not None and found.keys[-1] == keys[-1] else None

    @contextlib.contextmanager
    def using(self, session_id: str, keys: tuple[str, ...]) -> Iterator[None]:
        """A request of the session is in flight: it is busy, then just used."""
        found = self._own(session_id, keys)
        if found is None:
            yield
            return
        found.busy += 1
        try:
            yield
        finally:
            found.busy -= 1
            found.used = self.clock()

    def gone(self, session_id: str, keys: tuple[str, ...]) -> None:
        """The session ended (its client's DELETE) or the server knows it no more (404)."""
        if self._own(session_id, keys) is not None:
            del self._open[session_id]


def session_keys(token_key: str | None, principal: str, org: str | None) -> tuple[str, ...]:
    """What a session counts under: its token, its office, then its principal in its office
    (last: whom the SDK holds it for)."""
    office = (org or "(its office)").lower()
    return (f"token:{token_key}", f"office:{office}", f"principal:{principal} in {office}")


def _who(key: str) -> str:
    kind, _, rest = key.partition(":")
    return {"token": "this API token", "office": f"the {rest} office"}.get(kind, rest)
