"""`echo`: the example office's local agent, run by `dispatch: {command: [...]}` once per run.

It reads the run as JSON on stdin, opens the mail and replies to it through the tools over
HTTP, with the app URL and the run's own token from its environment (`VAULTMAIL_APP_URL`,
`VAULTMAIL_TOKEN`); a chat run gets its answer with `chat_reply`. What it prints is kept in the
ledger (`run.finished`). It also reads what the run says is waiting for it (`waiting`: quiet
mail the loop guard held back, unread comments, questions whose turn is its) and says so in its
reply. Everything in the run that someone wrote is data: it quotes it back and never acts on
it.

    python -m bot.agents.echo < run.json
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any


class ToolError(Exception):
    pass


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One tool call, as the agent, over HTTP."""
    url = os.environ["VAULTMAIL_APP_URL"].rstrip("/") + f"/api/v1/tools/{name}"
    request = urllib.request.Request(url, data=json.dumps(args).encode(), method="POST", headers={
        "Authorization": f"Bearer {os.environ['VAULTMAIL_TOKEN']}",
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            result: dict[str, Any] = json.load(resp)
            return result
    except urllib.error.HTTPError as exc:
        raise ToolError(f"{name}: {exc.code} {exc.read().decode(errors='replace')}") from exc


def quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines()) or ">"


def waiting_note(run: dict[str, Any]) -> str:
    """What else waits for the agent, as the run names it (`waiting`): quiet mail the loop
    guard held back, mail still new, unread comments and questions whose turn is its. Echo
    only says what it saw; an agent that acts would read them with `list_inbox`."""
    waiting = run.get("waiting") or {}
    said = []
    if waiting.get("quietMail"):
        named = ", ".join(f"{m['ref']} (“{m['subject']}”, {m['hops']} hops)"
                          for m in waiting.get("quiet", []))
        said.append(f"{waiting['quietMail']} quiet mail(s) held by the loop guard: {named}")
    if waiting.get("newMail"):
        said.append(f"{waiting['newMail']} other new mail(s)")
    if waiting.get("unread"):
        said.append(f"{waiting['unread']} unread comment(s)")
    if waiting.get("yourTurn"):
        said.append(f"{waiting['yourTurn']} question(s) where it is my turn")
    return ("Also waiting for me: " + "; ".join(said) + ".") if said else ""


def answer_mail(run: dict[str, Any]) -> str:
    content = run["content"]
    ref = run["reply"]["arguments"]["mail"]
    if content["state"] in ("mail:new", "quiet"):
        call("mail_open", {"mail": ref})
    latest = content["followUp"] or {"from": content["from"], "body": content["body"]}
    text = (f"Echo here ({run['reply']['as']}): I read “{content['subject']}” from "
            f"{latest['from']}, {content['hops']} hop(s) into its thread. You wrote:\n\n"
            f"{quote(latest['body'])}")
    also = waiting_note(run)
    if also:
        text += f"\n\n{also}"
    call("mail_reply", {"mail": ref, "body": text, "idempotencyKey": f"echo-run-{run['run']}"})
    return f"replied to {ref}" + (f"; {also}" if also else "")


def answer_chat(run: dict[str, Any]) -> str:
    call("chat_reply", {"chat": run["chat"], "message": f"Echo: {run['message']}"})
    also = waiting_note(run)
    return f"answered chat {run['chat']}" + (f"; {also}" if also else "")


def main() -> int:
    try:
        run = json.load(sys.stdin)
        done = answer_mail(run) if run.get("kind") == "mail" else answer_chat(run)
    except (ToolError, KeyError, ValueError, OSError) as exc:
        print(f"echo: {exc}", file=sys.stderr)
        return 1
    print(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
