"""Exactly once, for anything a caller names with a key: the one mechanism behind every tool's
`idempotencyKey` and behind the worker's dedupe of forge changes (a comment, an issue event)
that reach the app more than once under different delivery ids.

`Store.once(scope, key, fingerprint, work)`:

* claims (scope, key) in the `idempotency` table *before* `work` runs, so before any forge
  write it makes;
* a second call with the key while the first still runs (a client that timed out and retried)
  waits for the first and gets its result; nothing runs twice;
* a later call gets the stored result, and nothing runs;
* the same key with other arguments (another `fingerprint`) is refused with 409
  `idempotency_key_reused`;
* a refusal (a `VaultmailError`) on the key's first try, before any forge write, releases the
  claim, so the key can be used again once the caller has fixed what was wrong; a refusal
  after a write (see `bot.forge.writes`), or on a try that resumed an unfinished one, keeps
  it, like any other failure;
* any other failure, or a process that stopped midway, leaves the claim without a result: the
  next call with the key runs `work` again with `resumed()` true, and `work` looks on the forge
  for what the first attempt may have written (markers, mail ids) before writing it again.

The worker passes `later=`: a result is then recorded in the transaction that finishes the
delivery (`settle_in`, then `settled`) rather than in one of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bot.errors import Conflict, VaultmailError
from bot.forge.writes import counting as counting_writes
from bot.store import lease
from bot.store.group import GroupCommit
from bot.store.queue import DEAD_AFTER, ReplicaIdTaken, id_taken

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager


SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    scope {text} NOT NULL,          -- whose keys: "tool:<name>:<principal>", "forge:<event>"
    key {text} NOT NULL,
    fingerprint {text} NOT NULL,    -- what the key was first used for
    result {text},                  -- JSON, once the work is done
    attempts {int} NOT NULL DEFAULT 1,
    claimed_at {real} NOT NULL,
    done_at {real},
    PRIMARY KEY (scope, key)
);
"""

Result = dict[str, Any]
# a try's claim: (scope, key) as claimed, its owner and attempt, and its own id (the row's
# `claim`), by which the try finds its row wherever an office's rename moved the key since
# (bot.store.offices._move_steps); owner and attempt fence it against a takeover
Claim = tuple[str, str, str, int, str]
# a claim to let go of with a later write: whether to free it (else leave it unowned), and it
Stray = tuple[bool, Claim]
# a finished try's result left for the caller to record in a transaction of its own (the
# worker's, which finishes the delivery that ran it): its claim, and the result's JSON
Settlement = tuple[Claim, str]
# what a claim found: ("claimed", attempt, resumed), ("done", result JSON, _), ("reused", ...),
# ("wait", ...)
_Claimed = tuple[str, Any, bool]
# the row of a try's claim, wherever its key is now: its id, still its owner's and attempt's,
# unfinished (`_ours`)
_OURS = "claim=? AND owner=? AND attempts=? AND result IS NULL"
OTHER_REPLICA_POLL = 0.05  # seconds between looks at a key another replica is working on
_resumed: contextvars.ContextVar[bool] = contextvars.ContextVar("idempotency_resumed",
                                                                default=False)
# the claim the running `work` holds: its store, and it
_claim: contextvars.ContextVar[tuple[IdempotencyMixin, Claim] | None] = \
    contextvars.ContextVar("idempotency_claim", default=None)
# what the running `work` was told its first `left_under` of each key finds (`once`'s
# `peek`): read with its claim's fence as it began, so not again
_peeked: contextvars.ContextVar[dict[tuple[str, str], Any] | None] = \
    contextvars.ContextVar("idempotency_peeked", default=None)


def resumed() -> bool:
    """True inside `work` that runs again for a key an earlier attempt claimed and did not
    finish: what it writes may be on the forge already, so look before writing."""
    return _resumed.get()


def this_try() -> str | None:
    """The id of the try the running `work` is (a new one each time its key is claimed
    again), or None outside any."""
    held = _claim.get()
    return None if held is None else held[1][4]


@contextlib.contextmanager
def resuming() -> Iterator[None]:
    """`resumed()` true within: the work goes on from a try recorded under another key (the
    form a release before gave it: `IdempotencyMixin.left_under`)."""
    token = _resumed.set(True)
    try:
        yield
    finally:
        _resumed.reset(token)


def fingerprint(value: Any) -> str:
    """A short stable digest of JSON-able arguments."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class KeyReused(Conflict):
    code = "idempotency_key_reused"


class ClaimLost(Exception):  # noqa: N818 (a state, like KeyReused's)
    """The running `work`'s claim was taken over (its replica stalled past DEAD_AFTER and
    another took the key): it writes nothing more; `once` waits for the new owner's result."""


def fence_key() -> str | None:
    """The transaction key of the claim the running `work` holds (None outside `once`): a
    transaction that names it and checks `claim_held_in` commits only under the claim (a
    takeover takes the same key)."""
    held = _claim.get()
    return None if held is None else _key_lock(held[1][0], held[1][1])


async def claim_held_in(db: Any) -> bool:
    """Whether the running `work` still holds its claim (True outside `once`)."""
    held = _claim.get()
    if held is None:
        return True
    return await db.fetchone(f"SELECT 1 FROM idempotency WHERE {_OURS}",
                             _ours(held[1])) is not None


@contextlib.asynccontextmanager
async def fenced(store: Any, what: str, *keys: str) -> AsyncIterator[Any]:
    """A write transaction of `store` on `keys` that commits only while the running `work`'s
    claim (if any: a keyed tool call, a delivery's change) is still its own: under the claim's
    own key (`fence_key`), which a takeover takes too, ClaimLost naming `what` when it was
    taken over (its try stalled past DEAD_AFTER; the one that took it does the work)."""
    fence = fence_key()
    async with store.transaction(*keys, *([fence] if fence else [])) as db:
        if fence and not await claim_held_in(db):
            raise ClaimLost(f"{what}: its key was taken over")
        yield db


async def check_claim() -> None:
    """The fence before a write that must happen once (an issue's creation): raises
    NamedLockLost when a named lock the running task holds was lost (bot.store.lease),
    `ClaimLost` when the running `work`'s claim is another's now. Cheap: one read."""
    await lease.check()
    held = _claim.get()
    if held is None:
        return
    row = await held[0].fetchone(f"SELECT 1 FROM idempotency WHERE {_OURS}", _ours(held[1]))
    if row is None:
        raise ClaimLost(f"idempotency claim {held[1][0]!r}/{held[1][1]!r} taken over")


async def _fence_and_peek(store: IdempotencyMixin, ours: Claim,
                          peek: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """`check_claim` for the try of claim `ours` as it begins, and the rows (result, owner)
    of the keys `peek` as `left_under` reads them (None: no row), in the same one read."""
    await lease.check()
    also = " OR ".join("(scope=? AND key=?)" for _ in peek)
    rows = await store.fetchall(
        f"SELECT 1 AS ours, scope, key, result, owner FROM idempotency WHERE {_OURS}"
        + (f" UNION ALL SELECT 0, scope, key, result, owner FROM idempotency WHERE {also}"
           if peek else ""), (*_ours(ours), *(part for slot in peek for part in slot)))
    if not any(row["ours"] for row in rows):
        raise ClaimLost(f"idempotency claim {ours[0]!r}/{ours[1]!r} taken over")
    peeked: dict[tuple[str, str], Any] = dict.fromkeys(peek)
    for row in rows:
        if not row["ours"]:
            peeked[row["scope"], row["key"]] = (row["result"], row["owner"])
    return peeked


def _key_lock(scope: str, key: str) -> str:
    return f"idempotency:{scope}\n{key}"


class IdempotencyMixin:
    """The idempotency half of Store (see bot.store.db)."""

    _running: dict[tuple[str, str], tuple[asyncio.Future[Result], str]]
    _unsettled: set[tuple[str, str]]  # done, their results not yet recorded: kept in _running
    _stray: list[Stray]  # claims to let go of with the worker's next write (see `stray`)
    _preclaims: dict[tuple[str, str], str]  # the ids `preclaim_in` gave, until a `once` runs
    # the claim ids of this process's tries, running or their results not yet recorded: a
    # key its office's rename moved is no slot `_running` knows, and its row names this
    # replica as owner, which a claim would otherwise take for a dead incarnation's
    _at_work: set[str]
    claim_waits: int  # calls that waited for another try of their key to finish

    replica_id: str
    incarnation: str
    engine: ClassVar[str]

    if TYPE_CHECKING:
        def transaction(self, *keys: str) -> AbstractAsyncContextManager[Any]: ...
        def retire(self) -> str: ...
        async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...
        async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]: ...

    async def _held_elsewhere(self, db: Any, owner: str | None) -> bool:
        """Whether `owner`, another replica than this one, is alive (its claim holds)."""
        if not owner or owner == self.replica_id:
            return False
        return await db.fetchone("SELECT 1 FROM replicas WHERE id=? AND seen_at>vm_now()-?",
                                 (owner, DEAD_AFTER)) is not None

    async def once(self, scope: str, key: str, fingerprint: str,
                   work: Callable[[], Awaitable[Result]], *,
                   later: list[Settlement] | None = None, preclaimed: bool = False,
                   peek: Sequence[tuple[str, str]] = ()) -> Result:
        """Run `work` once for (scope, key); see the module docstring. With `later`, a result
        is not recorded here: it is appended to `later`, for the caller to record with
        `settle_in` in a transaction it makes anyway, then `settled`; until then a call with
        the key in this process gets the result, and another replica's waits for it. With
        `preclaimed`, the caller claimed the key itself (`preclaim_in`, committed). `peek`:
        the keys `work` looks under first (`left_under`), read with the fence a preclaimed
        try begins with (one read for both)."""
        slot = (scope, key)
        running = self._running.get(slot)
        if running is not None:  # the first call is still at work: wait for its result
            future, first = running
            if first != fingerprint:
                raise _reused(key)
            return _copy(await asyncio.shield(future))
        task = asyncio.ensure_future(
            self._claim_and_run(slot, fingerprint, work, later, preclaimed, peek))
        self._running[slot] = (task, fingerprint)
        task.add_done_callback(lambda t: self._finished(slot, t))
        return _copy(await asyncio.shield(task))  # a caller that leaves never cuts the work

    async def left_under(self, scope: str, key: str) -> tuple[bool, Result | None]:
        """What (scope, key) holds, for work now keyed otherwise that a release before keyed
        so: (whether it was claimed, its result once done). Waits while another live replica
        is at work on it (a release before, during a rolling deploy), as `once` would. Inside
        `once(..., peek=)`, a key it peeked at is first taken as its try's fence read it, as
        the try began (one read fewer), then read again each time it waits; once it waited,
        every key it peeked at is read again (the fence's reading is stale by then)."""
        peeked = _peeked.get()
        while True:
            if peeked is not None and (scope, key) in peeked:  # (read as the try began)
                row = peeked.pop((scope, key))
            else:
                row = await self.fetchone("SELECT result, owner FROM idempotency WHERE"
                                          " scope=? AND key=?", (scope, key))
            if row is None:
                return False, None
            if row[0] is not None:
                done: Result = json.loads(row[0])
                return True, done
            if not await self._held_elsewhere(self, row[1]):
                return True, None  # left unfinished: go on from it (`resuming`)
            if peeked:  # (what the fence read is stale once anything waited)
                peeked.clear()
            await asyncio.sleep(OTHER_REPLICA_POLL)

    def _finished(self, slot: tuple[str, str], task: asyncio.Future[Result]) -> None:
        if self._running.get(slot, (None, ""))[0] is task and slot not in self._unsettled:
            del self._running[slot]
        if not task.cancelled():
            task.exception()  # retrieved: a waiter that left must not leave it unreported

    async def settle_in(self, db: Any, settlements: list[Settlement]) -> list[Settlement]:
        """Record, in `db`'s transaction, the results `once(..., later=)` left: each under
        its claim, as `once` records its own (one taken over meanwhile keeps theirs).
        Returns those whose key's row another transaction holds now (PostgreSQL), to be
        recorded in a later write (not `settled` yet): one office's key held never holds up
        the others' results, nor the finishes written with them."""
        if not settlements:
            return []
        if self.engine == "sqlite":  # (one writer: it holds every row)
            for ours, text in settlements:
                await _write_result_in(db, ours, text)
            return []
        # one statement for them all (SETTLE_FREE)
        rows = await db.fetchall(SETTLE_FREE, (
            [ours[4] for ours, _ in settlements], [ours[2] for ours, _ in settlements],
            [ours[3] for ours, _ in settlements], [text for _, text in settlements],
            time.time()))
        held = {row["claim"] for row in rows if row["there"] and not row["wrote"]}
        return [(ours, text) for ours, text in settlements if ours[4] in held]

    async def preclaim_in(self, db: Any, scope: str,
                          keys: Sequence[tuple[str, str]]) -> set[str]:
        """Claim each (key, fingerprint) of `keys` under `scope` in `db`'s transaction where
        no one has yet (its first try), in the keys' order (two replicas claiming one pair
        of keys never wait for each other's second: a deadlock), one statement for them all
        on PostgreSQL: the keys claimed, for `once(..., preclaimed=True)` once committed. A
        key already there (done, at work elsewhere, left unfinished) is left to `once` to
        look at."""
        ordered = sorted(dict(keys).items())
        claims = {key: uuid.uuid4().hex for key, _ in ordered}
        at = time.time()
        if self.engine == "sqlite":  # (in the writer's thread: no hop per statement)
            claimed = {key for key, fingerprint in ordered if await db.execute(
                "INSERT INTO idempotency(scope, key, fingerprint, claimed_at, owner, claim)"
                " VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (scope, key, fingerprint, at, self.replica_id, claims[key]))}
        elif ordered:
            claimed = {row["key"] for row in await db.fetchall(PRECLAIM, (
                scope, at, self.replica_id, [key for key, _ in ordered],
                [fingerprint for _, fingerprint in ordered], [claims[key] for key, _ in ordered]))}
        else:
            claimed = set()
        for key in claimed:  # (a rolled-back one's is replaced by the next)
            self._preclaims[scope, key] = claims[key]
        return claimed

    def preclaims_unused(self, slots: list[tuple[str, str]]) -> None:
        """Keys `preclaim_in` claimed that no `once` ran under (their deliveries were let go
        of, or no handler ran): let go of with the caller's next write, free again as a
        refused first try leaves its key, rather than waited on by another replica's call."""
        self.let_go_later([(True, self._preclaimed(scope, key)) for scope, key in slots])

    def _preclaimed(self, scope: str, key: str) -> Claim:
        return (scope, key, self.replica_id, 1, self._preclaims.pop((scope, key), ""))

    def stray(self) -> list[Stray]:
        """The claims to let go of (failed tries' that could not be while the store was away,
        unused pre-claims), taken for the caller to let go of in a transaction of its own
        (`let_go_in`; `let_go_later` again should that transaction fail)."""
        taken, self._stray = self._stray, []
        return taken

    def has_stray(self) -> bool:
        return bool(self._stray)

    def let_go_later(self, claims: list[Stray]) -> None:
        self._stray[:0] = claims

    async def let_go_in(self, db: Any, claims: list[Stray]) -> list[Stray]:
        """Let go of `claims` in `db`'s transaction; returns those whose key's row another
        transaction holds now (PostgreSQL), for `let_go_later` (see `settle_in`)."""
        held: list[Stray] = []
        for free, ours in sorted(claims, key=lambda claim: claim[1]):  # (one order of rows)
            if await _locked_now(db, self.engine, ours):
                await _let_go_in(db, free, ours)
            else:
                held.append((free, ours))
        return held

    def settled(self, settlements: list[Settlement]) -> None:
        """The transaction that held `settle_in` committed (or this replica retired): its
        keys' calls look at the stored results from now on."""
        for (scope, key, *_, claim), _ in settlements:
            self._at_work.discard(claim)
            slot = (scope, key)
            self._unsettled.discard(slot)
            running = self._running.get(slot)
            if running is not None and running[0].done():
                del self._running[slot]

    async def _claim_and_run(self, slot: tuple[str, str], fingerprint: str,
                             work: Callable[[], Awaitable[Result]],
                             later: list[Settlement] | None, preclaimed: bool,
                             peek: Sequence[tuple[str, str]]) -> Result:
        while True:
            try:
                return await self._claim_and_run_once(slot, fingerprint, work, later,
                                                      preclaimed, peek)
            except ClaimLost:
                preclaimed = False
                # taken over while this try stalled (past DEAD_AFTER): it wrote nothing more,
                # and waits for the new owner's result as a second caller would
                continue

    async def _claim_and_run_once(self, slot: tuple[str, str], fingerprint: str,
                                  work: Callable[[], Awaitable[Result]],
                                  later: list[Settlement] | None, preclaimed: bool,
                                  peek: Sequence[tuple[str, str]]) -> Result:
        scope, key = slot
        ours = self._preclaimed(scope, key) if preclaimed else None
        while True:
            fresh = uuid.uuid4().hex  # (this try's claim's id, should it make one)
            outcome: _Claimed = (("claimed", 1, False) if preclaimed
                                 else await self._take_claim(slot, fingerprint, fresh))
            if outcome[0] == "claimed":
                claim, existed = outcome[1], outcome[2]
                break
            if outcome[0] == "reused":
                raise _reused(key)
            if outcome[0] == "done":
                done: Result = json.loads(outcome[1])
                return done
            # another live replica is at work on it (a client's retry that reached another
            # replica), or this one under the key's name before its office's rename: wait for
            # its result, as a second call on this replica would
            self.claim_waits += 1
            await asyncio.sleep(OTHER_REPLICA_POLL)
        # this try's claim: its owner and number (fencing: a try that stalled past DEAD_AFTER
        # and was taken over records nothing when it wakes), and its id
        ours = ours or (scope, key, self.replica_id, claim, fresh)
        token = _resumed.set(existed)
        fence = _claim.set((self, ours))
        looked = _peeked.set(None)
        self._at_work.add(ours[4])
        ran = False
        try:
            if preclaimed:  # claimed with its delivery, maybe long ago: still ours? (this
                # replica may have been taken for dead meanwhile); what `work` looks at first
                # is read with it (`check_claim` and `left_under`'s first reads in one)
                _peeked.set(await _fence_and_peek(self, ours, peek))
            with counting_writes() as made:
                result = await work()
            ran = True
        except ClaimLost:
            raise  # another's claim now: nothing of this try's is written to the key
        except Exception as exc:  # (cancelled: the replica is stopping; its claims go with it)
            # refused before any forge write, on the key's first try: free again (a try that
            # resumed one may follow an earlier try's writes: it keeps it)
            free = isinstance(exc, VaultmailError) and made[0] == 0 and not existed
            try:
                async with self.transaction() as db:
                    await _let_go_in(db, free, ours)
            except Exception:
                # the store is away too: let go of with the worker's next write (`stray`),
                # or another replica given the key would wait on it while this one lives
                self.let_go_later([(free, ours)])
                raise
            raise
        finally:
            _peeked.reset(looked)
            _claim.reset(fence)
            _resumed.reset(token)
            if not ran:  # (let go of, or left for a later call of this replica to take over)
                self._at_work.discard(ours[4])
        if later is not None:  # recorded by the caller, with what it writes next (`settled`)
            self._unsettled.add(slot)
            later.append((ours, json.dumps(result)))
            return result
        try:
            theirs = await self._record_result(ours, json.dumps(result))
        finally:
            self._at_work.discard(ours[4])
        if theirs is not None:  # taken over while this try stalled: the key keeps theirs
            kept: Result = json.loads(theirs)
            return kept
        return result

    # -- claims --------------------------------------------------------------------------------
    # A key is claimed under its own lock (two replicas claiming it at once look one after the
    # other), in a transaction that first checks this process still is its replica. On SQLite,
    # whose one writer holds every key anyway, the claims asked for while one such transaction
    # waits for its turn or commits are made together in the next (`bot.store.group`), each
    # by the same statements as alone, one after the other.

    async def _take_claim(self, slot: tuple[str, str], fingerprint: str,
                          claim: str) -> _Claimed:
        if self.engine != "sqlite":
            async with self.transaction(_key_lock(*slot)) as db:
                if await id_taken(db, self.replica_id, self.incarnation):
                    raise ReplicaIdTaken(self.retire())  # its claims are another's now
                return await self._claim_in(db, slot, fingerprint, claim)
        group: GroupCommit[tuple[tuple[str, str], str, str], _Claimed] | None
        group = self.__dict__.get("_claims_group")
        if group is None:
            group = self.__dict__["_claims_group"] = GroupCommit(self._write_claims)
        return await group((slot, fingerprint, claim))

    async def _write_claims(self, batch: list[tuple[tuple[str, str], str, str]]
                            ) -> list[_Claimed]:
        async with self.transaction(*sorted({_key_lock(*slot) for slot, _, _ in batch})) as db:
            if await id_taken(db, self.replica_id, self.incarnation):
                raise ReplicaIdTaken(self.retire())  # its claims are another's now
            return [await self._claim_in(db, slot, fingerprint, claim)
                    for slot, fingerprint, claim in batch]

    async def _claim_in(self, db: Any, slot: tuple[str, str], fingerprint: str,
                        claim: str) -> _Claimed:
        """Claim (scope, key) in `db`'s transaction, the claim's id `claim`: ("claimed", its
        attempt, whether an earlier try claimed it), ("done", the stored result), ("reused",
        ...) for a key first used with another fingerprint, or ("wait", ...) while another
        live replica is at it."""
        scope, key = slot
        row = await db.fetchone("SELECT fingerprint, result, owner, attempts, claim FROM"
                                " idempotency WHERE scope=? AND key=?", slot)
        if row is None:
            await db.execute("INSERT INTO idempotency(scope, key, fingerprint,"
                             " claimed_at, owner, claim) VALUES (?,?,?,?,?,?)",
                             (scope, key, fingerprint, time.time(), self.replica_id, claim))
            return ("claimed", 1, False)
        if row[0] != fingerprint:
            return ("reused", 0, True)
        if row[1] is not None:
            return ("done", str(row[1]), True)
        if row[4] in self._at_work:  # this process's try, under its key's name before
            return ("wait", 0, True)
        if not await self._held_elsewhere(db, row[2]):
            # claimed before and never finished (its replica died or restarted): this call
            # takes it over
            attempt = int(row[3]) + 1
            await db.execute("UPDATE idempotency SET attempts=?, claimed_at=?, owner=?, claim=?"
                             " WHERE scope=? AND key=?",
                             (attempt, time.time(), self.replica_id, claim, scope, key))
            return ("claimed", attempt, True)
        return ("wait", 0, True)

    # -- results, committed together ---------------------------------------------------------
    # A finished try's result is written as it always was (under its claim: its owner and
    # attempt, while no result is there), and `once` returns only once it is committed; the
    # results of tries that finish while one such transaction waits for its turn or commits
    # are written together in the next (`bot.store.group`): one write transaction for several
    # keys' results instead of one each. On SQLite only, whose one writer holds every key
    # anyway: grouping there adds no wait, it takes turns away.

    async def _record_result(self, ours: Claim, text: str) -> str | None:
        """Store a finished try's result under its claim, committed when this returns: None,
        or the result another try stored meanwhile (this try's claim was taken over)."""
        if self.engine != "sqlite":
            # writers side by side (PostgreSQL): each result alone, as before, so that no
            # key's row another replica holds (a takeover) keeps other offices' results waiting
            return (await self._write_results([(ours, text)]))[0]
        group: GroupCommit[tuple[Claim, str], str | None] | None
        group = self.__dict__.get("_results_group")
        if group is None:
            group = self.__dict__["_results_group"] = GroupCommit(self._write_results)
        return await group((ours, text))

    async def _write_results(self, batch: list[tuple[Claim, str]]
                             ) -> list[str | None]:
        # each key's row in one order (PostgreSQL: two replicas' batches never wait in a circle)
        order = sorted(range(len(batch)), key=lambda i: batch[i][0])
        answers: list[str | None] = [None] * len(batch)
        async with self.transaction() as db:
            for i in order:
                answers[i] = await _write_result_in(db, *batch[i])
        return answers


# PostgreSQL's `preclaim_in`: the keys' rows inserted in the order given (sorted), where none
# is yet. (parameters: the scope, when, the replica, the keys, fingerprints and claim ids)
PRECLAIM = (
    "INSERT INTO idempotency(scope, key, fingerprint, claimed_at, owner, claim)"
    " SELECT ?::text, k, f, ?::float8, ?::text, c FROM unnest(?::text[], ?::text[], ?::text[])"
    " WITH ORDINALITY AS u(k, f, c, n) ORDER BY n ON CONFLICT DO NOTHING RETURNING key")

# PostgreSQL's `settle_in`, in one statement: each result is written under its claim (`_OURS`:
# its id, owner and attempt, wherever a rename moved its key, while no result is there) where
# no other transaction holds the claim's row now (FOR UPDATE SKIP LOCKED, as
# queue.FINISH_FREE: no wait, so no order to keep). Per claim: `wrote`, or `there` (still
# unfinished and ours, as the statement began: its row is held elsewhere, to be written by a
# later write), or neither (gone, or another try's now: nothing to write). The update finds
# its rows by claim id, which a rename that committed since the statement began keeps.
# (parameters: the claim ids, owners, attempts and results, when)
SETTLE_FREE = (
    "WITH s(claim, owner, attempts, result) AS (SELECT * FROM unnest(?::text[], ?::text[],"
    " ?::bigint[], ?::text[])),"
    " took AS (SELECT i.claim FROM idempotency i JOIN s ON i.claim=s.claim AND i.owner=s.owner"
    " AND i.attempts=s.attempts WHERE i.result IS NULL FOR UPDATE OF i SKIP LOCKED),"
    " wrote AS (UPDATE idempotency i SET result=s.result, done_at=?::float8 FROM s"
    " WHERE i.claim IN (SELECT claim FROM took) AND i.claim=s.claim AND i.owner=s.owner"
    " AND i.attempts=s.attempts AND i.result IS NULL RETURNING i.claim)"
    " SELECT s.claim, s.claim IN (SELECT claim FROM wrote) AS wrote, EXISTS (SELECT 1 FROM"
    " idempotency i WHERE i.claim=s.claim AND i.owner=s.owner AND i.attempts=s.attempts"
    " AND i.result IS NULL) AS there FROM s")


async def _write_result_in(db: Any, ours: Claim, text: str) -> str | None:
    """A finished try's result, under its claim, wherever a rename moved its key: None, or the
    result another try stored meanwhile (this try's claim was taken over while it stalled:
    the key keeps theirs)."""
    changed = await db.execute(f"UPDATE idempotency SET result=?, done_at=? WHERE {_OURS}",
                               (text, time.time(), *_ours(ours)))
    if changed == 0:
        row = await db.fetchone("SELECT result FROM idempotency WHERE scope=? AND key=?",
                                ours[:2])
        if row is not None and row[0] is not None:
            return str(row[0])
    return None


async def _locked_now(db: Any, engine: str, ours: Claim) -> bool:
    """Lock the claim's row (wherever its key is now) for `db`'s transaction unless another
    transaction holds it now (PostgreSQL; SQLite's one writer holds every row): False when it
    is held. A claim whose row is gone, or another try's now, is no one's to wait for (True:
    what follows finds nothing to write)."""
    if engine == "sqlite":
        return True
    row = await db.fetchone(
        f"SELECT EXISTS (SELECT 1 FROM idempotency WHERE {_OURS} FOR UPDATE SKIP LOCKED)"
        f" AS took, EXISTS (SELECT 1 FROM idempotency WHERE {_OURS}) AS there",
        (*_ours(ours), *_ours(ours)))
    return bool(row["took"]) or not row["there"]


async def _let_go_in(db: Any, free: bool, ours: Claim) -> None:
    """A failed try's claim, let go of: deleted when `free`, else left unowned, so that the
    next try, on any replica, takes it over (as from a dead replica) instead of waiting for
    a result no one is at work on."""
    if free:
        await db.execute(f"DELETE FROM idempotency WHERE {_OURS}", _ours(ours))
    else:
        await db.execute(f"UPDATE idempotency SET owner=NULL WHERE {_OURS}", _ours(ours))


def _ours(ours: Claim) -> tuple[str, str, int]:
    """The parameters of `_OURS` for a try's claim."""
    return ours[4], ours[2], ours[3]


def _copy(result: Result) -> Result:
    copied: Result = json.loads(json.dumps(result))
    return copied


def _reused(key: str) -> KeyReused:
    return KeyReused(f"idempotencyKey {key!r} was already used for a call with other "
                     "arguments; use a new key for a new call, the same key only to retry "
                     "the same call")
