"""The app's long-lived parts, built once at start-up and shared by intake, worker and tools."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from gidgethub.routing import Router

from bot.app.egress import ALLOW_SETTING
from bot.app.hook_generations import HookGenerations
from bot.app.notify import Notifier
from bot.app.settings import DOMAINS_SETTING, Settings
from bot.app.tries import FailedTries
from bot.cursors import Cursors
from bot.errors import NotInstalled
from bot.mail.signing import Keyrings, former_offices
from bot.names import Behalf
from bot.office.config import COMMANDS_SETTING
from bot.office.source import FIRST_READ_WAIT, ROUND_WAIT, OfficeSource
from bot.office.visibility import Visibility
from bot.store import Store
from bot.store import installations as installed
from bot.tools.polls import LongPolls

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.forge.gitea import GiteaClient
    from bot.forge.github import ForgeClient
    from bot.office.config import Office, UrlCheck

log = logging.getLogger("vaultmail.services")
ACCOUNT_KEPT = 60.0  # seconds a login's bound account is taken as read (as a config is)


def _cancelled_elsewhere(exc: BaseException) -> bool:
    """A read shared with others cancelled while this round was not: that org's, unread."""
    task = asyncio.current_task()
    return (isinstance(exc, asyncio.CancelledError) and task is not None
            and not task.cancelling())


def _tell_not_theirs(setting: str, org: str, entries: list[str], first: int,
                     account: int) -> None:
    """The operator's warning that `setting`'s entries for `org` by its login alone (its
    outbound entries, the agents given a command, or the email domains vouched for) are not
    account `account`'s, and what to write."""
    extra = {"org": org, "bound_account": first, "account": account}
    bound = (f"are bound to forge account {first}, the first this app knew as {org}, and "
             f"{org} is account {account} now (an org deleted or renamed, and its name taken "
             "by another account)")
    if setting == DOMAINS_SETTING:
        log.warning(
            "VAULTMAIL_SMTP_DOMAINS's domains for %s (%s) %s: they are not vouched for it, its "
            "mail to them is refused and none is sent from them, as for a domain not proven. "
            "To vouch for them for the new owner, write %s; to keep them the first account's "
            "under a new name, %s; else remove them",
            org, ", ".join(entries), bound,
            ",".join(f"{d}={org}#{account}" for d in entries),
            ",".join(f"{d}=NEWNAME#{first}" for d in entries),
            extra={**extra, "domains": entries})
        return
    if setting == ALLOW_SETTING:
        log.warning(
            "VAULTMAIL_OUTBOUND_ALLOW's entries for %s (%s) %s: they do not apply to it. To "
            "allow the new owner, write its entries as %s#%d=HOST; to keep them the first "
            "account's under a new name, write NEWNAME#%d=HOST; else remove them",
            org, ", ".join(entries), bound, org, account, first,
            extra={**extra, "entries": entries})
        return
    log.warning(
        "VAULTMAIL_AGENT_COMMANDS's commands for %s (%s) %s: they do not run for it, its runs "
        "fail as with no command set. To run them for the new owner, write them under "
        "`%s#%d:`; to keep them the first account's under a new name, under `NEWNAME#%d:`; "
        "else remove them",
        org, ", ".join(entries), bound, org, account, first,
        extra={**extra, "agents": entries})


ACCOUNT_UNKNOWN = ""  # (`_not_theirs_told`'s setting for `_tell_account_unknown`)


def _tell_account_unknown(org: str, named: dict[str, list[str]]) -> None:
    """The operator's warning that the entries naming `org` by its login alone apply to no
    one while the index knows no forge account under it."""
    said = "; ".join(f"{setting}: {', '.join(entries)}" for setting, entries in named.items()
                     if entries)
    log.warning(
        "the entries naming %s by its login alone (%s) are not applied while the forge has not "
        "said which account %s is (the index has no id for it): they apply once it has, to "
        "the account the login is bound to; write %s#ID to name the account yourself",
        org, said, org, org, extra={"org": org, "entries": said})


@dataclass
class Services:
    settings: Settings
    store: Store
    forge_client: ForgeClient | GiteaClient
    router: Router
    own_router: Router  # the few events the app caused that it still reads (recovery)
    app_slug: str
    offices: OfficeSource
    # every office's signing keys: `keyring.for_office(org)` signs, `keyring` verifies
    keyring: Keyrings
    # org (lower case) -> installation id: read at start, kept by installation events
    installations: dict[str, int] = field(default_factory=dict)
    # org (lower case) -> the forge's id of the account its office here was made for, as
    # `installations` is taken (where known): the forge an office's work is given writes
    # only into that account's repositories (Gitea: bot.forge.gitea, `GiteaForge.account`)
    accounts: dict[str, int] = field(default_factory=dict)
    # seconds between the app's own looks for new installations (Gitea's, which sends no
    # installation events: bot.app.gitea_orgs sets it); None where the forge tells of each at
    # once (GitHub's installation events)
    installs_looked_for_every: float | None = None
    # Gitea's look at the bot's orgs now, for a delivery about an org with no office here
    # (bot.app.gitea_orgs: at most once in a while, whoever asks); whether it looked
    look_for_orgs: Callable[[], Awaitable[bool]] | None = None
    # orgs whose index the start is still catching up with the forge (bot.app.doctor.
    # catch_up_at_start): their keyed sends wait for it
    catching_up: set[str] = field(default_factory=set)
    background: set[asyncio.Task[None]] = field(default_factory=set)
    notifier: Notifier = field(default_factory=Notifier)
    long_polls: LongPolls = field(default_factory=LongPolls)  # `wait` calls held per API token
    failed_tries: FailedTries = field(default_factory=FailedTries)  # bad tokens per address
    visibility: Visibility = field(default_factory=Visibility)  # who sees which repository
    bot_user: str | None = None  # gitea: the bot is a plain user, not "<slug>[bot]"
    # set by whoever runs the worker: new deliveries are queued, look now
    wake_worker: Callable[[], None] = lambda: None
    _unread: set[str] = field(default_factory=set, repr=False)  # orgs the last round left out
    # (services, forge, office): the office's open questions stop waiting on those its configs
    # named once and name no more (bot.store.members.departed): bot.items.service.left_office,
    # set by the builder (the items import these services)
    left_office: Callable[[Services, Forge, Office], Awaitable[None]] | None = field(
        default=None, repr=False)

    # (org, principal, login): the account id bound to it (bot.store.members.bind) and when it
    # was read: read again after ACCOUNT_KEPT (another replica may have applied a config that
    # bound it anew)
    _accounts: dict[tuple[str, str, str], tuple[int, float]] = field(default_factory=dict,
                                                                      repr=False)
    # (setting, org, account): told that the setting's entries for org's login are not its
    # (`behalf`)
    _not_theirs_told: set[tuple[str, str, int]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.take_offices(self.offices)
        self.cursors = Cursors(self.settings.webhook_secret)  # (bot.cursors)
        # each org's webhook secret generation (Gitea), as intake takes it
        self.hook_generations = HookGenerations(self.store)

    async def same_account(self, org: str, principal: str, login: str,
                           user_id: object) -> bool:
        """Whether the forge account `user_id` acting (or signing in) as `login` is the one
        `principal` of `org`'s office has (bot.store.members.bind); True when the forge said
        no id."""
        if not isinstance(user_id, int) or isinstance(user_id, bool):
            return True
        key = (org.lower(), principal, login.lower())
        bound, at = self._accounts.get(key, (None, 0.0))
        if bound == user_id and time.monotonic() - at < ACCOUNT_KEPT:
            return True
        from bot.store import members

        if not await members.bind(self.store, org, principal, login, user_id):
            log.warning("a login acting as an office's member is another forge account than "
                        "the one first seen with it: taken as an outsider",
                        extra={"org": org, "principal": principal, "login": login})
            return False
        self._accounts[key] = (user_id, time.monotonic())
        return True

    def take_offices(self, source: OfficeSource) -> None:
        """Read the offices' configs from `source`, told what it needs of the index."""
        self.offices = source
        source.on_read = self._config_taken
        source.file_holder = self._file_holder
        source.url_refused_for = self._url_refused_for

    async def _url_refused_for(self, org: str) -> UrlCheck:
        """(bot.office.source.OfficeSource.url_refused_for)"""
        behalf = await self.behalf(org)
        policy = self.settings.outbound
        return lambda url, _org: policy.url_refusal(url, behalf)

    async def behalf(self, org: str) -> Behalf:
        """`org`'s office as the operator's entries for one org are applied to it (the
        outbound policy, bot.app.egress; the agents' commands, bot.office.config.
        AgentCommands; the email domains vouched for, bot.email.domains): the forge account
        under its login now, and whether the entries naming the login alone (`acme=10.0.0.5`,
        `acme:`, `mail.acme.example=acme`) are that account's: they are bound to the first
        account the index recorded under the login (`login_entries_holder`, one binding for
        every setting), so an org made again under the login by another account, heard or
        not, does not reach what the operator allowed the one before, nor run its programs,
        nor have its mail. While the index knows no account under the login, they are no
        one's (failing closed: whose the login is cannot be told). The operator is told once
        (per process) of each account refused so, per setting."""
        org = org.lower()
        account = await installed.account_of(self.store, org)
        named = {ALLOW_SETTING: self.settings.outbound.by_login(org),
                 COMMANDS_SETTING: self.settings.agent_commands.by_login(org),
                 DOMAINS_SETTING: self.settings.email.vouched_by_login(org)}
        if not any(named.values()):
            return Behalf(org, account, by_login=True)  # (nothing by login to bind)
        if account is None:
            if (ACCOUNT_UNKNOWN, org, 0) not in self._not_theirs_told:
                self._not_theirs_told.add((ACCOUNT_UNKNOWN, org, 0))
                _tell_account_unknown(org, named)
            return Behalf(org, None, by_login=False)
        first = await installed.login_entries_holder(self.store, org, account)
        if first != account:
            for setting, entries in named.items():
                if entries and (setting, org, account) not in self._not_theirs_told:
                    self._not_theirs_told.add((setting, org, account))
                    _tell_not_theirs(setting, org, entries, first, account)
        return Behalf(org, account, by_login=first == account)

    async def _file_holder(self, named: str, org: str) -> tuple[int, int] | None:
        """(bot.office.source.OfficeSource.file_holder)"""
        return await installed.file_office_holder(self.store, named, org)

    async def _config_taken(self, org: str, office: Office, read_at: float, new: bool) -> None:
        """A config read from the forge (`new`: a text this replica had not taken), on any
        replica: whoever the last one recorded named and this one does not (or gives another
        forge account) loses what they held in the office (bot.store.members)."""
        from bot.store import members

        named = {h.principal: h.login for h in office.humans}
        named.update({a.principal: a.login for a in office.agents})
        changed = await members.apply(self.store, org, named, read_at)
        if changed.removed or changed.relogged:
            for key in [k for k in self._accounts if k[0] == org.lower()]:
                del self._accounts[key]  # (bound again from the index, as it now stands)
            log.info("office config: tokens of members removed or given another account "
                     "revoked", extra={"org": org, "removed": sorted(changed.removed),
                                       "relogged": sorted(changed.relogged),
                                       "revoked": changed.revoked})
        # each config text taken, changed or not (a replica's first read, a read again after
        # one failed), and each read that recorded someone gone: a sweep cut off part-way, on
        # any replica, is finished by the next (not at every read of a text unchanged, which
        # each replica makes once a minute per office)
        if new or changed.removed:
            await self._left_office(org, office)

    async def _left_office(self, org: str, office: Office) -> None:
        """Those who have left: the questions still waiting on them stop waiting."""
        if self.left_office is None:
            return
        try:
            forge = self.forge_for_org(org)
        except NotInstalled:  # (nothing of the office's is written while it is not)
            return
        await self.left_office(self, forge, office)

    def lock_for(self, key: str) -> AbstractAsyncContextManager[None]:
        """One holder at a time of a mail (or other key) across every replica: serialises
        the worker and tool calls on it."""
        return self.store.named_lock(key)

    @property
    def bot_login(self) -> str:
        return self.bot_user or f"{self.app_slug}[bot]"

    def by_app(self, posted: Mapping[str, Any]) -> bool:
        """Whether the app wrote this comment or issue (the forge's `user` is the app's
        login): where the app finds its own markers again, anyone else may have written them."""
        user = posted.get("user")
        return isinstance(user, dict) and str(user.get("login") or "").lower() == \
            self.bot_login.lower()

    def is_own_event(self, payload: dict[str, Any]) -> bool:
        sender = payload.get("sender")
        return isinstance(sender, dict) and sender.get("login") == self.bot_login

    @property
    def default_installation(self) -> int | None:
        """The installation, when there is exactly one (the usual case)."""
        return next(iter(self.installations.values())) if len(self.installations) == 1 else None

    @property
    def default_org(self) -> str | None:
        return next(iter(self.installations)) if len(self.installations) == 1 else None

    def installation_of(self, org: str) -> int | None:
        return self.installations.get(org.lower())

    def named_before(self, login: str, orgs: Iterable[str]) -> list[str]:
        """Those of `orgs` whose office had the org login `login` before (renamed since): a
        delivery sent under it is theirs."""
        login = login.lower()
        return [org for org in orgs if (ring := self.keyring.existing(org)) is not None
                and login in former_offices(ring.renamed)]

    async def no_office(self, org: str) -> bool:
        """Whether no office here is `org`'s, now or under a name it had before, nor is one in
        the index (installed through another replica's look since this one's): an outsider,
        whose deliveries cost no forge read and no queued work. Read from memory, the
        keyrings and one index row, never the forge."""
        org = org.lower()
        if org in self.installations or self.named_before(org, self.installations):
            return False
        return await installed.live_installation(self.store, org) is None

    async def follow_index(self) -> None:
        """Serve what the index has installed now, whichever replica heard of it (a webhook
        reaches one replica, which writes it there before it acts on it): an org installed,
        unsuspended or renamed to its name that this replica did not hear of is served here
        too; one uninstalled, suspended, renamed away or installed anew is forgotten, its
        config with it (and its installation's token, when no org has it now)."""
        live, accounts = await installed.live_accounts(self.store)
        for org in set(self.installations) | set(live):
            inst = self.installations.get(org)
            was, now = self.accounts.get(org), accounts.get(org)
            # (an account first learnt, or not kept in memory before, is the same office:
            # only another account under the login is another office)
            if live.get(org) == inst and (was is None or now is None or was == now):
                continue
            self.offices.forget(org)  # (another office under that name now, or none)
            if inst is not None and inst not in live.values():
                self.forge_client.forget(inst)
        self.installations.clear()  # (in place: others hold this dict)
        self.installations.update(live)
        self.accounts.clear()
        self.accounts.update(accounts)

    async def still_installed(self, org: str) -> None:
        """`org` served as the index has it now (`follow_index`); NotInstalled when this
        replica served it and the index has it installed no more."""
        was = self.installation_of(org)
        if await installed.live_installation(self.store, org) == was:
            return  # (as this replica serves it: one row read, however many orgs there are)
        await self.follow_index()  # (changed: every org as the index has it now)
        if was is not None and self.installation_of(org) is None:
            raise self.not_installed(
                f"the App is not installed on {org} any more (uninstalled, suspended, or the "
                "organisation renamed): an org owner installs it again to use the office")

    async def installed_offices(self) -> list[tuple[str, Office]]:
        """(org, office) of every installed org with a config (`read_offices`): an org whose
        config cannot be read now is left out of this round, and said so."""
        return (await self.read_offices())[0]

    async def read_offices(self, within: float = ROUND_WAIT
                           ) -> tuple[list[tuple[str, Office]], list[str]]:
        """(org, office) of every installed org with a config, each read through the office
        source's cache, side by side; and the orgs left out of this round because their
        config cannot be read now (their forge answers an error, or has not answered within
        `within` seconds of the read's start, when it was never read before: a read that
        waits out its rate limit goes on for the next round). One org never stops, or holds
        up, a round of every office (outbound webhooks, sign-in, email's recipients). An
        office never read before gets FIRST_READ_WAIT (a start on a loaded host)."""
        await self.follow_index()  # (an install, rename or uninstall another replica heard)
        orgs = sorted(self.installations)
        read = await asyncio.gather(*(self.offices.get(self.forge_for_org(org), org,
                                                       within=within, first=FIRST_READ_WAIT)
                                      for org in orgs), return_exceptions=True)
        found, unread = [], []
        for org, office in zip(orgs, read, strict=True):
            if isinstance(office, BaseException):
                if not isinstance(office, Exception) and not _cancelled_elsewhere(office):
                    raise office  # (this round cancelled, or the process stopping)
                if org not in self._unread:  # said once, not at every round it lasts
                    log.warning("office config unreadable now; left out until it is: %r",
                                office, extra={"org": org})
                unread.append(org)
            elif office is not None:
                found.append((org, office))
        self._unread = set(unread)
        return found, unread

    def forge_for_org(self, org: str) -> Forge:
        """This org's installation's forge; NotInstalled (503) naming the org otherwise."""
        inst = self.installation_of(org)
        if inst is None:
            raise self.not_installed(
                f"the App is not installed on {org}, or is suspended there: an owner of {org} "
                "installs it (the App's page on the forge, Install) or unsuspends it (the org's "
                "settings, GitHub Apps), then the office works again")
        return self.forge_client.installation(inst, org=org,
                                              account=self.accounts.get(org.lower()))

    def not_installed(self, message: str) -> NotInstalled:
        """NotInstalled whose Retry-After is when this app may first know of an installation
        made now: at its next look for them, where it looks (Gitea), else shortly."""
        exc = NotInstalled(message, code="not_installed")
        exc.retry_after = self.installs_looked_for_every
        return exc

    def forge_for(self, installation_id: int | None, org: str | None = None) -> Forge:
        """The forge an event's installation acts through (`org`: the org it is about, which
        on Gitea, one bot for every org, is whose writes are paced and budgeted)."""
        inst = installation_id if installation_id is not None else self.default_installation
        if inst is None:
            raise LookupError("no installation id in the event and no default installation")
        return self.forge_client.installation(
            inst, org=org, account=None if org is None else self.accounts.get(org.lower()))


SERVICES_KEY = web.AppKey("services", Services)
