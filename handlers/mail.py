"""Mail in the forge by hand: issues opened in a vault, closed, reopened, relabelled, edited."""

from __future__ import annotations

import time

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.app.routing import OrderedRouter
from bot.errors import VaultmailError
from bot.items.model import kind_of, type_names
from bot.mail.header import parse_mail_body
from bot.mail.mailer import Mailer
from bot.store import ledger, mails, moves
from bot.store.mails import QUIET, MailRecord
from bot.store.queue import issue_key
from handlers.common import Scene, scene
from labels.states import LabelReview, MailState, labels_for, review_label_change

router = OrderedRouter()
own_router = OrderedRouter()

_LEDGER_FOR = {MailState.NEW: "mail.sent", MailState.WORKING: "mail.opened",
               MailState.REPLIED: "mail.replied", MailState.CLOSED: "mail.closed"}
# An `issues.opened` handled within this many seconds of the issue's making may be taken as
# delivered (`opened_just_now`); the reconciler's redeliveries come minutes later
FRESH_OPENING = 10.0


@router.register("issues", action="opened")
async def adopt_issue_as_mail(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    if s is None or s.office.agent_for_vault(s.repo) is None:
        return
    if kind_of(s.labels, s.issue, type_names(s.office)) is not None:
        return  # goals, outcomes, plans and evidence (by label or issue type) are items
    key = issue_key(event.data)
    current = await opened_just_now(s, key)
    try:
        await s.mailer.adopt(s.repo, s.issue, s.actor, as_delivered=current)
    except VaultmailError as exc:
        await s.refuse(exc, f"this issue cannot become mail: {exc.message}")
        await ctx.forge.update_issue(s.repo, s.number, state="closed",
                                     state_reason="not_planned")
        return
    # what came about the issue before its opening did (that delivery was missing) runs now;
    # none did when nothing else about it was waiting
    if key is None or current:
        return
    unparked = 0
    for waiting in _keys(s, key):
        unparked += await ctx.services.store.unpark(waiting)
    if unparked:
        ctx.log.info("deliveries that waited for this mail run now", extra={
            "issue": s.ref, "unparked": unparked})


async def opened_just_now(s: Scene, key: str | None) -> bool:
    """Whether this `issues.opened` delivery describes the issue as the forge has it now, so
    adoption may take it as delivered instead of reading the issue first (one request less a
    mail, the forge's most frequent event).

    It does when it is handled within `FRESH_OPENING` seconds of the issue's making (by the
    forge's clock and ours), shows the issue open and unchanged since it was made, is not a
    retry, and nothing else about the issue has arrived. (What it says of the issue is the
    forge's: a GitHub App's delivery is signed by GitHub; one an org's admins sign, on Gitea,
    has its issue read back from the forge before any handler sees it, bot.app.org_signed.)
    A late opening (dropped, then redelivered by the reconciler; issue 28) or one whose issue
    changed since reads the forge first. What is left, a change made between the issue's
    making and the adoption's write (up to `FRESH_OPENING` seconds here; the moment between a
    read and the write otherwise) whose own delivery is late or lost, the write undoes; that
    delivery, when it comes (the reconciler's redelivery of a lost one), makes a label change
    again (`Mailer.undone_by_adoption`) and puts an edit of title or body back in view as its
    editor's, unsigned, the mail flagged (`Mailer.edited`): nothing is lost, and nothing is
    signed that its sender did not send."""
    issue = s.issue
    made = moves.forge_time(issue.get("created_at"))
    if (made is None or key is None or s.ctx.retry or issue.get("state") != "open"
            or issue.get("updated_at") != issue.get("created_at")
            or abs(time.time() - made) > FRESH_OPENING):
        return False
    for about in _keys(s, key):
        if await s.ctx.services.store.others_about(about, s.ctx.delivery_id):
            return False
    return True


def _keys(s: Scene, key: str) -> list[str]:
    """The queue's keys of the issue a delivery keyed `key` is about: its own, and the name
    the issue's repository has now (`s.ref`). One sent before its vault's rename names the
    old name; the others about the issue may name the new one (sent since, or their queue
    rows renamed with the vault: bot.store.offices.rename_vault_in)."""
    return list(dict.fromkeys((key, s.ref)))


def wait_for_mail(s: Scene, why: str) -> None:
    """A delivery about an issue that is not mail (yet): if the issue may still become mail
    (a vault's, not an item, not the app's own), its `issues.opened` delivery may be missing
    and come later (dropped, then redelivered by the reconciler; issue 28), so this delivery
    is parked until the issue is adopted rather than dropped (`HandlerContext.park`). One
    about an issue that never becomes mail stays parked until pruned."""
    if s.office.agent_for_vault(s.repo) is None or s.issue.get("pull_request"):
        return
    if kind_of(s.labels, s.issue, type_names(s.office)) is not None:
        return  # an item: never adopted
    user = s.issue.get("user")
    if isinstance(user, dict) and user.get("login") == s.ctx.services.bot_login:
        return  # the app's own issue: recorded by its sender (or its own `opened`)
    s.ctx.park(why)


async def _still(s: Scene, state: str, action: str) -> list[str] | None:
    """The issue's labels now, when the forge says it is still `state`; else None, and the
    delivery ends here as stale: a replay (a captured body under a new delivery id) or an
    event overtaken since must not move the mail back."""
    fresh = await s.ctx.forge.get_issue(s.repo, s.number)
    if fresh.get("state") == state:
        return [str(label["name"]) for label in fresh.get("labels", [])]
    s.ctx.log.info("stale delivery: the issue is not %s any more", state, extra={
        "outcome": "stale", "issue": s.ref, "event_action": action,
        "issue_state": fresh.get("state")})
    return None


@router.register("issues", action="closed")
async def close_mail(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is None or mail is None:
        if s is not None:
            wait_for_mail(s, "closed before it was adopted")
        return
    labels = await _still(s, "closed", "closed")
    if labels is None:
        return
    try:
        await s.mailer.close(mail, s.actor, issue_closed=True, labels=labels,
                             at=moves.forge_time(s.issue.get("closed_at")
                                                 or s.issue.get("updated_at")))
    except VaultmailError as exc:
        await ctx.forge.update_issue(s.repo, s.number, state="open")
        await s.refuse(exc)


@router.register("issues", action="reopened")
async def reopen_mail(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is None or mail is None:
        if s is not None:
            wait_for_mail(s, "reopened before it was adopted")
        return
    labels = await _still(s, "open", "reopened")
    if labels is None:
        return
    if not s.mailer.may_manage(s.actor, mail):
        await ctx.forge.update_issue(s.repo, s.number, state="closed")
        await s.refuse(await s.mailer.deny(s.actor, mail.ref, (
            f"{s.actor} may not reopen {mail.ref}: write to it instead, or ask its sender")))
        return
    await s.mailer.reopened(mail, s.actor, labels=labels,
                            at=moves.forge_time(s.issue.get("updated_at")))


@router.register("issues", action="labeled")
@router.register("issues", action="unlabeled")
async def review_hand_made_label_change(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is None or mail is None:
        return
    fresh = await ctx.forge.get_issue(s.repo, s.number)  # the newest label set, not the event's
    # made just before the adoption's write, which undid it: made again
    redo = await s.mailer.undone_by_adoption(mail, s.issue, str(event.data.get("action")),
                                             str((event.data.get("label") or {}).get("name")))
    labels = redo.apply(str(label["name"]) for label in fresh.get("labels", []))
    previous = None if mail.state == QUIET else MailState(mail.state)
    review = review_label_change(previous, labels)
    if review.accepted and review.state not in (None, previous):
        refusal = _who_may_set(s.mailer, s.actor, mail, review.state)
        if refusal is not None:  # a legal move, but not this person's to make
            await s.mailer.deny(s.actor, mail.ref, refusal)
            review = LabelReview(previous, False, refusal, labels_for(previous, labels))
    fields: dict[str, object] = {}
    if not (review.changes.empty and redo.empty):
        fields["labels"] = review.changes.apply(labels)
    # the issue's open/closed state follows a label that moves the mail; a change that moves
    # none leaves it: the index's state may be behind a close or reopen still on its way
    if review.accepted and review.state not in (None, previous):
        is_open = fresh.get("state") == "open"
        if review.state is MailState.CLOSED and is_open:
            fields.update(state="closed", state_reason="completed")
        elif review.state is not MailState.CLOSED and not is_open:
            fields["state"] = "open"
    if fields:
        await ctx.forge.update_issue(s.repo, s.number, **fields)
    if not review.accepted:
        await s.say(f"label change undone: {review.reason}.")
        return
    after = review.changes.apply(labels)
    if review.state is None or review.state.value == mail.state:
        async with ctx.services.store.transaction(  # other labels may have changed
                mails.box_key(mail.org, mail.to_principal)) as db:
            await mails.set_state(db, mail.mail_id, mail.state, after)
        return
    async with ctx.services.store.transaction(mails.box_key(mail.org, mail.to_principal),
                                              ledger.key(mail.org)) as db:
        await mails.set_state(db, mail.mail_id, review.state.value, after)
        # the labels as the forge had them then: later than any change delivered before
        await moves.note(db, mail.mail_id, moves.forge_time(fresh.get("updated_at")))
        await ledger.append(db, _LEDGER_FOR[review.state], s.actor, mail.ref,
                            {"mail": mail.mail_id, "from": mail.state, "to": review.state.value,
                             "by_hand": True}, org=mail.org)
        if previous in (None, MailState.HELD) and review.state is not MailState.CLOSED \
                and mail.from_principal.startswith("email:"):
            # quiet or held mail from outside released to the agent by hand
            await ledger.append(db, "email.released", s.actor, mail.ref,
                                {"mail": mail.mail_id, "to": review.state.value}, org=mail.org)


def _who_may_set(mailer: Mailer, actor: str, mail: MailRecord,
                 target: MailState) -> str | None:
    """Why `actor` may not move `mail` to `target` by hand, or None when they may."""
    if target is MailState.HELD:  # only the office holds mail, as it arrives from outside
        return "only the office sets mail:held, on mail from outside as it arrives"
    if target is MailState.WORKING:  # "mail:working (the agent opened it)"
        if actor in (mail.to_principal, "office"):
            return None
        return f"only {mail.to_principal} sets mail:working: it means the agent opened it"
    if target is MailState.REPLIED:  # the recipient's side of the mail
        if actor == mail.to_principal or mailer.speaks_for_recipient(actor, mail):
            return None
        return f"only {mail.to_principal} (or its person, or an editor) sets {target.value}"
    if mailer.may_manage(actor, mail):
        return None
    return (f"{actor} may not set {target.value} on {mail.ref}: only its recipient, its "
            "sender, the recipient's person or an editor can")


@router.register("issues", action="edited")
async def detect_tampering(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is not None and mail is not None:
        await s.mailer.edited(mail, s.issue, s.actor, changes=event.data.get("changes"))


@own_router.register("issues", action="opened")
async def index_mail_the_app_created(event: sansio.Event, ctx: HandlerContext) -> None:
    """The app's own new issue, seen again: if a crash kept it out of the index, index it;
    if the index holds its mail as another issue, it is a late duplicate its try did not get
    to close (stopped after the create: this delivery is retried until it is closed)."""
    header, _ = parse_mail_body(event.data["issue"].get("body"))
    if header is None:
        return
    indexed = await mails.get_mail(ctx.services.store, header.mail_id)
    if indexed is not None and indexed.number == int(event.data["issue"]["number"]):
        return  # the usual case: the sender recorded it already, at no forge request
    s = await scene(event, ctx)
    if s is None or s.office.agent_for_vault(s.repo) is None:
        return
    if indexed is not None:
        await s.mailer.close_if_duplicate(s.repo, s.issue, indexed)
        return
    if await s.mailer.record_found(s.repo, s.issue) is not None:
        ctx.log.warning("mail recovered from its own webhook", extra={"mail": s.ref})
