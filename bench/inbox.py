"""`list_inbox` latency with a large index, and the cost of many waiting long polls.

On the embedded default's fresh index first: 1,000 real HTTP `list_inbox` long polls from a
client in its own process (the app's memory held, traced; the time from one `notify` to each
answer, each woken poll then computing its inbox), and 1,000 and 10,000 concurrent
`services.notifier.wait_any` calls (what `list_inbox` with `wait` holds: one wait per inbox it
watches): memory held (tracemalloc), and wake-up latency of one waiter among all the others, of
the waiters of 20 people (a comment's most addressees), and of all the rest by one `notify`.
Then `list_inbox` is timed over HTTP (what a caller pays: token check, office config, the tool)
and in-process (`call_tool` with a ready Call: the index work alone) for a person with agents,
a person without, and two agents.

Then the index is filled directly through the store layer (one transaction, executemany in
chunks) to the DESIGN sizes: 1,000,000 comments in 200,000 threads on 10,000 items, one inbox
delivery per comment (the newest 120 unread), 100,000 updates on items and 100,000 mails (1 %
new or in progress, the rest replied or closed); 1.5 % of threads are open (2,000 questions
waiting on someone in the office, 1,000 plain threads). Every row is the office's (`org`, and
each inbox owner scoped to it, as the app writes them); the items are on two repositories,
acme/product, which the office's people and agents can read, and acme/research, which none of
them can: two in three open questions can be shown, the rest are hidden by visibility.
`list_inbox` is timed again, and each index read it makes on its own.

Run: .venv/bin/python -m bench.inbox
(`--list-only`: the filled index's `list_inbox` timings and reads alone, without the waits and
the fresh office: one round of a before/after comparison, run alternately against each tree.)
Targets (DESIGN §6): list_inbox under 10 ms at p99 with a million comments and a hundred
thousand mails in the index; ten thousand waiting `wait` calls held in under 200 MB, each woken
within 50 ms.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import client_main, ms, percentile, run, run_client
from bot.app.embedded import Embedded, start_embedded
from bot.cli.main import collect_as_served
from bot.items import inbox
from bot.items.questions import Option, Question
from bot.items.threads import Answer, ThreadState
from bot.office.visibility import viewer_for
from bot.store import api_tokens, mails
from bot.store import comments as db
from bot.store.offices import scoped
from bot.tools.http import make_call
from bot.tools.polls import PER_TOKEN
from bot.tools.registry import call_tool

ITEMS = 10_000
THREADS = 200_000
PER_THREAD = 5
COMMENTS = THREADS * PER_THREAD
UPDATES = 100_000
MAILS = 100_000
UNREAD = 120  # the newest deliveries are unread
CHUNK = 50_000
CALLS = 100
MIN_CALLS = 5
SERIES_BUDGET = 3.0  # seconds per timed series
WARMUP = 1
TARGET_LIST = 0.010
TARGET_WAKE = 0.050
TARGET_MEMORY = 200 * 2**20

HUMANS = ["human:marco@acme.com", "human:sara@acme.com", "human:lee@acme.com"]
AGENTS = ["agent:scout", "agent:builder", "agent:critic"]
PRINCIPALS = HUMANS + AGENTS
LOGINS = {"human:marco@acme.com": "marco", "human:sara@acme.com": "sara",
          "human:lee@acme.com": "lee", "agent:scout": "scout-bot",
          "agent:builder": "builder-bot", "agent:critic": "critic-bot"}
AGENTS_OF = {"human:marco@acme.com": ["agent:scout", "agent:critic"],
             "human:sara@acme.com": ["agent:builder"], "human:lee@acme.com": []}
KINDS = ["goal", "outcome", "outcome", "outcome", "outcome", "plan", "plan", "plan",
         "evidence", "evidence"]
TIMED = ["human:marco@acme.com", "human:lee@acme.com", "agent:scout", "agent:builder"]
BODY = ("Checked the EU and US price lists against last quarter; the difference is in the "
        "shipping line, not the unit price. Details in the sheet. ")


ORG = "acme"  # every row is the office's (its org), and each inbox owner is scoped to it
# acme/product is a repository the office's people and agents can read; acme/research one none
# of them can: two in three open questions are shown (full pages, `more...` counts), the rest
# hidden
VISIBLE_REPO = "product"


def _ref(i: int) -> str:
    return f"acme/{'product' if i % 3 else 'research'}#{i + 1}"


def _thread_state(t: int) -> str:
    asker = PRINCIPALS[t % 6]
    other = PRINCIPALS[(t + 1 + t // 7 % 5) % 6]
    is_open = _open(t)
    if t % 5:
        state = ThreadState(asker=asker, members={asker: "personal", other: "personal"},
                            resolved=not is_open)
    else:
        question = Question(body="EU or US first?", header="Launch order",
                            options=(Option("EU first", then="book the EU slot"),
                                     Option("US first")))
        answer = None if is_open else Answer(comment=f"c{t * PER_THREAD + 1:010x}", by=other,
                                             at=1.7e9 + t, option="EU first")
        state = ThreadState(asker=asker, members={asker: "personal", other: "personal"},
                            asked=(other,), waiting_on=(other,) if is_open else (asker,),
                            question=question, answer=answer, resolved=not is_open)
    return json.dumps(state.to_json())


PERIOD = 4200  # a thread's asker, other member, kind and openness repeat with this period


def _open(t: int) -> bool:
    return t % 100 == 0 or t % 200 == 3


def _chunks(rows: Iterator[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    chunk: list[tuple[Any, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _items() -> Iterator[tuple[Any, ...]]:
    for i in range(ITEMS):
        kind = KINDS[i % 10]
        agent = AGENTS[i % 3]
        repo, _, number = _ref(i).partition("#")
        yield (_ref(i), repo, int(number), kind, f"Item {i}", "open" if i % 4 else "closed",
               LOGINS[PRINCIPALS[i % 6]], PRINCIPALS[i % 6],
               None if kind == "goal" else _ref(i - i % 10),
               json.dumps([LOGINS[agent]] if kind == "outcome" else []),
               agent if kind != "goal" else None, 1.7e9 + i, ORG)


def _threads(states: dict[int, str]) -> Iterator[tuple[Any, ...]]:
    for t in range(THREADS):
        key = t % PERIOD
        is_q = t % 5 == 0
        yield (f"c{t * PER_THREAD:010x}", _ref(t % ITEMS), _ref(t % ITEMS), PRINCIPALS[t % 6],
               int(is_q), int(_open(t)), None, None, states[key],
               None if not is_q or _open(t) else 1.7e9 + t, 1.7e9 + t, ORG)


DATA = json.dumps({"to": [], "cc": [], "kind": "comment", "option": None, "amend": False,
                   "confirmedWithPerson": False})


def _comments() -> Iterator[tuple[Any, ...]]:
    for c in range(COMMENTS):
        t = c // PER_THREAD
        yield (f"c{c:010x}", _ref(t % ITEMS), f"c{t * PER_THREAD:010x}",
               None if c % PER_THREAD == 0 else f"c{t * PER_THREAD:010x}",
               PRINCIPALS[c % 6], BODY, DATA, 10_000_000 + c, 1.7e9 + c, ORG)


def _deliveries() -> Iterator[tuple[Any, ...]]:
    for c in range(COMMENTS):
        owner = HUMANS[c % 3]
        agents = AGENTS_OF[owner]
        box = "agents" if agents and c % 2 else "you"
        principal = agents[c % len(agents)] if box == "agents" else owner
        read_at = None if c >= COMMENTS - UNREAD else 1.7e9 + c + 60
        yield (scoped(ORG, owner), box, principal, f"c{c:010x}", read_at, 1.7e9 + c, ORG)


def _updates() -> Iterator[tuple[Any, ...]]:
    for u in range(UPDATES):
        yield (_ref(u % ITEMS), "state", PRINCIPALS[u % 6], "closed as done", "{}", 1.7e9 + u,
               ORG)


def _mails() -> Iterator[tuple[Any, ...]]:
    numbers = {a: 0 for a in AGENTS}
    for m in range(MAILS):
        to = AGENTS[m % 3]
        numbers[to] += 1
        sender = HUMANS[m % 3] if m % 2 else AGENTS[(m + 1) % 3]
        state = ("mail:new" if m >= MAILS - 30 else "mail:working" if m % 100 == 1
                 else "mail:replied" if m % 100 < 10 else "mail:closed")
        body = f"Mail {m}: please check the figures."
        yield (f"m-{m:08d}", f"acme/{to.removeprefix('agent:')}-vault", numbers[to],
               f"Subject {m}", body, sender, to, "2025-01-01T00:00:00Z", 0, None, f"m-{m:08d}",
               "k1", hashlib.sha256(body.encode()).hexdigest(), state, 0, 1.7e9 + m, ORG)


TABLES: list[tuple[str, str, int]] = [
    ("items", "INSERT INTO items(ref, repo, number, kind, title, state, author_login, author,"
     " parent, assignees, claim, updated_at, org) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", ITEMS),
    ("threads", "INSERT INTO threads(id, item, scope, asker, is_question, open, card_id,"
     " card_body, state, answered_at, updated_at, org) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
     THREADS),
    ("comments", "INSERT INTO comments(id, item, thread, parent, author, body, data, forge_id,"
     " created_at, org) VALUES (?,?,?,?,?,?,?,?,?,?)", COMMENTS),
    ("inbox_deliveries", "INSERT INTO inbox_deliveries(owner, box, principal, comment, read_at,"
     " created_at, org) VALUES (?,?,?,?,?,?,?)", COMMENTS),
    ("item_updates", "INSERT INTO item_updates(item, kind, actor, summary, data, at, org)"
     " VALUES (?,?,?,?,?,?,?)", UPDATES),
    ("mails", "INSERT INTO mails(mail_id, vault, number, subject, body, from_principal,"
     " to_principal, sent, hops, in_reply_to, thread_id, key_id, body_sha256, state, tampered,"
     " updated_at, org) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", MAILS),
]


async def fill(embedded: Embedded) -> float:
    embedded.forge.add_repo(ORG, VISIBLE_REPO)
    for login in LOGINS.values():
        embedded.forge.set_permission(f"{ORG}/{VISIBLE_REPO}", login, "read")
    states = {k: _thread_state(k) for k in range(PERIOD)}
    rows = {"items": _items(), "threads": _threads(states), "comments": _comments(),
            "inbox_deliveries": _deliveries(), "item_updates": _updates(), "mails": _mails()}
    start = time.perf_counter()
    async with embedded.services.store.transaction() as db:
        for table, sql, _ in TABLES:
            for chunk in _chunks(rows[table]):
                await db.executemany(sql, chunk)
    return time.perf_counter() - start


# -- list_inbox timings -----------------------------------------------------------------------
async def _series(call: Callable[[], Awaitable[object]]) -> list[float]:
    """Time `call` CALLS times after WARMUP, or for SERIES_BUDGET seconds (at least MIN_CALLS)."""
    for _ in range(WARMUP):
        await call()
    out: list[float] = []
    begin = time.perf_counter()
    while len(out) < CALLS and (len(out) < MIN_CALLS
                                or time.perf_counter() - begin < SERIES_BUDGET):
        t = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t)
    return out


async def time_http(embedded: Embedded, session: aiohttp.ClientSession,
                    principal: str) -> list[float]:
    headers = {"Authorization": f"Bearer {embedded.api_tokens[principal]}"}
    url = f"{embedded.app_url}/api/v1/tools/list_inbox"

    async def call() -> None:
        async with session.post(url, json={}, headers=headers) as resp:
            SIZES.setdefault(principal, []).append(len(await resp.read()))
            assert resp.status == 200, resp.status

    SIZES.pop(principal, None)
    return await _series(call)


SIZES: dict[str, list[int]] = {}  # answer bytes of each principal's last HTTP series


async def time_direct(embedded: Embedded, principal: str) -> list[float]:
    call = await make_call(embedded.services, principal)
    return await _series(lambda: call_tool(call, "list_inbox", {}))


async def breakdown(embedded: Embedded, principal: str) -> dict[str, str]:
    """Median time of each index read list_inbox makes (and read: true adds), for one caller."""
    store = embedded.services.store
    call = await make_call(embedded.services, principal)
    office = call.office
    sees = viewer_for(call).visible
    questions = getattr(inbox, "_questions", None)
    who = inbox.Whose.of(office, principal)
    items = await inbox.relevant_items(store, office, who)
    mine = who.everyone
    logins = inbox.logins_of(office, who)
    parts: dict[str, Callable[[], Awaitable[object]]] = {
        # the tree after issue 22's inbox pass reads the repositories, asks visibility, then
        # the four lists' pages in SQL (inbox._questions); the tree before read every open
        # question involving the caller (then visibility hid most of them in Python)
        "open questions for the inbox (the tree before: every one involving the caller; "
        "after: a page of each list, visibility in SQL)": (
            (lambda: questions(store, who, sees)) if questions is not None
            else (lambda: db.open_questions_involving(store, mine, org=who.org))),
        # (one read of both boxes since issue 22's builder pass: db.unread_boxes; before it
        # the unread of both boxes, read apart)
        "unread (both boxes)": (
            (lambda: db.unread_boxes(store, who.owner, you=who.person is not None,
                                     agent=None if principal == who.person else principal,
                                     agents=list(who.agents), org=who.org))
            if hasattr(db, "unread_boxes")
            else lambda: db.unread_in(store, who.owner, ["you", "agents"], org=who.org)),
        "relevant_items (in SQL; list_inbox no longer builds it when the newest updates "
        "fill the page)": lambda: inbox.relevant_items(store, office, who),
        "  of which questions_asked_on": lambda: db.questions_asked_on(store, who.everyone,
                                                                     org=who.org),
        "updates_for (the updates page list_inbox reads)": lambda: db.updates_for(
            store, mine, logins, mine, None, None, inbox.PAGE + 1, org=who.org),
        # (since issue 22's updates pass a person's or agent's page is read by repository:
        # the keys of a page of updates first, then the page's updates by their seqs)
        "  the updates page's first read of keys (seqs and repositories)": lambda:
            db.updates_for(store, mine, logins, mine, None, None, inbox.PAGE + 1,
                           org=who.org, keys=True),
        "mail_waiting (mail:new, quiet)": lambda: asyncio.gather(
            mails.list_mails(store, org="acme", to=principal, state="mail:new"),
            mails.list_mails(store, org="acme", to=principal, state="quiet")),
        "read_page (only with read: true)": lambda: db.read_page(
            store, who.owner, None, inbox.PAGE + 1, org=who.org),
    }
    out: dict[str, str] = {}
    for name, part in parts.items():
        times = []
        for _ in range(5):
            t = time.perf_counter()
            await part()
            times.append(time.perf_counter() - t)
        out[name] = ms(percentile(times, 50))
    out["(relevant items: a count)"] = f"{len(items):,}"
    return out


# -- waits ------------------------------------------------------------------------------------
async def hold_waits(embedded: Embedded, n: int, *, trace: bool) -> dict[str, float]:
    """n concurrent wait_any({person, agent}) on synthetic inboxes, ten waiters per person:
    memory held (traced), then wake-ups: one agent's waiter among all, the waiters of 20
    people (a comment's most addressees), then all the rest by one notify."""
    notifier = embedded.services.notifier
    woken: dict[int, float] = {}
    people = max(1, n // 10)
    persons = [f"human:p{i % people}@bench" for i in range(n)]

    async def waiter(i: int) -> None:
        if await notifier.wait_any({persons[i], f"agent:w{i}"}, 120, org="acme"):
            woken[i] = time.perf_counter()

    gc.collect()
    if trace:
        tracemalloc.start()
    tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
    for _ in range(3000):  # bounded: 30 s
        if notifier.waiting() >= 2 * n:
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError(f"only {notifier.waiting()} of {2 * n} waits registered")
    held = tracemalloc.get_traced_memory()[0] if trace else 0
    if trace:
        tracemalloc.stop()
    first = n // 2 + 1  # its person is p1: not among those woken next
    t = time.perf_counter()
    notifier.notify([f"agent:w{first}"], org="acme")
    await tasks[first]
    one = woken[first] - t
    batch = {f"human:p{k}@bench" for k in range(2, 22)}
    chosen = [i for i in range(n) if persons[i] in batch]
    t = time.perf_counter()
    notifier.notify(batch, org="acme")
    await asyncio.gather(*(tasks[i] for i in chosen))
    twenty = [woken[i] - t for i in chosen]
    t = time.perf_counter()
    notifier.notify(set(persons), org="acme")
    await asyncio.gather(*tasks)
    rest = [w - t for i, w in woken.items() if i != first and i not in set(chosen)]
    assert len(woken) == n, len(woken)
    return {"held": held, "one": one, "twenty_n": len(chosen), "twenty_p99": percentile(
        twenty, 99), "twenty_max": max(twenty), "all_n": len(rest),
        "p50": percentile(rest, 50), "p99": percentile(rest, 99), "max": max(rest)}


async def _polls(spec: dict[str, Any]) -> dict[str, Any]:
    """Client process: spec["n"] concurrent list_inbox long polls; wall time of each answer."""
    answers: list[float] = []
    statuses: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def poll(i: int) -> None:
            token = spec["tokens"][i % len(spec["tokens"])]
            async with session.post(spec["url"], json={"wait": spec["wait"]},
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
                await resp.read()
            answers.append(time.time())
            statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1

        await asyncio.gather(*(poll(i) for i in range(spec["n"])))
    return {"answers": answers, "statuses": statuses}


async def hold_http_polls(embedded: Embedded, n: int, *, trace: bool) -> dict[str, float]:
    """n real HTTP long polls by the three people (no unread left, no mail checks): memory
    held (traced, this process only), then the time from one notify to each answer."""
    notifier = embedded.services.notifier
    async with embedded.services.store.transaction() as tx:  # nothing unread: all must wait
        await tx.execute("UPDATE inbox_deliveries SET read_at=? WHERE read_at IS NULL",
                         (time.time(),))
    gc.collect()
    if trace:
        tracemalloc.start()
    # the polls are three people's: past the cap per person (PER_PRINCIPAL), lifted here,
    # since what is measured is the wake-up of many polls, not the cap (bot.tools.polls)
    embedded.services.long_polls.per_principal = n
    # one token holds at most PER_TOKEN long polls: enough tokens for the three people
    tokens = [await api_tokens.create_token(embedded.services.store, HUMANS[i % len(HUMANS)])
              for i in range(-(-n // PER_TOKEN))]
    start = time.perf_counter()
    client = asyncio.create_task(run_client("bench.inbox", {
        "url": f"{embedded.app_url}/api/v1/tools/list_inbox", "wait": 50, "n": n,
        "tokens": tokens}))
    while notifier.waiting() < n:
        if client.done() or time.perf_counter() - start > 45:
            raise RuntimeError(f"only {notifier.waiting()} of {n} polls waiting")
        await asyncio.sleep(0.05)
    registered = time.perf_counter() - start
    await asyncio.sleep(1.0)  # let the connections settle
    held = tracemalloc.get_traced_memory()[0] if trace else 0
    if trace:
        tracemalloc.stop()
    t = time.time()
    # what a delivery wakes
    notifier.notify([inbox.wake_key(h, "you") for h in HUMANS], org="acme")
    result = await client
    lat = [a - t for a in result["answers"]]
    bad = {s: c for s, c in result["statuses"].items() if s != "200"}
    assert not bad, bad
    return {"held": held, "registered": registered, "p50": percentile(lat, 50),
            "p99": percentile(lat, 99), "max": max(lat)}


OPEN_THREADS = "SELECT count(*) AS n FROM threads WHERE open=1"


async def _count(embedded: Embedded, sql: str) -> int:
    row = await embedded.services.store.fetchone(sql)
    return int(row["n"]) if row else 0


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def _ok(ok: bool) -> str:
    return "OK" if ok else "FAIL"


async def time_list_inbox(embedded: Embedded, index: str) -> list[list[str]]:
    rows = []
    async with aiohttp.ClientSession() as session:
        for principal in TIMED:
            http = await time_http(embedded, session, principal)
            direct = await time_direct(embedded, principal)
            p99 = percentile(http, 99)
            rows.append([
                principal, index, str(len(http)), ms(percentile(http, 50)), ms(p99),
                ms(max(http)),
                f"{len(direct)}: {ms(percentile(direct, 50))} / {ms(percentile(direct, 99))}",
                f"{percentile(SIZES[principal], 50) / 1024:.1f}",
                f"{_ok(p99 < TARGET_LIST)} (<{TARGET_LIST * 1000:.0f} ms)"])
    return rows


async def fresh_office(embedded: Embedded, list_rows: list[list[str]],
                       wait_rows: list[list[str]]) -> float:
    """The waits and list_inbox on the fresh index; the process's peak RSS (MB) after them."""
    traced_polls = await hold_http_polls(embedded, 1_000, trace=True)
    polls = await hold_http_polls(embedded, 1_000, trace=False)
    wait_rows.append([
        f"HTTP list_inbox wait x 1,000 (all waiting {polls['registered']:.1f} s after the "
        "first POST)", f"{traced_polls['held'] / 2**20:.1f}", "-", "-",
        f"{ms(polls['p50'])} / {ms(polls['p99'])} / {ms(polls['max'])}",
        f"{_ok(traced_polls['held'] < TARGET_MEMORY / 10)} memory (x10 < 200 MB); "
        f"{_ok(polls['max'] < TARGET_WAKE)} answers"])
    for n in (1_000, 10_000):
        traced = await hold_waits(embedded, n, trace=True)
        plain = await hold_waits(embedded, n, trace=False)
        wait_rows.append([
            f"notifier.wait_any x {n:,}", f"{traced['held'] / 2**20:.1f}", ms(plain["one"]),
            f"{plain['twenty_n']:.0f}: {ms(plain['twenty_p99'])} / "
            f"{ms(plain['twenty_max'])}",
            f"{plain['all_n']:,.0f}: {ms(plain['p50'])} / {ms(plain['p99'])} / "
            f"{ms(plain['max'])}",
            f"{_ok(traced['held'] < TARGET_MEMORY)} memory; "
            f"{_ok(max(plain['one'], plain['twenty_max']) < TARGET_WAKE)} one and twenty;"
            f" {_ok(plain['max'] < TARGET_WAKE)} all at once"])
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    list_rows += await time_list_inbox(embedded, "fresh (the seeded office)")
    return peak_rss


async def main(list_only: bool = False) -> None:
    embedded = await start_embedded(data_dir=Path(tempfile.mkdtemp()), port=0, forge_port=0)
    # the process collects garbage as `serve` does: with Python's own thresholds, a full
    # collection over the start-up heap and 1,000 held polls (0.2-0.35 s) fell inside about
    # half of the wake-ups measured, which `serve` does not make (bench.polls_profile)
    collect_as_served()
    list_rows: list[list[str]] = []
    wait_rows: list[list[str]] = []
    parts: dict[str, dict[str, str]] = {}
    try:
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if not list_only:  # on the fresh index: the waits (a woken HTTP poll then computes
            # a small inbox), and list_inbox for comparison
            peak_rss = await fresh_office(embedded, list_rows, wait_rows)
        filled = await fill(embedded)
        counts = {t: await _count(embedded, f"SELECT count(*) AS n FROM {t}")
                  for t, _, _ in TABLES}
        open_threads = await _count(embedded, OPEN_THREADS)
        list_rows += await time_list_inbox(embedded, "filled")
        for principal in ("agent:scout", "agent:builder", "human:lee@acme.com"):
            parts[principal] = await breakdown(embedded, principal)
    finally:
        await embedded.stop()
    print("command: .venv/bin/python -m bench.inbox" + (" --list-only" if list_only else "")
          + "\n")
    print("filled index, in one transaction in " + f"{filled:.1f} s: "
          + ", ".join(f"{counts[t]:,} {t}" for t, _, _ in TABLES)
          + f"; {open_threads:,} threads open\n")
    _table(["principal", "index", "HTTP calls", "HTTP p50 ms", "HTTP p99 ms", "HTTP max ms",
            "in-process calls: p50 / p99 ms", "answer KB (median)", "p99 target (HTTP)"],
           list_rows)
    print(f"\nsequential calls after {WARMUP} warm-up, {CALLS} or as many as fit in "
          f"{SERIES_BUDGET:.0f} s (at least {MIN_CALLS}: with that few, p99 is the max); "
          "unread deliveries are marked read by the first call that returns them.\n")
    names = list(next(iter(parts.values())))
    _table(["filled index: each read list_inbox makes (median of 5, ms)", *parts],
           [[name, *(parts[p][name] for p in parts)] for name in names])
    print("\nan agent's list_inbox reads the open questions involving it once, shared by its "
          "boxes, its `inbox` field and its person's counts.\n")
    if list_only:
        return
    _table(["waiters (fresh index)", "held, traced MB", "one woken among all ms",
            "waiters of 20 people: n: p99 / max ms", "all the rest at once: n: p50 / p99 / "
            "max ms", "targets"], wait_rows)
    print(f"\nwait_any waiters watch two inboxes each (a person shared by ten, and their own); "
          "woken = the waiting coroutine resumed, measured from the notify call. HTTP row: "
          "from one notify of the three people to each answer at the client (in its own "
          "process; the traced MB are the app's), each woken poll then computing its inbox; "
          "latencies measured in a second pass without tracemalloc. Peak RSS of the process "
          f"before the fill: {peak_rss:.0f} MB.")


if __name__ == "__main__":
    if "--client" in sys.argv:
        client_main(_polls)
    else:
        run(main(list_only="--list-only" in sys.argv))
