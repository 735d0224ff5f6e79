"""The tools from the shell: `vaultmail send`, `inbox`, `open`, `reply`, `close`, `chat`, `call`...

Each command acts as one principal, by `--token` (or VAULTMAIL_TOKEN) or by `--as PRINCIPAL`
with `--data DIR` of `vaultmail up` (its tokens.json), and calls the running app's
`/api/v1/tools/<name>` like any other client: the app stays the only writer. Output is for
people by default; `--json` prints the tool's JSON result (or its error) for scripts.
Exit status: 0 done, 1 the tool refused (the error says why), 2 a usage or connection problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.cli.output import say, say_json
from bot.cli.shell import REFUSED, ShellFailure, done, existing_data_dir, fail, wants_json

DEFAULT_APP_URL = "http://127.0.0.1:8080"


class ShellError(ShellFailure):
    """A usage or connection problem (exit 2), said in one line."""

    def __init__(self, message: str, *, code: str = "usage") -> None:
        super().__init__(code, message)


def app_unreachable(app_url: str, exc: BaseException) -> ShellError:
    import aiohttp

    reason = (exc.os_error.strerror or str(exc.os_error)
              if isinstance(exc, aiohttp.ClientConnectorError) else type(exc).__name__)
    return ShellError(f"cannot reach the vaultmail app at {app_url} ({reason}): start it "
                      "(`vaultmail up` or `vaultmail serve`), or give its address (--app URL, "
                      "or --data DIR of `vaultmail up`)", code="app_unreachable")


@dataclass(frozen=True)
class Identity:
    app_url: str
    token: str
    principal: str | None


def _tokens_file(data: str | None) -> dict[str, Any] | None:
    directory = data or os.environ.get("VAULTMAIL_DATA")
    if not directory:
        return None
    path = existing_data_dir(directory, needs="tokens.json") / "tokens.json"
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ShellError(f"{path} cannot be read ({exc}): pass --data DIR of a running "
                         "`vaultmail up --data DIR`, or --token", code="bad_data_dir") from exc
    return found


def _match_principal(name: str, known: dict[str, str]) -> str:
    if name in known:
        return name
    candidates = [p for p in known if p == f"agent:{name}" or p.startswith(f"human:{name}@")]
    if len(candidates) == 1:
        return candidates[0]
    raise ShellError(f"no API token for {name!r} in tokens.json; principals: "
                     f"{', '.join(sorted(known))}")


def identity(args: argparse.Namespace) -> Identity:
    tokens = _tokens_file(args.data)
    app_url = (args.app or os.environ.get("VAULTMAIL_APP_URL")
               or (tokens or {}).get("app_url") or DEFAULT_APP_URL).rstrip("/")
    token = args.token or (None if args.as_principal else os.environ.get("VAULTMAIL_TOKEN"))
    if token:
        return Identity(app_url, token, None)
    if not args.as_principal:
        raise ShellError("say who you are: --token TOKEN (or VAULTMAIL_TOKEN), or --as "
                         "PRINCIPAL --data DIR for `vaultmail up --data DIR`")
    if tokens is None:
        raise ShellError("--as needs --data DIR (the data dir of `vaultmail up`), whose "
                         "tokens.json holds each principal's API token")
    known: dict[str, str] = tokens.get("api_tokens", {})
    principal = _match_principal(args.as_principal, known)
    return Identity(app_url, known[principal], principal)


class ToolRefused(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(err.get("message", f"the app answered {status}"))
        self.status, self.body = status, body
        self.code = str(err.get("code", "error"))


async def call_app(who: Identity, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    import aiohttp  # (by the commands that call the app: the others start without it)

    timeout = aiohttp.ClientTimeout(total=int(arguments.get("wait") or 0) + 60)
    headers = {"Authorization": f"Bearer {who.token}"}
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
                f"{who.app_url}/api/v1/tools/{tool}", json=arguments, headers=headers) as resp:
            body = await resp.json(content_type=None)
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise app_unreachable(who.app_url, exc) from exc
    if status >= 400 or not isinstance(body, dict):
        raise ToolRefused(status, body if isinstance(body, dict) else {})
    return body


# -- human-readable output ----------------------------------------------------------------

def _mail_line(m: dict[str, Any]) -> str:
    state = str(m.get("state", "")).removeprefix("mail:")
    return (f"{m.get('ref', '?'):<26} {state:<8} {m.get('from_principal', m.get('from', '?'))}"
            f" -> {m.get('to_principal', m.get('to', '?'))}  {m.get('subject', '')}")


def _inbox_summary(inbox: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    mails = inbox.get("mail") or []
    if mails:
        lines.append(f"Mail waiting for you ({len(mails)}):")
        lines += [f"  {m.get('ref')}  from {m.get('from')}: {m.get('subject')}"
                  f"{'  (quiet: past the loop guard)' if m.get('state') != 'mail:new' else ''}"
                  for m in mails]
    chats = inbox.get("chats") or []
    if chats:
        lines.append(f"Chats waiting for your answer ({len(chats)}):")
        lines += [f"  chat {c.get('chat')} from {c.get('from')}: {c.get('message')}"
                  for c in chats]
    for key in ("unreadForYourPerson", "waitingOnYourPerson"):
        if inbox.get(key):
            lines.append(f"{key}: {inbox[key]}")
    return lines


def _card_lines(card: dict[str, Any]) -> list[str]:
    who = card.get("author") or card.get("from") or card.get("askedBy") or ""
    where = card.get("target") or card.get("item") or ""
    head = card.get("header") or card.get("body") or ""
    # an unread comment by its id; a question card is a thread, by its id (its first
    # comment's, what `parent` takes to answer it)
    ident = card.get("id") or card.get("thread") or "?"
    lines = [f"  [{ident}] {where} {who}: {head}".rstrip()]
    for i, opt in enumerate(card.get("options") or [], start=1):
        if isinstance(opt, dict):
            desc = f" - {opt['description']}" if opt.get("description") else ""
            lines.append(f"      {i}. {opt.get('label', '')}{desc}")
    return lines


def render_inbox(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for side in ("you", "agents"):
        part = result.get(side)
        if not isinstance(part, dict):
            continue
        title = part.get("title") or ("Yours" if side == "you" else "Your agents'")
        turn, unread = part.get("yourTurn") or [], part.get("unread") or []
        waiting = part.get("waitingOnOthers") or []
        lines.append(f"{title}: {len(turn)} your turn, {len(unread)} unread, "
                     f"{len(waiting)} waiting on others")
        for card in turn:
            lines += _card_lines(card)
        for card in unread:
            lines += _card_lines(card)
    inbox = result.get("inbox")
    if isinstance(inbox, dict):
        lines += _inbox_summary(inbox)
    return lines or ["Nothing in your inbox."]


def _generic(value: Any, indent: str = "") -> list[str]:
    if isinstance(value, dict):
        out: list[str] = []
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                out.append(f"{indent}{k}:")
                out += _generic(v, indent + "  ")
            else:
                out.append(f"{indent}{k}: {json.dumps(v) if not isinstance(v, str) else v}")
        return out
    if isinstance(value, list):
        out = []
        for item in value:
            sub = _generic(item, indent + "  ")
            out += [f"{indent}- {sub[0].lstrip()}" if sub else f"{indent}-"] + sub[1:]
        return out
    return [f"{indent}{value}"]


def render(tool: str, result: dict[str, Any]) -> list[str]:
    body = {k: v for k, v in result.items() if k != "inbox"}
    if tool == "list_inbox":
        return render_inbox(result)
    lines: list[str]
    if "mail" in body and isinstance(body["mail"], dict) and len(body) == 1:
        lines = [_mail_line(body["mail"])]
    elif "mails" in body and set(body) <= {"mails", "moreMailsBefore"}:
        lines = [_mail_line(m) for m in body["mails"]] or ["no mail"]
        if body.get("moreMailsBefore"):
            lines.append(f"older mail: --before '{body['moreMailsBefore']}'")
    elif "chat" in body and len(body) == 1:
        c = body["chat"]
        lines = [f"chat {c['chat']} to {c['agent']}: {c['message']}",
                 f"  answer: {c['answer']}" if c.get("answer") else
                 "  no answer yet (`vaultmail call chat_get --arg chat=N` later)"]
    elif "events" in body:
        lines = [f"{e['seq']:>5}  {e['time']}  {e['event']:<16} {e['actor']:<28} {e['subject']}"
                 for e in body["events"]] or ["no events"]
    else:
        lines = _generic(body)
    if isinstance(result.get("inbox"), dict):
        summary = _inbox_summary(result["inbox"])
        if summary:
            lines += [""] + summary
    return lines


# -- the commands ------------------------------------------------------------------------

def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _takes_text(schema: dict[str, Any]) -> bool:
    kinds = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
    return "string" in kinds


def _call_arguments(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    arguments: dict[str, Any] = {}
    if args.args_json:
        try:
            loaded = json.loads(args.args_json)
        except json.JSONDecodeError as exc:
            raise ShellError(f"--args is not JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ShellError("--args must be a JSON object")
        arguments.update(loaded)
    props: dict[str, Any] = getattr(args, "tool_properties", {}) or {}
    for pair in args.arg or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ShellError(f"--arg {pair!r}: write KEY=VALUE (VALUE is JSON or plain text)")
        # Text for a text field (so `body=42` stays "42"); JSON where the field takes more.
        arguments[key] = value if _takes_text(props.get(key, {})) else _parse_value(value)
    return args.tool, arguments


async def _tool_properties(app_url: str, tool: str) -> dict[str, Any]:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, \
                session.get(f"{app_url}/api/v1/tools") as resp:
            data = await resp.json()
    except (aiohttp.ClientError, ValueError):
        return {}
    for t in data.get("tools", []):
        if t.get("name") == tool:
            found: dict[str, Any] = t.get("inputSchema", {}).get("properties", {})
            return found
    return {}


def _body(text: str | None) -> str:
    if text is None or text == "-":
        return sys.stdin.read()
    return text


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v is not False}


Builder = Callable[[argparse.Namespace], tuple[str, dict[str, Any]]]

BUILDERS: dict[str, Builder] = {
    "send": lambda a: ("mail_send", _drop_none({
        "to": a.to, "subject": a.subject, "body": _body(a.body), "inReplyTo": a.in_reply_to})),
    "open": lambda a: ("mail_open", {"mail": a.mail}),
    "reply": lambda a: ("mail_reply", {"mail": a.mail, "body": _body(a.body)}),
    "close": lambda a: ("mail_close", {"mail": a.mail}),
    "mail": lambda a: ("mail_list", _drop_none({"state": a.state, "vault": a.vault,
                                                "thread": a.thread, "mailsBefore": a.before})),
    "show": lambda a: ("mail_get", {"mail": a.mail}),
    "inbox": lambda a: ("list_inbox", _drop_none({"wait": a.wait or None, "read": a.read})),
    "chat": lambda a: ("agent_chat", _drop_none({"agent": a.agent, "message": a.message,
                                                 "wait": a.wait or None})),
    "call": _call_arguments,
}


async def cmd_tool(args: argparse.Namespace) -> int:
    try:
        who = identity(args)
        if args.command == "call" and args.arg:
            args.tool_properties = await _tool_properties(who.app_url, args.tool)
        tool, arguments = BUILDERS[args.command](args)
        result = await call_app(who, tool, arguments)
    except ShellFailure as exc:
        return fail(args, exc)
    except ToolRefused as exc:
        extra = {k: v for k, v in exc.body.items() if k != "error"}
        if wants_json(args):
            say_json(ShellFailure(exc.code, str(exc), extra=extra).as_json())
        say(f"vaultmail {args.command}: refused ({exc.status} {exc.code}): {exc}",
            file=sys.stderr)
        return REFUSED
    if wants_json(args):
        done(result)
    else:
        say("\n".join(render(tool, result)))
    return 0


def _flags(annotations: dict[str, Any]) -> str:
    """A tool's MCP annotations in words, for `vaultmail tools`."""
    read_only = annotations.get("readOnlyHint")
    flags = ["read-only" if read_only else "writes"]
    if annotations.get("destructiveHint") and not read_only:
        flags.append("destructive")
    if annotations.get("idempotentHint") and not read_only:
        flags.append("idempotent")
    if annotations.get("openWorldHint"):
        flags.append("open world")
    return ", ".join(flags)


async def cmd_tools(args: argparse.Namespace) -> int:
    import aiohttp

    try:
        tokens = _tokens_file(args.data)
        app_url = (args.app or os.environ.get("VAULTMAIL_APP_URL")
                   or (tokens or {}).get("app_url") or DEFAULT_APP_URL).rstrip("/")
        try:
            async with aiohttp.ClientSession() as session, \
                    session.get(f"{app_url}/api/v1/tools") as resp:
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise app_unreachable(app_url, exc) from exc
    except ShellFailure as exc:
        return fail(args, exc)
    if wants_json(args):
        done(data)
        return 0
    for t in data["tools"]:
        props = t["inputSchema"].get("properties", {})
        required = set(t["inputSchema"].get("required", []))
        params = " ".join(f"{k}" if k in required else f"[{k}]" for k in props)
        title = f": {t['title']}" if t.get("title") else ""
        say(f"{t['name']} {params}{title}  [{_flags(t.get('annotations') or {})}]\n"
            f"    {t['description']}")
    return 0


async def cmd_mcp(args: argparse.Namespace) -> int:
    from bot.tools.mcp_server import StartFailure, run_stdio

    try:
        who = identity(args)
        await run_stdio(who.app_url, who.token)
    except ShellFailure as exc:
        return fail(args, exc)
    except StartFailure as exc:
        return fail(args, ShellFailure(exc.code, str(exc)))
    return 0


def add_tool_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    who = argparse.ArgumentParser(add_help=False)
    g = who.add_argument_group("acting as")
    g.add_argument("--token", help="API token (default: VAULTMAIL_TOKEN)")
    g.add_argument("--as", dest="as_principal", metavar="PRINCIPAL",
                   help="act as this principal (agent:scout, scout, marco) using the token "
                        "in DIR/tokens.json of `vaultmail up --data DIR`")
    g.add_argument("--data", help="the data dir of `vaultmail up` (or VAULTMAIL_DATA)")
    g.add_argument("--app", help="the app's URL (default: from tokens.json, VAULTMAIL_APP_URL, "
                                 f"or {DEFAULT_APP_URL})")
    g.add_argument("--json", action="store_true", help="print the JSON result, for scripts")

    def tool_cmd(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[who])
        p.set_defaults(func=cmd_tool)
        return p

    p = tool_cmd("send", "send mail to an agent (mail_send)")
    p.add_argument("to", metavar="TO", help="agent slug or principal")
    p.add_argument("subject", metavar="SUBJECT")
    p.add_argument("body", metavar="BODY", nargs="?", help="the text; - or omitted: stdin")
    p.add_argument("--in-reply-to", metavar="MAIL")
    p = tool_cmd("open", "open a mail addressed to you (mail_open)")
    p.add_argument("mail", metavar="MAIL", help="mail id or owner/repo#N")
    p = tool_cmd("reply", "reply to a mail addressed to you (mail_reply)")
    p.add_argument("mail", metavar="MAIL")
    p.add_argument("body", metavar="BODY", nargs="?", help="the text; - or omitted: stdin")
    p = tool_cmd("close", "close a mail (mail_close)")
    p.add_argument("mail", metavar="MAIL")
    p = tool_cmd("mail", "list mail you sent or received, newest first, 30 at a time (mail_list)")
    p.add_argument("--state", choices=["new", "working", "replied", "closed", "quiet"])
    p.add_argument("--vault")
    p.add_argument("--thread")
    p.add_argument("--before", metavar="CURSOR", help="the next page: the cursor the last "
                   "page printed (moreMailsBefore)")
    p = tool_cmd("show", "a mail with its thread (mail_get)")
    p.add_argument("mail", metavar="MAIL")
    p = tool_cmd("inbox", "what is yours to handle (list_inbox)")
    p.add_argument("--wait", type=int, default=0, metavar="SECONDS",
                   help="wait up to this long (at most 50) for something new")
    p.add_argument("--read", action="store_true", help="include comments already read")
    p = tool_cmd("chat", "ask an agent a quick question (agent_chat; people only)")
    p.add_argument("agent", metavar="AGENT")
    p.add_argument("message", metavar="MESSAGE")
    p.add_argument("--wait", type=int, default=0, metavar="SECONDS",
                   help="wait up to this long (at most 50) for the answer")
    p = tool_cmd("call", "call any tool by name (see `vaultmail tools`)")
    p.add_argument("tool", metavar="TOOL")
    p.add_argument("--arg", action="append", metavar="KEY=VALUE",
                   help="an argument; VALUE is JSON (42, true, [1]) or plain text")
    p.add_argument("--args", dest="args_json", metavar="JSON", help="all arguments as JSON")

    p = sub.add_parser("tools", help="list the tools with their arguments")
    p.add_argument("--data")
    p.add_argument("--app")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tools)

    p = sub.add_parser("mcp", parents=[who],
                       help="an MCP server on stdio acting as one principal (via the app)")
    p.set_defaults(func=cmd_mcp)
