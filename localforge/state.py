"""The forge's state: plain pydantic models, so a snapshot is `State.model_dump_json()`.
Each is a `Tracked` model: with a data_dir, a field assigned is reported to the persisted rows
it lies in (localforge/persist.py), so a save writes what changed; without one, inert.

Dialect-neutral: GitHub's (and later Gitea's) JSON shapes are rendered from these elsewhere.
Logins are matched case-insensitively, as on the real forges.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

AccountType = Literal["User", "Organization", "Bot"]
Permission = Literal["read", "triage", "write", "maintain", "admin"]
PERMISSIONS: tuple[Permission, ...] = ("read", "triage", "write", "maintain", "admin")


class _Hook(Protocol):
    def changed(self, model: Tracked, name: str) -> None: ...


class Tracked(BaseModel):
    """A state model that tells the persistence layer (its `_lf_hook`, set only while the
    model lies in a persisted state) when one of its fields is assigned. The slot is not a
    field: it is not dumped, compared or copied."""

    __slots__ = ("_lf_hook",)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        try:
            hook: _Hook | None = object.__getattribute__(self, "_lf_hook")
        except AttributeError:
            return
        if hook is not None and not name.startswith("_"):
            hook.changed(self, name)


def perm_rank(p: str | None) -> int:
    """0 for no access, 1 read ... 5 admin."""
    return PERMISSIONS.index(p) + 1 if p in PERMISSIONS else 0  # type: ignore[arg-type,unused-ignore]


class Account(Tracked):
    id: int
    login: str
    type: AccountType = "User"
    email: str | None = None
    name: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    site_admin: bool = False  # Gitea's instance administrator (sees others' private fields)


class IssueType(Tracked):
    """An organisation's issue type (GitHub: "Managing issue types in an organization")."""

    id: int
    name: str
    description: str | None = None
    color: str | None = None
    is_enabled: bool = True
    created_at: float = 0.0
    updated_at: float = 0.0


class IssueFieldOption(Tracked):
    """An option of a single- or multi-select issue field."""

    id: int
    name: str
    description: str | None = None
    color: str | None = None
    priority: int | None = None
    created_at: float = 0.0
    updated_at: float = 0.0


class IssueField(Tracked):
    """An organisation's issue field (GitHub: "Managing issue fields in an organization")."""

    id: int
    name: str
    data_type: Literal["text", "date", "single_select", "multi_select", "number"]
    description: str | None = None
    visibility: Literal["organization_members_only", "all"] = "organization_members_only"
    options: list[IssueFieldOption] = Field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0


class IssueFieldValue(Tracked):
    """An issue's value of one of its org's issue fields: `value` for text, date and number
    fields; the chosen options' ids for select fields."""

    id: int
    field_id: int
    value: str | float | None = None
    option_ids: list[int] = Field(default_factory=list)


class Org(Tracked):
    login: str
    owners: list[str] = Field(default_factory=list)
    members: list[str] = Field(default_factory=list)  # includes the owners
    description: str | None = None
    issue_types: list[IssueType] = Field(default_factory=list)
    issue_fields: list[IssueField] = Field(default_factory=list)


class Team(Tracked):
    id: int
    org: str
    slug: str
    name: str
    members: list[str] = Field(default_factory=list)
    repo_permissions: dict[int, str] = Field(default_factory=dict)


class Reaction(Tracked):
    id: int
    content: str
    user: str
    created_at: float
    via_app: int | None = None


class Label(Tracked):
    id: int
    name: str
    color: str = "ededed"
    description: str | None = None
    default: bool = False
    # Gitea's exclusive scoped labels: on an issue, one label a scope ("mail/new" and
    # "mail/working" share the scope "mail"); GitHub has none and leaves it False
    exclusive: bool = False

    @property
    def exclusive_scope(self) -> str:
        """Gitea's Label.ExclusiveScope: the name up to its last "/", for an exclusive label
        whose name has one neither first nor last; else no scope ("")."""
        at = self.name.rfind("/")
        if not self.exclusive or at <= 0 or at == len(self.name) - 1:
            return ""
        return self.name[:at]


class Comment(Tracked):
    id: int
    issue_number: int
    body: str
    user: str
    created_at: float
    updated_at: float
    via_app: int | None = None
    reactions: list[Reaction] = Field(default_factory=list)


class Event(Tracked):
    """A timeline event: labeled, unlabeled, closed, reopened, renamed, assigned, ..."""

    id: int
    event: str
    actor: str
    created_at: float
    via_app: int | None = None
    label: dict[str, str] | None = None
    rename: dict[str, str] | None = None
    state_reason: str | None = None
    assignee: str | None = None
    # the other issue of a dependency or sub-issue event (blocked_by_added, sub_issue_added...)
    issue_ref: int | None = None


class Issue(Tracked):
    id: int
    number: int
    title: str
    body: str | None = None
    user: str
    state: Literal["open", "closed"] = "open"
    state_reason: str | None = None
    labels: list[int] = Field(default_factory=list)  # label ids, in order applied
    assignees: list[str] = Field(default_factory=list)
    created_at: float
    updated_at: float
    closed_at: float | None = None
    closed_by: str | None = None
    locked: bool = False
    via_app: int | None = None
    comment_ids: list[int] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    reactions: list[Reaction] = Field(default_factory=list)
    type_id: int | None = None  # the org's issue type it has
    parent_id: int | None = None  # the issue id of its parent, when it is a sub-issue
    sub_issue_ids: list[int] = Field(default_factory=list)  # its sub-issues' ids, in order
    # the ids of the issues it is blocked by (GitHub's dependencies; Gitea's "depends on")
    blocked_by_ids: list[int] = Field(default_factory=list)
    blocking_ids: list[int] = Field(default_factory=list)  # the other side of each
    field_values: list[IssueFieldValue] = Field(default_factory=list)  # its issue fields'


class Branch(Tracked):
    """A branch besides the default one: its whole tree (text files), the tree it was made
    from (what a pull request from it is compared with) and its head commit."""

    name: str
    files: dict[str, str] = Field(default_factory=dict)
    base_files: dict[str, str] = Field(default_factory=dict)
    base_sha: str = ""
    head_sha: str = ""


class Commit(Tracked):
    """A commit on a branch besides the default one: the branch's tree at it (so contents
    read `?ref=<sha>` see that commit's files)."""

    sha: str
    branch: str
    message: str = ""
    author: str = ""
    parents: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    created_at: float = 0.0


class PullRequest(Tracked):
    """A pull request from a branch of the repository to another (no forks); its number is
    taken from the repository's issue numbers, as GitHub's are."""

    id: int
    number: int
    title: str
    body: str | None = None
    user: str
    head_ref: str
    base_ref: str
    head_sha: str
    base_sha: str
    state: Literal["open", "closed"] = "open"
    commits: int = 1
    created_at: float
    updated_at: float
    closed_at: float | None = None


class CheckRun(Tracked):
    """A check run an App made on a commit (GitHub's Checks API); `annotations` are appended
    to at each update that brings some, as GitHub does."""

    id: int
    app_id: int
    name: str
    head_sha: str
    status: str = "queued"
    conclusion: str | None = None
    started_at: float
    completed_at: float | None = None
    details_url: str | None = None
    external_id: str | None = None
    title: str | None = None
    summary: str | None = None
    text: str | None = None
    annotations: list[dict[str, Any]] = Field(default_factory=list)


class Repo(Tracked):
    id: int
    owner: str
    name: str
    private: bool = True
    description: str | None = None
    has_issues: bool = True
    archived: bool = False  # read-only: every write answers 403 (PATCH /repos/{o}/{r})
    default_branch: str = "main"
    created_at: float
    updated_at: float
    pushed_at: float
    collaborators: dict[str, str] = Field(default_factory=dict)  # lower login -> permission
    labels: list[Label] = Field(default_factory=list)
    issues: dict[int, Issue] = Field(default_factory=dict)
    comments: dict[int, Comment] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    # path -> base64 of a file that is not UTF-8 text (written through the contents API)
    blobs: dict[str, str] = Field(default_factory=dict)
    next_number: int = 1
    # branches, pull requests and check runs (localforge/github/routes_pulls.py)
    head_sha: str = ""  # the default branch's head commit ("" until a commit names one)
    branches: dict[str, Branch] = Field(default_factory=dict)  # name -> a non-default branch
    commits: dict[str, Commit] = Field(default_factory=dict)  # sha -> a non-default commit
    pulls: dict[int, PullRequest] = Field(default_factory=dict)
    check_runs: dict[int, CheckRun] = Field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def file_bytes(self, path: str) -> bytes | None:
        """The bytes of the file at `path` on the default branch, text or not."""
        text = self.files.get(path)
        if text is not None:
            return text.encode()
        b64 = self.blobs.get(path)
        return None if b64 is None else base64.b64decode(b64)

    def write_file(self, path: str, raw: bytes) -> None:
        """Commit `raw` at `path`: as text when it is UTF-8, else as a blob."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.files.pop(path, None)
            self.blobs[path] = base64.b64encode(raw).decode()
            return
        self.blobs.pop(path, None)
        self.files[path] = text

    def paths(self) -> list[str]:
        """Every file's path, text or not."""
        return [*self.files, *(p for p in self.blobs if p not in self.files)]

    def label_named(self, name: str) -> Label | None:
        low = name.lower()
        return next((lb for lb in self.labels if lb.name.lower() == low), None)

    def label_by_id(self, label_id: int) -> Label | None:
        return next((lb for lb in self.labels if lb.id == label_id), None)

    def open_issue_count(self) -> int:
        return sum(1 for i in self.issues.values() if i.state == "open")


class App(Tracked):
    id: int
    slug: str
    name: str
    owner: str
    public_key_pem: str
    webhook_url: str | None = None
    webhook_secret: str | None = None
    events: list[str] = Field(default_factory=list)
    permissions: dict[str, str] = Field(default_factory=dict)
    created_at: float
    client_id: str
    hook_id: int
    bot_login: str
    description: str = ""
    # what a manifest sets (apps registered through /settings/apps/new)
    external_url: str | None = None  # the manifest's `url`, the App's homepage
    setup_url: str | None = None
    setup_on_update: bool = False
    callback_urls: list[str] = Field(default_factory=list)
    request_oauth_on_install: bool = False
    public: bool = True  # a private App installs only on its owner's account
    client_secret: str | None = None
    # user access tokens expire after 8 hours and come with a refresh token (GitHub's
    # default for new Apps; "Opt out of user access token expiration" turns it off)
    expiring_user_tokens: bool = True


class ManifestCode(Tracked):
    """A manifest submitted on the form, waiting for its conversion (one hour, used once)."""

    code: str
    owner: str  # the user or org the App will belong to
    creator: str  # who submitted the form
    manifest: dict[str, Any]
    created_at: float


class Installation(Tracked):
    id: int
    app_id: int
    account: str
    repository_selection: Literal["all", "selected"] = "all"
    repo_ids: list[int] = Field(default_factory=list)  # used when selection is "selected"
    created_at: float
    updated_at: float
    suspended_at: float | None = None  # still listed; no token, API call or webhook meanwhile
    suspended_by: str | None = None


class Token(Tracked):
    token: str
    kind: Literal["user", "installation"]
    login: str | None = None
    installation_id: int | None = None
    created_at: float
    expires_at: float | None = None
    permissions: dict[str, str] = Field(default_factory=dict)
    repo_ids: list[int] | None = None  # narrowed installation token
    app_id: int | None = None  # a user access token (ghu_): the App it acts through


class WebSession(Tracked):
    """A signed-in browser (the `user_session` cookie), on the forge clock."""

    id: str
    login: str
    created_at: float
    expires_at: float


class OAuthCode(Tracked):
    """A code from /login/oauth/authorize: single use, ten minutes on the forge clock."""

    code: str
    app_id: int
    login: str
    redirect_uri: str | None  # as given to authorize (None: the first callback URL)
    created_at: float
    code_challenge: str | None = None  # PKCE (S256 or plain)
    code_challenge_method: str | None = None


class RefreshToken(Tracked):
    """A `ghr_` refresh token: trades once for a new user access token and refresh token."""

    token: str
    app_id: int
    login: str
    access_token: str  # revoked when this one is used
    expires_at: float


class WebState(Tracked):
    """What the forge's web side keeps: passwords, sessions, OAuth grants and codes."""

    passwords: dict[str, str] = Field(default_factory=dict)  # lower login -> password
    sessions: dict[str, WebSession] = Field(default_factory=dict)
    authorizations: dict[str, list[int]] = Field(default_factory=dict)  # lower login -> apps
    codes: dict[str, OAuthCode] = Field(default_factory=dict)
    refresh_tokens: dict[str, RefreshToken] = Field(default_factory=dict)


class Delivery(Tracked):
    id: int
    guid: str
    app_id: int
    event: str
    action: str | None
    installation_id: int | None
    repository_id: int | None
    url: str
    delivered_at: float = 0.0
    redelivery: bool = False
    duration: float = 0.0
    status: str = "pending"
    status_code: int = 0
    request_headers: dict[str, str] = Field(default_factory=dict)
    payload: dict[str, Any] = Field(default_factory=dict)
    response_headers: dict[str, str] = Field(default_factory=dict)
    response_payload: str | None = None


class State(Tracked):
    # whose access rules apply (access.user_level): an org member's base permission differs
    dialect: Literal["github", "gitea"] = "github"
    accounts: dict[str, Account] = Field(default_factory=dict)  # lower login -> account
    orgs: dict[str, Org] = Field(default_factory=dict)  # lower login -> org
    teams: list[Team] = Field(default_factory=list)
    repos: dict[int, Repo] = Field(default_factory=dict)
    apps: dict[int, App] = Field(default_factory=dict)
    installations: dict[int, Installation] = Field(default_factory=dict)
    tokens: dict[str, Token] = Field(default_factory=dict)
    deliveries: dict[int, Delivery] = Field(default_factory=dict)
    manifest_codes: dict[str, ManifestCode] = Field(default_factory=dict)
    web: WebState = Field(default_factory=WebState)
    ids: dict[str, int] = Field(default_factory=dict)
    # a repository's full names before (lower case) -> its id: where a renamed org's or
    # repository's old URLs lead (GitHub redirects them until the name is taken again)
    moved: dict[str, int] = Field(default_factory=dict)

    def next_id(self, kind: str) -> int:
        base = {"account": 1000, "repo": 100000, "label": 200000, "issue": 300000,
                "comment": 400000, "event": 500000, "reaction": 600000, "app": 1,
                "installation": 10, "delivery": 700000, "team": 50, "hook": 400,
                "issue_type": 900, "issue_field": 1200, "issue_field_option": 1300,
                "issue_field_value": 1400, "pull": 800000, "check_run": 1500000}
        n = self.ids.get(kind, base.get(kind, 1)) + 1
        self.ids[kind] = n
        return n

    # -- lookups -------------------------------------------------------------------------
    def account(self, login: str) -> Account | None:
        return self.accounts.get(login.lower())

    def account_by_id(self, account_id: int) -> Account | None:
        return next((a for a in self.accounts.values() if a.id == account_id), None)

    def org(self, login: str) -> Org | None:
        return self.orgs.get(login.lower())

    def repo(self, owner: str, name: str) -> Repo | None:
        o, n = owner.lower(), name.lower()
        return next(
            (r for r in self.repos.values() if r.owner.lower() == o and r.name.lower() == n),
            None,
        )

    def issue_by_id(self, issue_id: int) -> tuple[Repo, Issue] | None:
        """The issue with this id (ids are unique across repositories), and its repository."""
        for repo in self.repos.values():
            for issue in repo.issues.values():
                if issue.id == issue_id:
                    return repo, issue
        return None

    def repo_by_full_name(self, full_name: str) -> Repo | None:
        owner, _, name = full_name.partition("/")
        return self.repo(owner, name)

    def team(self, org: str, slug: str) -> Team | None:
        o, s = org.lower(), slug.lower()
        return next((t for t in self.teams if t.org.lower() == o and t.slug == s), None)

    def app_by_bot(self, login: str) -> App | None:
        low = login.lower()
        return next((a for a in self.apps.values() if a.bot_login.lower() == low), None)

    def installations_for_repo(self, repo: Repo) -> list[Installation]:
        return [
            inst for inst in self.installations.values()
            if inst.account.lower() == repo.owner.lower()
            and (inst.repository_selection == "all" or repo.id in inst.repo_ids)
        ]

    def installation_repos(self, inst: Installation) -> list[Repo]:
        return [
            r for r in self.repos.values()
            if r.owner.lower() == inst.account.lower()
            and (inst.repository_selection == "all" or r.id in inst.repo_ids)
        ]
