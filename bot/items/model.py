"""What an item is, read from a forge issue: its kind, parent, author and claim."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # (annotations only: the index loads this module, not the office's models)
    from bot.office.config import Office

ItemKind = Literal["goal", "outcome", "plan", "evidence"]
ITEM_KINDS: tuple[ItemKind, ...] = ("goal", "outcome", "plan", "evidence")

# "Part of #12" or "Part of acme/product#12", on a line of its own or inside a sentence.
_PART_OF = re.compile(r"\bpart of\s+(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)?#(?P<n>[0-9]+)\b",
                      re.IGNORECASE)
_ISSUE_URL = re.compile(r"/repos/(?P<repo>[^/]+/[^/]+)/issues/(?P<n>[0-9]+)$")
_REF = re.compile(r"^(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(?P<n>[1-9][0-9]*)$")
# A stable item key, like a tracker's: letters and digits, a dash, a number ("AC-12").
KEY = r"[A-Za-z][A-Za-z0-9]{0,15}-[0-9]{1,9}"
_KEY_ONLY = re.compile(rf"^{KEY}$")
# given at the start of the title ("AC-12: Token TTL", "[AC-12] Token TTL"), or on a line of
# the body of its own ("Key: AC-12"), or as the start of the body's first line ("AC-12: ...")
_TITLE_KEY = re.compile(rf"^\s*(?:\[(?P<a>{KEY})\]|(?P<b>{KEY})\s*:)")
_BODY_KEY = re.compile(rf"^[ \t]*key:[ \t]*(?P<k>{KEY})[ \t]*$", re.IGNORECASE | re.MULTILINE)
_FIRST_LINE_KEY = re.compile(rf"^\s*(?P<k>{KEY})\s*:")


def make_ref(repo: str, number: int) -> str:
    """The canonical name of an issue: repository lower-cased (the forge ignores case)."""
    return f"{repo.lower()}#{number}"


def split_ref(ref: str) -> tuple[str, int] | None:
    m = _REF.match(ref.strip())
    return (m["repo"].lower(), int(m["n"])) if m else None


def item_ref(ref: str) -> str:
    """`ref` as the index keeps items (`make_ref`, `Item.ref`): an `owner/repo#N` in any case
    names one issue (the forge ignores case), and a ref someone typed, kept as a ledger
    subject, may be in any; other text as it is."""
    where = split_ref(ref)
    return make_ref(*where) if where is not None else ref


def as_key(text: str) -> str | None:
    """`text` as an item key (upper-cased: keys are compared without case), or None."""
    text = text.strip()
    return text.upper() if _KEY_ONLY.match(text) else None


def key_of(title: str, body: str) -> str | None:
    """The key an item gives itself in its title or body, if any (the title's comes first)."""
    m = _TITLE_KEY.match(title)
    if m:
        return str(m["a"] or m["b"]).upper()
    found = _BODY_KEY.search(body) or _FIRST_LINE_KEY.match(body)
    return str(found["k"]).upper() if found else None


# The org's issue types that are items, by name (any case): GitHub's issue types named as the
# kinds. An office maps its own names with `item_types` (see `type_names`).
DEFAULT_TYPES: dict[str, ItemKind] = {k.capitalize(): k for k in ITEM_KINDS}


def type_names(office: Office | None) -> dict[str, ItemKind]:
    """Issue type name (lower-cased) -> kind: the office's `item_types` mapping over the
    defaults (Goal, Outcome, Plan, Evidence)."""
    names: dict[str, ItemKind] = {n.lower(): k for n, k in DEFAULT_TYPES.items()}
    for kind, name in (office.item_types if office is not None else {}).items():
        names = {n: k for n, k in names.items() if k != kind}
        names[name.lower()] = kind
    return names


def type_kind(issue: dict[str, Any], names: dict[str, ItemKind] | None = None) -> ItemKind | None:
    """The kind the issue's type gives it (GitHub's issue types), or None: no type, or a type
    that is none of the item kinds (a "Bug")."""
    t = issue.get("type")
    name = t.get("name") if isinstance(t, dict) else None
    return (names or type_names(None)).get(str(name).lower()) if name else None


def kind_of(labels: list[str], issue: dict[str, Any] | None = None,
            names: dict[str, ItemKind] | None = None) -> ItemKind | None:
    """An item's kind: its issue type's where that is one of the item types, else its label's.
    Read the same way from a REST issue and a webhook's, so both agree."""
    by_type = type_kind(issue, names) if issue is not None else None
    if by_type is not None:
        return by_type
    label_names = {name.lower() for name in labels}
    return next((k for k in ITEM_KINDS if k in label_names), None)


def part_of(repo: str, issue: dict[str, Any]) -> str | None:
    """The parent `Part of #N` in the body names, if in the item's own org."""
    m = _PART_OF.search(issue.get("body") or "")
    return _same_office(repo, make_ref(m["repo"] or repo, int(m["n"]))) if m else None


def native_parent(repo: str, issue: dict[str, Any]) -> str | None:
    """The parent the forge's sub-issue link names (`parent_issue_url`), if in the item's org."""
    link = _ISSUE_URL.search(str(issue.get("parent_issue_url") or ""))
    return _same_office(repo, make_ref(link["repo"], int(link["n"]))) if link else None


def _same_office(repo: str, parent: str) -> str | None:
    same_office = parent.split("/", 1)[0].lower() == repo.split("/", 1)[0].lower()
    return parent if same_office else None


def parent_of(repo: str, issue: dict[str, Any]) -> str | None:
    """The parent: the forge's sub-issue parent first (GitHub's sub-issues), else the one
    `Part of #N` in the body names (the fallback, and Gitea's way); only one in the item's own
    org (its office): `Part of other-org/x#1` names no parent, so nobody can hang an item, its
    updates and its decisions under another office's outcome."""
    return native_parent(repo, issue) or part_of(repo, issue)


def shows_native_parent(issue: dict[str, Any]) -> bool:
    """Whether the issue, as given, says its sub-issue parent: a REST issue from a forge with
    sub-issues does (`parent_issue_url`, null without one); a webhook's issue does not."""
    return "parent_issue_url" in issue


@dataclass(frozen=True)
class Item:
    repo: str
    number: int
    kind: ItemKind
    title: str
    state: str
    author_login: str
    parent: str | None = None
    assignees: tuple[str, ...] = field(default_factory=tuple)
    author: str | None = None  # office principal of the author, when they are in the office
    claim: str | None = None  # agent principal assigned (outcomes); for plans/evidence, filled
    #                           in from the parent outcome by the service
    key: str | None = None  # the stable key it gives itself ("AC-12"), see `key_of`
    # its issue's forge id (`id` in the forge's issue), where read from the forge: what the
    # app's seals bind (`render.seal`). Not indexed, and no part of an item's equality
    forge_id: int | None = field(default=None, compare=False)

    @property
    def ref(self) -> str:
        return make_ref(self.repo, self.number)

    @property
    def author_principal(self) -> str:
        """The author as an office principal, or `forge:<login>` for someone outside it."""
        return self.author or f"forge:{self.author_login}"

    def as_json(self) -> dict[str, Any]:
        """All of it, the refs it names included: a read path shows `views.item_view`."""
        return {"ref": self.ref, "key": self.key, "kind": self.kind, "title": self.title,
                "state": self.state,
                "parent": self.parent, "author": self.author_principal,
                "assignees": list(self.assignees), "claim": self.claim,
                "contentIsData": True}  # the title is someone's text: data, not instructions


def scope_of(item: Item) -> str:
    """Where the item's decisions count: a plan's or evidence's outcome or goal, else itself."""
    return item.parent if item.kind in ("plan", "evidence") and item.parent else item.ref


def claim_of(office: Office, assignees: list[str]) -> str | None:
    """The agent holding an outcome's claim: the first assignee who is an office agent."""
    for login in assignees:
        who = office.by_login(login)
        if who is not None and who.principal.startswith("agent:"):
            return who.principal
    return None


def item_from_issue(office: Office, repo: str, issue: dict[str, Any]) -> Item | None:
    """The item an issue is, or None when neither its issue type nor a label makes it one."""
    labels = [str(label["name"]) for label in issue.get("labels", [])]
    kind = kind_of(labels, issue, type_names(office))
    if kind is None or issue.get("pull_request"):
        return None
    login = str((issue.get("user") or {}).get("login") or "")
    who = office.by_login(login) if login else None
    assignees = [str(a["login"]) for a in issue.get("assignees") or []]
    return Item(repo=repo.lower(), number=int(issue["number"]), kind=kind,
                title=str(issue.get("title") or ""), state=str(issue.get("state") or "open"),
                author_login=login, parent=parent_of(repo, issue), assignees=tuple(assignees),
                author=who.principal if who else None,
                claim=claim_of(office, assignees) if kind == "outcome" else None,
                key=key_of(str(issue.get("title") or ""), str(issue.get("body") or "")),
                forge_id=int(issue["id"]) if issue.get("id") is not None else None)
