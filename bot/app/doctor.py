"""Anti-entropy (issue 28): writes the forge acknowledged and then lost are found and repaired.

A forge can answer a write and lose it afterwards (a failover to a replica that never had it):
a state label PATCH undone leaves a mail in the wrong state on the forge for good, a comment
removed takes a reply away, and no webhook ever says so. A pass of the doctor compares, for
every vault of every office:

- first, what the forge shows that the index has no word of (an index restored from an old
  backup: the forge is the source of truth and has moved on), caught up from the forge
  (`catch_up_vault`, which the app also runs at start, before serving): a mail on the forge
  the index does not hold is indexed, and a mail the app itself moved after the index's
  last knowledge of it (its last move applied, else its send) takes the forge's state. Such
  a change is never undone;
- each indexed mail's state with its issue's `mail:*` label and open/closed state. When they
  differ and the forge shows no change the index has not taken (no delivery about the issue
  waiting in the queue, and, in the issue's timeline, no state change by anyone but the app
  newer than the mail's last move as the index applied it: `bot.store.moves`), the app's own
  write was lost: the state the index holds is written again. Otherwise the difference is
  flagged, not touched: someone's change whose webhook is still to come must not be undone;
- each reply the ledger holds (`mail.replied` with the reply's key, within `reply_window`)
  against its comment on the mail's issue (the marker `vaultmail:reply DIGEST`, for replies the
  app posted): a comment that vanished is posted again as it was (`bot.store.replies` keeps
  it for the window), else from the reply's copy in the sender agent's vault (its body is the
  reply's words). A reply whose words are kept nowhere is flagged;
- each reply delivered to a vault (a mail the app opened with `in_reply_to`: a reply copy, an
  agent's answer) against its issue: one that vanished is opened again from the index (the
  same signed values, the same mail id, its state's label), the index points at it, and the
  ledger says where it went (`mail.restored`, naming the issue that vanished);
- each adopted mail (an issue a person opened) against its issue's body: one that still shows
  the person's words alone lost the adoption's write, and the signed header is written again
  above them.

Every repair happens under the mail's lock, after looking again (the index and the forge, so
a change made meanwhile wins) and on the forge for an earlier repair's result (a marker), so a
pass run twice, or by two replicas, repairs each thing once. Repairs are forge writes like any
other: the caller paces them within the installation's budget (as the office's turns), and a
pass makes at most `max_repairs` of them in each office and stops early in an office when its
installation's primary budget is below `budget_floor` of its limit (the other offices go on);
the next pass goes on where it stopped.

`vaultmail doctor` runs a pass by hand (`--dry-run`: what it would repair, nothing written);
the leader replica runs one every `VAULTMAIL_DOCTOR_SECONDS` (default 900).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bot.app.background import Background
from bot.app.listing import CATCH_UP_AT_ONCE, catch_up_office
from bot.forge import markers
from bot.forge.errors import ForgeError, NotFound
from bot.forge.pacing import writes_for
from bot.mail.header import (
    adopted_here,
    forge_id,
    headed_by,
    render_mail_body,
    written_body,
)
from bot.mail.mailer import Mailer, fits, keyed_mail_ids, signed_again
from bot.mail.reindex import CLOCK_SKEW, _rank, mail_from_issue
from bot.office.config import Office
from bot.office.source import ROUND_WAIT, OfficeUnanswered
from bot.store import ledger, mails, moves, replies
from bot.store.mails import QUIET, MailRecord
from labels.states import MailState, labels_for

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge, StateChange
    from bot.store import Store

log = logging.getLogger("vaultmail.doctor")
DOCTOR_EVERY = 900.0  # seconds between the leader's passes (VAULTMAIL_DOCTOR_SECONDS)
REPLY_WINDOW = 2 * 86400.0  # replies ledgered this recently have their comment looked for
MAX_REPAIRS = 100  # forge writes one pass makes at most in an office; the next pass goes on
BUDGET_FLOOR = 0.2  # a pass stops early below this share of the primary rate limit left

REPAIRED, WOULD_REPAIR, FLAGGED, SKIPPED = "repaired", "would repair", "flagged", "skipped"
CAUGHT_UP, WOULD_CATCH_UP = "caught up", "would catch up"  # the index behind the forge


@dataclass(frozen=True)
class Finding:
    """One difference between the forge and the index, and what the pass did about it."""

    ref: str
    kind: str  # state | reply comment | reply copy | issue
    forge: str  # what the forge shows
    index: str  # what the index holds
    outcome: str  # repaired | would repair | flagged | skipped
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"ref": self.ref, "kind": self.kind, "forge": self.forge, "index": self.index,
                "outcome": self.outcome, "reason": self.reason}


@dataclass
class DoctorReport:
    offices: int = 0
    vaults: int = 0
    mails: int = 0
    replies: int = 0
    findings: list[Finding] = field(default_factory=list)
    stopped: str | None = None  # why a pass over an office ended early ("org: why; ...")
    busy: bool = False  # another pass held the lock: this one looked at nothing

    def counts(self) -> Counter[str]:
        return Counter(f.outcome for f in self.findings)

    def table(self) -> str:
        """The summary an operator reads: what was looked at, then one line per finding."""
        counts = self.counts()
        behind = [name for name in (CAUGHT_UP, WOULD_CATCH_UP) if counts.get(name)]
        lines = [f"checked: {self.offices} office(s), {self.vaults} vault(s), {self.mails} "
                 f"mail(s), {self.replies} {'reply' if self.replies == 1 else 'replies'}",
                 "  ".join(f"{name}: {counts.get(name, 0)}"
                           for name in (REPAIRED, WOULD_REPAIR, FLAGGED, SKIPPED, *behind))]
        if self.stopped:
            lines.append(f"stopped early: {self.stopped}")
        if self.findings:
            rows = [("mail", "what", "on the forge", "in the index", "outcome", "why")] + [
                (f.ref, f.kind, f.forge, f.index, f.outcome, f.reason) for f in self.findings]
            widths = [max(len(r[i]) for r in rows) for i in range(5)]
            for row in rows:
                lines.append("  ".join(c.ljust(w) for c, w in zip(row[:5], widths, strict=True))
                             + "  " + row[5])
        else:
            lines.append("the forge and the index agree")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {"offices": self.offices, "vaults": self.vaults, "mails": self.mails,
                "replies": self.replies, "counts": dict(self.counts()),
                "stopped": self.stopped, "findings": [f.as_json() for f in self.findings]}


class _Stop(Exception):
    """The pass has spent what it may (repairs, rate budget): the next one goes on."""


LOCK_FILE = "doctor.lock"


@contextlib.contextmanager
def _one_pass_on_this_host(services: Services) -> Iterator[bool]:
    """On SQLite, `vaultmail doctor` is a process beside the app, whose locks it does not
    share: a file lock in the data directory keeps one pass at a time across both (False:
    another pass holds it). PostgreSQL's `named_lock` is shared by every process already."""
    if services.store.engine != "sqlite":
        yield True
        return
    fd = os.open(services.settings.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _label_names(issue: dict[str, Any]) -> list[str]:
    return [str(label["name"]) for label in issue.get("labels", [])]


def _mail_labels(names: list[str]) -> list[str]:
    return sorted(n for n in names if n.strip().lower().startswith("mail:"))


def _wanted(mail: MailRecord) -> tuple[list[str], bool]:
    """The mail labels and open-ness the index says the issue has."""
    if mail.state == QUIET:
        return [], True
    return [mail.state], mail.state != MailState.CLOSED.value


def _shows(issue: dict[str, Any]) -> str:
    return f"{', '.join(_mail_labels(_label_names(issue))) or 'no mail label'}, {issue['state']}"


def _holds(mail: MailRecord) -> str:
    labels, is_open = _wanted(mail)
    return f"{', '.join(labels) or 'no mail label'}, {'open' if is_open else 'closed'}"


def differs(mail: MailRecord, issue: dict[str, Any]) -> bool:
    labels, is_open = _wanted(mail)
    return (_mail_labels(_label_names(issue)) != labels
            or (issue.get("state") == "open") != is_open)


def lost_header(mail: MailRecord, issue: dict[str, Any]) -> bool:
    """An adopted mail whose issue still shows the person's words alone: the adoption's write
    (the signed header above them) was lost. (Words changed since are a person's edit, the
    tamper check's business, not a lost write.)"""
    text = str(issue.get("body") or "")
    return (adopted_here(mail.mail_id, mail.vault, mail.number, forge_id(issue))
            and mail.mail_id not in text and written_body(text) == mail.body)


def _gone(exc: ForgeError) -> bool:
    return isinstance(exc, NotFound) or exc.status in (404, 410)


async def state_changes(forge: Forge, mail: MailRecord) -> list[StateChange]:
    """The issue's closes, reopens and mail label changes, oldest first."""
    return [c for c in await forge.state_changes(mail.vault, mail.number)
            if c.event in ("closed", "reopened") or c.label.lower().startswith("mail:")]


# seconds the forge's clock may be ahead of the index's: an app write the forge dates within
# this of the index's last record of the mail is taken as one the index knew of (so a lost
# write is repaired; an index restored from a backup taken this soon after the mail's last
# move is not caught up for that mail)
RECORDED_MARGIN = 2.0


async def unheard_move(services: Services, mail: MailRecord,
                       changes: list[StateChange]) -> StateChange | None:
    """The forge's latest state change of the mail when it is the app's own and newer than
    anything the index knows of the mail: the index is behind the forge (restored from a
    backup), not the forge behind the index. What the index knows is judged by when it
    recorded it (`mails.recorded_at`, past RECORDED_MARGIN), not by its moves' forge times,
    which are when the person acted: a write that landed late is dated after later moves,
    yet before the index recorded them. None applied: past the send's own labels."""
    app = services.bot_login.lower()
    if not changes or changes[-1].actor != app:
        return None  # (someone's: `Doctor._undecided`)
    applied = await moves.last_move(services.store, mail.mail_id)
    if applied is None:
        sending = itertools.takewhile(lambda c: c.actor == app and c.event == "labeled", changes)
        return changes[-1] if len(list(sending)) < len(changes) else None
    at = moves.forge_time(changes[-1].at)
    recorded = await mails.recorded_at(services.store, mail.mail_id)
    if at is None or recorded is None:
        return None
    return changes[-1] if at > max(applied, recorded + RECORDED_MARGIN) else None


async def catch_up_vault(services: Services, forge: Forge, office: Office, vault: str,
                         issues: list[dict[str, Any]], *, dry_run: bool = False
                         ) -> list[Finding]:
    """The index caught up with what `issues` (of `vault`, as the forge lists them) show that
    it has no word of: a mail the index does not hold is indexed (the original, where two
    issues carry its header: `_rank`), and a mail the app moved after the index's last
    knowledge of it takes the forge's state (`unheard_move`). A mail id the index holds at
    another issue, or an issue another mail holds, is reindex's to settle."""
    best: dict[str, tuple[tuple[int, ...], MailRecord, dict[str, Any]]] = {}
    for issue in issues:
        record = mail_from_issue(vault, issue, services.keyring, app_login=services.bot_login)
        if record is None:
            continue
        rank = _rank(record, issue, None)
        if record.mail_id not in best or rank < best[record.mail_id][0]:
            best[record.mail_id] = (rank, record, issue)
    found: list[Finding] = []
    for _, record, issue in best.values():
        indexed = await mails.get_mail(services.store, record.mail_id)
        if indexed is None:
            if await mails.mail_at(services.store, record.vault, record.number) is None:
                found.append(await _index_unheard(services, Mailer(services, forge, office),
                                                  record, issue, dry_run))
        elif indexed.number == record.number and differs(indexed, issue):
            change = await unheard_move(services, indexed, await state_changes(forge, indexed))
            if change is not None:
                found.append(await _take_state(services, forge, indexed, change, dry_run))
    return [f for f in found if f.outcome != SKIPPED]


async def _index_unheard(services: Services, mailer: Mailer, record: MailRecord,
                         issue: dict[str, Any], dry_run: bool) -> Finding:
    def said(outcome: str) -> Finding:
        return Finding(record.ref, "index", _shows(issue), "not indexed", outcome,
                       "a mail on the forge the index had no word of: indexed from the forge")

    if dry_run:
        return said(WOULD_CATCH_UP)
    # a send this index began and never recorded (stopped between the forge's create and its
    # record): recorded as its sender would, with its `mail.sent` and its run, not as a row
    # alone, which its sender's retry would then find and take as recorded
    if (await mails.send_begun(services.store, record.mail_id)
            and await mailer.record_found(record.vault, issue) is not None):
        return said(CAUGHT_UP)
    async with (services.lock_for(record.mail_id), services.store.transaction(
            mails.box_key(record.org, record.to_principal)) as db):
        if (await mails.get_mail_in(db, record.mail_id)) is not None:
            return said(SKIPPED)
        await mails.put_mail(db, record)
        await moves.note(db, record.mail_id, moves.forge_time(issue.get("updated_at")))
    return said(CAUGHT_UP)


async def _take_state(services: Services, forge: Forge, mail: MailRecord,
                      change: StateChange, dry_run: bool) -> Finding:
    why = (f"the app moved it on the forge ({change.event} {change.label} at {change.at}) "
           "after anything the index knew of it: the forge's state taken, never undone")
    if dry_run:
        return Finding(mail.ref, "state", "?", _holds(mail), WOULD_CATCH_UP, why)
    async with services.lock_for(mail.mail_id):  # as every mover of the mail does: look again
        fresh = await mails.get_mail(services.store, mail.mail_id)
        now = await forge.get_issue(mail.vault, mail.number)
        record = mail_from_issue(mail.vault, now, services.keyring,
                                 app_login=services.bot_login)
        if (fresh is None or record is None or record.mail_id != fresh.mail_id
                or not differs(fresh, now)):
            return Finding(mail.ref, "state", _shows(now), _holds(mail), SKIPPED, why)
        change = await unheard_move(services, fresh, await state_changes(forge, fresh)) or change
        async with services.store.transaction(
                mails.box_key(fresh.org, fresh.to_principal)) as db:
            if not await mails.set_state(db, fresh.mail_id, record.state, _label_names(now),
                                         expected=fresh.state):
                return Finding(mail.ref, "state", _shows(now), _holds(mail), SKIPPED, why)
            await moves.note(db, fresh.mail_id, moves.forge_time(change.at))
    return Finding(mail.ref, "state", _shows(now), _holds(fresh), CAUGHT_UP, why)


async def catch_up_index(services: Services, org: str) -> list[Finding]:
    """`org`'s vaults as the forge lists what changed in them since the index last wrote
    their mail (less CLOCK_SKEW; a vault with none, all of it), caught up (`catch_up_vault`),
    and each finding said in the log."""
    found: list[Finding] = []
    forge = services.forge_for_org(org)
    office = await services.offices.get(forge, org)
    if office is None:
        return found
    written = await mails.last_written(services.store, office.org)
    for vault in office.vaults():
        at = written.get(vault.lower())
        since = None if at is None else datetime.fromtimestamp(at - CLOCK_SKEW, UTC)
        issues = [i async for i in forge.iter_issues(vault, state="all", since=since)]
        found += await catch_up_vault(services, forge, office, vault, issues)
    for finding in found:
        log.warning("the index was behind the forge (restored from a backup?): caught up",
                    extra={"issue": finding.ref, "kind": finding.kind,
                           "forge": finding.forge, "index": finding.index})
    return found


async def catch_up_at_start(services: Services) -> None:
    """At start, beside the serving (never in its way): each office's vaults renamed unheard
    followed (`catch_up_office`), then its index caught up with the forge (`catch_up_index`),
    CATCH_UP_AT_ONCE offices at a time, each office beside the others, so one whose forge is
    slow or failing holds up no other. Until its own is done, only an office's keyed sends
    wait (`Services.catching_up`: 503 catching_up); one that fails is logged and left to the
    doctor's next pass, which catches up the same way before it repairs anything."""
    services.catching_up.update(services.installations)
    turns = asyncio.Semaphore(CATCH_UP_AT_ONCE)

    async def office(org: str) -> None:
        installation = services.installations.get(org)
        try:
            await catch_up_office(services, org, turns)
            async with turns:
                log.info("the index's catch-up with the forge: office begun",
                         extra={"org": org, "installation": installation})
                found = await catch_up_index(services, org)
            log.info("the index's catch-up with the forge: office done", extra={
                "org": org, "installation": installation, "caught_up": len(found)})
        except Exception as exc:  # (its forge, or its config)
            log.warning("the index's catch-up with the forge: office not read", extra={
                "org": org, "installation": installation, "error": repr(exc)})
        finally:
            services.catching_up.discard(org)

    try:
        await asyncio.gather(*(office(org) for org in sorted(services.installations)))
    finally:  # (cancelled at stop: nothing waits for it any more)
        services.catching_up.clear()


class Doctor:
    def __init__(self, services: Services, *, dry_run: bool = False,
                 max_repairs: int = MAX_REPAIRS, reply_window: float = REPLY_WINDOW,
                 budget_floor: float = BUDGET_FLOOR,
                 progress: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.services = services
        self.dry_run = dry_run
        self.max_repairs = max_repairs
        self.reply_window = reply_window
        self.budget_floor = budget_floor
        self.progress = progress or (lambda line: None)
        self.clock = clock
        self._repairs = 0

    @property
    def store(self) -> Store:
        return self.services.store

    async def run(self, orgs: list[str] | None = None) -> DoctorReport:
        """One pass over `orgs` (default: every installation's office)."""
        report = DoctorReport()
        self._repairs = 0
        with _one_pass_on_this_host(self.services) as mine:
            if not mine:
                report.busy = True
                report.stopped = ("another doctor pass is running (the app's, or one by "
                                  "hand): this one looked at nothing")
                return report
            async with self.store.named_lock("doctor"):  # one pass at a time
                await self._offices(report, orgs)
        log.info("doctor pass", extra={"dry_run": self.dry_run, **{
            k: v for k, v in report.as_json().items() if k != "findings"}})
        return report

    async def _offices(self, report: DoctorReport, orgs: list[str] | None) -> None:
        await self.services.follow_index()  # (installs another replica heard of)
        for org in orgs or sorted(self.services.installations):
            forge = self.services.forge_for_org(org)
            try:  # (a read that waits out this office's limits holds no other's pass)
                office = await self.services.offices.get(forge, org, within=ROUND_WAIT)
            except OfficeUnanswered as exc:
                self.progress(f"{org}: {exc}: skipped this pass")
                continue
            if office is None:
                self.progress(f"{org}: no office config: skipped")
                continue
            report.offices += 1
            token = writes_for.set(f"{office.org.lower()}/office")  # the office's turns
            # each office's own repairs a pass, and its own installation's budget: one
            # that sorts first, with lost writes enough, never takes another's pass
            self._repairs = 0
            try:
                await self._office(report, forge, office)
            except _Stop as stop:
                said = f"{org}: {stop}"
                report.stopped = f"{report.stopped}; {said}" if report.stopped else said
            except Exception as exc:  # one office's fault ends its pass, not the others'
                log.exception("doctor pass over an office broke off", extra={"org": org})
                self._found(report, Finding(org, "office", "?", "?", FLAGGED,
                                            f"the pass over this office broke off: {exc!r}"
                                            [:300]))
            finally:
                writes_for.reset(token)
        if not self.dry_run:  # the words of replies past the window are not looked for
            await replies.forget_before(self.store, self.clock() - self.reply_window)

    # -- budget --------------------------------------------------------------------------------
    def _check_budget(self, forge: Forge) -> None:
        rate = getattr(forge, "rate_limit", None)
        if (isinstance(rate, dict) and rate.get("limit")
                and rate["remaining"] < self.budget_floor * rate["limit"]):
            raise _Stop(f"the installation's rate budget is low ({rate['remaining']} of "
                        f"{rate['limit']} requests left): the next pass goes on")

    def _may_repair(self) -> bool:
        if self.dry_run:
            return False
        if self._repairs >= self.max_repairs:
            raise _Stop(f"{self.max_repairs} repairs made: the next pass goes on")
        self._repairs += 1
        return True

    def _found(self, report: DoctorReport, finding: Finding) -> None:
        report.findings.append(finding)
        level = logging.WARNING if finding.outcome == FLAGGED else logging.INFO
        log.log(level, "doctor: %s %s: %s", finding.kind, finding.outcome, finding.reason,
                extra={"issue": finding.ref, "outcome": finding.outcome, "kind": finding.kind,
                       "forge": finding.forge, "index": finding.index})
        self.progress(f"  {finding.ref}: {finding.kind}: {finding.outcome}: {finding.reason}")

    # -- an office -----------------------------------------------------------------------------
    async def _office(self, report: DoctorReport, forge: Forge, office: Office) -> None:
        # the sends begun here and not recorded (a few, those in flight): one indexed so was
        # indexed with no `mail.sent`, which is written in the transaction that ends its send
        begun = await mails.sends_begun(self.store)
        for vault in office.vaults():
            self._check_budget(forge)
            report.vaults += 1
            issues = {int(i["number"]): i async for i in forge.iter_issues(vault, state="all")}
            # before any repair: what the index has no word of is taken, never undone
            caught = await catch_up_vault(self.services, forge, office, vault,
                                          list(issues.values()), dry_run=self.dry_run)
            for finding in caught:
                self._found(report, finding)
            indexed = await mails.list_mails(self.store, org=office.org, vault=vault,
                                             limit=1_000_000)
            self.progress(f"{vault}: {len(indexed)} mail(s), {len(issues)} issue(s)")
            taken = {finding.ref for finding in caught}
            for mail in indexed:
                if mail.ref in taken:  # (a dry run's: said once)
                    report.mails += 1
                    continue
                report.mails += 1
                issue = issues.get(mail.number)
                if issue is None:
                    await self._vanished(report, forge, office, mail)
                    continue
                if mail.mail_id in begun:
                    await self._unledgered(report, forge, office, mail, issue)
                if lost_header(mail, issue):
                    await self._header(report, forge, office, mail)
                if differs(mail, issue):
                    await self._state(report, forge, mail, issue)
        await self._replies(report, forge, office)

    # -- state labels --------------------------------------------------------------------------
    async def _undecided(self, forge: Forge, mail: MailRecord) -> str | None:
        """Why the difference may be a change the index has not taken yet (so it must not be
        undone), or None when the forge shows only the app's own writes since the index's
        last move: the app's latest write was lost."""
        if await self.store.pending_about(mail.ref):
            return "a delivery about it is still to be handled"
        changes = await state_changes(forge, mail)
        ahead = await unheard_move(self.services, mail, changes)
        if ahead is not None:
            return (f"the app moved it on the forge ({ahead.event} {ahead.label} at "
                    f"{ahead.at}) after anything the index knows of it (an index restored "
                    "from a backup?): taken from the forge, never undone")
        app = self.services.bot_login.lower()
        theirs = [c for c in changes if c.actor != app]
        if not theirs:
            return None
        last = theirs[-1]
        at = moves.forge_time(last.at)
        applied = await moves.last_move(self.store, mail.mail_id)
        if applied is not None and at is not None and at <= applied:
            return None  # the index took that change (and moved after it)
        if applied is None and changes and changes[-1] is not last:
            return None  # (no move recorded) the app wrote after that change
        return (f"{last.actor or 'someone'} changed it on the forge ({last.event} at "
                f"{last.at}) after the index's last move: a change not yet "
                "delivered is not undone (the reconciler asks the forge for missed webhooks)")

    async def _state(self, report: DoctorReport, forge: Forge, mail: MailRecord,
                     issue: dict[str, Any]) -> None:
        shows, holds = _shows(issue), _holds(mail)
        why = await self._undecided(forge, mail)
        if why is not None:
            self._found(report, Finding(mail.ref, "state", shows, holds, FLAGGED, why))
            return
        if not self._may_repair():
            self._found(report, Finding(mail.ref, "state", shows, holds, WOULD_REPAIR,
                                        "the app's write was lost: the index's state again"))
            return
        async with self.services.lock_for(mail.mail_id):  # as every mover of the mail does
            fresh = await mails.get_mail(self.store, mail.mail_id)
            now = await forge.get_issue(mail.vault, mail.number)
            if fresh is None or not differs(fresh, now):
                self._found(report, Finding(mail.ref, "state", shows, holds, SKIPPED,
                                            "it agrees now (changed meanwhile)"))
                return
            why = await self._undecided(forge, fresh)  # again: a change made meanwhile wins
            if why is not None:
                self._found(report, Finding(mail.ref, "state", _shows(now), _holds(fresh),
                                            FLAGGED, why))
                return
            current = _label_names(now)
            labels, is_open = _wanted(fresh)
            want = MailState(labels[0]) if labels else None
            fields: dict[str, Any] = {}
            after = labels_for(want, current).apply(current)
            if _mail_labels(current) != labels:
                fields["labels"] = after
            if (now.get("state") == "open") != is_open:
                fields["state"] = "open" if is_open else "closed"
                if not is_open:
                    fields["state_reason"] = "completed"
            await forge.update_issue(fresh.vault, fresh.number, **fields)
        self._found(report, Finding(mail.ref, "state", _shows(now), _holds(fresh), REPAIRED,
                                    "the app's write was lost: the index's state written "
                                    "again"))

    # -- mails indexed with no `mail.sent` ------------------------------------------------------
    async def _unledgered(self, report: DoctorReport, forge: Forge, office: Office,
                          mail: MailRecord, issue: dict[str, Any]) -> None:
        """A row of a send this index began and never recorded, so with no `mail.sent` (a
        release before 44's catch-up indexed a send stopped after its create as a row alone:
        never ledgered, its recipient never woken, mail to an address never emailed). Where
        the issue's signed header is the row's, it is recorded as its sender would have
        (`Mailer.record_unledgered`); else flagged. A row of a send never begun here (caught
        up after a restore from a backup, or reindexed) is as it should be: its ledger has no
        word of it."""
        def said(outcome: str, why: str) -> Finding:
            return Finding(mail.ref, "sent", _shows(issue), "no mail.sent", outcome, why)

        record = mail_from_issue(mail.vault, issue, self.services.keyring,
                                 app_login=self.services.bot_login)
        if record is None or record.tampered or record.mail_id != mail.mail_id:
            self._found(report, said(FLAGGED, (
                "a send begun here, indexed with no mail.sent, and its issue no longer "
                "carries its signed header: not ledgered, its recipient not woken")))
            return
        why = "a send begun here, indexed as a row alone: recorded as its sender would have"
        if not self._may_repair():
            self._found(report, said(WOULD_REPAIR, why))
            return
        done = await Mailer(self.services, forge, office).record_unledgered(mail)
        self._found(report, said(REPAIRED if done else SKIPPED, why))

    # -- adopted mails whose header was lost ---------------------------------------------------
    async def _header(self, report: DoctorReport, forge: Forge, office: Office,
                      mail: MailRecord) -> None:
        if not self._may_repair():
            self._found(report, Finding(mail.ref, "header", "no signed header", "signed",
                                        WOULD_REPAIR, "the adoption's write was lost: the "
                                        "header written again above the person's words"))
            return
        async with self.services.lock_for(mail.mail_id):  # look again: a change meanwhile wins
            fresh = await mails.get_mail(self.store, mail.mail_id)
            now = await forge.get_issue(mail.vault, mail.number)
            if fresh is None or not lost_header(fresh, now):
                self._found(report, Finding(mail.ref, "header", "no signed header", "signed",
                                            SKIPPED, "it agrees now (changed meanwhile)"))
                return
            header = signed_again(self.services.keyring.for_office(office.org), office, fresh)
            await forge.update_issue(fresh.vault, fresh.number, body=fits(
                render_mail_body(header, fresh.body), "the mail, its header added"))
            if (header.key_id, header.body_sha256) != (fresh.key_id, fresh.body_sha256):
                async with self.store.transaction() as db:
                    await mails.put_mail(db, replace(fresh, key_id=header.key_id,
                                                     body_sha256=header.body_sha256))
        self._found(report, Finding(mail.ref, "header", "no signed header", "signed",
                                    REPAIRED, "the adoption's write was lost: the header "
                                    "written again above the person's words"))

    # -- mails whose issue vanished ------------------------------------------------------------
    async def _vanished(self, report: DoctorReport, forge: Forge, office: Office,
                        mail: MailRecord) -> None:
        try:
            await forge.get_issue(mail.vault, mail.number)
            return  # it is there (opened after the listing)
        except ForgeError as exc:
            if not _gone(exc):
                raise
        if not mail.in_reply_to:  # (an adopted mail answers nothing)
            self._found(report, Finding(mail.ref, "issue", "gone", _holds(mail), FLAGGED,
                                        "the mail's issue is gone from the forge; only replies "
                                        "the app delivered are opened again"))
            return
        if not self._may_repair():
            self._found(report, Finding(mail.ref, "reply copy", "gone", _holds(mail),
                                        WOULD_REPAIR, "opened again from the index"))
            return
        async with self.services.lock_for(mail.mail_id):
            fresh = await mails.get_mail(self.store, mail.mail_id)
            if fresh is None or fresh.number != mail.number:
                self._found(report, Finding(mail.ref, "reply copy", "gone", _holds(mail),
                                            SKIPPED, "moved meanwhile"))
                return
            # an earlier repair's (its issue opens with the mail's header: the id elsewhere in
            # a body the app posted is someone's words)
            issue = await forge.find_issue(mail.vault, mail.mail_id, headed_by(mail.mail_id))
            key_id, digest = fresh.key_id, fresh.body_sha256
            if issue is None:
                header = signed_again(self.services.keyring.for_office(office.org), office, fresh)
                key_id, digest = header.key_id, header.body_sha256
                issue = await forge.create_issue(
                    fresh.vault, header.subject, render_mail_body(header, fresh.body),
                    labels=_wanted(fresh)[0], marker=fresh.mail_id,
                    accept=headed_by(fresh.mail_id))
                if not _wanted(fresh)[1]:
                    issue = await forge.update_issue(fresh.vault, int(issue["number"]),
                                                     state="closed", state_reason="completed")
            moved = replace(fresh, number=int(issue["number"]), key_id=key_id,
                            body_sha256=digest)
            async with self.store.transaction(ledger.key(office.org)) as db:
                await mails.put_mail(db, moved)
                # the ledger's `mail.sent` names the issue that vanished: say where it is now
                await ledger.append(db, "mail.restored", "office", moved.ref, {
                    "mail": fresh.mail_id, "was": fresh.ref}, org=office.org)
        self._found(report, Finding(mail.ref, "reply copy", "gone",
                                    _holds(fresh), REPAIRED,
                                    f"opened again as {fresh.vault}#{issue['number']}"))

    # -- reply comments ------------------------------------------------------------------------
    async def _replies(self, report: DoctorReport, forge: Forge, office: Office) -> None:
        rows = await ledger.entries_since(self.store, office.org, "mail.replied",
                                          self.clock() - self.reply_window)
        by_mail: dict[str, list[tuple[str, str]]] = {}
        for row in rows:
            data = json.loads(row["data"])
            key = data.get("reply")
            if isinstance(key, str) and not key.startswith("comment:"):  # the app posted it
                by_mail.setdefault(str(data.get("mail")), []).append((str(row["actor"]), key))
        for mail_id, made in by_mail.items():
            mail = await mails.get_mail(self.store, mail_id)
            if mail is None:
                continue
            self._check_budget(forge)
            report.replies += len(made)
            comments = await forge.list_comments(mail.vault, mail.number)
            bodies = self._app_posted(comments)  # (anyone may write a reply's marker)
            for replier, key in made:
                if not any(markers.is_reply(body, key) for body in bodies):
                    await self._reply_gone(report, forge, office, mail, replier, key)

    async def _reply_copy(self, org: str, replier: str, mail_id: str,
                          key: str) -> MailRecord | None:
        """The copy of reply `key` to `mail_id` in the sender agent's vault, when the mailer
        sent one (`Mailer.reply`: keyed by the reply's key, in `org`'s office)."""
        for copy_id in await keyed_mail_ids(self.services, org, replier,
                                            f"reply\n{mail_id}\n{key}"):
            copy = await mails.get_mail(self.store, copy_id, org=org)
            if copy is not None:
                return copy
        return None

    def _app_posted(self, comments: list[dict[str, Any]]) -> list[str]:
        """The bodies of the comments the app posted."""
        return [str(c.get("body") or "") for c in comments if self.services.by_app(c)]

    async def _reply_gone(self, report: DoctorReport, forge: Forge, office: Office,
                          mail: MailRecord, replier: str, key: str) -> None:
        what = f"reply {key[:12]}"
        marker = markers.reply(key)
        body = await replies.kept(self.store, mail.mail_id, key)
        source = "as it was posted"
        if body is not None:  # (under this release's marker: one kept before ends in the key)
            body = f"{markers.without_reply(body, key)}\n\n{marker}"
        else:
            copy = await self._reply_copy(office.org, replier, mail.mail_id, key)
            if copy is None:
                self._found(report, Finding(mail.ref, "reply comment", "gone", what, FLAGGED,
                                            "the reply's comment is gone from the forge, and "
                                            "its words are kept nowhere else"))
                return
            body, source = f"**{replier}** replied:\n\n{copy.body}\n\n{marker}", \
                f"from its copy {copy.ref}"
        if not self._may_repair():
            self._found(report, Finding(mail.ref, "reply comment", "gone", what, WOULD_REPAIR,
                                        f"posted again {source}"))
            return
        async with self.services.lock_for(f"reply:{mail.mail_id}:{key}"):
            comments = await forge.list_comments(mail.vault, mail.number)
            if any(markers.is_reply(body, key) for body in self._app_posted(comments)):
                self._found(report, Finding(mail.ref, "reply comment", "gone", what, SKIPPED,
                                            "it is there now"))
                return
            await forge.create_comment(mail.vault, mail.number, body, marker=marker)
        self._found(report, Finding(mail.ref, "reply comment", "gone", what, REPAIRED,
                                    f"posted again {source}"))


class DoctorSchedule(Background):
    """The leader's passes, every `every` seconds (as `Reconciler` and `Pruner` run)."""

    task_name = "vaultmail-doctor"

    def __init__(self, services: Services, every: float = DOCTOR_EVERY) -> None:
        self.services = services
        self.every = every
        super().__init__()

    async def run_once(self) -> DoctorReport:
        return await Doctor(self.services).run()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                if await self.services.store.is_leader():  # one replica looks for all
                    await self.run_once()
            except Exception as exc:  # the forge may be down: the next pass tries again
                log.warning("doctor pass failed: %r", exc)
