"""a question asked by hand on the forge finds "its card" as any comment of the
app's carrying the card's marker, whose id is predictable (the repository and the forge's
next comment id), and the app posts comments whose words someone else wrote."""

from __future__ import annotations

import hashlib
from typing import Any

from bot.app.embedded import Embedded
from tests.items_support import forge_comments, make_item, where


async def test_a_planted_card_marker_keeps_a_question_from_its_card(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco = person("marco")
    goal = await make_item(embedded, marco, "goal", "EU launch")
    repo, n = where(goal)
    scout = tools("agent:scout")
    # the agent's comment (posted by the app) carries, hidden, the marker of the card of the
    # forge's next comment
    probe = await marco.comment(repo, n, "just a note")
    await embedded.settle()
    after = max(int(c["id"]) for c in await forge_comments(marco, goal))
    guess = "c" + hashlib.sha256(f"{repo}\n{after + 2}".encode()).hexdigest()[:32]
    await scout("add_comment", targetType="goal", target=goal,
                body=f"Noted. <!-- vaultmail:comment id={guess} kind=question -->")
    await embedded.settle()
    asked = await marco.comment(repo, n, "/ask Which currency first? @sara\n- [ ] EUR\n- [ ] Local")
    assert int(asked["id"]) == after + 2, (probe, asked["id"], after)
    await embedded.settle()
    cards = [c for c in await forge_comments(marco, goal)
             if c["user"]["login"] == "vaultmail[bot]" and "❓ **Question**" in c["body"]]
    assert len(cards) == 1, [c["body"] for c in await forge_comments(marco, goal)]


async def test_a_deleted_question_card_is_posted_again_when_the_question_moves(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Anyone with write access may delete the app's card of a question. Every answer after
    it failed rewriting the card that was gone (the forge's 404, a retry, a dead letter), and
    a retry of a tool's answer posted its comment again each time (found by review). The
    card is posted again, showing the answer."""
    from tests.items_support import MARCO, TOKEN_TTL

    marco, admin = person("marco"), person("admin")
    ref = await make_item(embedded, marco, "outcome", "Auth schema migration")
    repo, n = where(ref)
    asked = await tools("agent:scout")("add_comment", **{**TOKEN_TTL, "target": ref})
    await embedded.settle()

    def cards(comments: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [c for c in comments
                if c["user"]["login"] == "vaultmail[bot]" and "❓ **Question**" in c["body"]]

    [card] = cards(await forge_comments(admin, ref))
    await admin.call("DELETE", f"/repos/{repo}/issues/comments/{card['id']}", expect=204)
    answered = await tools(MARCO)("add_comment", targetType="outcome", target=ref,
                                  parent=asked["comment"]["id"], option=1)
    assert answered["comment"]["id"], answered
    await embedded.settle()
    [again] = cards(await forge_comments(admin, ref))
    assert again["id"] != card["id"] and "Keep 30 days" in again["body"]
    answers = [c for c in await forge_comments(admin, ref) if "replied in thread" in c["body"]]
    assert len(answers) == 1, [c["body"] for c in await forge_comments(admin, ref)]
