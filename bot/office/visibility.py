"""What a principal may see (seed comments-and-inbox: "commenting never shares anything"; issue 9:
"reading never shares"). Every read path asks here: the tools over HTTP, MCP and the shell, the
`inbox` prompt, the `inbox` field of agent results and `list_changes`.

* **An item** (or any issue, or a repository) is visible when the principal's forge account can
  see its repository, asked the way the forge itself decides: the collaborator permission of the
  principal's forge login (which counts direct collaborators, teams, org base permission, and
  read for a public repository). The app's own token sees everything it is installed on, so it
  is never the judge. Answers are cached for `ttl` seconds (45 by default) per repository and
  login: a change of access on the forge takes effect within that. They are kept per office
  (the repository's owner), each office its newest `per_office`: one office asking about many
  logins or repositories pushes out none of another's answers.
* **A mail** is visible to its sender, its recipient, the recipient agent's person and editors.
* **A chat** to its sender and the agent asked.
* **A ledger entry** as what it is about: a mail or a chat as above, an item or repository as
  the repository (but one on a plan or evidence naming the claim holder of an outcome the
  viewer cannot see, `views.claim_seen`, as an entry about the outcome is not); a refused
  attempt (`run.denied`) also to whoever was refused; an entry about mail to an agent (a
  refused send) to the sender, that agent, its person and editors.
* `office` sees everything of its own office; a principal outside the office config sees
  nothing.
* **The office wall**: one deployment serves many offices (orgs), and nothing of another office
  is ever visible, whatever its principals are called: a repository, issue or mail outside the
  office's org, a chat or ledger entry of another office. This is checked before anything else.

What cannot be seen is refused as the forge refuses it: "not found", worded exactly as for
something that does not exist, so a refusal never tells that it exists.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from bot.items.model import make_ref
from bot.items.model import split_ref as _split
from bot.mail.signing import name_now
from bot.office.config import Office
from bot.store.offices import org_of

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.items.model import Item
    from bot.store import Store
    from bot.store.ledger import Entry
    from bot.store.mails import MailRecord

TTL = 45.0
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_CHAT = re.compile(r"^chat:(?P<n>[0-9]+)$")
_TO_AGENT = re.compile(r"^(?:mail|chat) to (?P<agent>agent:[a-z0-9-]+)$")
PER_OFFICE = 20_000  # answers kept per office (repository owner)
ASKED_AT_ONCE = 8  # forge requests one `visible` makes together (GitHub allows 100 in flight)
ENTRIES_AHEAD = 50  # ledger entries whose repositories `entries_seen` asks about together


@dataclass(frozen=True)
class EntriesAbout:
    """What a page of ledger entries is about, read together (`Viewer.entries_seen`): the
    mails by id and by (vault lower-cased, number), the items by their ref as kept
    (`make_ref`: an entry's subject may name one in another case)."""

    mails: dict[str, MailRecord]
    mails_at: dict[tuple[str, int], MailRecord]
    items: dict[str, Item]

    def mail(self, mail_id: object, where: tuple[str, int]) -> MailRecord | None:
        """The mail an entry is about: by its `mail` id, else at its issue (as `get_mail`,
        then `mail_at`, find it)."""
        return (self.mails.get(mail_id) if isinstance(mail_id, str) else None) \
            or self.mails_at.get((where[0].lower(), where[1]))


@dataclass
class Visibility:
    """The forge's answers about who holds what role on a repository, shared by every call and
    kept `ttl` seconds, per office its newest `per_office`. Concurrent questions about one pair
    share one forge request."""

    ttl: float = TTL
    clock: Callable[[], float] = time.monotonic
    per_office: int = PER_OFFICE
    # office -> (repository, login) -> (when asked, role), oldest first
    _roles: dict[str, dict[tuple[str, str], tuple[float, str]]] = field(default_factory=dict)
    _asking: dict[tuple[str, str], asyncio.Future[str]] = field(default_factory=dict)

    async def role(self, forge: Forge, repo: str, login: str) -> str:
        """admin|maintain|write|triage|read|none, as the forge says (cached)."""
        key = (repo.lower(), login.lower())
        hit = self._roles.get(org_of(key[0]), {}).get(key)
        if hit is not None and self.clock() - hit[0] < self.ttl:
            return hit[1]
        asking = self._asking.get(key)
        if asking is None:  # one request, in a task of its own: a caller that leaves (a long
            # poll whose client went away) never cancels the answer the others wait for
            asking = asyncio.ensure_future(self._ask(forge, key, login))
            self._asking[key] = asking
            asking.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(asking)

    async def _ask(self, forge: Forge, key: tuple[str, str], login: str) -> str:
        role = await forge.permission(key[0], login)
        kept = self._roles.setdefault(org_of(key[0]), {})
        kept.pop(key, None)  # (asked again: now the newest)
        if len(kept) >= self.per_office:  # the office's oldest answer makes room
            del kept[next(iter(kept))]
        kept[key] = (self.clock(), role)
        return role

    def _done(self, key: tuple[str, str], done: asyncio.Future[str]) -> None:
        if self._asking.get(key) is done:
            del self._asking[key]
        if not done.cancelled():
            done.exception()  # retrieved: whoever awaited it has it already

    def forget(self, repo: str | None = None, login: str | None = None) -> None:
        """Drop cached answers (all, or those about a repository and/or a login)."""
        offices = list(self._roles) if repo is None else [org_of(repo.lower())]
        for office in offices:
            kept = self._roles.get(office, {})
            for key in [k for k in kept if (repo is None or k[0] == repo.lower())
                        and (login is None or k[1] == login.lower())]:
                del kept[key]


def login_of(office: Office, principal: str) -> str | None:
    """The forge login a principal acts as: from the office config, or `forge:<login>`."""
    kind, _, ident = principal.partition(":")
    if kind == "human":
        human = office.human(ident)
        return human.login if human else None
    if kind == "agent":
        agent = office.agent(ident)
        return agent.login if agent else None
    if kind == "forge" and ident:
        return ident
    return None


def split_ref(ref: str) -> tuple[str, int] | None:
    """`owner/repo#N` as (lower-cased `owner/repo`, N); None for other text."""
    # (kept: every read asks about the same refs again, list_inbox about a hundred a call,
    # 1 us each; the answer is the text's alone. Only text a ref could be is kept, so what
    # is kept stays small: owner 39 and repository 100 characters, a number of 20 digits)
    return _split_ref(ref) if len(ref) <= _REF_KEPT else _split(ref)


_REF_KEPT = 200


_split_ref = lru_cache(maxsize=16_384)(_split)  # (bot.items.model's, kept)


def is_editor(office: Office, principal: str) -> bool:
    human = office.human(principal[6:]) if principal.startswith("human:") else None
    return bool(human and "editor" in human.permissions)


def person_of_agent(office: Office, agent: str) -> str | None:
    found = office.agent(agent.removeprefix("agent:"))
    return f"human:{found.person.lower()}" if found and found.person else None


def mail_parties(office: Office, sender: str, recipient: str, principal: str) -> bool:
    """Whether `principal` may read a mail (or what is about one) from `sender` to `recipient`:
    its sender, its recipient, the recipient agent's person, or an editor."""
    return (principal in ("office", sender, recipient)
            or principal == person_of_agent(office, recipient)
            or is_editor(office, principal))


@dataclass
class Viewer:
    """One principal looking, with the office and forge of the call it makes."""

    visibility: Visibility
    forge: Forge
    office: Office
    principal: str
    # the names the office, and its vaults, had before ({was: now}: Keyring.renamed): what
    # a ledger entry written before a rename names (its subject is hashed as written)
    renamed: dict[str, str] = field(default_factory=dict)

    def repo_now(self, repo: str) -> str:
        """What the repository `repo` (`owner/name`) is called now, by the names this office
        had (`renamed`): a ref given out before a rename still names its issue. Another
        office's names are never followed. Lower-cased, as the index keeps names (the name
        as given, in its own case, built a ref no item is kept under)."""
        return name_now(self.renamed, repo)

    @property
    def is_office(self) -> bool:
        return self.principal == "office"

    async def role(self, repo: str) -> str:
        if self.is_office:
            return "admin"
        login = login_of(self.office, self.principal)
        if login is None:
            return "none"
        return await self.visibility.role(self.forge, repo, login)

    @property
    def org(self) -> str:
        return self.office.org.lower()

    def in_office(self, repo: str) -> bool:
        """Whether a repository (or `owner/repo#N`) is in the viewer's office (its org)."""
        return repo.strip().split("/", 1)[0].lower() == self.org

    async def sees_repo(self, repo: str) -> bool:
        if not self.in_office(repo):
            return False
        return await self.role(repo) != "none"

    async def sees_ref(self, ref: str) -> bool:
        """An item or issue `owner/repo#N` (or a repository `owner/repo`)."""
        where = split_ref(ref)
        if where is not None:
            return await self.sees_repo(where[0])
        if _REPO.match(ref.strip()):
            return await self.sees_repo(ref.strip())
        return self.is_office and self.in_office(ref)

    async def visible(self, refs: Iterable[str]) -> set[str]:
        """Those of `refs` (items or issues) this principal may see; each repository asked once,
        ASKED_AT_ONCE of them together (on GitHub each is a request: in a row, an inbox over
        many repositories waited for every answer in turn each time the cached ones ran out)."""
        refs = set(refs)
        where = {ref: split_ref(ref) for ref in refs}
        names = sorted({w[0] for w in where.values() if w is not None})
        room = asyncio.Semaphore(ASKED_AT_ONCE)
        failed = False

        async def sees(repo: str) -> bool:
            nonlocal failed
            async with room:
                # once one ask failed (or the caller left) the read has failed: gather cancels
                # none of the others, and those still waiting would each ask the forge for
                # nobody (on a forge failing them all, a failure and its retries apiece)
                if failed:
                    return False
                try:
                    return await self.sees_repo(repo)
                except BaseException:
                    failed = True  # (before the room is left: the next in it sees it)
                    raise

        seen = dict(zip(names, await asyncio.gather(*map(sees, names)), strict=True))
        return {ref for ref, w in where.items()
                if (seen[w[0]] if w is not None else self.is_office and self.in_office(ref))}

    def sees_mail(self, mail: MailRecord) -> bool:
        return self.in_office(mail.vault) and mail_parties(
            self.office, mail.from_principal, mail.to_principal, self.principal)

    def sees_chat(self, sender: str, agent: str, org: str | None) -> bool:
        return org is not None and org.lower() == self.org and self.principal in (
            "office", sender, agent)

    async def entries_seen(self, entries: Sequence[Entry],
                           store: Store) -> AsyncIterator[tuple[Entry, bool]]:
        """Each of `entries` in order, and whether this viewer sees it (`sees_entry`). What the
        next ENTRIES_AHEAD are about is read first, and the repositories sees_entry will ask
        about are asked about together (`visible`): one by one, a page over many repositories
        waited for each forge answer in turn; a caller that stops early has asked about no
        more than that ahead."""
        from bot.store import comments, mails

        for start in range(0, len(entries), ENTRIES_AHEAD):
            chunk = entries[start:start + ENTRIES_AHEAD]
            page: EntriesAbout | None = None
            if not self.is_office:
                # the mails and items they are about: a read each, not a read or two an entry
                places = {(self.repo_now(where[0]), where[1]) for entry in chunk
                          if (where := split_ref(entry.subject.strip())) is not None}
                by_id, by_place = await mails.mails_known(
                    store, [i for e in chunk if isinstance(i := e.data.get("mail"), str)],
                    places)
                page = EntriesAbout(by_id, by_place, await comments.items_at(
                    store, [make_ref(repo, n) for repo, n in places]))
                # then the repositories sees_entry will ask about, together
                await self.visible({f"{repo}#1" for entry in chunk
                                    if (repo := self._repo_of(entry, page)) is not None})
            for entry in chunk:
                yield entry, await self.sees_entry(entry, store, page)

    def _repo_of(self, entry: Entry, page: EntriesAbout) -> str | None:
        """The repository `sees_entry` asks about for `entry` (None: it asks none, the entry
        being about a mail, a chat, or nothing of a repository)."""
        subject = entry.subject.strip()
        where = split_ref(subject)
        if where is not None:
            where = (self.repo_now(where[0]), where[1])
            mail_id = entry.data.get("mail")
            if page.mail(mail_id, where) is not None or entry.event.startswith("mail.") \
                    or isinstance(mail_id, str):
                return None
            return where[0]
        return self.repo_now(subject) if _REPO.match(subject) else None

    async def sees_entry(self, entry: Entry, store: Store,
                         page: EntriesAbout | None = None) -> bool:
        """A ledger entry, as what it is about (see the module's docstring); `page`: what the
        entries of its page are about, read together (`entries_seen`), else read here."""
        if entry.org is None or entry.org.lower() != self.org:
            return False
        if self.is_office:
            return True
        if entry.event == "run.denied" and entry.actor == self.principal:
            return True  # the refusal was told to them: the entry says no more
        subject = entry.subject.strip()
        where = split_ref(subject)
        if where is not None:
            where = (self.repo_now(where[0]), where[1])
            from bot.store import mails

            mail_id = entry.data.get("mail")
            if page is not None:
                mail = page.mail(mail_id, where)
            else:
                mail = (await mails.get_mail(store, mail_id) if isinstance(mail_id, str)
                        else None) or await mails.mail_at(store, *where)
            if mail is not None:
                return self.sees_mail(mail)
            if entry.event.startswith("mail.") or isinstance(mail_id, str):
                # a mail the index no longer holds: whoever acted, and editors
                return entry.actor == self.principal or is_editor(self.office, self.principal)
            return await self.sees_repo(where[0]) and not await self._names_hidden_claim(
                entry, make_ref(*where), store, page)
        chat = _CHAT.match(subject)
        if chat is not None:
            from bot.store import chats

            row = await chats.chat_parties(store, int(chat["n"]), org=entry.org)
            return row is not None and self.sees_chat(str(row["sender"]), str(row["agent"]),
                                                      row["org"])
        to_agent = _TO_AGENT.match(subject)
        if to_agent is not None:
            return mail_parties(self.office, entry.actor, to_agent["agent"], self.principal)
        if _REPO.match(subject):
            return await self.sees_repo(self.repo_now(subject))
        return entry.actor == self.principal

    async def _names_hidden_claim(self, entry: Entry, ref: str, store: Store,
                                  page: EntriesAbout | None = None) -> bool:
        """Whether `entry`, about item `ref`, names its claim holder where this viewer may not
        know of the claim (a plan's or evidence's whose outcome they cannot see:
        `views.claim_seen`), as its actor or in its data (reached, asked, answering)."""
        data = json.dumps(entry.data)
        if not entry.actor.startswith("agent:") and '"agent:' not in data:
            return False  # (only an agent holds a claim: most entries read no item)
        from bot.store.comments import get_item

        item = page.items.get(ref) if page is not None else await get_item(store, ref)
        if item is None or item.claim is None or not await self.hides_claim(item):
            return False
        return entry.actor == item.claim or f'"{item.claim}"' in data

    async def hides_claim(self, item: Item) -> bool:
        """Whether the claim of `item` is one this viewer may not know: a plan's or
        evidence's is its outcome's, known only to who may see that outcome
        (`views.claim_seen`, and the ledger's entries naming its holder)."""
        return item.kind in ("plan", "evidence") and item.parent is not None \
            and not await self.sees_ref(item.parent)


def viewer_for(call: Any) -> Viewer:
    """The viewer of a tool call (`bot.tools.registry.Call`)."""
    return viewer_of(call.services, call.forge, call.office, call.principal)


def viewer_of(services: Any, forge: Forge, office: Office, principal: str) -> Viewer:
    """`principal` looking, with the app's `services` (`bot.app.context.Services`): as a call
    of theirs would (`viewer_for`), for who is not calling (who an update would wake)."""
    return Viewer(services.visibility, forge, office, principal,
                  services.keyring.renamed(office.org))
