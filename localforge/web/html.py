"""The pages' frame: one layout with landmarks (banner, breadcrumb navigation, main, footer), a
skip link, a viewport for phones; escaping helpers; error pages. Every value put in a page goes
through `h()` (or `markdown.render`): content is data, never markup."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from urllib.parse import quote, urlencode

from aiohttp import web

from ..clock import iso

# No script at all; inline styles for label colours; images only from the forge itself.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "deny",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

STYLE = """
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1f2328;
background:#fff}
a{color:#0550ae}
a:focus-visible,button:focus-visible,input:focus-visible{outline:3px solid #0969da;
outline-offset:2px}
.skip{position:absolute;left:-999px}
.skip:focus{left:8px;top:8px;background:#fff;padding:4px 8px;z-index:1}
body>header{display:flex;flex-wrap:wrap;gap:8px 24px;align-items:center;
justify-content:space-between;padding:12px 16px;background:#f6f8fa;
border-bottom:1px solid #d1d9e0}
body>header .brand{font-weight:600;color:#1f2328;text-decoration:none}
body>header nav ul{display:flex;gap:16px;list-style:none;margin:0;padding:0}
main{max-width:980px;margin:0 auto;padding:16px}
footer{max-width:980px;margin:0 auto;padding:16px;color:#59636e;font-size:14px}
.crumbs ol{display:flex;flex-wrap:wrap;gap:4px;list-style:none;margin:0 0 8px;padding:0}
.crumbs li+li::before{content:"/";margin-right:4px;color:#59636e}
h1{font-size:1.6rem;margin:.3em 0;overflow-wrap:anywhere}
h1 .number{color:#59636e;font-weight:400}
h2{font-size:1.2rem}
h3{font-size:1rem;margin:0}
.meta,.muted{color:#59636e}
.state{display:inline-block;padding:2px 10px;border-radius:2em;color:#fff;font-weight:600}
.state[data-state=open]{background:#1a7f37}
.state[data-state=closed]{background:#8250df}
.labels{display:flex;flex-wrap:wrap;gap:6px;list-style:none;padding:0}
.label{display:inline-block;padding:0 8px;border-radius:2em;font-size:14px;font-weight:500}
article{border:1px solid #d1d9e0;border-radius:6px;margin:16px 0}
article>header{background:#f6f8fa;border-bottom:1px solid #d1d9e0;padding:8px 12px}
.markdown{padding:4px 12px;overflow-wrap:anywhere}
.markdown pre{background:#f6f8fa;padding:8px;overflow:auto}
.markdown table{border-collapse:collapse}
.markdown td,.markdown th{border:1px solid #d1d9e0;padding:4px 8px}
ul.list{list-style:none;padding:0;border:1px solid #d1d9e0;border-radius:6px}
ul.list>li{padding:8px 12px;border-top:1px solid #d1d9e0}
ul.list>li:first-child{border-top:0}
form.box{max-width:340px;padding:16px;border:1px solid #d1d9e0;border-radius:6px}
label{display:block;font-weight:600;margin-top:8px}
input[type=text],input[type=password]{width:100%;padding:6px 8px;font:inherit;
border:1px solid #818b98;border-radius:6px}
button{font:inherit;padding:6px 16px;margin-top:12px;border-radius:6px;
border:1px solid #818b98;background:#f6f8fa;color:#1f2328;cursor:pointer}
button.primary{background:#1f883d;border-color:#1a7f37;color:#fff}
.error{border:1px solid #cf222e;background:#ffebe9;padding:8px 12px;border-radius:6px}
pre.file{background:#f6f8fa;padding:12px;overflow:auto;border:1px solid #d1d9e0}
"""


def h(value: object) -> str:
    """Escaped for an HTML text node or a quoted attribute."""
    return escape(str(value), quote=True)


def path_of(*parts: str) -> str:
    """A path from unescaped segments: `/acme/vault`."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


def link(href: str, text: object, **attrs: str) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{h(v)}"' for k, v in attrs.items())
    return f'<a href="{h(href)}"{extra}>{h(text)}</a>'


def when(ts: float) -> str:
    stamp = iso(ts)
    return f'<time datetime="{stamp}">{stamp[:10]} {stamp[11:16]} UTC</time>'


def crumbs(items: Sequence[tuple[str, str | None]]) -> str:
    """Breadcrumb navigation: (text, href) pairs; the last one is the current page."""
    lis = []
    for i, (text, href) in enumerate(items):
        if href is None or i == len(items) - 1:
            lis.append(f'<li><span aria-current="page">{h(text)}</span></li>'
                       if i == len(items) - 1 else f"<li>{h(text)}</li>")
        else:
            lis.append(f"<li>{link(href, text)}</li>")
    return f'<nav class="crumbs" aria-label="Breadcrumb"><ol>{"".join(lis)}</ol></nav>'


def with_query(url: str, **params: str) -> str:
    return url + ("&" if "?" in url else "?") + urlencode(params)


def account_nav(login: str | None, here: str) -> str:
    if login:
        items = (f"<li>Signed in as {link(path_of(login), login)}</li>"
                 f"<li>{link('/logout', 'Sign out')}</li>")
    else:
        items = f"<li>{link(with_query('/login', return_to=here), 'Sign in')}</li>"
    return f'<nav aria-label="Account"><ul>{items}</ul></nav>'


def document(title: str, body: str, login: str | None, here: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)} · Local forge</title><style>{STYLE}</style></head><body>"
        '<a class="skip" href="#main">Skip to content</a>'
        f'<header><a class="brand" href="/">Local forge</a>{account_nav(login, here)}</header>'
        f'<main id="main">{body}</main>'
        "<footer><p>A local forge for tests and the embedded default: GitHub's API and pages,"
        " reproduced; not GitHub.</p></footer></body></html>"
    )


def page(request: web.Request, title: str, body: str, login: str | None, status: int = 200,
         headers: Mapping[str, str] | None = None) -> web.Response:
    resp = web.Response(text=document(title, body, login, request.path_qs), status=status,
                        content_type="text/html", charset="utf-8")
    resp.headers.update(headers or {})
    return resp


def redirect(location: str, status: int = 302) -> web.Response:
    return web.Response(status=status, headers={"Location": location})


class WebError(Exception):
    """An error page: the status, a heading and a sentence naming what was wrong and what to
    do (or `response` to answer as it is)."""

    def __init__(self, status: int, title: str, message: str = "",
                 response: web.StreamResponse | None = None) -> None:
        super().__init__(message or title)
        self.status = status
        self.title = title
        self.message = message
        self.response = response

    def render(self, request: web.Request, login: str | None) -> web.StreamResponse:
        if self.response is not None:
            return self.response
        body = f"<h1>{h(self.title)}</h1>"
        if self.message:
            body += f'<p class="error" role="alert">{h(self.message)}</p>'
        if self.status == 404 and not login:
            body += ("<p>If it is private, "
                     f"{link(with_query('/login', return_to=request.path_qs), 'sign in')}"
                     " with an account that may read it.</p>")
        return page(request, self.title, body, login, self.status)


def not_found(what: str = "") -> WebError:
    return WebError(404, "Not Found", what or "There is nothing here, or you may not see it.")
