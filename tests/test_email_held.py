"""The held queue's count beside Held on every console page (bot.email.held.count_for): one
COUNT for all the agents whose held mail is the viewer's, whatever their number."""

from __future__ import annotations

from typing import Any

from labels.states import MailState
from tests.test_email_support import DOMAIN, Mailroom, Sender, mailroom, message, send, wire

__all__ = ["mailroom"]


async def test_a_console_page_counts_the_held_mail_in_one_statement(
        mailroom: Mailroom) -> None:
    """Every console page an editor opened ran one held-mail query per agent of the office,
    each reading up to 200 mails only to take their number (acted out, review r4: a page's
    cost grew with the agents). Now one statement counts them all, handing back a number per
    agent with held mail, not the mails."""
    Sender("other.example", mailroom.dns).publish()
    for n in (1, 2):
        raw = wire(message("eve@other.example", f"builder@{DOMAIN}", f"Offer {n}", "cheap!",
                           Message_ID=f"<offer{n}@other.example>"))
        assert (await send(mailroom.port, raw, rcpts=[f"builder@{DOMAIN}"],
                           mail_from="eve@other.example")).code == 250
    await mailroom.embedded.settle()
    emb, session = mailroom.embedded, mailroom.session
    store = emb.services.store
    held: list[int] = []  # per statement about held mail: the rows it handed back
    fetchall, fetchone = store.fetchall, store.fetchone

    async def spy_all(sql: Any, params: Any = ()) -> Any:
        rows = await fetchall(sql, params)
        if MailState.HELD.value in tuple(params):
            held.append(len(rows))
        return rows

    async def spy_one(sql: Any, params: Any = ()) -> Any:
        row = await fetchone(sql, params)
        if MailState.HELD.value in tuple(params):
            held.append(0 if row is None else 1)
        return row

    store.fetchall = spy_all  # type: ignore[method-assign]
    store.fetchone = spy_one  # type: ignore[method-assign]
    for who, label in (("human:marco@acme.com", 'aria-label="2 held for you"'),  # an editor
                       ("human:sara@acme.com", 'aria-label="2 held for you"'),  # builder's
                       ("human:lee@acme.com", None)):  # no agent's person
        held.clear()
        async with session.get(emb.app_url + "/console/mail", headers={
                "Authorization": f"Bearer {emb.api_tokens[who]}"}) as resp:
            page = await resp.text()
        assert resp.status == 200, page
        if label is None:
            assert "held for you" not in page and held == [], held
        else:
            assert label in page
            assert held == [1], held  # one statement, builder's one number
