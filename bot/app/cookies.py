"""The app's browser cookies (the console's session and sign-in, the App set-up page's), named
and set in one place.

Over https each is `__Host-` (Secure, Path=/, no Domain: RFC 6265bis §4.1.3.2), which a browser
takes from this origin over https only: a page of a sibling subdomain (`Domain=`) or a man in
the middle of a plain-http request to the host cannot plant one (their own session, the
sign-in form's token, the set-up page's browser), as it could a plain name; and only that name
is read. Over http (the embedded default and `vaultmail register` on loopback) there is no
Secure, so no prefix: the plain name, on the pages' own path.
"""

from __future__ import annotations

from aiohttp import web

HOST_PREFIX = "__Host-"


def name(base: str, tls: bool) -> str:
    """What the cookie `base` is called (`__Host-` over https)."""
    return HOST_PREFIX + base if tls else base


def read(request: web.Request, base: str, tls: bool) -> str | None:
    """The cookie `base` as this app sets it: over https only its `__Host-` one."""
    return request.cookies.get(name(base, tls))


def put(response: web.StreamResponse, base: str, value: str, *, tls: bool, path: str,
        max_age: int) -> None:
    """Set the cookie `base` (HTTP-only, SameSite=Lax), on `path` over http."""
    response.set_cookie(name(base, tls), value, max_age=max_age, path="/" if tls else path,
                        httponly=True, samesite="Lax", secure=tls)


def drop(response: web.StreamResponse, base: str, *, tls: bool, path: str) -> None:
    """End the cookie `base` (with its own attributes: a browser keeps a `__Host-` one that a
    deletion without Secure and Path=/ names)."""
    response.del_cookie(name(base, tls), path="/" if tls else path, secure=tls,
                        httponly=True, samesite="Lax")
