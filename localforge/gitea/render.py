"""Gitea's JSON shapes (Gitea 1.22 API, `modules/structs`), rendered from the forge state.

API URLs live under `/api/v1`; label colours are returned without `#`, as Gitea's
`convert.ToLabel` trims it; empty assignee lists are `null`.
"""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..access import level
from ..clock import iso
from ..state import Account, Comment, Issue, Label, Repo, State, perm_rank

if TYPE_CHECKING:
    from ..forge import LocalForge

Json = dict[str, Any]
API = "/api/v1"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time
EPOCH = "1970-01-01T00:00:00Z"  # timeutil.TimeStamp(0).AsTime()


class GiteaRenderer:
    """Renders for one caller (`viewer`, Gitea's `ctx.Doer`; None for webhook payloads and
    anonymous requests), as Gitea's `convert` functions render for their `doer`."""

    def __init__(self, forge: LocalForge, viewer: str | None = None) -> None:
        self.forge = forge
        self.state: State = forge.state
        self.web = forge.url
        self.api = forge.url + API
        self.viewer = viewer

    # -- users -------------------------------------------------------------------------
    def _authed(self, acct: Account) -> bool:
        """services/convert/user.go ToUser: the doer is the user or a site administrator."""
        if self.viewer is None:
            return False
        me = self.state.account(self.viewer)
        return self.viewer.lower() == acct.login.lower() or bool(me and me.site_admin)

    def user(self, login: str | Account | None, *, signed: bool | None = None,
             authed: bool | None = None) -> Json | None:
        """Gitea's toUser(user, signed, authed): the real `email` only for a signed-in caller
        (else the no-reply placeholder); `active`, `is_admin`, `login_name`, `language`,
        `last_login`, `prohibit_login` only for the user themselves or a site admin. Without
        `signed`/`authed` they follow the renderer's viewer (ToUser(user, doer))."""
        acct = login if isinstance(login, Account) else (
            self.state.account(login) if login else None)
        if acct is None:
            return None
        signed = self.viewer is not None if signed is None else signed
        authed = self._authed(acct) if authed is None else authed
        placeholder = f"{acct.login.lower()}@noreply.localhost"
        email = placeholder
        if signed:  # an org may have no email; a user always has one in Gitea
            email = acct.email or ("" if acct.type == "Organization" else placeholder)
        return {
            "id": acct.id, "login": acct.login, "login_name": "", "source_id": 0,
            "full_name": acct.name or "", "email": email,
            "avatar_url": f"{self.web}/avatars/{acct.id}", "html_url": f"{self.web}/{acct.login}",
            "language": "", "is_admin": acct.site_admin if authed else False,
            "last_login": EPOCH if authed else ZERO_TIME,  # LastLoginUnix 0: never signed in
            "created": iso(acct.created_at), "restricted": False, "active": authed,
            "prohibit_login": False, "location": "", "website": "", "description": "",
            "visibility": "public", "followers_count": 0, "following_count": 0,
            "starred_repos_count": 0, "username": acct.login,
        }

    def anonymous_user(self, login: str | Account | None) -> Json | None:
        """ToUser(user, nil): webhook senders, comment posters, assignees."""
        return self.user(login, signed=False, authed=False)

    def user_req(self, login: str | Account) -> Json:
        out = self.user(login)
        assert out is not None
        return out

    def org(self, login: str) -> Json:
        acct = self.state.account(login)
        assert acct is not None
        org = self.state.org(login)
        return {"id": acct.id, "name": acct.login, "full_name": acct.name or "",
                "email": "", "avatar_url": f"{self.web}/avatars/{acct.id}",
                "description": (org.description if org else None) or "", "website": "",
                "location": "", "visibility": "public",
                "repo_admin_change_team_access": False, "username": acct.login}

    # -- repositories ------------------------------------------------------------------
    def repo_url(self, repo: Repo) -> str:
        return f"{self.api}/repos/{quote(repo.owner)}/{quote(repo.name)}"

    def repo(self, repo: Repo, role: str | None = "admin") -> Json:
        r = perm_rank(role)
        if r == 0 and not repo.private:  # access_model: anyone may read a public repository
            r = perm_rank("read")
        return {
            # convert.ToRepo: ToUserWithAccessMode(owner, mode): signed with any access, never
            # authed (so `active` is never shown there)
            "id": repo.id, "owner": self.user(repo.owner, signed=r > 0, authed=False),
            "name": repo.name,
            "full_name": repo.full_name, "description": repo.description or "", "empty": False,
            "private": repo.private, "fork": False, "template": False, "parent": None,
            "mirror": False, "size": 0, "language": "",
            "languages_url": f"{self.repo_url(repo)}/languages",
            "html_url": f"{self.web}/{repo.full_name}", "url": self.repo_url(repo),
            "link": "", "ssh_url": f"git@localforge:{repo.full_name}.git",
            "clone_url": f"{self.web}/{repo.full_name}.git", "original_url": "",
            "website": "", "stars_count": 0, "forks_count": 0, "watchers_count": 0,
            "open_issues_count": repo.open_issue_count(), "open_pr_counter": 0,
            # convert.ToRepo: `archived` as it is (Forge.repo_closed reads it at RCPT), and
            # `archived_at` the zero time until then (the state keeps no archive time: its
            # last update stands for it)
            "release_counter": 0, "default_branch": repo.default_branch,
            "archived": repo.archived,
            "created_at": iso(repo.created_at), "updated_at": iso(repo.updated_at),
            "archived_at": iso(repo.updated_at) if repo.archived else "1970-01-01T00:00:00Z",
            "permissions": {"admin": r >= 5, "push": r >= 3, "pull": r >= 1},
            "has_issues": repo.has_issues,
            "internal_tracker": {"enable_time_tracker": False,
                                 "allow_only_contributors_to_track_time": True,
                                 "enable_issue_dependencies": True},
            "has_wiki": False, "has_pull_requests": True, "has_projects": False,
            "has_releases": True, "has_packages": False, "has_actions": False,
            "ignore_whitespace_conflicts": False, "allow_merge_commits": True,
            "allow_rebase": True, "allow_rebase_explicit": True, "allow_squash_merge": True,
            "allow_fast_forward_only_merge": False, "allow_rebase_update": True,
            "default_delete_branch_after_merge": False, "default_merge_style": "merge",
            "default_allow_maintainer_edit": False, "avatar_url": "", "internal": False,
            "mirror_interval": "", "object_format_name": "sha1",
            "mirror_updated": ZERO_TIME, "repo_transfer": None, "topics": None,
        }  # no `licenses`: Gitea 1.23 added it (repository license detection), 1.22 has none

    def repo_for(self, repo: Repo, login: str | None) -> Json:
        """The repository as `login` sees it (its `permissions`)."""
        from ..access import Principal

        role = "admin" if login is None else level(
            self.state, Principal(kind="user", login=login), repo)
        return self.repo(repo, role)

    def repo_brief(self, repo: Repo) -> Json:
        return {"id": repo.id, "name": repo.name, "owner": repo.owner,
                "full_name": repo.full_name}

    # -- labels, issues, comments ------------------------------------------------------
    def label(self, repo: Repo, label: Label) -> Json:
        return {"id": label.id, "name": label.name, "exclusive": label.exclusive,
                "is_archived": False,
                "color": label.color.lstrip("#"), "description": label.description or "",
                "url": f"{self.repo_url(repo)}/labels/{label.id}"}

    def issue_labels(self, repo: Repo, issue: Issue) -> list[Json]:
        return [self.label(repo, lb) for lid in issue.labels
                if (lb := repo.label_by_id(lid)) is not None]

    def issue(self, repo: Repo, issue: Issue) -> Json:
        assignees = [a for a in (self.anonymous_user(x) for x in issue.assignees) if a]
        return {
            "id": issue.id, "url": f"{self.repo_url(repo)}/issues/{issue.number}",
            "html_url": f"{self.web}/{repo.full_name}/issues/{issue.number}",
            "number": issue.number, "user": self.user(issue.user), "original_author": "",
            "original_author_id": 0, "title": issue.title, "body": issue.body or "",
            "ref": "", "assets": [], "labels": self.issue_labels(repo, issue),
            "milestone": None, "assignee": assignees[0] if assignees else None,
            "assignees": assignees or None, "state": issue.state, "is_locked": issue.locked,
            "comments": len(issue.comment_ids), "created_at": iso(issue.created_at),
            "updated_at": iso(issue.updated_at),
            "closed_at": iso(issue.closed_at) if issue.closed_at else None,
            "due_date": None, "pull_request": None, "repository": self.repo_brief(repo),
            "pin_order": 0,
        }

    def comment(self, repo: Repo, c: Comment) -> Json:
        return {
            "id": c.id,
            "html_url": f"{self.web}/{repo.full_name}/issues/{c.issue_number}#issuecomment-{c.id}",
            "pull_request_url": "",
            "issue_url": f"{self.web}/{repo.full_name}/issues/{c.issue_number}",
            "user": self.anonymous_user(c.user),  # ToAPIComment: ToUser(poster, nil)
            "original_author": "", "original_author_id": 0,
            "body": c.body, "assets": [], "created_at": iso(c.created_at),
            "updated_at": iso(c.updated_at),
        }

    # -- contents ----------------------------------------------------------------------
    def content_file(self, repo: Repo, path: str, text: str | bytes) -> Json:
        raw = text.encode() if isinstance(text, str) else text  # a binary file: its bytes
        sha = hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()
        u = f"{self.repo_url(repo)}/contents/{quote(path)}?ref={repo.default_branch}"
        html = f"{self.web}/{repo.full_name}/src/branch/{repo.default_branch}/{quote(path)}"
        git = f"{self.repo_url(repo)}/git/blobs/{sha}"
        return {
            "name": path.rsplit("/", 1)[-1], "path": path, "sha": sha,
            "last_commit_sha": hashlib.sha1(path.encode() + raw).hexdigest(),
            "type": "file", "size": len(raw), "encoding": "base64",
            "content": base64.b64encode(raw).decode(), "target": None, "url": u,
            "html_url": html, "git_url": git,
            "download_url": f"{self.web}/{repo.full_name}/raw/branch/"
                            f"{repo.default_branch}/{quote(path)}",
            "submodule_git_url": None, "_links": {"self": u, "git": git, "html": html},
        }
