"""Comments: slash commands anywhere the app is installed, and messages on mail."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.app.routing import OrderedRouter
from bot.errors import InvalidArguments, VaultmailError
from bot.items.model import item_from_issue
from bot.items.render import parse_addressing
from bot.mail.commands import parse_commands, words_besides_commands
from bot.store.moves import forge_time
from handlers.common import Scene, actor_of, scene
from handlers.items import office_entries
from handlers.mail import wait_for_mail

router = OrderedRouter()


def comment_key(repo: str, comment: dict[str, Any]) -> str:
    """What a command in a comment is keyed on: the comment itself (its id and its update
    time), never the delivery that brought it, which a redelivery replaces."""
    return f"comment:{repo}:{comment.get('id')}:{comment.get('updated_at')}"


async def send_mail_from_command(s: Scene, args: str, body: str, key: str,
                                 at: float | None) -> None:
    """`/mail <agent> <subject>`; `at`: when the comment was written, by the forge, so an
    agent's counts from the run it was written in however late it is read (`sent_from`)."""
    agent, subject = (args.split(None, 1) + ["", ""])[:2]  # a tab separates them too
    if not agent or not subject.strip():
        await s.refuse(InvalidArguments(
            "usage: `/mail <agent> <subject>` on one line, the message below it."))
        return
    record = await s.mailer.send(s.actor, agent, subject, body, idempotency_key=key,
                                 written_at=at)
    await s.say(f"mail sent to {record.to_principal}: {record.ref}")


async def note_unread_edit(s: Scene, comment: dict[str, Any]) -> None:
    """A comment read in no one's name runs nothing it says: say so when its words asked
    something, as a refusal is said to its author (outside the office: once a while, else
    only ledgered), so a stranger editing each of their comments is not answered each time."""
    by = replace(s, login=str(comment["user"]["login"]),
                 actor=await actor_of(s.ctx, s.office, comment["user"]))
    if not await _asks(by, str(comment.get("body") or "")):
        return
    said = VaultmailError(
        f"comment {comment['id']} was edited since it was written, and this forge does not "
        "say by whom, so nothing it asks was done: no command run, no one mailed, answered "
        "or addressed. Write it again in a new comment for that.")
    if not await by.hushed(said):
        await s.note(said.message)  # (to no one: who made the edit is not known)


async def _asks(s: Scene, text: str) -> bool:
    """Whether `text`, from `s.actor`, would have had the app act: a command; on mail, a reply
    or follow-up from someone in the office; on an item, someone in the office addressed."""
    if parse_commands(text):
        return True
    if await s.mail() is not None:
        return not s.stranger  # (a stranger's words on mail wake no one)
    if item_from_issue(s.office, s.repo, s.issue) is None:
        return False
    try:
        addressed = parse_addressing(text)
    except VaultmailError:  # too long to be a comment: refused unread
        return False
    return bool(office_entries(s.office, addressed.to + addressed.cc))


@router.register("issue_comment", action="created")
async def handle_comment(event: sansio.Event, ctx: HandlerContext) -> None:
    s = await scene(event, ctx)
    if s is None:
        return
    if s.no_one:  # edited since it was written, by whom the forge does not say (org_signed)
        # (on an item its words are indexed all the same, as its author's, marked edited:
        # handlers.items.index_edited)
        await note_unread_edit(s, event.data["comment"])
        return
    text = event.data["comment"].get("body") or ""
    commands = parse_commands(text)
    mail = await s.mail()
    # when it was written on the forge: a delivery handled late moves nothing made after it
    at = forge_time(event.data["comment"].get("created_at"))
    reply_key = f"comment:{event.data['comment']['id']}"  # the reply, however often handled
    try:
        for index, cmd in enumerate(commands):
            if cmd.name == "mail":
                await send_mail_from_command(
                    s, cmd.args, cmd.body, f"{comment_key(s.repo, event.data['comment'])}:{index}",
                    at)
        names = {c.name for c in commands}
        if mail is None:
            if names != {"mail"}:  # something for the mail to do, once it is mail
                wait_for_mail(s, "commented on before it was adopted")
            return
        if "close" in names:
            labels: list[str] | None = s.labels
            words = words_besides_commands(text)
            if s.actor == mail.to_principal and "mail" not in names and words.strip():
                # the recipient's words beside its /close are its reply (copied to an agent
                # sender, answered by email), made before the close as written
                mail = await s.mailer.reply(mail, s.actor, words, posted=True, labels=labels,
                                            key=reply_key, at=at)
                labels = None  # the reply moved them: the close goes by the index
            await s.mailer.close(mail, s.actor, labels=labels, at=at)
        elif "working" in names:
            await s.mailer.open(mail, s.actor, labels=s.labels, at=at)
        elif "mail" in names:
            return
        elif s.actor == mail.to_principal:
            await s.mailer.reply(mail, s.actor, text, posted=True, labels=s.labels,
                                 key=reply_key, at=at)
        elif s.actor.startswith("forge:"):
            # someone outside the office: their words stay on the forge, but wake no one
            ctx.log.info("comment from outside the office leaves the mail as it is",
                         extra={"mail": mail.ref, "login": s.login})
        else:
            await s.mailer.follow_up(mail, s.actor, labels=s.labels, text=text, at=at)
    except VaultmailError as exc:
        await s.refuse(exc)
