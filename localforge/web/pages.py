"""Read-only pages for the `html_url`s the forge hands out: home, a user or org (its
repositories), a repository (its files and README), its issues (a list, by state), an issue
(title, Markdown body, labels in their colours, state, comments at `#issuecomment-{id}`), a
file (`blob`, `tree`, `raw`), an App, an installation, and avatars. A private repository is
404 unless the viewer may read it, exactly as through the API."""

from __future__ import annotations

import hashlib

from aiohttp import web

from ..access import Principal, user_level, visible
from ..state import Account, Issue, Label, Repo
from . import markdown
from .html import WebError, crumbs, h, link, not_found, page, path_of, redirect, when
from .session import forge_of, viewer

PER_PAGE = 25  # GitHub's issue list


def _principal(request: web.Request) -> Principal:
    return viewer(request).principal


def _repo(request: web.Request) -> Repo:
    st = forge_of(request).state
    repo = st.repo(request.match_info["owner"], request.match_info["repo"])
    if repo is None or not visible(st, _principal(request), repo):
        raise not_found()
    return repo


def _who(login: str) -> str:
    return link(path_of(login.removesuffix("[bot]")) if not login.endswith("[bot]")
                else path_of("apps", login.removesuffix("[bot]")), login)


def text_colour(hex_colour: str) -> str:
    """Black-ish or white text on a label, whichever contrasts more (WCAG luminance)."""
    try:
        rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    except ValueError:
        return "#1f2328"

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2])
    on_white = 1.05 / (lum + 0.05)
    on_dark = (lum + 0.05) / (0.0159 + 0.05)  # #1f2328
    return "#ffffff" if on_white > on_dark else "#1f2328"


def label_chip(label: Label) -> str:
    colour = label.color.lower().lstrip("#")
    if len(colour) != 6:
        colour = "ededed"
    title = f' title="{h(label.description)}"' if label.description else ""
    return (f'<span class="label" style="background-color: #{colour}; color: '
            f'{text_colour(colour)}"{title}>{h(label.name)}</span>')


def _labels(repo: Repo, issue: Issue) -> list[Label]:
    return [lb for lid in issue.labels if (lb := repo.label_by_id(lid)) is not None]


def _state(issue: Issue) -> str:
    text = "Open" if issue.state == "open" else "Closed"
    if issue.state == "closed" and issue.state_reason == "not_planned":
        text = "Closed as not planned"
    return f'<span class="state" data-state="{issue.state}">{text}</span>'


def _repo_crumbs(repo: Repo, *more: tuple[str, str | None]) -> str:
    return crumbs([(repo.owner, path_of(repo.owner)),
                   (repo.name, path_of(repo.owner, repo.name)), *more])


# -- home, accounts ---------------------------------------------------------------------------
def _visible_repos(request: web.Request, owner: str | None = None) -> list[Repo]:
    st = forge_of(request).state
    p = _principal(request)
    return sorted((r for r in st.repos.values()
                   if (owner is None or r.owner.lower() == owner.lower()) and visible(st, p, r)),
                  key=lambda r: r.full_name.lower())


def _repo_list(repos: list[Repo], empty: str) -> str:
    if not repos:
        return f"<p>{h(empty)}</p>"
    items = "".join(
        f"<li>{link(path_of(r.owner, r.name), r.full_name)} "
        f'<span class="muted">{"Private" if r.private else "Public"}'
        f"{' · ' + h(r.description) if r.description else ''}</span></li>" for r in repos)
    return f'<ul class="list">{items}</ul>'


async def home(request: web.Request) -> web.Response:
    who = viewer(request).login
    if who:
        mine = [r for r in _visible_repos(request)
                if user_level(forge_of(request).state, who, r) is not None]
        body = (f"<h1>Welcome, {h(who)}</h1><h2>Repositories you can read</h2>"
                + _repo_list(mine, "None yet."))
    else:
        body = ("<h1>Local forge</h1><p>" + link("/login", "Sign in") +
                " to see private repositories.</p><h2>Public repositories</h2>"
                + _repo_list(_visible_repos(request), "None."))
    return page(request, "Home", body, who)


async def account(request: web.Request) -> web.Response:
    forge = forge_of(request)
    acct = forge.state.account(request.match_info["owner"])
    if acct is None or acct.type == "Bot":
        raise not_found()
    kind = "Organization" if acct.type == "Organization" else "User"
    about = ""
    if acct.name:
        about += f"<p>{h(acct.name)}</p>"
    org = forge.state.org(acct.login)
    if org is not None and org.description:
        about += f"<p>{h(org.description)}</p>"
    repos = _visible_repos(request, acct.login)
    body = (f'<h1>{h(acct.login)} <span class="muted">({kind})</span></h1>{about}'
            f"<h2>Repositories</h2>"
            + _repo_list(repos, "No repositories you can see."))
    return page(request, acct.login, body, viewer(request).login)


# -- repositories and issues ------------------------------------------------------------------
async def repository(request: web.Request) -> web.Response:
    repo = _repo(request)
    open_n = repo.open_issue_count()
    closed_n = len(repo.issues) - open_n
    base = path_of(repo.owner, repo.name)
    files = sorted(repo.files)
    readme = next((p for p in files if p.lower() in ("readme.md", "readme")), None)
    listing = "".join(
        f"<li>{link(f'{base}/blob/{repo.default_branch}/{p}', p)}</li>" for p in files)
    body = (
        _repo_crumbs(repo)
        + f'<h1>{h(repo.owner)} / {h(repo.name)} <span class="muted">'
        f'{"Private" if repo.private else "Public"}</span></h1>'
        + (f"<p>{h(repo.description)}</p>" if repo.description else "")
        + f"<p>{link(base + '/issues', 'Issues')} "
        f'<span class="muted">{open_n} open, {closed_n} closed</span></p>'
        + "<h2>Files</h2>"
        + (f'<ul class="list">{listing}</ul>' if files else "<p>No files yet.</p>")
        + (f'<h2>{h(readme)}</h2><div class="markdown">'
           f"{markdown.render(repo.files[readme], heading_base=2)}</div>" if readme else "")
    )
    return page(request, repo.full_name, body, viewer(request).login)


async def issues(request: web.Request) -> web.Response:
    repo = _repo(request)
    state = request.query.get("state", "open")
    if state not in ("open", "closed", "all"):
        raise WebError(400, "Bad request", f"state: should be open, closed or all, not "
                       f"{state!r}.")
    try:
        page_no = max(1, int(request.query.get("page", "1")))
    except ValueError:
        raise WebError(400, "Bad request", "page: should be a number (1, 2, ...).") from None
    chosen = sorted((i for i in repo.issues.values() if state == "all" or i.state == state),
                    key=lambda i: i.number, reverse=True)
    shown = chosen[(page_no - 1) * PER_PAGE: page_no * PER_PAGE]
    base = path_of(repo.owner, repo.name) + "/issues"
    counts = {"open": repo.open_issue_count(), "closed": len(repo.issues) - repo.open_issue_count(),
              "all": len(repo.issues)}
    tabs = ""
    for s in ("open", "closed", "all"):
        current = {"aria_current": "page"} if s == state else {}
        shown_name = f"{s.capitalize()} ({counts[s]})"
        tabs += f"<li>{link(f'{base}?state={s}', shown_name, **current)}</li>"
    rows = []
    for i in shown:
        chips = " ".join(label_chip(lb) for lb in _labels(repo, i))
        rows.append(
            f"<li>{link(f'{base}/{i.number}', i.title)} {chips}<br>"
            f'<span class="muted">#{i.number} {"opened" if i.state == "open" else "closed"}'
            f" · by {h(i.user)} · {when(i.created_at)} · {len(i.comment_ids)} comments"
            "</span></li>")
    listing = (f'<ul class="list">{"".join(rows)}</ul>' if rows
               else f"<p>No {'' if state == 'all' else state + ' '}issues.</p>")
    pages = ""
    last = max(1, -(-len(chosen) // PER_PAGE))
    if last > 1:
        parts = []
        if page_no > 1:
            parts.append(link(f"{base}?state={state}&page={page_no - 1}", "Previous"))
        parts.append(f"Page {page_no} of {last}")
        if page_no < last:
            parts.append(link(f"{base}?state={state}&page={page_no + 1}", "Next"))
        pages = f'<nav aria-label="Pages"><p>{" · ".join(parts)}</p></nav>'
    body = (_repo_crumbs(repo, ("Issues", None)) + "<h1>Issues</h1>"
            + f'<nav aria-label="Issue state"><ul class="labels">{tabs}</ul></nav>'
            + listing + pages)
    return page(request, f"Issues · {repo.full_name}", body, viewer(request).login)


def _article(anchor: str, login: str, verb: str, ts: float, text: str | None,
             via: str | None) -> str:
    heading = f"{anchor}-h"
    by = f" via {h(via)}" if via else ""
    rendered = markdown.render(text) or '<p class="muted"><em>No description provided.</em></p>'
    return (f'<article id="{h(anchor)}" aria-labelledby="{h(heading)}"><header>'
            f'<h3 id="{h(heading)}">{_who(login)} {verb} {when(ts)}{by}</h3></header>'
            f'<div class="markdown">{rendered}</div></article>')


async def issue(request: web.Request) -> web.Response:
    forge = forge_of(request)
    repo = _repo(request)
    try:
        found = repo.issues.get(int(request.match_info["number"]))
    except ValueError:
        found = None
    if found is None:
        raise not_found("No issue with this number in this repository.")
    i = found
    labels = _labels(repo, i)
    chips = ("".join(f"<li>{label_chip(lb)}</li>" for lb in labels))

    def via(app_id: int | None) -> str | None:
        app = forge.state.apps.get(app_id) if app_id is not None else None
        return app.name if app else None

    comments = [repo.comments[c] for c in i.comment_ids if c in repo.comments]
    parts = [_article("issue-body", i.user, "opened this issue", i.created_at, i.body,
                      via(i.via_app))]
    parts += [_article(f"issuecomment-{c.id}", c.user, "commented", c.created_at, c.body,
                       via(c.via_app)) for c in comments]
    closed = ""
    if i.state == "closed" and i.closed_at is not None:
        closed = (f"<p>Closed by {_who(i.closed_by or i.user)} {when(i.closed_at)}"
                  f"{' as ' + h(i.state_reason.replace('_', ' ')) if i.state_reason else ''}"
                  "</p>")
    assignees = ", ".join(_who(a) for a in i.assignees) or "No one"
    body = (
        _repo_crumbs(repo, ("Issues", path_of(repo.owner, repo.name) + "/issues"),
                     (f"#{i.number}", None))
        + f'<h1><span class="title">{h(i.title)}</span> <span class="number">#{i.number}'
        "</span></h1>"
        + f'<p class="meta">{_state(i)} {_who(i.user)} opened this issue {when(i.created_at)}'
        f" · {len(comments)} comment{'s' if len(comments) != 1 else ''}</p>"
        + '<section aria-labelledby="labels-h"><h2 id="labels-h">Labels</h2>'
        + (f'<ul class="labels">{chips}</ul>' if labels else "<p>None yet</p>")
        + f"<p>Assignees: {assignees}</p></section>"
        + '<section aria-labelledby="conversation-h"><h2 id="conversation-h">Conversation'
        "</h2>" + "".join(parts) + closed + "</section>"
    )
    return page(request, f"{i.title} · Issue #{i.number} · {repo.full_name}", body,
                viewer(request).login)


# -- files --------------------------------------------------------------------------------------
def _ref_ok(repo: Repo, request: web.Request) -> None:
    if request.match_info["ref"] != repo.default_branch:
        raise not_found(f"No branch {request.match_info['ref']!r}: this forge keeps one branch, "
                        f"{repo.default_branch}.")


async def blob(request: web.Request) -> web.Response:
    repo = _repo(request)
    _ref_ok(repo, request)
    path = request.match_info["path"].strip("/")
    text = repo.files.get(path)
    if text is None:
        raise not_found("No such file on this branch.")
    base = path_of(repo.owner, repo.name)
    body = (_repo_crumbs(repo, (path, None)) + f"<h1>{h(path)}</h1>"
            + f"<p>{link(f'{base}/raw/{repo.default_branch}/{path}', 'Raw')}</p>"
            + f'<pre class="file" tabindex="0" aria-label="Contents of {h(path)}">{h(text)}'
            "</pre>")
    return page(request, f"{path} · {repo.full_name}", body, viewer(request).login)


async def tree(request: web.Request) -> web.Response:
    repo = _repo(request)
    _ref_ok(repo, request)
    path = request.match_info.get("path", "").strip("/")
    base = path_of(repo.owner, repo.name)
    if path in repo.files:  # a file's tree URL shows its blob, as GitHub redirects it
        return redirect(f"{base}/blob/{repo.default_branch}/{path}")
    prefix = path + "/" if path else ""
    children: dict[str, bool] = {}
    for p in repo.files:
        if p.startswith(prefix):
            head, sep, _ = p[len(prefix):].partition("/")
            children[head] = children.get(head, False) or bool(sep)
    if path and not children:
        raise not_found("No such folder on this branch.")
    items = ""
    for name, is_dir in sorted(children.items()):
        kind, shown = ("tree", name + "/") if is_dir else ("blob", name)
        items += f"<li>{link(f'{base}/{kind}/{repo.default_branch}/{prefix}{name}', shown)}</li>"
    body = (_repo_crumbs(repo, (path or repo.default_branch, None))
            + f"<h1>{h(path or repo.name)}</h1>" + f'<ul class="list">{items}</ul>')
    return page(request, f"{path or repo.name} · {repo.full_name}", body,
                viewer(request).login)


async def raw(request: web.Request) -> web.Response:
    repo = _repo(request)
    _ref_ok(repo, request)
    text = repo.files.get(request.match_info["path"].strip("/"))
    if text is None:
        raise not_found("No such file on this branch.")
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


# -- apps, installations, avatars ---------------------------------------------------------------
async def app_page(request: web.Request) -> web.Response:
    forge = forge_of(request)
    slug = request.match_info["slug"]
    app = next((a for a in forge.state.apps.values() if a.slug == slug), None)
    if app is None:
        raise not_found("No GitHub App with this name.")
    perms = "".join(f"<li>{h(k)}: {h(v)}</li>" for k, v in sorted(app.permissions.items()))
    events = ", ".join(h(e) for e in app.events) or "none"
    body = (f"<h1>{h(app.name)}</h1>"
            + (f"<p>{h(app.description)}</p>" if app.description else "")
            + f"<p>A GitHub App owned by {_who(app.owner)}.</p>"
            + f"<p>{link(path_of('apps', app.slug, 'installations', 'new'), 'Install')}</p>"
            + f"<h2>Permissions</h2><ul>{perms}</ul><h2>Events</h2><p>{events}</p>")
    return page(request, app.name, body, viewer(request).login)


async def installation(request: web.Request) -> web.Response:
    """An installation's settings page: for its account's owners (an org's owners, the user)."""
    forge = forge_of(request)
    st = forge.state
    try:
        inst = st.installations.get(int(request.match_info["id"]))
    except ValueError:
        inst = None
    org_name = request.match_info.get("org")
    who = viewer(request).login
    if inst is None or (org_name is not None and org_name.lower() != inst.account.lower()):
        raise not_found()
    org = st.org(inst.account)
    owners = [o.lower() for o in org.owners] if org else [inst.account.lower()]
    if who is None or who.lower() not in owners:
        raise not_found()
    app = st.apps[inst.app_id]
    repos = st.installation_repos(inst)
    body = (f"<h1>{h(app.name)} on {h(inst.account)}</h1>"
            f"<p>Installed {when(inst.created_at)}; repository access: "
            f"{'all repositories' if inst.repository_selection == 'all' else 'selected'}.</p>"
            "<h2>Repositories</h2>"
            + _repo_list(sorted(repos, key=lambda r: r.full_name.lower()), "None."))
    return page(request, f"{app.name} installation", body, who)


def _avatar_svg(acct: Account) -> str:
    hue = int(hashlib.sha256(acct.login.lower().encode()).hexdigest()[:4], 16) % 360
    letter = h((acct.login[:1] or "?").upper())
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96" '
            f'viewBox="0 0 96 96" role="img" aria-label="{h(acct.login)}">'
            f'<rect width="96" height="96" fill="hsl({hue},45%,38%)"/>'
            f'<text x="48" y="62" font-size="44" text-anchor="middle" fill="#fff" '
            f'font-family="sans-serif">{letter}</text></svg>')


async def avatar(request: web.Request) -> web.Response:
    try:
        acct = forge_of(request).state.account_by_id(int(request.match_info["id"]))
    except ValueError:
        acct = None
    if acct is None:
        raise not_found()
    return web.Response(text=_avatar_svg(acct), content_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=3600"})
