"""Who is asking, and what they may do to a repository (dialect-neutral).

A principal is resolved from a request's credentials; `level()` gives the permission it holds on
a repository for one permission scope ("issues", "contents", "metadata", ...), `None` when the
repository is not visible to it at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .state import PERMISSIONS, App, Installation, Repo, State, Token, perm_rank

AuthKind = Literal["none", "user", "installation", "app"]


@dataclass
class Principal:
    kind: AuthKind
    login: str | None = None  # user login, the bot login for an installation, the app slug
    token: Token | None = None
    installation: Installation | None = None
    app: App | None = None

    @property
    def rate_key(self) -> str:
        if self.kind == "installation" and self.installation is not None:
            return f"installation:{self.installation.id}"
        if self.kind == "app" and self.app is not None:
            return f"app:{self.app.id}"
        if self.kind == "user" and self.login:
            return f"user:{self.login.lower()}"
        return "anonymous"

    @property
    def via_app(self) -> int | None:
        """The App a write goes through: an installation's, or a user access token's."""
        return self.app.id if self.kind in ("installation", "user") and self.app else None

    @property
    def user_via_app(self) -> bool:
        """A user access token (ghu_): the user, as far as the App's installation reaches."""
        return self.kind == "user" and self.app is not None


def user_level(state: State, login: str, repo: Repo) -> str | None:
    """The role a user holds on a repository (None: no access beyond what public gives)."""
    low = login.lower()
    best = 0
    if repo.owner.lower() == low:
        return "admin"
    org = state.org(repo.owner)
    if org is not None:
        if low in (o.lower() for o in org.owners):
            return "admin"
        # GitHub: membership gives the org's base permission (default read) on every
        # repository. Gitea (models/perm/access/repo_permission.go, GetUserRepoPermission):
        # a member reaches a private repository only through a team that has it (the
        # Owners team: owner); membership alone gives a public one's minimum, read.
        if state.dialect == "github" and low in (m.lower() for m in org.members):
            best = max(best, perm_rank("read"))
        for team in state.teams:
            if team.org.lower() == org.login.lower() and low in (m.lower() for m in team.members):
                best = max(best, perm_rank(team.repo_permissions.get(repo.id)))
    best = max(best, perm_rank(repo.collaborators.get(low)))
    if best == 0 and not repo.private:
        best = perm_rank("read")
    return PERMISSIONS[best - 1] if best else None


def installation_covers(state: State, p: Principal, repo: Repo) -> bool:
    inst = p.installation
    if inst is None:
        return False
    if inst.account.lower() != repo.owner.lower():
        return False
    if inst.repository_selection == "selected" and repo.id not in inst.repo_ids:
        return False
    return not (p.token is not None and p.token.repo_ids is not None
                and repo.id not in p.token.repo_ids)


def _app_role(permissions: dict[str, str], scope: str) -> str | None:
    granted = permissions.get(scope)
    if scope == "metadata" and granted is None:
        granted = "read"
    return granted if granted in ("read", "write", "admin") else None


def app_user_level(state: State, p: Principal, repo: Repo, scope: str) -> str | None:
    """A user access token reaches what both the user and the App's installation reach, with
    the lesser of the user's role and the App's permission (GitHub's user-to-server tokens).
    A public repository the App is not installed on is read-only to it."""
    assert p.login is not None and p.app is not None
    user = user_level(state, p.login, repo)
    if user is None:
        return None
    app = p.app
    if not any(i.app_id == app.id for i in state.installations_for_repo(repo)):
        return "read" if not repo.private and scope in ("metadata", "issues", "contents") \
            else None
    role = _app_role(app.permissions, scope)
    return PERMISSIONS[min(perm_rank(user), perm_rank(role)) - 1] if role else None


def app_level(state: State, p: Principal, repo: Repo, scope: str) -> str | None:
    """What the App behind a user access token may do on `repo` for `scope` by itself."""
    if p.app is None or not any(i.app_id == p.app.id
                                for i in state.installations_for_repo(repo)):
        return None
    return _app_role(p.app.permissions, scope)


def installation_permissions(p: Principal) -> dict[str, str]:
    if p.token is not None and p.token.permissions:
        return p.token.permissions
    return dict(p.app.permissions) if p.app is not None else {}


def visible(state: State, p: Principal, repo: Repo) -> bool:
    if not repo.private:
        return True
    if p.user_via_app:
        return app_user_level(state, p, repo, "metadata") is not None
    if p.kind == "user" and p.login:
        return user_level(state, p.login, repo) is not None
    if p.kind == "installation":
        return installation_covers(state, p, repo)
    return False


def level(state: State, p: Principal, repo: Repo, scope: str = "issues") -> str | None:
    """Permission held on `repo` for `scope`; installations map app permissions to roles."""
    if p.user_via_app:
        return app_user_level(state, p, repo, scope)
    if p.kind == "user" and p.login:
        return user_level(state, p.login, repo)
    if p.kind == "installation":
        if not installation_covers(state, p, repo):
            return "read" if not repo.private else None
        granted = installation_permissions(p).get(scope)
        if scope == "metadata" and granted is None:
            granted = "read"
        if granted == "admin":
            return "admin"
        if granted == "write":
            return "write"
        if granted == "read":
            return "read"
        return None
    return "read" if not repo.private else None


def at_least(perm: str | None, needed: str) -> bool:
    return perm_rank(perm) >= perm_rank(needed)
