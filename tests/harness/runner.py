"""Plays a `Schedule` against the local forge and the app's processes (three `vaultmail
serve` replicas on PostgreSQL behind the forge's load balancer, or one on SQLite, killed and
restarted on its data directory): the workload over HTTP by real clients (builder's tools with
idempotency keys, retrying on the next replica; marco and scout on the forge, retrying a 5xx),
the faults at their steps. Then everything is healed, the app settles (its reconciler runs
every half second, dead letters are replayed, `vaultmail doctor` makes a pass) and the
invariants are checked: every accepted mail is one issue with one state label, one index row
and one ledger entry; every reply one copy; the index equals a fresh reindex; the ledger
verifies; every question asked on the run's outcome items is one thread with one card, answered
once (one decision, its card saying so, no one's turn left but its asker's). `Report.failures`
says which mail or question and what was expected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.replicas import Replica
from bot.store import comments as store_comments
from bot.store import ledger, open_store
from localforge import LocalForge
from localforge.faults import RouteFault
from tests import pg
from tests.deployed import deploy
from tests.harness import skewed as skewed_clock
from tests.harness.schedule import Fault, Op, Schedule
from tests.support import free_port

SCOUT, BUILDER = "acme/scout-vault", "acme/builder-vault"
APP_BOT = "vaultmail[bot]"  # the App's installation's account: whose writes `lost` loses
MARCO, SCOUT_AGENT = "human:marco@acme.com", "agent:scout"
OPTIONS = ("Yes", "No")
PER_ITEM = 4  # questions asked on one outcome item (the app lets one asker have 5 open there)
_CARD = re.compile(r"^### (Q\d+)\s*$", re.MULTILINE)  # a question card's header line
SETTLE_WITHIN = 90.0  # a guard: past it the checks run on what is there and report the diff
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=5)  # a client gives up on a hung replica
RETRYABLE = {409, 429, 500, 502, 503, 504}
DOCTOR_AFTER = 2.0  # seconds the forge may differ with nothing queued before a doctor pass


@dataclass
class Expected:
    vault: str
    title: str
    label: str
    why: str  # what put it there (for the diff)
    ledger: dict[str, int] = field(default_factory=dict)  # event -> entries due


@dataclass
class Report:
    schedule: Schedule
    failures: list[str] = field(default_factory=list)
    mails: int = 0
    seconds: float = 0.0
    fired: dict[str, int] = field(default_factory=dict)  # what each kind of fault did
    repaired: int = 0  # what `vaultmail doctor`'s passes repaired while settling

    @property
    def ok(self) -> bool:
        return not self.failures

    def explain(self) -> str:
        return ("\n".join(["fault harness: invariants broken", *self.failures[:60],
                           self.schedule.describe()]))


@dataclass
class Cluster:
    forge: LocalForge
    procs: list[Replica]
    env: dict[str, str]
    database_url: str  # the index (a path for SQLite)
    tokens: dict[str, str]


@contextlib.asynccontextmanager
async def cluster(schedule: Schedule, workdir: Path) -> AsyncIterator[Cluster]:
    ports = [free_port() for _ in range(schedule.replicas)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    deployed = await deploy(f"{urls[0]}/webhook")
    forge = deployed.forge
    forge.faults.seed(schedule.seed)
    forge.webhooks.timeout = 2.0  # a stopped replica holds a delivery this long, no more
    if len(urls) > 1:
        forge.balance(f"{urls[0]}/webhook", [f"{u}/webhook" for u in urls])
    env = {**deployed.env(str(workdir / "data")), "VAULTMAIL_DOCTOR_SECONDS": "3600"}
    if schedule.engine == "postgresql":
        database_url = await pg.fresh_database()
        env["DATABASE_URL"] = database_url
    else:
        database_url = str(workdir / "data" / "index.sqlite3")
    procs = [Replica(f"replica-{n + 1}", url,
                     {**env, "PORT": str(port), "REPLICA_ID": f"replica-{n + 1}"},
                     workdir / f"replica-{n + 1}.log")
             for n, (port, url) in enumerate(zip(ports, urls, strict=True))]
    if schedule.skew is not None:  # that replica's host clock is off, the whole run
        skewed, seconds = procs[schedule.skew[0]], schedule.skew[1]
        skewed.module = "tests.harness.skewed"
        skewed.env[skewed_clock.ENV] = str(seconds)
    deployed.install()
    try:
        await asyncio.gather(*(p.start() for p in procs))
        code, out = await vaultmail(env, "token", "create", "agent:builder", "--org",
                                    deployed.org)
        assert code == 0, out
        yield Cluster(forge, procs, env, database_url,
                      {**deployed.tokens, "api:agent:builder": out.split()[-1]})
    finally:
        for p in procs:
            if p.proc is not None and p.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.proc.send_signal(signal.SIGCONT)
        await asyncio.gather(*(p.kill() for p in procs))
        await forge.stop()
        if schedule.engine == "postgresql":
            await pg.drop_database(database_url)


async def vaultmail(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", *args, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def run(schedule: Schedule, workdir: Path, *, close_unseen: bool = True) -> Report:
    started = time.monotonic()
    async with cluster(schedule, workdir) as c:
        report = await Player(schedule, c, close_unseen).play()
    report.seconds = round(time.monotonic() - started, 1)
    return report


class Player:
    """`close_unseen` (the default): marco closes an issue he opened at its step (by hand, or
    by a `/close` comment), whether or not the app has taken it in: its `opened` delivery may
    have been dropped and come back from the reconciler after the close (issue 28: adoption
    takes the issue as found, and the close waits in the queue for the mail). Off: he waits
    until he sees the issue labelled as mail."""

    def __init__(self, schedule: Schedule, c: Cluster, close_unseen: bool = True) -> None:
        self.schedule, self.c, self.close_unseen = schedule, c, close_unseen
        self.accepted: dict[int, dict[str, Any]] = {}  # send n -> the mail the tool returned
        self.sent: dict[int, asyncio.Task[None]] = {}
        self.opened: dict[int, int] = {}  # open n -> issue number
        self.replied: set[int] = set()  # send n replied to
        self.closed: set[int] = set()  # open n closed
        self.worked: set[int] = set()  # send n scout marked /working
        self.items: list[str] = []  # the outcome items questions are asked on (owner/repo#N)
        self.questions: dict[int, asyncio.Task[None]] = {}  # ask n -> its comment posted
        self.answered: dict[int, str] = {}  # ask n -> the option marco chose
        self.refused: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.heals: dict[int, list[Callable[[], Awaitable[None]]]] = {}
        self.session: aiohttp.ClientSession | None = None
        self.fired: Counter[str] = Counter()  # processes signalled, requests failed, ...
        self.asked: Counter[str] = Counter()  # webhook faults scheduled, by kind
        self.lost: list[RouteFault] = []  # the app's writes to lose, armed
        self.repaired = 0  # what the doctor's passes repaired

    @property
    def s(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    async def play(self) -> Report:
        faults_at: dict[int, list[Fault]] = {}
        for step, fault in self.schedule.faults:
            faults_at.setdefault(step, []).append(fault)
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as self.session:
            asks = sum(op.kind == "ask" for op in self.schedule.ops)
            for k in range(-(-asks // PER_ITEM)):
                item = await self.forge("POST", f"/repos/{SCOUT}/issues", "marco",
                                        {"title": f"Harness outcome {k}", "body": "questions",
                                         "labels": ["outcome"], "assignees": ["scout-bot"]},
                                        201)
                self.items.append(f"{SCOUT}#{item['number']}")
            for step, op in enumerate(self.schedule.ops):
                for heal in self.heals.pop(step, []):
                    await heal()
                for fault in faults_at.get(step, []):
                    await self.inject(step, fault)
                await self.do(op)
            for step in sorted(self.heals):  # heal everything, in the order it was due
                for heal in self.heals.pop(step):
                    await heal()
            await asyncio.wait_for(asyncio.gather(*self.tasks), SETTLE_WITHIN)
            await self.c.forge.webhooks_idle()  # the workload's webhooks met their faults
            for kind, asked in self.asked.items():
                self.fired[kind] += asked - getattr(self.c.forge.faults, kind).count
            if self.lost:
                self.fired["lost"] += sum(route.fired for route in self.lost)
            self.c.forge.faults.clear()
            expected = self.expected()
            await self.settle(expected)
            return await self.check(expected)

    # -- faults ------------------------------------------------------------------------
    async def inject(self, step: int, f: Fault) -> None:
        faults, due = self.c.forge.faults, step + f.span
        heal: Callable[[], Awaitable[None]]
        if f.kind == "kill":
            proc = self.c.procs[f.replica]
            await proc.kill()
            self.fired["kill"] += 1
            heal = proc.start
        elif f.kind == "stop":
            proc = self.c.procs[f.replica]
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGSTOP)
            self.fired["stop"] += 1

            async def heal() -> None:
                assert proc.proc is not None
                proc.proc.send_signal(signal.SIGCONT)
        elif f.kind == "pg_restart":
            outage = pg.outage(self.c.database_url)
            await outage.__aenter__()
            self.fired["pg_restart"] += 1

            async def heal() -> None:
                await outage.__aexit__(None, None, None)
        elif f.kind in ("latency", "forge_error"):
            route = (faults.delay("*", f.delay) if f.kind == "latency"
                     else faults.add("*", status=502, rate=f.rate))

            async def heal() -> None:
                faults.remove(route)
                self.fired[f.kind] += route.fired
        elif f.kind == "lost":  # the app's next write there, whenever: answered, then lost
            self.lost.append(faults.add(f.route, mode="lost", count=1, actor=APP_BOT,
                                        repo=f.repo))
            return
        else:  # webhooks: counted, not timed (the next `count` deliveries, whenever)
            hook = getattr(faults, f.kind)
            {"drop": faults.drop_webhooks, "duplicate": faults.duplicate_webhooks,
             "reorder": faults.reorder_webhooks}[f.kind](count=hook.count + f.count)
            self.asked[f.kind] += f.count
            return
        self.heals.setdefault(due, []).append(heal)

    # -- the workload -------------------------------------------------------------------
    async def do(self, op: Op) -> None:
        if op.kind == "send":
            self.sent[op.n] = self.spawn(self.send(op.n))
        elif op.kind == "open":
            issue = await self.forge("POST", f"/repos/{SCOUT}/issues", "marco",
                                     {"title": f"By hand {op.n}", "body": f"by hand {op.n}"},
                                     201)
            self.opened[op.n] = int(issue["number"])
        elif op.kind == "reply":
            assert op.target is not None
            self.spawn(self.reply(op.target))
        elif op.kind == "working":
            assert op.target is not None
            self.spawn(self.working(op.target))
        elif op.kind == "ask":
            self.questions[op.n] = self.spawn(self.ask(op.n))
        elif op.kind == "answer":
            assert op.target is not None
            self.spawn(self.answer(op.target, OPTIONS[op.n % 2]))
        else:  # close, by hand or by command
            assert op.target is not None
            command = op.kind == "command"
            if self.close_unseen:
                await self.close(op.target, command)
            else:
                self.spawn(self.close_seen(op.target, command))

    async def close(self, n: int, command: bool = False) -> None:
        path = f"/repos/{SCOUT}/issues/{self.opened[n]}"
        if command:
            await self.forge("POST", path + "/comments", "marco",
                             {"body": f"Done with {n}, thanks\n/close"}, 201)
        else:
            await self.forge("PATCH", path, "marco", {"state": "closed"}, 200)
        self.closed.add(n)

    async def close_seen(self, n: int, command: bool = False) -> None:
        """marco closes the mail once he sees it is one (labelled) (see `close_unseen`)."""
        path = f"/repos/{SCOUT}/issues/{self.opened[n]}"
        while True:
            if _state_labels(await self.forge("GET", path, "marco", None, 200)):
                return await self.close(n, command)
            await asyncio.sleep(0.1)  # a person looking again

    async def working(self, n: int) -> None:
        """scout says it is working on send `n`'s mail, by command."""
        await self.sent[n]
        if n not in self.accepted:
            return
        number = self.accepted[n]["number"]
        await self.forge("POST", f"/repos/{SCOUT}/issues/{number}/comments", "scout-bot",
                         {"body": "On it\n/working"}, 201)
        self.worked.add(n)

    async def ask(self, n: int) -> None:
        """scout asks marco question `Q<n>` on an outcome item, with two options."""
        repo, _, number = self.items[n // PER_ITEM].partition("#")
        await self.forge("POST", f"/repos/{repo}/issues/{number}/comments", "scout-bot",
                         {"body": f"to: marco@acme.com\n/ask Shall we do {n}?\nheader: Q{n}\n"
                                  f"- [ ] {OPTIONS[0]}\n- [ ] {OPTIONS[1]}\n"}, 201)

    async def answer(self, n: int, option: str) -> None:
        """marco answers question `Q<n>` once he sees its card (the app took the question
        in), naming it and his option's number."""
        await self.questions[n]
        repo, _, number = self.items[n // PER_ITEM].partition("#")
        path = f"/repos/{repo}/issues/{number}/comments"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WITHIN / 2
        while True:
            cards = await self.forge("GET", path + "?per_page=100", "marco", None, 200)
            if any(f"Q{n}" in _CARD.findall(str(c["body"])) for c in cards):
                break
            if loop.time() > deadline:
                return  # no card to answer: the checks say so
            await asyncio.sleep(0.1)  # a person looking again
        await self.forge("POST", path, "marco",
                         {"body": f"/answer Q{n} {OPTIONS.index(option) + 1}"}, 201)
        self.answered[n] = option

    def spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self.tasks.append(task)
        return task

    async def send(self, n: int) -> None:
        """A client with its key: on no answer or a retryable one, the next replica."""
        headers = {"Authorization": f"Bearer {self.c.tokens['api:agent:builder']}"}
        body = {"to": "scout", "subject": f"Tool {n}", "body": f"body {n}",
                "idempotencyKey": f"harness-{self.schedule.seed}-{n}"}
        turn = n
        while True:
            url = self.c.procs[turn % len(self.c.procs)].url + "/api/v1/tools/mail_send"
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.s.post(url, headers=headers, json=body) as resp:
                    if resp.status == 200:
                        self.accepted[n] = (await resp.json())["mail"]
                        return
                    if resp.status not in RETRYABLE:
                        self.refused.append(f"send {n}: {resp.status} {await resp.text()}")
                        return
            turn += 1
            await asyncio.sleep(0.05)  # a client's back-off before its next try

    async def reply(self, n: int) -> None:
        await self.sent[n]
        if n not in self.accepted:
            return
        number = self.accepted[n]["number"]
        await self.forge("POST", f"/repos/{SCOUT}/issues/{number}/comments", "scout-bot",
                         {"body": f"Reply to {n}"}, 201)
        self.replied.add(n)

    async def forge(self, method: str, path: str, who: str, body: Any, expect: int) -> Any:
        """A person's client on the forge: a 5xx (the forge failing) is tried again."""
        headers = {"Authorization": f"token {self.c.tokens[who]}"}
        for _ in range(50):
            async with self.s.request(method, self.c.forge.url + path, headers=headers,
                                      json=body) as resp:
                if resp.status < 500:
                    assert resp.status == expect, (method, path, resp.status,
                                                   await resp.text())
                    return await resp.json()
        raise AssertionError(f"{method} {path}: the forge kept failing")

    # -- settling ------------------------------------------------------------------------
    def expected(self) -> list[Expected]:
        want = []
        for n in sorted(self.accepted):
            label = ("mail:replied" if n in self.replied else
                     "mail:working" if n in self.worked else "mail:new")
            events = ({"mail.sent": 1} | ({"mail.replied": 1} if n in self.replied else {})
                      | ({"mail.opened": 1} if n in self.worked else {}))
            want.append(Expected(SCOUT, f"Tool {n}", label, f"send {n} (key harness-"
                                 f"{self.schedule.seed}-{n})", events))
            if n in self.replied:
                want.append(Expected(BUILDER, f"Re: Tool {n}", "mail:new",
                                     f"the reply copy of send {n}", {"mail.sent": 1}))
        for n in sorted(self.opened):
            closed = n in self.closed
            want.append(Expected(SCOUT, f"By hand {n}", "mail:closed" if closed else "mail:new",
                                 f"open {n}" + (" then closed" if closed else ""),
                                 {"mail.sent": 1} | ({"mail.closed": 1} if closed else {})))
        return want

    async def issues(self) -> dict[str, list[dict[str, Any]]]:
        """Each vault's issues, less the late duplicates the app closed: a stalled replica's
        create that landed after another replica sent the mail (closed `not_planned`, no
        state label; the mail is the other issue, which the checks then find once)."""
        found = {}
        for vault in (SCOUT, BUILDER):
            listed = await self.forge(
                "GET", f"/repos/{vault}/issues?state=all&per_page=100", "marco", None, 200)
            found[vault] = [i for i in listed if not _closed_duplicate(i)]
        return found

    async def pending(self) -> int:
        total = 0
        for p in self.c.procs:
            async with self.s.get(p.url + "/healthz") as resp:
                total += int((await resp.json())["queue_pending"])
        return total

    async def settle(self, expected: list[Expected]) -> None:
        """Wait (on conditions) until no webhook and no queued delivery is left and the
        forge shows what is expected; dead letters are replayed meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WITHIN
        store = await open_store(self.c.database_url)
        stuck: float | None = None  # since when nothing is queued yet the forge differs
        try:
            while loop.time() < deadline:
                await self.c.forge.webhooks_idle()
                if not await self.pending():
                    if not (_diff_forge(expected, await self.issues())
                            or await self.diff_questions(store)):
                        break
                    await store.replay()  # what ran out of retries while the forge failed
                    stuck = loop.time() if stuck is None else stuck
                    if loop.time() - stuck > DOCTOR_AFTER:  # a write the forge lost?
                        await self.run_doctor()
                        stuck = None
                else:
                    stuck = None
                await asyncio.sleep(0.2)
        finally:
            await store.close()
        await self.run_doctor()
        await self.c.forge.webhooks_idle()
        while loop.time() < deadline:  # what the doctor's repairs queued, handled
            if not await self.pending():
                break
            await asyncio.sleep(0.2)

    async def run_doctor(self) -> None:
        """`vaultmail doctor` by hand, as an operator would: its last pass's exit status is
        checked; what each pass repaired is counted."""
        code, out = await vaultmail(self.c.env, "doctor", "--json")
        self.doctor = (code, out)
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), "{}")
            self.repaired += int(json.loads(line)["result"]["counts"].get("repaired", 0))

    # -- the invariants -------------------------------------------------------------------
    async def check(self, expected: list[Expected]) -> Report:
        report = Report(self.schedule, mails=len(expected),
                        fired=dict(sorted(self.fired.items())), repaired=self.repaired)
        fail = report.failures
        fail += [f"refused: {r}" for r in self.refused]
        code, out = self.doctor
        if code != 0:
            fail.append(f"vaultmail doctor exited {code}: {out[-2000:]}")
        found = await self.issues()
        fail += _diff_forge(expected, found)
        for n, mail in sorted(self.accepted.items()):
            numbers = [i["number"] for i in found[SCOUT] if i["title"] == f"Tool {n}"]
            if numbers and mail["number"] not in numbers:
                fail.append(f"send {n}: the tool answered #{mail['number']}, the forge has "
                            f"it as {numbers}")
        store = await open_store(self.c.database_url)
        try:
            broken = await ledger.verify_chain(store)
            if broken is not None:
                fail.append(f"the ledger's chain breaks at seq {broken}")
            rows = await _mail_rows(store)
            entries = await ledger.entries(store, limit=100000)
            questions = await self.diff_questions(store, entries)
        finally:
            await store.close()
        fail += questions
        fail += _diff_index(expected, found, rows)
        fail += _diff_ledger(expected, found, entries)
        fail += await self.diff_reindex(rows)
        return report

    async def diff_questions(self, store: Any,
                             entries: list[ledger.Entry] | None = None) -> list[str]:
        """Every question asked is one thread on its item with one card on the forge; one
        answered is answered once, by marco with his option (one decision), its card says so,
        and it waits on its asker alone; one not answered waits on marco. With `entries` (the
        ledger), each question and each answer is ledgered once."""
        out: list[str] = []
        cards: dict[str, list[dict[str, Any]]] = {}
        by_header: dict[str, list[store_comments.ThreadRow]] = {}
        decisions: set[str] = set()
        for item in self.items:
            repo, _, number = item.partition("#")
            for c in await self.forge("GET", f"/repos/{repo}/issues/{number}/comments"
                                      "?per_page=100", "marco", None, 200):
                if c["user"]["login"] == "vaultmail[bot]":
                    for header in _CARD.findall(str(c["body"])):
                        cards.setdefault(header, []).append(c)
            for row in await store.fetchall("SELECT * FROM threads WHERE item=?",
                                            (item.lower(),)):
                t = store_comments._thread(row)
                q = t.state.question
                if q is not None and q.header:
                    by_header.setdefault(q.header, []).append(t)
            decisions |= {t.id for t in await store_comments.decisions(
                store, item.lower(), limit=1000)}
        waiting = {str(r["thread"]): str(r["principal"]) for r in await store.fetchall(
            "SELECT thread, principal FROM thread_waiting")}
        for n in sorted(self.questions):
            header = f"Q{n}"
            mine, shown = by_header.get(header, []), cards.get(header, [])
            if len(mine) != 1 or len(shown) != 1:
                out.append(f"ask {n}: expected one thread and one card, found {len(mine)} "
                           f"thread(s) and cards {[c['id'] for c in shown]}")
                continue
            t, card = mine[0], shown[0]
            if t.card_id != card["id"] or t.card_body != card["body"]:
                out.append(f"ask {n}: the card on the forge (#{card['id']}) is not the one "
                           f"the index holds (#{t.card_id}, same body: "
                           f"{t.card_body == card['body']})")
            option = self.answered.get(n)
            answer = t.state.answer
            if option is None:
                if answer is not None or t.state.waiting_on != (MARCO,):
                    out.append(f"ask {n}: never answered, yet {answer} and waiting on "
                               f"{t.state.waiting_on}")
                continue
            if answer is None or answer.by != MARCO or answer.option != option:
                out.append(f"ask {n}: expected marco's answer {option!r}, found {answer}")
            elif (len(t.state.history) > 1 or t.id not in decisions
                  or f"**Answered** by marco: {option}" not in str(card["body"])):
                out.append(f"ask {n}: answered, but history {t.state.history}, decision "
                           f"{t.id in decisions}, card {str(card['body'])[-300:]!r}")
            if t.state.waiting_on != (SCOUT_AGENT,) or waiting.get(t.id) not in (
                    None, SCOUT_AGENT):
                out.append(f"ask {n}: answered, yet waiting on {t.state.waiting_on} "
                           f"(inbox: {waiting.get(t.id)})")
            if entries is not None:
                kinds = Counter(str(e.data.get("kind")) for e in entries
                                if e.event == "comment.added" and e.data.get("thread") == t.id)
                if kinds["question"] != 1 or kinds["answer"] != 1:
                    out.append(f"ask {n}: expected one question and one answer ledgered, "
                               f"found {dict(kinds)}")
        return out

    async def diff_reindex(self, rows: list[tuple[Any, ...]]) -> list[str]:
        if self.schedule.engine == "postgresql":
            fresh = await pg.fresh_database()
        else:
            fresh = "sqlite:///" + str(Path(self.c.database_url).parent.parent
                                       / "reindexed.sqlite3")
        try:
            code, out = await vaultmail({**self.c.env, "DATABASE_URL": fresh}, "reindex")
            if code != 0:
                return [f"vaultmail reindex exited {code}: {out[-2000:]}"]
            store = await open_store(fresh.removeprefix("sqlite:///"))
            try:
                rebuilt = await _mail_rows(store)
            finally:
                await store.close()
        finally:
            if self.schedule.engine == "postgresql":
                await pg.drop_database(fresh)
        if rows == rebuilt:
            return []
        have, want = set(rows), set(rebuilt)
        return ([f"index row not in a fresh reindex: {r}" for r in sorted(have - want)]
                + [f"a fresh reindex has a row the index lacks: {r}"
                   for r in sorted(want - have)]
                + ([] if have != want else ["the index's rows differ in order or count"]))


async def _mail_rows(store: Any) -> list[tuple[Any, ...]]:
    rows = await store.fetchall(
        "SELECT mail_id, vault, number, subject, from_principal, to_principal, hops,"
        " in_reply_to, thread_id, state FROM mails ORDER BY vault, number")
    return [tuple(r) for r in rows]


def _closed_duplicate(issue: dict[str, Any]) -> bool:
    return (issue["state"] == "closed" and issue.get("state_reason") == "not_planned"
            and not _state_labels(issue) and issue["title"].startswith("Tool "))


def _state_labels(issue: dict[str, Any]) -> list[str]:
    return sorted(lb["name"] for lb in issue["labels"] if lb["name"].startswith("mail:"))


def _diff_forge(expected: list[Expected],
                found: dict[str, list[dict[str, Any]]]) -> list[str]:
    out = []
    titles = {(e.vault, e.title) for e in expected}
    for e in expected:
        issues = [i for i in found[e.vault] if i["title"] == e.title]
        if len(issues) != 1:
            out.append(f"{e.why}: expected one issue {e.title!r} in {e.vault}, found "
                       f"{[i['number'] for i in issues]}")
            continue
        labels = _state_labels(issues[0])
        if labels != [e.label]:
            out.append(f"{e.why}: {e.vault}#{issues[0]['number']} expected [{e.label}], "
                       f"has {labels} (the issue {issues[0]['state']})")
    for vault, issues in found.items():
        for i in issues:
            if (vault, i["title"]) not in titles and (
                    i["title"].startswith(("Tool ", "By hand ", "Re: Tool "))):
                out.append(f"{vault}#{i['number']} {i['title']!r}: not a mail anyone sent "
                           "(a send refused or lost to its client, or a copy of no reply)")
    return out


def _number(e: Expected, found: dict[str, list[dict[str, Any]]]) -> int | None:
    issues = [i for i in found[e.vault] if i["title"] == e.title]
    return int(issues[0]["number"]) if len(issues) == 1 else None


def _diff_index(expected: list[Expected], found: dict[str, list[dict[str, Any]]],
                rows: list[tuple[Any, ...]]) -> list[str]:
    out = []
    by_issue = Counter((r[1], r[2]) for r in rows)
    for e in expected:
        number = _number(e, found)
        if number is None:
            continue
        mine = [r for r in rows if (r[1], r[2]) == (e.vault, number)]
        if len(mine) != 1:
            out.append(f"{e.why}: expected one index row for {e.vault}#{number}, found "
                       f"{len(mine)}")
        elif mine[0][9] != e.label:  # the state as its label
            out.append(f"{e.why}: {e.vault}#{number} indexed as {mine[0][9]!r}, expected "
                       f"{e.label}")
    out += [f"{vault}#{number}: {n} index rows" for (vault, number), n in by_issue.items()
            if n > 1]
    return out


def _diff_ledger(expected: list[Expected], found: dict[str, list[dict[str, Any]]],
                 entries: list[ledger.Entry]) -> list[str]:
    out = []
    seen: Counter[tuple[str, str]] = Counter()
    # a reply copy the doctor opened again (its issue lost): its entries follow it there
    moved = {str(e.data.get("was")): e.subject for e in entries if e.event == "mail.restored"}
    for entry in entries:
        subject = entry.subject
        while subject in moved:
            subject = moved[subject]
        if subject != entry.subject:
            entry = replace(entry, subject=subject)
        if entry.event == "mail.sent" and (entry.data.get("follow_up")
                                           or entry.data.get("reopened")):
            continue  # a mail sent again, not a new one
        seen[(entry.event, entry.subject)] += 1
    for e in expected:
        number = _number(e, found)
        if number is None:
            continue
        ref = f"{e.vault}#{number}"
        for event, due in e.ledger.items():
            if seen[(event, ref)] != due:
                out.append(f"{e.why}: expected {due} ledger {event} for {ref}, found "
                           f"{seen[(event, ref)]}: " + json.dumps(
                               [x.as_json() for x in entries if x.subject == ref])[:600])
    return out
