"""`GET /user`: the authenticated user, as GitHub's `private-user` (for a personal access token
or a user access token from the OAuth web flow; an App or installation is no user)."""

from __future__ import annotations

from aiohttp import web

from ..access import user_level
from .http import ApiError, Ctx, Routes, json_response


async def get_authenticated_user(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    p = ctx.principal
    if p.kind == "none":
        raise ApiError(401, "Requires authentication")
    if p.kind != "user" or p.login is None:
        raise ApiError(403, "Resource not accessible by integration")
    st = ctx.forge.state
    acct = st.account(p.login)
    if acct is None:
        raise ApiError(401, "Bad credentials")
    out = ctx.r.public_user(acct)
    owned = [r for r in st.repos.values() if r.owner.lower() == acct.login.lower()]
    private = [r for r in st.repos.values()
               if r.private and user_level(st, acct.login, r) is not None]
    out.update({
        "notification_email": acct.email,
        "private_gists": 0,
        "total_private_repos": len(private),
        "owned_private_repos": sum(1 for r in owned if r.private),
        "disk_usage": 0,
        "collaborators": len({login for r in owned for login in r.collaborators}),
        "two_factor_authentication": False,
        "plan": {"name": "free", "space": 976562499, "collaborators": 0,
                 "private_repos": 10000},
    })
    return json_response(out)


def register(routes: Routes) -> None:
    routes.add("GET", "/user", get_authenticated_user)
