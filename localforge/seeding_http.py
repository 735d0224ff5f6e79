"""Seeding over HTTP (/_forge/users, orgs, repos, ...): the Python API for out-of-process use,
e.g. pointing another app (Probot) at a forge started with `vaultmail forge`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .forge import LocalForge


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is required")
    return value


def apply(forge: LocalForge, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """Run one seeding call; raises ValueError/KeyError on bad input."""
    if kind == "users":
        login = _str(body, "login")
        token = forge.add_user(login, email=body.get("email"), name=body.get("name"))
        return {"login": login, "token": token, "password": forge.user_password(login)}
    if kind == "orgs":
        forge.add_org(_str(body, "login"), owner=body.get("owner") or "admin")
        for member in body.get("members") or []:
            forge.add_org_member(body["login"], str(member))
        return {"login": body["login"]}
    if kind == "teams":
        team_id = forge.add_team(_str(body, "org"), _str(body, "slug"),
                                 [str(m) for m in body.get("members") or []])
        return {"id": team_id}
    if kind == "repos":
        repo_id = forge.add_repo(_str(body, "owner"), _str(body, "name"),
                                 private=bool(body.get("private", True)),
                                 description=body.get("description"))
        return {"id": repo_id}
    if kind == "permissions":
        forge.set_permission(_str(body, "repo"), _str(body, "login"), _str(body, "permission"))
        return {}
    if kind == "files":
        forge.put_file(_str(body, "repo"), _str(body, "path"), str(body.get("text", "")))
        return {}
    if kind == "apps":
        app_id = forge.register_app(
            slug=_str(body, "slug"), name=body.get("name") or body["slug"],
            public_key_pem=_str(body, "public_key_pem"), webhook_url=body.get("webhook_url"),
            webhook_secret=body.get("webhook_secret"), events=body.get("events"),
            permissions=body.get("permissions"), owner=body.get("owner"),
            callback_urls=[str(u) for u in body.get("callback_urls") or []],
            client_secret=body.get("client_secret"),
            expiring_user_tokens=bool(body.get("expiring_user_tokens", True)))
        client_id, client_secret = forge.client_credentials(app_id)
        return {"id": app_id, "client_id": client_id, "client_secret": client_secret}
    if kind == "installations":
        repos = body.get("repositories")
        inst = forge.install_app(int(body["app_id"]), _str(body, "account"),
                                 repositories=list(repos) if repos is not None else None)
        return {"id": inst}
    raise KeyError(kind)
