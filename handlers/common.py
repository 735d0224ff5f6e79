"""What every handler needs from an event: the office, the repo, the actor, the mail."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gidgethub import sansio

from bot.app.context import HandlerContext
from bot.errors import Denied, VaultmailError
from bot.forge.pacing import writes_for
from bot.mail.mailer import Mailer, principal_of
from bot.mail.markdown import as_data
from bot.mail.signing import former_offices, name_now
from bot.office.config import Office
from bot.store import idempotency, installations, ledger, mails, strangers
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
        await self._post(f"@{self.login} {as_data(text)}")

    async def note(self, text: str) -> None:
        """A one-line note on the issue addressed to no one: about an act the forge does not
        say who made (its sender is the app's own account: bot.app.org_signed)."""
        await self._post(as_data(text))

    async def _post(self, line: str) -> None:
        marker = self.ctx.next_marker()  # a retry finds what an earlier attempt said
        await self.ctx.post_once(self.repo, self.number, f"{line} {marker}", marker)

    @property
    def no_one(self) -> bool:
        """The act is the app's own account's: one the forge does not say who made (a Gitea
        org's own webhook: bot.app.org_signed), which acts as no member."""
        return self.login.lower() == self.ctx.services.bot_login.lower()

    @property
    def stranger(self) -> bool:
        """Someone outside the office (on a public repository, anyone may comment)."""
        return self.actor.startswith("forge:")

    async def refuse(self, exc: VaultmailError, text: str | None = None) -> None:
        """Tell the one who acted why not, in one line (`text`, else the error's message).

        Someone outside the office hears it once: their further refusals within
        `strangers.QUIET_FOR` are only ledgered (`run.denied` with `quiet`), so a stranger's
        flood of commands costs one reply, not one each."""
        if await self.hushed(exc):
            return
        self.ctx.log.info("refused", extra={"reason": exc.message, "issue": self.ref})
        await self.say(text if text is not None else exc.on_forge)

    async def hushed(self, exc: VaultmailError) -> bool:
        """Whether this refusal goes unsaid, only ledgered: the actor is outside the office
        and heard one within `strangers.QUIET_FOR`."""
        store = self.ctx.services.store
        if not self.stranger or await strangers.may_reply(
                store, self.login, self.ctx.delivery_id, org=self.office.org):
            return False
        self.ctx.log.info("refused quietly", extra={"reason": exc.message, "issue": self.ref})
        if not (isinstance(exc, Denied) and exc.ledgered):
            await ledger.record(store, "run.denied", self.actor, self.ref,
                                {"reason": exc.message, "quiet": True}, org=self.office.org)
        return True

    @property
    def ref(self) -> str:
        return f"{self.repo}#{self.number}"


async def actor_of(ctx: HandlerContext, office: Office, sender: dict[str, Any]) -> str:
    """The principal a delivery's sender acts as: the office member the config gives its
    login, when it is the forge account first seen with that login (a login renamed away and
    taken by someone else is not: `Services.same_account`); else `forge:<login>`, an
    outsider."""
    login = str(sender["login"])
    actor = principal_of(office, login)
    if actor is not None and await ctx.services.same_account(office.org, actor, login,
                                                             sender.get("id")):
        return actor
    return f"forge:{login}"


async def repo_now(ctx: HandlerContext, repository: Mapping[str, Any]) -> str:
    """The full name now of a delivery's `repository` (its `full_name` and forge `id`). A
    delivery sent before a rename (queued then, or redelivered as it was sent) names the
    repository as it was called: an org's old login, no office's now, is the org its
    installation is the index's for, when that login is one of its names before; and a name
    one of the office's repositories had before is asked of the forge by the repository's
    id, as a new repository may have taken the name since: the repository the delivery is
    about is followed, within the office only. On Gitea one bot is every org's
    installation, which names no org: an old login is followed by the repository's id alone
    (`_left_login`). An id is the forge's word only: one an org's admins signed is dropped
    before this (bot.app.org_signed)."""
    repo = str(repository["full_name"]).lower()
    owner, _, name = repo.partition("/")
    repo_id = repository.get("id")
    if ctx.installation_id is None:
        return repo
    if ctx.orgs is None:
        ctx.orgs = await installations.orgs_of_installation(ctx.services.store,
                                                            ctx.installation_id)
    orgs = ctx.orgs
    if len(orgs) > 1 and owner not in orgs:  # (Gitea)
        return await _left_login(ctx, repo, repo_id, orgs)
    org = orgs[0] if len(orgs) == 1 else owner if owner in orgs else None
    if org is None:
        return repo
    had = _names_before(ctx, org)
    if org != owner and owner in former_offices(had):
        repo = f"{org}/{name}"
    if name_now(had, repo) == repo or not isinstance(repo_id, int):
        return repo
    now = await ctx.forge.repo_name_of(repo_id)
    return now if now is not None and now.partition("/")[0] == org else repo


def _names_before(ctx: HandlerContext, org: str) -> dict[str, str]:
    """The names office `org` and its repositories had before (with the names taken since)."""
    ring = ctx.services.keyring.existing(org)
    return ring.renamed if ring is not None else {}


async def _left_login(ctx: HandlerContext, repo: str, repo_id: Any, orgs: list[str]) -> str:
    """`repo`, whose owner is none of `orgs` (an installation several orgs share: Gitea's
    bot), under its name now: the forge, asked with the app's own token by the repository's
    id, names it within an office one of whose names before is the delivery's login; else
    as it came. A login no office ever had is not asked about: Gitea's system webhook sends
    every org's comments, and an outsider's must cost no forge read (nor fail with one)."""
    had = ctx.services.named_before(repo.partition("/")[0], orgs)
    if not had or not isinstance(repo_id, int):
        return repo
    now = await ctx.forge.repo_name_of(repo_id)
    return now if now is not None and now.partition("/")[0] in had else repo


async def scene(event: sansio.Event, ctx: HandlerContext) -> Scene | None:
    """The scene of an issue or issue_comment event, or None outside a configured office.
    Found once for the handlers a delivery is routed to in one try (an `issues.opened` is
    the mail's and the items'): a later handler of that try is given the same."""
    this_try = idempotency.this_try()
    found = ctx.scenes.get(id(event))
    if found is not None and found[0] is event and found[1] == this_try:
        known: Scene = found[2]
        writes_for.set(f"{known.office.org.lower()}/{known.actor}")  # (as the first set it)
        return known
    s = await _scene(event, ctx)
    if s is not None:  # (none found is found again: each handler logs why it ignores it)
        ctx.scenes[id(event)] = (event, this_try, s)
    return s


async def _scene(event: sansio.Event, ctx: HandlerContext) -> Scene | None:
    data = event.data
    repo = await repo_now(ctx, data["repository"])
    office = await ctx.services.offices.get(ctx.forge, repo.split("/")[0])
    if office is None:
        ctx.log.info("no office config for this org: event ignored", extra={"repo": repo})
        return None
    login = data["sender"]["login"]
    actor = await actor_of(ctx, office, data["sender"])
    # its forge writes take the actor's turns, in its office (the worker resets it)
    writes_for.set(f"{office.org.lower()}/{actor}")
    return Scene(ctx, office, repo, int(data["issue"]["number"]), data["issue"], login, actor)
