"""The harness's plan, sans I/O: from a seed, a mixed workload (one operation a step) and the
faults that start at given steps, each lasting a number of steps. The same seed gives the same
schedule; nothing here touches a process, a socket or a clock."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Literal

Engine = Literal["postgresql", "sqlite"]
OpKind = Literal["send", "open", "reply", "close"]
FaultKind = Literal["kill", "stop", "latency", "forge_error", "drop", "duplicate", "reorder",
                    "pg_restart"]

OP_KINDS: tuple[OpKind, ...] = ("send", "open", "reply", "close")
# faults on a process (SIGKILL then a restart, SIGSTOP then SIGCONT) and the database's
# restart hold one at a time: on PostgreSQL some replica always lives to take the work
PROCESS_FAULTS: tuple[FaultKind, ...] = ("kill", "stop", "pg_restart")
FORGE_FAULTS: tuple[FaultKind, ...] = ("latency", "forge_error", "drop", "duplicate",
                                       "reorder")


@dataclass(frozen=True)
class Op:
    """One step of the workload. send: agent builder mails scout through the tools (key
    `harness-<n>`, the client retrying on the next replica); open: marco opens an issue in
    scout's vault by hand; reply: scout comments on send `target`'s issue (a reply copy is due
    in builder's vault); close: marco closes open `target`'s issue."""

    kind: OpKind
    n: int  # its number among operations of its kind
    target: int | None = None


@dataclass(frozen=True)
class Fault:
    """Starts before the workload step it is scheduled at, healed before step + `span`
    (webhook faults: once they have fired, or when the workload is done). `replica`: the
    process (kill, stop); `count`: how many webhooks (drop, duplicate, reorder); `rate`: the
    share of forge requests failed with 502 (forge_error); `delay`: seconds added to every
    forge request (latency)."""

    kind: FaultKind
    span: int = 1
    replica: int = 0
    count: int = 0
    rate: float = 0.0
    delay: float = 0.0


@dataclass(frozen=True)
class Schedule:
    seed: int
    engine: Engine
    replicas: int
    ops: tuple[Op, ...]
    faults: tuple[tuple[int, Fault], ...]  # (step, fault), by step

    def fault_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for _, f in self.faults).items()))

    def op_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(o.kind for o in self.ops).items()))

    def describe(self) -> str:
        lines = [f"seed {self.seed} on {self.engine} with {self.replicas} process(es)"]
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
    rng = random.Random(seed)
    procs = replicas if replicas is not None else (3 if engine == "postgresql" else 1)
    ops = _workload(rng, steps)
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
    planned.sort(key=lambda sf: (sf[0], sf[1].kind))
    return Schedule(seed, engine, procs, tuple(ops), tuple(planned))


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
    for _ in range(steps):
        choices: list[OpKind] = ["send", "send", "open"]
        if sends:
            choices.append("reply")
        if opens:
            choices.append("close")
        kind = rng.choice(choices)
        target: int | None = None
        if kind == "reply":
            target = sends.pop(rng.randrange(len(sends)))  # each mail replied to once
        elif kind == "close":
            target = opens.pop(rng.randrange(len(opens)))  # each closed once
        op = Op(kind, n[kind], target)
        n[kind] += 1
        if kind == "send":
            sends.append(op.n)
        elif kind == "open":
            opens.append(op.n)
        ops.append(op)
    return ops
