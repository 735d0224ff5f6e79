"""The harness's plan, sans I/O: from a seed, a mixed workload (one operation a step) and the
faults that start at given steps, each lasting a number of steps. The same seed gives the same
schedule; nothing here touches a process, a socket or a clock."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Literal

Engine = Literal["postgresql", "sqlite"]
OpKind = Literal["send", "open", "reply", "close", "command", "working", "ask", "answer"]
FaultKind = Literal["kill", "stop", "latency", "forge_error", "drop", "duplicate", "reorder",
                    "pg_restart", "lost"]

OP_KINDS: tuple[OpKind, ...] = ("send", "open", "reply", "close", "command", "working", "ask",
                                 "answer")
# faults on a process (SIGKILL then a restart, SIGSTOP then SIGCONT) and the database's
# restart hold one at a time: on PostgreSQL some replica always lives to take the work
PROCESS_FAULTS: tuple[FaultKind, ...] = ("kill", "stop", "pg_restart")
FORGE_FAULTS: tuple[FaultKind, ...] = ("latency", "forge_error", "drop", "duplicate",
                                       "reorder")
# the app's writes a `lost` fault may lose (the forge answers, then undoes it): those
# `vaultmail doctor` repairs, (route, repository or None for any): a mail's state (labels,
# open or closed) as the app PATCHes it, and a reply copy's issue in builder's vault (the
# app's create of a mail in scout's vault it does not open again: that is the sender's)
LOST_ROUTES: tuple[tuple[str, str | None], ...] = (
    ("PATCH /repos/{owner}/{repo}/issues/{issue_number}", None),
    ("PATCH /repos/{owner}/{repo}/issues/{issue_number}", None),
    ("POST /repos/{owner}/{repo}/issues", "acme/builder-vault"),
)
# a replica's host clock off for the whole run (PostgreSQL): behind by up to 5 minutes, or
# ahead by at most what GitHub's JWT check tolerates (exp = iat + 10 min, iat 60 s back:
# a clock more than 60 s ahead mints an exp more than 10 minutes ahead, refused; the local
# forge refuses one 90 s ahead too). In this order CI's seed 2035 draws 300 s behind, the
# repro of issue 28.
SKEWS: tuple[float, ...] = (-120.0, -45.0, -300.0, 30.0, 60.0)


@dataclass(frozen=True)
class Op:
    """One step of the workload. send: agent builder mails scout through the tools (key
    `harness-<n>`, the client retrying on the next replica); open: marco opens an issue in
    scout's vault by hand; reply: scout comments on send `target`'s issue (a reply copy is due
    in builder's vault); close: marco closes open `target`'s issue; command: marco comments
    `/close` on open `target`'s issue instead; working: scout comments `/working` on send
    `target`'s issue (mail:working); ask: scout `/ask`s marco question `Q<n>` with two options
    on an outcome item of the run's (four to an item); answer: marco `/answer`s ask `target`
    once he sees its card."""

    kind: OpKind
    n: int  # its number among operations of its kind
    target: int | None = None


@dataclass(frozen=True)
class Fault:
    """Starts before the workload step it is scheduled at, healed before step + `span`
    (webhook faults: once they have fired, or when the workload is done). `replica`: the
    process (kill, stop); `count`: how many webhooks (drop, duplicate, reorder); `rate`: the
    share of forge requests failed with 502 (forge_error); `delay`: seconds added to every
    forge request (latency); `route` (and `repo`, where only there): the next of the app's
    own writes there is answered and then lost (lost; armed at its step until the workload
    is done, `span` unused)."""

    kind: FaultKind
    span: int = 1
    replica: int = 0
    count: int = 0
    rate: float = 0.0
    delay: float = 0.0
    route: str = ""
    repo: str | None = None


@dataclass(frozen=True)
class Schedule:
    seed: int
    engine: Engine
    replicas: int
    ops: tuple[Op, ...]
    faults: tuple[tuple[int, Fault], ...]  # (step, fault), by step
    # (process, seconds): that replica's wall clock is off by this much the whole run
    skew: tuple[int, float] | None = None

    def fault_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for _, f in self.faults).items()))

    def op_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(o.kind for o in self.ops).items()))

    def describe(self) -> str:
        lines = [f"seed {self.seed} on {self.engine} with {self.replicas} process(es)"
                 + (f", replica {self.skew[0] + 1}'s clock off by {self.skew[1]:+.0f} s"
                    if self.skew else "")]
        at = dict[int, list[Fault]]()
        for step, fault in self.faults:
            at.setdefault(step, []).append(fault)
        for step, op in enumerate(self.ops):
            for fault in at.get(step, []):
                lines.append(f"  step {step}: fault {fault}")
            lines.append(f"  step {step}: {op.kind} {op.n}"
                         + (f" (target {op.target})" if op.target is not None else ""))
        return "\n".join(lines)


def make_schedule(seed: int, *, engine: Engine = "postgresql", steps: int = 24,
                  faults: int = 8, replicas: int | None = None) -> Schedule:
    # the workload and the faults are drawn apart: a new kind of operation leaves a seed's
    # faults as they were
    rng = random.Random(f"faults {seed}")
    procs = replicas if replicas is not None else (3 if engine == "postgresql" else 1)
    ops = _workload(random.Random(seed), steps)
    kinds = list(FORGE_FAULTS) + ["kill", "stop"] + (
        ["pg_restart"] if engine == "postgresql" else [])
    planned: list[tuple[int, Fault]] = []
    busy: set[int] = set()  # steps a process fault or a database restart already holds
    for _ in range(faults):
        kind = rng.choice(kinds)
        step = rng.randrange(0, max(1, steps - 1))
        span = rng.randint(1, 3)
        if kind in PROCESS_FAULTS:
            held = set(range(step, step + span + 1))
            if held & busy:
                kind = rng.choice(FORGE_FAULTS)  # one process fault at a time
            else:
                busy |= held
        planned.append((step, _fault(rng, kind, span, procs)))
    # skew and lost writes each from a stream of their own: a seed's workload and its other
    # faults stay as they were before these were added
    lost = random.Random(f"lost {seed}")
    for _ in range(lost.randint(0, 2)):
        route, repo = lost.choice(LOST_ROUTES)
        planned.append((lost.randrange(0, max(1, steps - 1)), Fault("lost", route=route,
                                                                    repo=repo)))
    skew: tuple[int, float] | None = None
    if engine == "postgresql" and procs > 1:  # one process on SQLite: it is the only clock
        clock = random.Random(f"skew {seed}")
        skew = (clock.randrange(procs), clock.choice(SKEWS))
    planned.sort(key=lambda sf: (sf[0], sf[1].kind))
    return Schedule(seed, engine, procs, tuple(ops), tuple(planned), skew)


def _fault(rng: random.Random, kind: FaultKind, span: int, procs: int) -> Fault:
    if kind in ("kill", "stop"):
        return Fault(kind, span=span, replica=rng.randrange(procs))
    if kind in ("drop", "duplicate", "reorder"):
        return Fault(kind, span=span, count=rng.randint(1, 4))
    if kind == "forge_error":
        return Fault(kind, span=span, rate=rng.choice((0.1, 0.2, 0.3)))
    if kind == "latency":
        return Fault(kind, span=span, delay=rng.choice((0.02, 0.05, 0.1)))
    return Fault(kind, span=span)


def _workload(rng: random.Random, steps: int) -> list[Op]:
    ops: list[Op] = []
    sends: list[int] = []
    opens: list[int] = []
    n: Counter[str] = Counter()
    asks: list[int] = []
    for _ in range(steps):
        choices: list[OpKind] = ["send", "send", "open", "ask"]
        if sends:
            choices += ["reply", "working"]
        if opens:
            choices += ["close", "command"]
        if asks:
            choices.append("answer")
        kind = rng.choice(choices)
        target: int | None = None
        if kind in ("reply", "working"):  # each mail replied to or worked on, once
            target = sends.pop(rng.randrange(len(sends)))
        elif kind in ("close", "command"):  # each closed once, by hand or by command
            target = opens.pop(rng.randrange(len(opens)))
        elif kind == "answer":  # each question answered once
            target = asks.pop(rng.randrange(len(asks)))
        op = Op(kind, n[kind], target)
        n[kind] += 1
        if kind == "send":
            sends.append(op.n)
        elif kind == "open":
            opens.append(op.n)
        elif kind == "ask":
            asks.append(op.n)
        ops.append(op)
    return ops
