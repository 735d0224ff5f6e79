"""The fault-injection harness (issues 27 and 28), one fixed seed per engine: a seeded
schedule of SIGKILL/SIGSTOP of the app's processes, forge latency and 502s, webhooks dropped,
duplicated and reordered and (PostgreSQL) a database restart, over a mixed workload of keyed
sends, issues opened by hand and closed by hand or by `/close` (whether or not the app has
taken them in yet), replies, `/working`, and questions `/ask`ed and `/answer`ed on an item;
then every accepted mail is one issue, one label, one index row, one ledger entry, one reply
copy where due, the index equals a fresh reindex and the ledger verifies, and every question
is one thread and one card, answered once where answered. On PostgreSQL one replica's host
clock is off for the whole run (seed 2035: 300 s behind); on both engines up to two of the
app's own writes the doctor repairs (a mail's state PATCH, a reply copy's issue) are answered
by the forge and then lost, and `vaultmail doctor` runs while the harness settles. Random seeds
by hand: `python -m bench.soak`."""

from __future__ import annotations

from pathlib import Path

from localforge.faults import Faults
from tests.harness import runner
from tests.harness.schedule import LOST_ROUTES, OP_KINDS, SKEWS, make_schedule

# (seeds whose schedules hold every kind of operation and, on PostgreSQL, a kill, a database
# restart and a dropped webhook; on SQLite a kill, a stop, a drop and reordering)
SEEDS = {"postgresql": 2035, "sqlite": 2028}


def test_the_same_seed_makes_the_same_schedule() -> None:
    for engine in ("postgresql", "sqlite"):
        a = make_schedule(7, engine=engine)
        assert a == make_schedule(7, engine=engine)
        assert a != make_schedule(8, engine=engine)
    sqlite = make_schedule(7, engine="sqlite", faults=40)
    assert sqlite.replicas == 1 and "pg_restart" not in sqlite.fault_counts()
    assert all(f.replica == 0 for _, f in sqlite.faults)


def test_skew_and_lost_writes_are_drawn_apart_and_only_where_they_apply() -> None:
    for seed in range(50):
        pg, lite = make_schedule(seed), make_schedule(seed, engine="sqlite")
        assert pg.skew is not None and 0 <= pg.skew[0] < pg.replicas and pg.skew[1] in SKEWS
        assert lite.skew is None  # one process: its clock is the only one
        for s in (pg, lite):
            lost = [f for _, f in s.faults if f.kind == "lost"]
            assert len(lost) <= 2 and all((f.route, f.repo) in LOST_ROUTES for f in lost)
        # a fault stream with more faults leaves the lost writes and the skew as they were
        more = make_schedule(seed, faults=12)
        assert more.skew == pg.skew
        assert [sf for sf in more.faults if sf[1].kind == "lost"] == [
            sf for sf in pg.faults if sf[1].kind == "lost"]
    assert make_schedule(2035).skew == (1, -300.0)  # CI's seed: the repro


def test_a_lost_fault_loses_only_its_actors_writes() -> None:
    faults = Faults()
    route = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"
    fault = faults.add(route, mode="lost", count=1, actor="vaultmail[bot]",
                       repo="acme/builder-vault")
    template = route.partition(" ")[2]
    assert faults.pick("PATCH", template, "marco", "acme/builder-vault")[1] is None
    assert faults.pick("PATCH", template, "vaultmail[bot]", "acme/scout-vault")[1] is None
    assert faults.pick("PATCH", template, None, None)[1] is None
    assert faults.pick("PATCH", template, "VaultMail[bot]", "acme/builder-vault")[1] is fault
    assert fault.fired == 1 and not faults.routes  # once


def test_a_schedule_holds_one_process_fault_at_a_time_and_replies_to_what_was_sent() -> None:
    kinds: set[str] = set()
    for seed in range(50):
        s = make_schedule(seed, faults=12)
        held: set[int] = set()
        for step, f in s.faults:
            if f.kind in ("kill", "stop", "pg_restart"):
                steps = set(range(step, step + f.span + 1))
                assert not steps & held, s.describe()
                held |= steps
        sent: set[int] = set()
        opened: set[int] = set()
        asked: set[int] = set()
        for op in s.ops:
            kinds.add(op.kind)
            if op.kind == "send":
                sent.add(op.n)
            elif op.kind == "open":
                opened.add(op.n)
            elif op.kind == "ask":
                asked.add(op.n)
            elif op.kind in ("reply", "working"):
                assert op.target in sent
                sent.discard(op.target)
            elif op.kind == "answer":
                assert op.target in asked
                asked.discard(op.target)
            else:
                assert op.kind in ("close", "command") and op.target in opened
                opened.discard(op.target)
    assert kinds == set(OP_KINDS), "every kind of operation is scheduled"


def _faults_really_happened(report: runner.Report) -> None:
    """Processes signalled and the database restarted as often as scheduled; dropped and
    duplicated webhooks at least once each where scheduled (rates and reordering vary); no
    more writes lost than scheduled (one may find no write of the app's to lose after it)."""
    scheduled = report.schedule.fault_counts()
    for kind in ("kill", "stop", "pg_restart"):
        assert report.fired.get(kind, 0) == scheduled.get(kind, 0), (kind, report.fired)
    for kind in ("drop", "duplicate"):
        if kind in scheduled:
            assert report.fired.get(kind, 0) >= 1, (kind, report.fired)
    assert report.fired.get("lost", 0) <= scheduled.get("lost", 0), report.fired


async def test_fault_schedule_on_three_postgresql_replicas(tmp_path: Path) -> None:
    schedule = make_schedule(SEEDS["postgresql"], engine="postgresql", steps=24, faults=8)
    report = await runner.run(schedule, tmp_path)
    assert report.ok, report.explain()
    _faults_really_happened(report)


async def test_fault_schedule_on_one_sqlite_process(tmp_path: Path) -> None:
    schedule = make_schedule(SEEDS["sqlite"], engine="sqlite", steps=24, faults=8)
    report = await runner.run(schedule, tmp_path)
    assert report.ok, report.explain()
    _faults_really_happened(report)
