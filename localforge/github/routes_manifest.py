"""Registering a GitHub App from a manifest, and installing it, as GitHub describes both
("Registering a GitHub App from a manifest", "Installing your own GitHub App").

Web pages (HTML, not part of the REST API, so no rate-limit headers or ETags):
- `POST /settings/apps/new` and `POST /organizations/{org}/settings/apps/new` take the form's
  `manifest` (JSON) and `state`, check the manifest and redirect (302) to its `redirect_url`
  with `?code=...&state=...`. Posted by a browser not signed in, the manifest is kept (an hour,
  by an unguessable id) and the page links the sign-in, which comes back to `GET` of the same
  path with `?pending=ID`: the App's creation with that manifest and state, to confirm;
- `GET` / `POST /apps/{slug}/installations/new`: the accounts the signed-in user may install the
  App on, and installing it on one; then a redirect to the App's `setup_url` with
  `installation_id` and `setup_action=install`, or a page saying it is installed.

The API (`POST /app-manifests/{code}/conversions`, operation `apps/create-from-manifest`) creates
the App and answers, once, its id, slug, client id and secret, webhook secret and private key
(`pem`). As on GitHub, the App exists only once the code is converted; a code is good for one
hour on the forge clock and for one conversion, then it is 404.
"""

from __future__ import annotations

import html
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from ..state import App, ManifestCode
from ..web.session import signed_in as web_signed_in
from ..web.signin import sign_in_url
from .http import FORGE_KEY, ApiError, Ctx, Handler, Routes, json_response, not_found

if TYPE_CHECKING:
    from ..forge import LocalForge

CODE_TTL = 3600.0  # "You must complete all three steps ... within one hour."
MAX_CALLBACK_URLS = 10
MAX_NAME = 34  # GitHub refuses longer App names
# The manifest's parameters, as GitHub's documentation lists them.
MANIFEST_KEYS = {
    "name", "url", "hook_attributes", "redirect_url", "callback_urls", "setup_url",
    "description", "public", "default_events", "default_permissions",
    "request_oauth_on_install", "setup_on_update",
}
HOOK_KEYS = {"url", "active"}
# Permission -> the access levels it takes (the `app-permissions` schema of GitHub's REST
# description).
PERMISSION_LEVELS: dict[str, tuple[str, ...]] = {
    **{name: ("read", "write") for name in (
        "actions", "administration", "artifact_metadata", "attestations", "checks",
        "code_quality", "codespaces", "contents", "custom_properties_for_organizations",
        "dependabot_secrets", "deployments", "discussions", "email_addresses", "environments",
        "followers", "git_ssh_keys", "gpg_keys", "interaction_limits", "issues", "members",
        "merge_queues", "metadata", "organization_administration",
        "organization_announcement_banners", "organization_copilot_agent_settings",
        "organization_copilot_seat_management", "organization_custom_org_roles",
        "organization_custom_roles", "organization_hooks", "organization_packages",
        "organization_personal_access_token_requests", "organization_personal_access_tokens",
        "organization_secrets", "organization_self_hosted_runners",
        "organization_user_blocking", "packages", "pages", "pull_requests",
        "repository_custom_properties", "repository_hooks", "secret_scanning_alerts",
        "secrets", "security_events", "single_file", "starring", "statuses",
        "vulnerability_alerts")},
    **{name: ("read", "write", "admin") for name in (
        "enterprise_custom_properties_for_organizations", "organization_custom_properties",
        "organization_projects", "repository_projects")},
    "organization_events": ("read",), "organization_plan": ("read",),
    "profile": ("write",), "workflows": ("write",),
}
# The events an App may subscribe to, each with the permissions any one of which allows it
# ("Webhook events and payloads": availability for GitHub Apps). Every App holds metadata.
EVENT_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "branch_protection_rule": ("administration",), "check_run": ("checks",),
    "check_suite": ("checks",), "code_scanning_alert": ("security_events",),
    "commit_comment": ("contents",), "create": ("contents",), "delete": ("contents",),
    "deployment": ("deployments",), "deployment_status": ("deployments",),
    "discussion": ("discussions",), "discussion_comment": ("discussions",),
    "fork": ("contents",), "gollum": ("contents",),
    "issue_comment": ("issues", "pull_requests"), "issues": ("issues",),
    "label": ("metadata",), "member": ("members",), "membership": ("members",),
    "merge_group": ("merge_queues",), "milestone": ("issues", "pull_requests"),
    "organization": ("members",), "page_build": ("pages",), "public": ("metadata",),
    "pull_request": ("pull_requests",), "pull_request_review": ("pull_requests",),
    "pull_request_review_comment": ("pull_requests",),
    "pull_request_review_thread": ("pull_requests",), "push": ("contents",),
    "release": ("contents",), "repository": ("metadata",),
    "repository_dispatch": ("contents",), "star": ("metadata",), "status": ("statuses",),
    "issue_dependencies": ("issues",), "sub_issues": ("issues",), "team": ("members",),
    "team_add": ("members",),
    "watch": ("metadata",), "workflow_dispatch": ("actions",), "workflow_job": ("actions",),
    "workflow_run": ("actions",),
}
# Sent to every App without subscribing; GitHub does not offer them in the list.
ALWAYS_SENT = {"installation", "installation_repositories", "installation_target", "meta",
               "github_app_authorization"}

WEB_ROUTES_KEY: web.AppKey[set[Any]] = web.AppKey("web_routes", set)


class ManifestError(ValueError):
    """A manifest the form refuses; the message names the parameter and what it should be."""


# --------------------------------------------------------------------------------------------
# Who is signed in


def signed_in(forge: LocalForge, request: web.Request) -> str | None:
    """The login of the user signed in to the forge's web pages, or None: the forge's one
    answer (`localforge.web.signed_in`: the `user_session` cookie from /login, or
    `Authorization: token <PAT>` for scripts)."""
    return web_signed_in(forge, request)


# --------------------------------------------------------------------------------------------
# The manifest


def _url(value: Any, where: str) -> str:
    if not isinstance(value, str) or not re.match(r"^https?://[^\s/]+", value):
        raise ManifestError(f"{where}: should be a full http(s) URL, got {value!r}")
    return value


def check_manifest(raw: Any) -> dict[str, Any]:
    """The manifest as JSON, checked against GitHub's documented parameters."""
    if not isinstance(raw, str) or not raw.strip():
        raise ManifestError("manifest: the form has no `manifest` field (the App's manifest "
                            "as JSON)")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"manifest: not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ManifestError("manifest: should be a JSON object")
    unknown = sorted(set(manifest) - MANIFEST_KEYS)
    if unknown:
        raise ManifestError(f"{', '.join(unknown)}: not a manifest parameter (known: "
                            f"{', '.join(sorted(MANIFEST_KEYS))})")
    name = manifest.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ManifestError("name: the App's name is required")
    if len(name) > MAX_NAME:
        raise ManifestError(f"name: is too long (maximum is {MAX_NAME} characters)")
    _url(manifest.get("url"), "url")  # required: the App's homepage
    hook = manifest.get("hook_attributes")
    if hook is not None:
        if not isinstance(hook, dict) or set(hook) - HOOK_KEYS:
            raise ManifestError("hook_attributes: should be an object with `url` and `active`")
        if hook.get("active", True) is not False:
            _url(hook.get("url"), "hook_attributes.url")
        if not isinstance(hook.get("active", True), bool):
            raise ManifestError("hook_attributes.active: should be true or false")
    for key in ("redirect_url", "setup_url"):
        if manifest.get(key) is not None:
            _url(manifest[key], key)
    callbacks = manifest.get("callback_urls", [])
    if not isinstance(callbacks, list):
        raise ManifestError("callback_urls: should be a list of URLs")
    if len(callbacks) > MAX_CALLBACK_URLS:
        raise ManifestError(f"callback_urls: at most {MAX_CALLBACK_URLS} URLs, got "
                            f"{len(callbacks)}")
    for i, cb in enumerate(callbacks):
        _url(cb, f"callback_urls[{i}]")
    for key in ("public", "request_oauth_on_install", "setup_on_update"):
        if key in manifest and not isinstance(manifest[key], bool):
            raise ManifestError(f"{key}: should be true or false")
    perms = manifest.get("default_permissions", {})
    if not isinstance(perms, dict):
        raise ManifestError("default_permissions: should map a permission to its access")
    for perm, access in perms.items():
        levels = PERMISSION_LEVELS.get(perm)
        if levels is None:
            raise ManifestError(f"default_permissions.{perm}: not a GitHub App permission")
        if access not in levels:
            raise ManifestError(f"default_permissions.{perm}: {access!r} should be one of "
                                f"{', '.join(levels)}")
    held = {**perms, "metadata": perms.get("metadata", "read")}
    events = manifest.get("default_events", [])
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise ManifestError("default_events: should be a list of event names")
    for event in events:
        if event in ALWAYS_SENT:
            raise ManifestError(f"default_events: {event!r} is sent to every App; it cannot "
                                "be subscribed to")
        allowed_by = EVENT_PERMISSIONS.get(event)
        if allowed_by is None:
            raise ManifestError(f"default_events: {event!r} is not an event an App can "
                                "subscribe to")
        if not any(p in held for p in allowed_by):
            raise ManifestError(f"default_events: {event!r} needs the "
                                f"{' or '.join(allowed_by)} permission")
    return manifest


def slug_of(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _slug_taken(forge: LocalForge, slug: str) -> bool:
    return any(a.slug == slug for a in forge.state.apps.values())


# --------------------------------------------------------------------------------------------
# Pages


def _page(title: str, body: str, status: int = 200,
          headers: Mapping[str, str] | None = None) -> web.Response:
    text = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")
    return web.Response(text=text, status=status, content_type="text/html",
                        headers=dict(headers or {}))


def _sign_in_first(return_to: str = "/") -> web.Response:
    return _page("Sign in", f"<p>Sign in first, on <a href=\"{html.escape(sign_in_url(return_to))}"
                 "\">/login</a> (or send a personal access token as <code>Authorization: token "
                 "&lt;PAT&gt;</code>).</p>", 401)


@dataclass(frozen=True)
class _Pending:
    """A manifest posted by a browser not signed in, kept for the way back from the sign-in."""

    path: str  # where it was posted (/settings/apps/new or an org's)
    manifest: str
    state: str
    at: float


PENDING_KEY: web.AppKey[dict[str, _Pending]] = web.AppKey("forge_pending_manifests", dict)
MAX_PENDING = 256


def _keep_pending(request: web.Request, forge: LocalForge, manifest: str, state: str) -> str:
    """Keep a signed-out browser's manifest; the path (with ?pending=ID) that brings it back."""
    pending = request.app[PENDING_KEY]
    now = forge.clock.now()
    for key, p in list(pending.items()):
        if now - p.at > CODE_TTL or len(pending) >= MAX_PENDING:
            del pending[key]
    key = secrets.token_urlsafe(18)
    pending[key] = _Pending(request.path, manifest, state, now)
    return f"{request.path}?{urlencode({'pending': key})}"


async def pending_app_page(request: web.Request) -> web.Response:
    """`GET .../settings/apps/new?pending=ID`: back from the sign-in, the App's creation with
    the manifest posted before it, to confirm (the form posts it as it was posted)."""
    forge = request.app[FORGE_KEY]
    found = request.app[PENDING_KEY].get(request.query.get("pending", ""))
    if (found is None or found.path != request.path
            or forge.clock.now() - found.at > CODE_TTL):
        return _page("No manifest here", "<p>This link holds no App manifest (or it is over an "
                     "hour old): post the manifest form again, from where you started "
                     "registering the App.</p>", 404)
    if signed_in(forge, request) is None:
        return _sign_in_first(request.path_qs)
    try:
        name = str(check_manifest(found.manifest)["name"])
    except ManifestError as exc:
        return _page("Invalid manifest", f"<p>{html.escape(str(exc))}</p>", 422)
    org = request.match_info.get("org")
    owner = f"the organisation {org}" if org else "your account"
    action = f"{found.path}?{urlencode({'state': found.state})}" if found.state else found.path
    return _page(f"Create {name}", (
        f"<p>Create the GitHub App <b>{html.escape(name)}</b> on {html.escape(owner)} from "
        "the manifest you posted.</p>"
        f"<form method=\"post\" action=\"{html.escape(action)}\">"
        f"<input type=\"hidden\" name=\"manifest\" value=\"{html.escape(found.manifest)}\">"
        f"<button type=\"submit\">Create GitHub App {html.escape(name)}</button></form>"))


def _with_query(url: str, **params: str | int) -> str:
    return url + ("&" if "?" in url else "?") + urlencode(params)


async def new_app_from_manifest(request: web.Request) -> web.Response:
    forge = request.app[FORGE_KEY]
    user = signed_in(forge, request)
    if user is None:  # kept for the way back from the sign-in (GitHub's form does the same)
        form = await request.post()
        raw = form.get("manifest")
        state = request.query.get("state") or str(form.get("state") or "")
        if isinstance(raw, str):
            return _sign_in_first(_keep_pending(request, forge, raw, state))
        return _sign_in_first()
    org_name = request.match_info.get("org")
    owner = user
    if org_name is not None:
        org = forge.state.org(org_name)
        if org is None or user.lower() not in (o.lower() for o in org.owners):
            return _page("Not Found", "<p>No such organisation, or you do not own it: only its "
                         "owners register Apps for it.</p>", 404)
        owner = org.login
    form = await request.post()
    state = request.query.get("state") or str(form.get("state") or "")
    try:
        manifest = check_manifest(form.get("manifest"))
    except ManifestError as exc:
        return _page("Invalid manifest", f"<p>{html.escape(str(exc))}</p>", 422)
    if _slug_taken(forge, slug_of(manifest["name"])):
        return _page("Invalid manifest", f"<p>name: {html.escape(manifest['name'])} is "
                     "already taken by another App: choose another name.</p>", 422)
    code = secrets.token_hex(10)
    forge.state.manifest_codes[code] = ManifestCode(
        code=code, owner=owner, creator=user, manifest=manifest, created_at=forge.clock.now())
    forge.save()
    redirect = manifest.get("redirect_url")
    if not redirect:
        return _page("App manifest accepted", f"<p>Exchange this code within an hour: "
                     f"<code>{code}</code> (POST /app-manifests/{code}/conversions).</p>")
    params: dict[str, str | int] = {"code": code}
    if state:
        params["state"] = state
    return web.Response(status=302, headers={"Location": _with_query(redirect, **params)})


def _new_key() -> tuple[str, str]:
    """A private key as GitHub hands it out (PKCS#1 PEM), and its public half."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


async def convert_manifest(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    forge = ctx.forge
    pending = forge.state.manifest_codes.pop(request.match_info["code"], None)
    if pending is None or forge.clock.now() - pending.created_at > CODE_TTL:
        raise not_found()
    m = pending.manifest
    slug = slug_of(m["name"])
    if _slug_taken(forge, slug):  # registered by someone else since the form
        # validation_failed_simple: the errors are messages, not {resource, field, code}
        raise ApiError(422, "Validation Failed", ["Name is already in use"])
    private, public = _new_key()
    hook = m.get("hook_attributes") or {}
    active = hook.get("url") is not None and hook.get("active", True) is not False
    secret = secrets.token_hex(20) if active else None
    perms = {**m.get("default_permissions", {})}
    perms.setdefault("metadata", "read")
    app_id = forge.register_app(
        slug=slug, name=m["name"], public_key_pem=public,
        webhook_url=hook["url"] if active else None, webhook_secret=secret,
        events=list(m.get("default_events", [])), permissions=perms, owner=pending.owner,
        description=m.get("description") or "")
    app = forge.state.apps[app_id]
    app.external_url = m["url"]
    app.setup_url = m.get("setup_url")
    app.setup_on_update = bool(m.get("setup_on_update", False))
    app.callback_urls = list(m.get("callback_urls", []))
    app.request_oauth_on_install = bool(m.get("request_oauth_on_install", False))
    app.public = bool(m.get("public", False))
    app.client_secret = secrets.token_hex(20)
    forge.save()
    body: dict[str, Any] = ctx.r.integration(app)
    body.update(client_id=app.client_id, client_secret=app.client_secret,
                webhook_secret=secret, pem=private)
    return json_response(body, 201)


def _app_of(forge: LocalForge, slug: str) -> App | None:
    return next((a for a in forge.state.apps.values() if a.slug == slug), None)


def _installable_on(forge: LocalForge, app: App, user: str) -> list[str]:
    """The accounts `user` may install `app` on: their own and the orgs they own; for a
    private App, only its owner's account."""
    accounts = [forge.state.account(user).login]  # type: ignore[union-attr]
    accounts += sorted(o.login for o in forge.state.orgs.values()
                       if user.lower() in (x.lower() for x in o.owners))
    if not app.public:
        accounts = [a for a in accounts if a.lower() == app.owner.lower()]
    return accounts


def _installed_on(forge: LocalForge, app: App, account: str) -> int | None:
    return next((i.id for i in forge.state.installations.values()
                 if i.app_id == app.id and i.account.lower() == account.lower()), None)


def _installer(request: web.Request) -> tuple[LocalForge, App, str] | web.Response:
    """The forge, the App named in the path and the signed-in user installing it, or the page
    that says why not (no such App, nobody signed in)."""
    forge = request.app[FORGE_KEY]
    app = _app_of(forge, request.match_info["slug"])
    if app is None:
        return _page("Not Found", "<p>No such App.</p>", 404)
    user = signed_in(forge, request)
    if user is None:
        return _sign_in_first()
    return forge, app, user


async def install_page(request: web.Request) -> web.Response:
    found = _installer(request)
    if isinstance(found, web.Response):
        return found
    forge, app, user = found
    items = []
    for account in _installable_on(forge, app, user):
        name = html.escape(account)
        if (inst := _installed_on(forge, app, account)) is not None:
            items.append(f"<li>{name}: installed (installation {inst})</li>")
            continue
        items.append(
            f"<li><form method=\"post\" action=\"/apps/{html.escape(app.slug)}/installations/"
            f"new\"><input type=\"hidden\" name=\"account\" value=\"{name}\">"
            f"<button type=\"submit\">Install on {name}</button></form></li>")
    where = "".join(items) or "<li>no account you can install it on</li>"
    return _page(f"Install {app.name}", f"<p>Where do you want to install {html.escape(app.name)}?"
                 f"</p><ul>{where}</ul>")


async def install(request: web.Request) -> web.Response:
    found = _installer(request)
    if isinstance(found, web.Response):
        return found
    forge, app, user = found
    form = await request.post()
    account = str(form.get("account") or "")
    allowed = {a.lower(): a for a in _installable_on(forge, app, user)}
    if account.lower() not in allowed:
        mine = account.lower() == user.lower() or any(
            o.login.lower() == account.lower() and user.lower() in (x.lower() for x in o.owners)
            for o in forge.state.orgs.values())
        if mine and not app.public:
            return _page("Cannot install", f"<p>{html.escape(app.name)} is private: only its "
                         f"owner {html.escape(app.owner)} can install it (make it public to "
                         "install it elsewhere).</p>", 422)
        return _page("Not Found", "<p>No such account, or you do not own it.</p>", 404)
    account = allowed[account.lower()]
    if (existing := _installed_on(forge, app, account)) is not None:
        return _page(f"{app.name} is already installed",
                     f"<p>On {html.escape(account)} (installation {existing}).</p>")
    repos = [str(r) for r in form.getall("repositories", [])]
    inst = forge.install_app(app.id, account, repositories=repos or None, sender=user)
    if app.setup_url:
        return web.Response(status=302, headers={"Location": _with_query(
            app.setup_url, installation_id=inst, setup_action="install")})
    return _page(f"Installed {app.name}",
                 f"<p>Installed on {html.escape(account)} (installation {inst}).</p>")


# --------------------------------------------------------------------------------------------
# Registration


def register(routes: Routes) -> None:
    routes.add("POST", "/app-manifests/{code}/conversions", convert_manifest)


def register_web(app: web.Application) -> None:
    """The web pages: routed beside the API, but outside its middleware's API behaviour."""
    app[PENDING_KEY] = {}
    pages: list[tuple[str, str, Handler]] = [
        ("POST", "/settings/apps/new", new_app_from_manifest),
        ("POST", "/organizations/{org}/settings/apps/new", new_app_from_manifest),
        ("GET", "/settings/apps/new", pending_app_page),
        ("GET", "/organizations/{org}/settings/apps/new", pending_app_page),
        ("GET", "/apps/{slug}/installations/new", install_page),
        ("POST", "/apps/{slug}/installations/new", install),
    ]
    app[WEB_ROUTES_KEY] = {app.router.add_route(method, path, handler)
                           for method, path, handler in pages}


def is_web(request: web.Request) -> bool:
    return request.match_info.route in request.app.get(WEB_ROUTES_KEY, set())
