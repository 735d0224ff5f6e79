"""The fault-injection harness (issues 27 and 28), one fixed seed per engine: a seeded
schedule of SIGKILL/SIGSTOP of the app's processes, forge latency and 502s, webhooks dropped,
duplicated and reordered and (PostgreSQL) a database restart, over a mixed workload of keyed
sends, issues opened and closed by hand and replies; then every accepted mail is one issue, one
label, one index row, one ledger entry, one reply copy where due, the index equals a fresh
reindex and the ledger verifies. Random seeds by hand: `python -m bench.soak`."""

from __future__ import annotations

from pathlib import Path

from tests.harness import runner
from tests.harness.schedule import make_schedule

SEEDS = {"postgresql": 2027, "sqlite": 2028}


def test_the_same_seed_makes_the_same_schedule() -> None:
    for engine in ("postgresql", "sqlite"):
        a = make_schedule(7, engine=engine)
        assert a == make_schedule(7, engine=engine)
        assert a != make_schedule(8, engine=engine)
    sqlite = make_schedule(7, engine="sqlite", faults=40)
    assert sqlite.replicas == 1 and "pg_restart" not in sqlite.fault_counts()
    assert all(f.replica == 0 for _, f in sqlite.faults)


def test_a_schedule_holds_one_process_fault_at_a_time_and_replies_to_what_was_sent() -> None:
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
        for op in s.ops:
            if op.kind == "send":
                sent.add(op.n)
            elif op.kind == "open":
                opened.add(op.n)
            elif op.kind == "reply":
                assert op.target in sent
                sent.discard(op.target)
            else:
                assert op.target in opened
                opened.discard(op.target)


def _faults_really_happened(report: runner.Report) -> None:
    """Processes signalled and the database restarted as often as scheduled; dropped and
    duplicated webhooks at least once each where scheduled (rates and reordering vary)."""
    scheduled = report.schedule.fault_counts()
    for kind in ("kill", "stop", "pg_restart"):
        assert report.fired.get(kind, 0) == scheduled.get(kind, 0), (kind, report.fired)
    for kind in ("drop", "duplicate"):
        if kind in scheduled:
            assert report.fired.get(kind, 0) >= 1, (kind, report.fired)


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
