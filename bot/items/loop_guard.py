"""The loop guard on items (seed mail.md's, for comments): agents that address each other on
a goal, outcome, plan or evidence woke each other for ever. An item counts its agents'
comments in a row, all its threads together (a person's comment, anyone's who is not an
agent, ends the run); a comment's hops are the agents' comments in the run before it. Beyond
LOOP_GUARD_HOPS an agent's comment is recorded, shown and delivered, but quietly: it wakes no
agent's wait, mentions no agent on the forge, and hands no agent the turn.

Pure: the live path (`bot.items.service.Comments.add`, both the tools and the webhook) and the
rebuild's replay (`bot.items.rebuild`) both decide with it, so a reindex reads the same turns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from bot.items.threads import ThreadState
from bot.mail.header import LOOP_GUARD_HOPS


def is_agent(principal: str) -> bool:
    return principal.startswith("agent:")


def hops(earlier: Iterable[str]) -> int:
    """A comment's hops: how many of the item's comments just before it (their authors,
    newest first) agents wrote."""
    n = 0
    for author in earlier:
        if not is_agent(author):
            break
        n += 1
    return n


def held(author: str, hops: int) -> str | None:
    """Why a comment by `author` at `hops` wakes no agent, or None when it may."""
    if not is_agent(author) or hops <= LOOP_GUARD_HOPS:
        return None
    return (f"beyond {LOOP_GUARD_HOPS} hops ({hops} agents' comments in a row on this item): "
            "delivered without waking an agent; it sees it on its next look, and a person's "
            "comment starts the count again")


def no_agents_turn(before: tuple[str, ...], state: ThreadState) -> ThreadState:
    """`state` without the turn handed to an agent that did not have it (`before`: whom the
    thread waited on before the comment); a person still gets theirs."""
    waiting = tuple(p for p in state.waiting_on if not is_agent(p) or p in before)
    return replace(state, waiting_on=waiting)
