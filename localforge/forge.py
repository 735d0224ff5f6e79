"""LocalForge: the in-process forge tests and `vaultmail up` run (see docs/internals.md)."""

from __future__ import annotations

import functools
import secrets
import string
from pathlib import Path
from typing import Any

from aiohttp import web

from .clock import Clock
from .dialect import Dialect, get_dialect
from .faults import Faults
from .limits import Limits, RateTracker
from .persist import Snapshotter
from .reqlog import BodySent, RequestLog
from .state import PERMISSIONS, Account, App, Installation, Org, Repo, State, Team, Token
from .webhooks import Dispatcher

_ALNUM = string.ascii_letters + string.digits


@functools.lru_cache(maxsize=16)
def public_half(private_pem: str) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def random_token(prefix: str, length: int) -> str:
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(length))


class LocalForge:
    def __init__(self, dialect: str = "github", data_dir: str | Path | None = None) -> None:
        self.dialect_name = dialect
        self.dialect: Dialect = get_dialect(dialect)
        self.clock = Clock()
        self.state = State()
        self._snap: Snapshotter | None = None
        if data_dir is not None:
            self._snap = Snapshotter(data_dir)
            loaded = self._snap.load()
            if loaded is not None:
                self.state, self.clock.offset = loaded
            self._snap.track(self.state)  # saves write what changed (persist.py)
        if self.state.dialect != dialect:
            self.state.dialect = "gitea" if dialect == "gitea" else "github"
        self.faults = Faults()
        self.limits = Limits()
        self.rates = RateTracker(self.limits, self.clock)
        self.requests = RequestLog()
        self.streamed: list[BodySent] = []  # large answers sent in chunks (gitea/http.py)
        self.webhooks = Dispatcher(self.state, self.clock, self.faults, self._headers,
                                   self.save)
        self.url = "http://127.0.0.1:0"
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = self.dialect.build_app(self)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{bound}"
        self.webhooks.start()
        return self.url

    async def stop(self) -> None:
        await self.webhooks.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.save()
        if self._snap is not None:
            self._snap.close()
            self._snap = None

    async def webhooks_idle(self) -> None:
        await self.webhooks.idle()

    def save(self) -> None:
        if self._snap is not None:
            self._snap.save(self.state, self.clock.offset)

    def _headers(self, app: App, delivery: Any, body: bytes) -> dict[str, str]:
        return self.dialect.delivery_headers(self, app, delivery, body)

    # -- seeding -----------------------------------------------------------------------
    def _account(self, login: str, type_: str = "User", email: str | None = None,
                 name: str | None = None) -> Account:
        acct = self.state.account(login)
        if acct is None:
            now = self.clock.now()
            acct = Account(id=self.state.next_id("account"), login=login, type=type_,  # type: ignore[arg-type]
                           email=email, name=name, created_at=now, updated_at=now)
            self.state.accounts[login.lower()] = acct
        return acct

    def add_user(self, login: str, email: str | None = None, name: str | None = None) -> str:
        """Create the user (if new) and return a new personal access token for it."""
        acct = self._account(login, "User", email, name)
        if email and not acct.email:
            acct.email = email
        token = (secrets.token_hex(20) if self.dialect_name == "gitea"  # Gitea: 40 hex chars
                 else random_token("ghp_", 36))
        self.state.tokens[token] = Token(token=token, kind="user", login=acct.login,
                                         created_at=self.clock.now())
        self.save()
        return token

    def user_token(self, login: str) -> str:
        """An existing personal access token of `login` (a new one if it has none)."""
        for tok in self.state.tokens.values():
            if (tok.kind == "user" and tok.app_id is None and tok.login
                    and tok.login.lower() == login.lower()):
                return tok.token
        return self.add_user(login)

    def user_password(self, login: str) -> str:
        """The password `login` signs in to the forge's web pages with (made on first ask)."""
        acct = self.state.account(login)
        if acct is None or acct.type != "User":
            raise KeyError(f"no user {login!r}")
        key = acct.login.lower()
        password = self.state.web.passwords.get(key)
        if password is None:
            password = secrets.token_urlsafe(15)
            self.state.web.passwords[key] = password
            self.save()
        return password

    def add_org(self, login: str, owner: str = "admin") -> None:
        if self.state.account(owner) is None:
            self.add_user(owner)
        self._account(login, "Organization")
        owner_login = self.state.account(owner).login  # type: ignore[union-attr]
        org = self.state.org(login) or Org(login=login)
        if owner_login not in org.owners:
            org.owners.append(owner_login)
        if owner_login not in org.members:
            org.members.append(owner_login)
        self.state.orgs[login.lower()] = org
        self.save()

    def add_org_member(self, org: str, login: str, role: str = "member") -> None:
        o = self._org(org)
        if self.state.account(login) is None:
            self.add_user(login)
        real = self.state.account(login).login  # type: ignore[union-attr]
        if real not in o.members:
            o.members.append(real)
        if role == "admin" and real not in o.owners:
            o.owners.append(real)
        self.save()

    def remove_org_member(self, org: str, login: str) -> None:
        """Take someone out of an org (and its owners): what they saw as a member, they lose."""
        o = self._org(org)
        o.members[:] = [m for m in o.members if m.lower() != login.lower()]
        o.owners[:] = [m for m in o.owners if m.lower() != login.lower()]
        self.save()

    def add_team(self, org: str, slug: str, members: list[str],
                 name: str | None = None) -> int:
        self._org(org)
        team = self.state.team(org, slug)
        if team is None:
            team = Team(id=self.state.next_id("team"), org=org, slug=slug, name=name or slug)
            self.state.teams.append(team)
        for m in members:
            if self.state.account(m) is None:
                self.add_user(m)
            real = self.state.account(m).login  # type: ignore[union-attr]
            if real not in team.members:
                team.members.append(real)
        self.save()
        return team.id

    def remove_team_member(self, org: str, slug: str, login: str) -> None:
        """Take someone out of a team: what they reached through it, they lose."""
        team = self.state.team(org, slug)
        if team is None:
            raise KeyError(f"no team {org}/{slug}")
        team.members[:] = [m for m in team.members if m.lower() != login.lower()]
        self.save()

    def add_repo(self, owner: str, name: str, private: bool = True,
                 description: str | None = None, sender: str | None = None) -> int:
        """Create a repository (issues enabled); installations on all repos hear about it."""
        existing = self.state.repo(owner, name)
        if existing is not None:
            return existing.id
        acct = self.state.account(owner)
        if acct is None:
            raise KeyError(f"no user or org {owner!r}")
        now = self.clock.now()
        repo = Repo(id=self.state.next_id("repo"), owner=acct.login, name=name, private=private,
                    description=description, created_at=now, updated_at=now, pushed_at=now)
        self.state.repos[repo.id] = repo
        org = self.state.org(owner)
        who = sender or (org.owners[0] if org and org.owners else acct.login)
        self.dialect.repo_created(self, repo, who)
        self.save()
        return repo.id

    def rename_org(self, old: str, new: str, sender: str | None = None) -> None:
        """The org (or user) `old` renames itself `new`, as its owner would in its settings:
        the same account (its id) under a new login, its repositories with it, their old
        names leading to them (`State.moved`); each App installed on it hears
        `installation_target.renamed` (GitHub; Gitea tells no hook)."""
        acct = self.state.account(old)
        if acct is None:
            raise KeyError(f"no user or org {old!r}")
        if self.state.account(new) is not None:
            raise ValueError(f"the login {new!r} is taken")
        was, low = acct.login, old.lower()
        who = sender or self._owner_of_login(was)
        del self.state.accounts[low]
        acct.login = new
        acct.updated_at = self.clock.now()
        self.state.accounts[new.lower()] = acct
        org = self.state.orgs.pop(low, None)
        if org is not None:
            org.login = new
            self.state.orgs[new.lower()] = org
        moved = dict(self.state.moved)
        for repo in self.state.repos.values():
            if repo.owner.lower() == low:
                moved[f"{low}/{repo.name.lower()}"] = repo.id
                repo.owner = new
        self.state.moved = moved
        for team in self.state.teams:
            if team.org.lower() == low:
                team.org = new
        for inst in self.state.installations.values():
            if inst.account.lower() == low:
                inst.account = new
        self.dialect.account_renamed(self, acct, was, who)
        self.save()

    def rename_repo(self, full_name: str, name: str, sender: str | None = None) -> None:
        """Rename a repository (its settings): its old name leads to it (`State.moved`), and
        the Apps on it hear `repository.renamed` (GitHub)."""
        repo = self._repo(full_name)
        if self.state.repo(repo.owner, name) is not None:
            raise ValueError(f"{repo.owner}/{name} exists")
        was = repo.name
        self.state.moved = {**self.state.moved, repo.full_name.lower(): repo.id}
        repo.name = name
        repo.updated_at = self.clock.now()
        self.dialect.repo_renamed(self, repo, was, sender or self._owner_of_login(repo.owner))
        self.save()

    def transfer_repo(self, full_name: str, owner: str, sender: str | None = None) -> None:
        """Transfer a repository to the user or org `owner` (its admin may, GitHub's
        "Transfer ownership"): the same repository (its id) under the new owner, its old name
        leading to it (`State.moved`), as GitHub redirects it; the Apps on the new owner hear
        `repository.transferred` (GitHub sends it only there; Gitea tells no hook)."""
        repo = self._repo(full_name)
        acct = self.state.account(owner)
        if acct is None:
            raise KeyError(f"no user or org {owner!r}")
        if self.state.repo(acct.login, repo.name) is not None:
            raise ValueError(f"{acct.login}/{repo.name} exists")
        was = repo.owner
        self.state.moved = {**self.state.moved, repo.full_name.lower(): repo.id}
        repo.owner = acct.login
        repo.updated_at = self.clock.now()
        self.dialect.repo_transferred(self, repo, was, sender or self._owner_of_login(was))
        self.save()

    def _owner_of_login(self, login: str) -> str:
        org = self.state.org(login)
        return org.owners[0] if org and org.owners else login

    def set_permission(self, full_name: str, login: str, permission: str) -> None:
        if permission not in PERMISSIONS:
            raise ValueError(f"permission must be one of {PERMISSIONS}")
        repo = self._repo(full_name)
        if self.state.account(login) is None:
            self.add_user(login)
        repo.collaborators[login.lower()] = permission
        self.save()

    def remove_permission(self, full_name: str, login: str) -> None:
        """Remove a collaborator from a repository (what the forge's UI calls "Remove")."""
        self._repo(full_name).collaborators.pop(login.lower(), None)
        self.save()

    def set_team_permission(self, org: str, slug: str, full_name: str, permission: str) -> None:
        team = self.state.team(org, slug)
        if team is None:
            raise KeyError(f"no team {org}/{slug}")
        team.repo_permissions[self._repo(full_name).id] = permission
        self.save()

    def put_file(self, full_name: str, path: str, text: str, pusher: str | None = None) -> None:
        """Commit one file to the default branch; with `pusher`, as a push that sends the
        `push` webhook (seeding passes no pusher: the repository starts with the file)."""
        repo = self._repo(full_name)
        existed = path.strip("/") in repo.files
        repo.files[path.strip("/")] = text
        repo.pushed_at = repo.updated_at = self.clock.now()
        repo.head_sha = secrets.token_hex(20)  # the default branch's new head commit
        self.save()
        if pusher is not None:
            self.dialect.pushed(self, repo, pusher, path.strip("/"), existed)

    # -- branches and pull requests (GitHub dialect: localforge/github/routes_pulls.py) ---
    def push_to_branch(self, full_name: str, branch: str, files: dict[str, str | None],
                       pusher: str, message: str | None = None) -> str:
        """Commit `files` (path -> text; None removes the file) on `branch`, a branch
        besides the default one (made from it when new); its new head sha. An open pull
        request from the branch is told with `pull_request.synchronize`."""
        from .github import routes_pulls

        self._github_only("push_to_branch")
        _, sha = routes_pulls.push(self, self._repo(full_name), branch, files, pusher, message)
        self.save()
        return sha

    def open_pull(self, full_name: str, head_branch: str, files: dict[str, str | None],
                  author: str, title: str | None = None, body: str | None = None) -> int:
        """Push `files` to `head_branch` (see `push_to_branch`; none: the branch as it is)
        and open a pull request from it into the default branch, as `author`: the
        `pull_request.opened` webhook. Returns the pull request's number."""
        from .github import routes_pulls

        self._github_only("open_pull")
        repo = self._repo(full_name)
        if files or head_branch not in repo.branches:
            routes_pulls.push(self, repo, head_branch, files, author)
        pr = routes_pulls.open_pull(self, repo, head_branch, author,
                                    title or f"Update {', '.join(sorted(files)) or head_branch}",
                                    body)
        self.save()
        return pr.number

    def _github_only(self, what: str) -> None:
        if self.dialect_name != "github":
            raise NotImplementedError(f"{what}: the {self.dialect_name} dialect has no pull "
                                      "requests yet")

    def register_app(self, slug: str, name: str, public_key_pem: str | bytes,
                     webhook_url: str | None = None, webhook_secret: str | None = None,
                     events: list[str] | None = None,
                     permissions: dict[str, str] | None = None,
                     owner: str | None = None, description: str = "",
                     callback_urls: list[str] | None = None, client_secret: str | None = None,
                     expiring_user_tokens: bool = True) -> int:
        """Register a GitHub App. `callback_urls` are where the OAuth web flow may send a user
        back (`redirect_uri`); the client secret is made up unless given (40 hex characters,
        as GitHub's) and read back with `client_credentials`."""
        pem = public_key_pem.decode() if isinstance(public_key_pem, bytes) else public_key_pem
        if "PRIVATE KEY" in pem:  # accept the private key too: keep only its public half
            pem = public_half(pem)
        owner_login = owner or next(iter(self.state.orgs.values()), Org(login="admin")).login
        if self.state.account(owner_login) is None:
            self.add_user(owner_login)
        app_id = self.state.next_id("app")
        bot_login = f"{slug}[bot]"
        self._account(bot_login, "Bot")
        self.state.apps[app_id] = App(
            id=app_id, slug=slug, name=name, owner=owner_login, public_key_pem=pem,
            webhook_url=webhook_url, webhook_secret=webhook_secret, events=list(events or []),
            permissions=dict(permissions or {"issues": "write", "metadata": "read"}),
            created_at=self.clock.now(), client_id=random_token("Iv1.", 16),
            hook_id=self.state.next_id("hook"), bot_login=bot_login, description=description,
            callback_urls=list(callback_urls or []),
            client_secret=client_secret or secrets.token_hex(20),
            expiring_user_tokens=expiring_user_tokens,
        )
        self.save()
        return app_id

    def client_credentials(self, app_id: int) -> tuple[str, str]:
        """The App's OAuth client id and client secret (a secret is made if it has none)."""
        app = self.state.apps[app_id]
        if not app.client_secret:
            app.client_secret = secrets.token_hex(20)
            self.save()
        return app.client_id, app.client_secret

    def set_callback_urls(self, app_id: int, urls: list[str]) -> None:
        """Replace the App's OAuth callback URLs (e.g. once the app's port is known)."""
        self.state.apps[app_id].callback_urls = list(urls)
        self.save()

    def set_webhook(self, app_id: int, url: str | None = None,
                    secret: str | None = None) -> None:
        app = self.state.apps[app_id]
        if url is not None:
            app.webhook_url = url
        if secret is not None:
            app.webhook_secret = secret
        self.save()

    def balance(self, url: str, targets: list[str]) -> None:
        """A load balancer at `url` (an App's webhook URL, a Gitea hook's) in front of
        `targets`, the replicas of the app: each delivery goes to the next in turn, past any
        that refuses the connection. Empty `targets`: deliveries go to `url` itself again.
        Which replica took a delivery: `forge.webhooks.took[delivery.id]`."""
        if targets:
            self.webhooks.balanced[url] = list(targets)
        else:
            self.webhooks.balanced.pop(url, None)

    def install_app(self, app_id: int, account: str,
                    repositories: list[str] | None = None, sender: str | None = None) -> int:
        """Install on `account` (all repos, or the named ones); sends installation.created."""
        app = self.state.apps[app_id]
        acct = self.state.account(account)
        if acct is None:
            raise KeyError(f"no user or org {account!r}")
        now = self.clock.now()
        inst = Installation(id=self.state.next_id("installation"), app_id=app.id,
                            account=acct.login, created_at=now, updated_at=now)
        if repositories is not None:
            inst.repository_selection = "selected"
            inst.repo_ids = [self._repo(r if "/" in r else f"{acct.login}/{r}").id
                             for r in repositories]
        self.state.installations[inst.id] = inst
        org = self.state.org(account)
        who = sender or (org.owners[0] if org and org.owners else acct.login)
        self.dialect.installation_created(self, inst, who)
        self.save()
        return inst.id

    def uninstall_app(self, installation_id: int, sender: str | None = None) -> None:
        """Uninstall (as an org owner would): sends installation.deleted, then the
        installation and its tokens are gone (its calls answer 401 or 404)."""
        inst = self.state.installations[installation_id]
        who = sender or self._owner_of(inst)
        self.dialect.installation_deleted(self, inst, who)
        del self.state.installations[installation_id]
        for value, token in list(self.state.tokens.items()):
            if token.installation_id == installation_id:
                del self.state.tokens[value]
        self.save()

    def suspend_app(self, installation_id: int, sender: str | None = None) -> None:
        """Suspend the installation (as an org owner would, in its settings): sends
        installation.suspend; it stays listed, with `suspended_at`, but gets no token (403)
        and no other webhook until `unsuspend_app`, and its tokens stop working (401)."""
        inst = self.state.installations[installation_id]
        who = sender or self._owner_of(inst)
        inst.suspended_at = inst.updated_at = self.clock.now()
        inst.suspended_by = who
        for value, token in list(self.state.tokens.items()):
            if token.installation_id == installation_id:
                del self.state.tokens[value]
        self.dialect.installation_suspended(self, inst, who, "suspend")
        self.save()

    def unsuspend_app(self, installation_id: int, sender: str | None = None) -> None:
        """Undo `suspend_app`: sends installation.unsuspend."""
        inst = self.state.installations[installation_id]
        who = sender or self._owner_of(inst)
        inst.suspended_at = inst.suspended_by = None
        inst.updated_at = self.clock.now()
        self.dialect.installation_suspended(self, inst, who, "unsuspend")
        self.save()

    def _owner_of(self, inst: Installation) -> str:
        org = self.state.org(inst.account)
        return org.owners[0] if org and org.owners else inst.account

    def create_installation_token(self, installation_id: int, ttl: float = 3600.0) -> Token:
        """Mint an installation token directly (the API route does the same after the JWT)."""
        inst = self.state.installations[installation_id]
        now = self.clock.now()
        token = Token(token=random_token("ghs_", 36 + secrets.randbelow(40)),
                      kind="installation", installation_id=inst.id, created_at=now,
                      expires_at=now + ttl)
        self.state.tokens[token.token] = token
        return token

    # -- helpers -----------------------------------------------------------------------
    def _org(self, login: str) -> Org:
        org = self.state.org(login)
        if org is None:
            raise KeyError(f"no org {login!r}")
        return org

    def _repo(self, full_name: str) -> Repo:
        repo = self.state.repo_by_full_name(full_name)
        if repo is None:
            raise KeyError(f"no repository {full_name!r}")
        return repo
