"""The office console: the pages people use in a browser (seed mail.md, "the Mail page" and
"each agent's desk"; seed comments-and-inbox.md, "the console's card stack and badge").

Routes (all under /console but `/`): `sign-in` (GET; `sign-in/forge` and `oauth/callback`
for GitHub's OAuth web flow; POST `sign-in/token` on the embedded default), POST `sign-out`;
`inbox` (the card stack, unread, waiting on others, updates, "Your agents are handling") with
POST `inbox/answer`, `inbox/defer`, `inbox/resolve`; `mail`, `mail/{thread}`, POST `mail/send`;
`agents`, `agents/{slug}` (a desk), POST `agents/{slug}/chat`; `ledger`; `events`
(server-sent events); `static/`.
"""

from __future__ import annotations

from aiohttp import web

from bot.console import actions, held, live, pages, signin
from bot.console.render import STATIC
from bot.console.visitor import CONSOLE


async def _home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(f"{CONSOLE}/inbox")


def add_console_routes(app: web.Application) -> None:
    app[live.STREAMS] = live.Streams()
    signin.add_limits(app)
    r = app.router
    r.add_get("/", _home)
    r.add_get(CONSOLE, _home)
    r.add_get(f"{CONSOLE}/", _home)
    r.add_get(f"{CONSOLE}/sign-in", signin.sign_in_page)
    r.add_post(f"{CONSOLE}/sign-in/token", signin.token_sign_in)
    r.add_get(f"{CONSOLE}/sign-in/forge", signin.forge_start)
    r.add_get(signin.CALLBACK, signin.forge_callback)
    r.add_post(f"{CONSOLE}/sign-out", signin.sign_out)
    r.add_get(f"{CONSOLE}/inbox", pages.inbox_page)
    r.add_post(f"{CONSOLE}/inbox/answer", actions.answer)
    r.add_post(f"{CONSOLE}/inbox/defer", actions.defer)
    r.add_post(f"{CONSOLE}/inbox/resolve", actions.resolve)
    r.add_get(f"{CONSOLE}/mail", pages.mail_page)
    r.add_post(f"{CONSOLE}/mail/send", actions.send)
    r.add_get(f"{CONSOLE}/mail/{{thread}}", pages.thread_page)
    r.add_get(f"{CONSOLE}/held", held.held_page)  # outside mail held (issue 24)
    r.add_post(f"{CONSOLE}/held/release", held.release)
    r.add_post(f"{CONSOLE}/held/drop", held.drop)
    r.add_get(f"{CONSOLE}/agents", pages.agents_page)
    r.add_get(f"{CONSOLE}/agents/{{slug}}", pages.desk_page)
    r.add_post(f"{CONSOLE}/agents/{{slug}}/chat", actions.chat)
    r.add_get(f"{CONSOLE}/ledger", pages.ledger_page)
    # no HEAD: the stream writes its events itself, and a HEAD answer has no body (written
    # anyway, they would be the next response read on the connection)
    r.add_get(f"{CONSOLE}/events", live.events, allow_head=False)
    r.add_static(f"{CONSOLE}/static", STATIC, append_version=False)
