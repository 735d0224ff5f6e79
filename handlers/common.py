"""What every handler needs from an event: the office, the repo, the actor, the mail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.errors import VaultmailError
from bot.mail.mailer import Mailer, principal_of
from bot.mail.markdown import defuse_mentions
from bot.office.config import Office
from bot.store import mails
from bot.store.mails import MailRecord


@dataclass
class Scene:
    ctx: HandlerContext
    office: Office
    repo: str
    number: int
    issue: dict[str, Any]
    login: str
    actor: str  # office principal, or forge:<login> for someone outside the office

    @property
    def mailer(self) -> Mailer:
        return Mailer(self.ctx.services, self.ctx.forge, self.office)

    @property
    def labels(self) -> list[str]:
        return [str(label["name"]) for label in self.issue.get("labels", [])]

    async def mail(self) -> MailRecord | None:
        return await mails.mail_at(self.ctx.services.store, self.repo, self.number)

    async def say(self, text: str) -> None:
        """A one-line reply on the issue (refusals and confirmations) to the one who acted.

        Only they are mentioned: `text` often quotes what they wrote, so its @mentions are
        defused."""
        await self.ctx.forge.create_comment(self.repo, self.number,
                                            f"@{self.login} {defuse_mentions(text)}")

    async def refuse(self, exc: VaultmailError) -> None:
        self.ctx.log.info("refused", extra={"reason": exc.message, "issue": self.ref})
        await self.say(exc.message)

    @property
    def ref(self) -> str:
        return f"{self.repo}#{self.number}"


async def scene(event: sansio.Event, ctx: HandlerContext) -> Scene | None:
    """The scene of an issue or issue_comment event, or None outside a configured office."""
    data = event.data
    repo = data["repository"]["full_name"].lower()
    office = await ctx.services.offices.get(ctx.forge, repo.split("/")[0])
    if office is None:
        ctx.log.info("no office config for this org: event ignored", extra={"repo": repo})
        return None
    login = data["sender"]["login"]
    actor = principal_of(office, login) or f"forge:{login}"
    return Scene(ctx, office, repo, int(data["issue"]["number"]), data["issue"], login, actor)
