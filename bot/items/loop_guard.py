"""The loop guard on items (seed mail.md's, for comments): agents that address each other on
a goal, outcome, plan or evidence woke each other for ever. Each conversation on an item counts
its agents' comments in a row, as mail counts a thread's hops (a person's comment there,
anyone's who is not an agent, ends the run); a comment's hops are the agents' comments in the
run before it. A conversation (`conversation`) is a thread, for a reply in it; the comments
that reply to none (each starts a thread: a question, a plain comment) are the item's own.
Agents elsewhere on the item (another question's thread) are no part of the run. Beyond
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


def conversation(thread: str, parent: str | None) -> str | None:
    """Where a comment in `thread` replying to `parent` counts its hops: its thread (whose
    first comment is part of it), or None, the item's comments that reply to none."""
    return thread if parent is not None else None


def counts_in(where: str | None, thread: str, parent: str | None) -> bool:
    """Whether a comment in `thread` replying to `parent` is part of conversation `where`."""
    return parent is None if where is None else thread == where


def hops(earlier: Iterable[str]) -> int:
    """A comment's hops: how many of its conversation's comments just before it (their
    authors, newest first) agents wrote."""
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
    return (f"beyond {LOOP_GUARD_HOPS} hops ({hops} agents' comments in a row in this "
            "conversation): delivered without waking an agent; it sees it on its next look, "
            "and a person's comment there starts the count again")


def no_agents_turn(before: tuple[str, ...], state: ThreadState) -> ThreadState:
    """`state` without the turn handed to an agent that did not have it (`before`: whom the
    thread waited on before the comment); a person still gets theirs."""
    waiting = tuple(p for p in state.waiting_on if not is_agent(p) or p in before)
    return replace(state, waiting_on=waiting)
