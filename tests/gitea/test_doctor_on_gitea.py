"""`vaultmail doctor` on Gitea (issue 28): a reply comment an admin deleted is posted again
from the words the app kept, once; a change not yet delivered is flagged, never written,
and a state write the forge lost is written again: the issue's timeline (`state_changes`)
tells one from the other, as on GitHub."""

from __future__ import annotations

import re

import aiohttp

from bot.app.embedded import Embedded
from bot.forge import markers
from tests.gitea.test_mail_on_gitea import VAULT, Person, tool
from tests.test_tamper import vaultmail


def _count(out: str, outcome: str) -> int:
    found = re.search(rf"{outcome}: (\d+)", out)
    assert found, out
    return int(found[1])


async def test_the_doctor_on_gitea(office: Embedded) -> None:
    async with aiohttp.ClientSession() as s:
        status, sent = await tool(s, office, "human:marco@acme.com", "mail_send", to="scout",
                                  subject="Prices", body="EU?")
        assert status == 200, sent
        ref, n = f"{VAULT}#{sent['mail']['number']}", sent["mail"]["number"]
        await office.settle()
        status, replied = await tool(s, office, "agent:scout", "mail_reply", mail=ref,
                                     body="Up 3 %.", idempotencyKey="g1")
        assert status == 200, replied
        await office.settle()
        admin, marco = Person(s, office, "admin"), Person(s, office, "marco")
        marker = markers.reply("g1")
        [comment] = [c for c in await admin.comments(n) if marker in c["body"]]
        await admin.call("DELETE", f"/repos/{VAULT}/issues/comments/{comment['id']}",
                         expect=204)
        await office.settle()

        code, out = await vaultmail(office, "doctor")
        assert code == 0 and _count(out, "repaired") == 1, out
        code, out = await vaultmail(office, "doctor")
        assert code == 0 and "the forge and the index agree" in out, out
        back = [c for c in await admin.comments(n) if marker in c["body"]]
        assert len(back) == 1 and "Up 3 %." in back[0]["body"], back

        office.forge.faults.drop_webhooks(count=2)  # marco's close by hand is not delivered
        await marco.call("PATCH", f"/repos/{VAULT}/issues/{n}", {"state": "closed"},
                         expect=201)
        await office.forge.webhooks_idle()
        code, out = await vaultmail(office, "doctor")
        assert code == 1 and _count(out, "flagged") == 1, out
        # before, Gitea's timeline was not read: every difference was flagged, "this forge
        # lists no issue timeline", a lost write of the app's as well as marco's close
        assert "marco changed it on the forge (closed at" in out, out
        assert (await marco.issue(n))["state"] == "closed", "nothing written"


async def test_the_doctor_on_gitea_writes_a_lost_close_again(office: Embedded) -> None:
    """Before, the doctor flagged it ("this forge lists no issue timeline"): on Gitea no
    lost write was ever repaired."""
    async with aiohttp.ClientSession() as s:
        status, sent = await tool(s, office, "human:marco@acme.com", "mail_send", to="scout",
                                  subject="Close me", body="done?")
        assert status == 200, sent
        n = sent["mail"]["number"]
        await office.settle()
        status, closed = await tool(s, office, "human:marco@acme.com", "mail_close",
                                    mail=f"{VAULT}#{n}")
        assert status == 200, closed
        await office.settle()
        repo = office.forge.state.repo("acme", "scout-vault")
        assert repo is not None
        repo.issues[n].state = "open"  # the forge lost the app's close (a failover)
        marco = Person(s, office, "marco")
        assert (await marco.issue(n))["state"] == "open", "the close was lost"
        code, out = await vaultmail(office, "doctor")
        assert code == 0 and _count(out, "repaired") == 1, out
        assert (await marco.issue(n))["state"] == "closed"
