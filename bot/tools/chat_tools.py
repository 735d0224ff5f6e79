"""Chat (seed mail.md, "Mail versus chat"): a person's quick question to an agent.

Unlike mail, a chat is kept in the office's index, never on the forge. Only people start one
(`agent_chat`); it queues a run of kind `chat` when the agent's `run.triggers` admit it (else
`run.refused` is ledgered and nothing is kept). The agent answers with `chat_reply`; the
person gets the answer from `agent_chat` with `wait`, or later with `chat_get`.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from pydantic import Field

from bot.app import runs
from bot.errors import Conflict, NotFoundError, TooManyRequests
from bot.office.config import Agent
from bot.office.visibility import viewer_for
from bot.store import chats, idempotency, ledger
from bot.store.chats import get_chat, number_of, waiting_for
from bot.store.db import Row
from bot.tools import outputs
from bot.tools.registry import (
    MAX_ID,
    READS_INDEX,
    Args,
    Call,
    Hints,
    inbox_provider,
    still_acting,
    tool,
)

MAX_WAIT = 50
# Each chat queues a run (and its dispatch), so unanswered ones are capped: one person's to
# every agent of the office together, one agent's from everyone, and the office's in all (the
# operator's setting, VAULTMAIL_CHATS_WAITING).
WAITING_PER_PERSON = 20
WAITING_PER_AGENT = 200
# seconds an unanswered chat counts toward those: an agent whose runs fail leaves its chats
# unanswered, and those must not shut its people out for good
WAITING_FOR = 3600.0


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _chat_json(row: Row) -> dict[str, Any]:
    return {"chat": number_of(row), "agent": row["agent"], "from": row["sender"],
            "message": row["message"], "sent": _iso(row["created_at"]),
            "answer": row["answer"], "answered": _iso(row["answered_at"]),
            "contentIsData": True}  # the message and the answer are someone's text: data


def _agent(call: Call, name: str) -> Agent:
    agent = call.office.agent(name.removeprefix("agent:"))
    if agent is None:
        known = ", ".join(a.slug for a in call.office.agents) or "none"
        raise NotFoundError(f"no agent {name!r} in this office; known agents: {known}",
                            code="unknown_agent")
    return agent


class ChatArgs(Args):
    agent: str = Field(min_length=1, max_length=200, description="the agent to ask: its slug "
                       "(scout) or principal (agent:scout)")
    message: str = Field(min_length=1, max_length=10_000, description="your question")
    wait: int = Field(default=0, ge=0, le=MAX_WAIT, description=(
        "seconds (at most 50) to wait for the agent's answer before returning; 0 returns at "
        "once and you read the answer later with chat_get"))
    idempotencyKey: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "any string; a retried call with the same key returns the first chat (and waits for "
        "its answer), never starts a second"))


async def _answer(call: Call, args: ChatArgs, result: dict[str, Any]) -> dict[str, Any]:
    """The chat as it is after waiting `wait` seconds for its answer: after the call, and
    after each retry of it with the same idempotencyKey."""
    return {"chat": _chat_json(await _wait_answer(call, int(result["chat"]["chat"]), args.wait))}


@tool("agent_chat", ChatArgs, (
    "Ask an agent a quick, interactive question (people only; agents use mail_send). The chat "
    "is kept in the office's index, not on the forge, and starts a `chat` run for the agent if "
    "its run.triggers accept chat runs; otherwise it is refused (409) and nothing is kept. Any "
    "person of the office whose forge account can see the agent's vault may chat with it. "
    "Returns {chat: {chat, agent, from, message, sent, answer, "
    "answered}}; `answer` is null until the agent answers: pass `wait` to wait for it, or call "
    "chat_get later. For requests that need an answer on record, send mail instead."),
    then=_answer, title="Chat with an agent", output=outputs.ChatResult,
    hints=Hints(read_only=False, destructive=False, idempotent=False, open_world=True))
async def agent_chat(call: Call, args: ChatArgs) -> dict[str, Any]:
    store = call.services.store
    kind, _, ident = call.principal.partition(":")
    if kind != "human":
        raise await call.mailer.deny(call.principal, f"chat to {args.agent}", (
            f"{call.principal} may not chat: agent_chat is for people; an agent writes to "
            "another agent with mail_send"))
    agent = _agent(call, args.agent)
    human = call.office.human(ident)
    vault = call.office.vault_of(agent).lower()
    if human is None:
        raise await call.mailer.deny(call.principal, f"chat to {agent.principal}", (
            f"{call.principal} is not one of the office's people (humans in vaultmail.yml), "
            "so may not chat with its agents"))
    if not await viewer_for(call).sees_repo(vault):
        raise await call.mailer.deny(call.principal, f"chat to {agent.principal}", (
            f"{call.principal} may not chat with {agent.principal}: their forge account "
            f"{human.login} cannot see its vault {vault}; an org owner can give them read "
            "access"))

    async def record() -> tuple[int, int | None]:
        # a try taken over (stalled past DEAD_AFTER) keeps no chat and wakes no one; `once`
        # answers the retry's chat
        async with idempotency.fenced(store, f"chat to {agent.principal}",
                                      ledger.key(call.office.org)) as db:
            now = time.time()
            waiting = await chats.waiting_counts(db, agent.principal, call.principal,
                                                 org=call.office.org, since=now - WAITING_FOR)
            _refuse_over_caps(waiting, agent.principal, call.office.org,
                              call.services.settings.chats_waiting, now)
            chat_id = await chats.add_chat(db, agent.principal, call.principal, args.message,
                                           time.time(), org=call.office.org)
            admitted = await runs.admit(db, agent, "chat", f"chat:{chat_id}", call.principal,
                                        org=call.office.org)
            if admitted is None:  # refused: the ledger says so, and no chat is kept
                await chats.delete_chat(db, chat_id, org=call.office.org)
        return chat_id, admitted

    # Shielded: a long-polling client that leaves cancels the wait, never the write.
    chat_id, admitted = await asyncio.shield(record())
    if admitted is None:
        raise Conflict(f"{agent.principal} does not take chat runs (its run.triggers: "
                       f"{', '.join(agent.run.triggers) or 'none'}); send it mail with mail_send "
                       "instead",
                       code="run_refused")
    call.services.notifier.notify([agent.principal], org=call.office.org)
    runs.dispatch_chat(call.services, call.forge, agent, vault, chat_id, call.principal,
                       args.message, admitted)
    row = await get_chat(store, chat_id, org=call.office.org)
    assert row is not None
    return {"chat": _chat_json(row)}  # the wait for the answer is `_answer`, after this


def _refuse_over_caps(waiting: chats.Waiting, agent: str, org: str, per_office: int,
                      now: float) -> None:
    """TooManyRequests naming the first cap `waiting` is at, how many wait, what to do, and
    when the oldest chat it counts stops counting (Retry-After; an answer makes room sooner)."""
    def refuse(said: str, oldest: float | None) -> TooManyRequests:
        # whole seconds, rounded up: what the message says is what Retry-After says
        wait = max(1, math.ceil((now if oldest is None else oldest) + WAITING_FOR - now))
        return TooManyRequests(
            f"{said} (of the last hour): wait for their answers (chat_get), send mail instead, "
            f"or try again in {wait} s, when the oldest stops counting", code="too_many_chats",
            retry_after=wait)

    if waiting.person >= WAITING_PER_PERSON:
        raise refuse(f"{waiting.person} chats of yours wait for an answer, to this office's "
                     f"agents together; at most {WAITING_PER_PERSON} of one person's wait at "
                     "once", waiting.person_oldest)
    if waiting.agent >= WAITING_PER_AGENT:
        raise refuse(f"{agent} has {waiting.agent} chats waiting for an answer, everyone's "
                     f"together; at most {WAITING_PER_AGENT} wait for one agent at once",
                     waiting.agent_oldest)
    if waiting.office >= per_office:
        raise refuse(f"{waiting.office} chats wait in the {org} office, every person's to "
                     f"every agent together; at most {per_office} wait in an office at once "
                     "(the app operator's setting VAULTMAIL_CHATS_WAITING)",
                     waiting.office_oldest)


async def _wait_answer(call: Call, chat_id: int, wait: float) -> Row:
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        row = await get_chat(call.services.store, chat_id, org=call.office.org)
        assert row is not None
        remaining = deadline - asyncio.get_running_loop().time()
        if row["answered_at"] is not None or remaining <= 0:
            return row
        woken = await call.services.notifier.wait(call.principal, remaining,
                                                  org=call.office.org)
        await still_acting(call)  # slept: its token or office may be gone since
        if not woken:  # timed out, or shutting down
            row = await get_chat(call.services.store, chat_id, org=call.office.org)
            assert row is not None
            return row


class ChatRef(Args):
    # (no bound of the schema's own: a number of no chat is "no chat N", saying where they are)
    chat: int = Field(description="the chat's number, from agent_chat or your inbox",
                      json_schema_extra={"minimum": 1, "maximum": MAX_ID})


class ChatReplyArgs(ChatRef):
    message: str = Field(min_length=1, max_length=10_000, description="your answer")


async def _visible_chat(call: Call, chat_id: int) -> Row:
    row = await get_chat(call.services.store, chat_id, org=call.office.org)
    if row is None or not viewer_for(call).sees_chat(row["sender"], row["agent"], row["org"]):
        raise NotFoundError(f"no chat {chat_id} of yours: the chats waiting for you are in "
                            "the `chats` of your inbox")
    return row


@tool("chat_reply", ChatReplyArgs, (
    "Answer a chat a person started with you (agents only: the `chats` in your inbox are the "
    "ones waiting). The answer goes back to the person at once; a chat is answered once."),
    title="Answer a chat", output=outputs.ChatResult,
    hints=Hints(read_only=False, destructive=False, idempotent=True, open_world=False))
async def chat_reply(call: Call, args: ChatReplyArgs) -> dict[str, Any]:
    row = await _visible_chat(call, args.chat)
    if call.principal != row["agent"]:
        raise await call.mailer.deny(call.principal, f"chat:{args.chat}", (
            f"{call.principal} may not answer chat {args.chat}: it was addressed to "
            f"{row['agent']}"))
    already = Conflict(f"chat {args.chat} is already answered (a chat takes one answer); "
                       "read the answer it has with chat_get", code="already_answered")
    if row["answered_at"] is not None:
        raise already
    # Conditional: of two replies racing past the check above, only the first lands.
    landed = await chats.answer_chat(call.services.store, args.chat, args.message,
                                     org=call.office.org)
    if landed == 0:
        raise already
    call.services.notifier.notify([row["sender"]], org=call.office.org)
    answered = await get_chat(call.services.store, args.chat, org=call.office.org)
    assert answered is not None
    return {"chat": _chat_json(answered)}


@tool("chat_get", ChatRef, "A chat you started or that was addressed to you, with its answer "
      "(null while the agent has not answered).", title="Read a chat", hints=READS_INDEX,
      output=outputs.ChatResult)
async def chat_get(call: Call, args: ChatRef) -> dict[str, Any]:
    return {"chat": _chat_json(await _visible_chat(call, args.chat))}


@inbox_provider
async def chats_waiting(call: Call) -> dict[str, Any]:
    """An agent's inbox lists the chats waiting for its answer (answer with chat_reply)."""
    rows = await waiting_for(call.services.store, call.principal, org=call.office.org)
    return {"chats": [{"chat": number_of(r), "from": r["sender"], "message": r["message"],
                       "sent": _iso(r["created_at"]), "contentIsData": True} for r in rows]}

