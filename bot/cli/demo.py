"""`vaultmail demo`: a scripted story on the embedded forge, each step checked.

A person writes to an agent in the forge, the agent opens and answers, two agents reply to each
other until the loop guard holds, a mail wakes a local agent through `dispatch: {command}` and
its reply lands, a question is asked and answered, and the labels are printed at the end. Exits
non-zero when a step does not come out as expected.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.embedded import Embedded, start_embedded
from bot.cli.output import say
from bot.mail.header import parse_mail_body
from bot.store import ledger


class StepFailed(Exception):
    pass


class Story:
    def __init__(self, embedded: Embedded, session: aiohttp.ClientSession) -> None:
        self.e = embedded
        self.session = session
        self.step = 0

    def check(self, ok: bool, what: str) -> None:
        self.step += 1
        say(f"{'✓' if ok else '✗'} {self.step:>2}. {what}", flush=True)
        if not ok:
            raise StepFailed(what)

    async def forge(self, login: str, method: str, path: str, json: Any = None) -> Any:
        headers = {"Authorization": f"token {self.e.forge_tokens[login]}"}
        async with self.session.request(method, self.e.forge.url + path, json=json,
                                        headers=headers) as resp:
            resp.raise_for_status()
            return await resp.json() if resp.status != 204 else None

    async def tool(self, principal: str, name: str, **args: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.e.api_tokens[principal]}"}
        async with self.session.post(f"{self.e.app_url}/api/v1/tools/{name}", json=args,
                                     headers=headers) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise StepFailed(f"{name} as {principal}: {body}")
            return body

    async def labels(self, repo: str, number: int) -> list[str]:
        issue = await self.forge("admin", "GET", f"/repos/{repo}/issues/{number}")
        return sorted(label["name"] for label in issue["labels"])

    async def run(self) -> None:
        e = self.e
        scout_vault = e.office.vault_of(e.office.agents[0])
        issue = await self.forge("marco", "POST", f"/repos/{scout_vault}/issues", {
            "title": "EU price check", "body": "Can you check our EU prices against the list?"})
        n = issue["number"]
        await e.settle()
        found = await self.forge("admin", "GET", f"/repos/{scout_vault}/issues/{n}")
        header, _ = parse_mail_body(found["body"])
        self.check(header is not None and header.from_principal == "human:marco@acme.com"
                   and await self.labels(scout_vault, n) == ["mail:new"],
                   f"marco opens an issue in {scout_vault}: adopted as signed mail, mail:new")
        await self.forge("scout-bot", "POST", f"/repos/{scout_vault}/issues/{n}/comments",
                         {"body": "/working"})
        await e.settle()
        self.check(await self.labels(scout_vault, n) == ["mail:working"],
                   "scout comments /working: mail:working")
        await self.forge("scout-bot", "POST", f"/repos/{scout_vault}/issues/{n}/comments",
                         {"body": "Two SKUs are 3% above list; details in the sheet."})
        await e.settle()
        self.check(await self.labels(scout_vault, n) == ["mail:replied"],
                   "scout replies in the thread: mail:replied")

        mail = (await self.tool("agent:builder", "mail_send", to="scout",
                                subject="Spec review", body="Can you review the spec?"))["mail"]
        self.check(mail["state"] == "mail:new", f"builder mails scout: {mail['ref']}")
        speakers = ["agent:scout", "agent:builder", "agent:scout", "agent:builder"]
        for hop, who in enumerate(speakers, start=1):
            await self.tool(who, "mail_reply", mail=mail["ref"], body=f"reply {hop}")
            await e.settle()
            mail = [m for m in (await self.tool(who, "mail_list"))["mails"]
                    if m["hops"] == hop][0]
            quiet = hop > 3
            self.check((mail["state"] == "quiet") == quiet,
                       f"{who} replies: copy {mail['ref']} hops {hop}"
                       + (" delivered quietly (loop guard)" if quiet else " mail:new"))
        guards = await ledger.entries(e.services.store, event="mail.loop_guard")
        self.check(len(guards) == 1, "the ledger records mail.loop_guard once")

        await self.local_agent()
        await self.ask_and_answer(scout_vault)

        closed = await self.tool("human:marco@acme.com", "mail_close", mail=f"{scout_vault}#{n}")
        self.check(closed["mail"]["state"] == "mail:closed", "marco closes his mail")
        say("\nfinal labels:")
        for vault in e.office.vaults():
            for item in await self.forge("admin", "GET", f"/repos/{vault}/issues?state=all"):
                names = ",".join(sorted(x["name"] for x in item["labels"])) or "(quiet)"
                say(f"  {vault}#{item['number']:<3} {item['state']:<7} {names:<14} "
                    f"{item['title']}")
        ok = await ledger.verify_chain(e.services.store) is None
        self.check(ok, "the ledger's hash chain holds")


    async def local_agent(self) -> None:
        """The example office's `echo` agent is a command (`dispatch: {command}`): a mail
        starts it with the run on stdin, and it answers through the tools by itself."""
        e = self.e
        mail = (await self.tool("human:marco@acme.com", "mail_send", to="echo",
                                subject="Are you there?", body="Say hello back."))["mail"]
        await e.settle()  # the run, the command and what its reply caused
        finished = [x for x in await ledger.entries(e.services.store, event="run.finished")
                    if x.subject == mail["ref"]]
        self.check(len(finished) == 1 and finished[0].data["exit"] == 0,
                   f"marco mails echo ({mail['ref']}): its run starts `python -m "
                   "bot.agents.echo` with the mail on stdin (dispatch: {command}), exit 0")
        comments = await self.forge("admin", "GET", f"/repos/{mail['vault']}/issues/"
                                    f"{mail['number']}/comments")
        self.check(await self.labels(mail["vault"], mail["number"]) == ["mail:replied"]
                   and any("Say hello back." in c["body"] for c in comments),
                   "echo's reply lands on the mail: mail:replied")

    async def ask_and_answer(self, vault: str) -> None:
        e = self.e
        outcome = await self.forge("marco", "POST", f"/repos/{vault}/issues", {
            "title": "Auth migration", "body": "Move sessions to the new store",
            "labels": ["outcome"], "assignees": ["scout-bot"]})
        ref = f"{vault}#{outcome['number']}"
        await e.settle()
        asked = await self.tool(
            "agent:scout", "add_comment", targetType="outcome", target=ref,
            to=["marco@acme.com"], header="Token TTL", humanOnly=True,
            body="After the migration, should existing sessions keep working?",
            options=[{"label": "Keep 30 days", "recommended": True,
                      "description": "Nobody is signed out; dual-read code for a month.",
                      "then": "Add dual-read and a removal task 30 days out."},
                     {"label": "Force re-login",
                      "description": "Everyone signs in again once.",
                      "then": "Invalidate legacy tokens at cutover."}])
        self.check(asked["thread"]["waitingOn"] == ["human:marco@acme.com"],
                   f"scout asks marco a question on {ref}; it waits on marco")
        turn = (await self.tool("human:marco@acme.com", "list_inbox"))["you"]["yourTurn"]
        self.check([t["header"] for t in turn] == ["Token TTL"],
                   "the question is in marco's inbox, his turn")
        await self.forge("marco", "POST", f"/repos/{vault}/issues/{outcome['number']}/comments",
                         {"body": "/answer 1"})
        await e.settle()
        got = await self.tool("agent:scout", "get_outcome", outcome=ref)
        decisions = got["decisions"]
        self.check(bool(decisions) and decisions[0]["answer"]["option"] == "Keep 30 days",
                   "marco answers `/answer 1` in the forge: the decision is on the outcome")


async def run_demo(data: str | None = None) -> int:
    if data:
        return await _run_demo(Path(data))
    # without --data: a temp dir, keys and all, gone when the demo ends
    with tempfile.TemporaryDirectory(prefix="vaultmail-demo-",
                                     ignore_cleanup_errors=True) as tmp:
        return await _run_demo(Path(tmp))


async def _run_demo(data_dir: Path) -> int:
    embedded = await start_embedded(data_dir=data_dir, port=0, forge_port=0)
    try:
        async with aiohttp.ClientSession() as session:
            await Story(embedded, session).run()
    except StepFailed as exc:
        say(f"demo failed at: {exc}")
        return 1
    finally:
        await embedded.stop()
    say("demo passed")
    return 0
