"""Mail in the forge by hand: issues opened in a vault, closed, reopened, relabelled, edited."""

from __future__ import annotations

from gidgethub import sansio
from gidgethub.routing import Router

from bot.context import HandlerContext
from bot.errors import VaultmailError
from bot.header import parse_mail_body
from bot.store import ledger, mails
from bot.store.mails import QUIET
from handlers.common import scene
from labels.states import MailState, review_label_change

router = Router()
own_router = Router()
ITEM_LABELS = frozenset({"goal", "outcome", "plan", "evidence"})

_LEDGER_FOR = {MailState.NEW: "mail.sent", MailState.WORKING: "mail.opened",
               MailState.REPLIED: "mail.replied", MailState.CLOSED: "mail.closed"}


@router.register("issues", action="opened")
async def adopt_issue_as_mail(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    if s is None or s.office.agent_for_vault(s.repo) is None:
        return
    if ITEM_LABELS & {name.lower() for name in s.labels}:
        return  # goals, outcomes, plans and evidence are items, not mail
    try:
        await s.mailer.adopt(s.repo, s.issue, s.actor)
    except VaultmailError as exc:
        await s.say(f"this issue cannot become mail: {exc.message}")
        await ctx.forge.update_issue(s.repo, s.number, state="closed",
                                     state_reason="not_planned")


@router.register("issues", action="closed")
async def close_mail(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is None or mail is None:
        return
    try:
        await s.mailer.close(mail, s.actor, issue_closed=True, labels=s.labels)
    except VaultmailError as exc:
        await ctx.forge.update_issue(s.repo, s.number, state="open")
        await s.refuse(exc)


@router.register("issues", action="reopened")
async def reopen_mail(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is not None and mail is not None:
        await s.mailer.reopened(mail, s.actor, labels=s.labels)


@router.register("issues", action="labeled")
@router.register("issues", action="unlabeled")
async def review_hand_made_label_change(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is None or mail is None:
        return
    fresh = await ctx.forge.get_issue(s.repo, s.number)  # the newest label set, not the event's
    labels = [str(label["name"]) for label in fresh.get("labels", [])]
    previous = None if mail.state == QUIET else MailState(mail.state)
    review = review_label_change(previous, labels)
    fields: dict[str, object] = {}
    if not review.changes.empty:
        fields["labels"] = review.changes.apply(labels)
    if review.accepted:  # the issue's open/closed state follows an accepted label
        is_open = fresh.get("state") == "open"
        if review.state is MailState.CLOSED and is_open:
            fields.update(state="closed", state_reason="completed")
        elif review.state not in (None, MailState.CLOSED) and not is_open:
            fields["state"] = "open"
    if fields:
        await ctx.forge.update_issue(s.repo, s.number, **fields)
    if not review.accepted:
        await s.say(f"label change undone: {review.reason}.")
        return
    if review.state is None or review.state.value == mail.state:
        return
    async with ctx.services.store.transaction() as db:
        await mails.set_state(db, mail.mail_id, review.state.value)
        await ledger.append(db, _LEDGER_FOR[review.state], s.actor, mail.ref,
                            {"mail": mail.mail_id, "from": mail.state, "to": review.state.value,
                             "by_hand": True})


@router.register("issues", action="edited")
async def detect_tampering(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    mail = await s.mail() if s else None
    if s is not None and mail is not None:
        await s.mailer.check_tamper(mail, s.issue, s.actor)


@own_router.register("issues", action="opened")
async def index_mail_the_app_created(event: sansio.Event, ctx: HandlerContext) -> None:
    """The app's own new issue, seen again: if a crash kept it out of the index, index it."""
    header, _ = parse_mail_body(event.data["issue"].get("body"))
    if header is None or await mails.get_mail(ctx.services.store, header.mail_id):
        return  # the usual case: the sender recorded it already, at no forge request
    s = await scene(event, ctx)
    if s is None or s.office.agent_for_vault(s.repo) is None:
        return
    if await s.mailer.record_found(s.repo, s.issue) is not None:
        ctx.log.warning("mail recovered from its own webhook", extra={"mail": s.ref})
