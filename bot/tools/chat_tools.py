"""Chat (seed mail.md, "Mail versus chat"): a person's quick question to an agent.

Unlike mail, a chat is kept in the office's index, never on the forge. Only people start one
(`agent_chat`); it queues a run of kind `chat` when the agent's `run.triggers` admit it (else
`run.refused` is ledgered and nothing is kept). The agent answers with `chat_reply`; the
person gets the answer from `agent_chat` with `wait`, or later with `chat_get`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiosqlite
from pydantic import Field

from bot.app import runs
from bot.errors import Conflict, NotFoundError
from bot.office.config import Agent
from bot.store import Store
from bot.store.db import register_schema
from bot.tools.registry import Args, Call, inbox_provider, tool

register_schema("""
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    sender TEXT NOT NULL,
    message TEXT NOT NULL,
    created_at REAL NOT NULL,
    answer TEXT,
    answered_at REAL
);
CREATE INDEX IF NOT EXISTS chats_agent ON chats(agent, answered_at);
""")

MAX_WAIT = 50


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _chat_json(row: aiosqlite.Row) -> dict[str, Any]:
    return {"chat": row["id"], "agent": row["agent"], "from": row["sender"],
            "message": row["message"], "sent": _iso(row["created_at"]),
            "answer": row["answer"], "answered": _iso(row["answered_at"])}


async def get_chat(store: Store, chat_id: int) -> aiosqlite.Row | None:
    return await store.fetchone("SELECT * FROM chats WHERE id=?", (chat_id,))


async def waiting_for(store: Store, agent: str) -> list[aiosqlite.Row]:
    return await store.fetchall(
        "SELECT * FROM chats WHERE agent=? AND answered_at IS NULL ORDER BY id", (agent,))


def _agent(call: Call, name: str) -> Agent:
    agent = call.office.agent(name.removeprefix("agent:"))
    if agent is None:
        known = ", ".join(a.slug for a in call.office.agents) or "none"
        raise NotFoundError(f"no agent {name!r} in this office; known agents: {known}",
                            code="unknown_agent")
    return agent


class ChatArgs(Args):
    agent: str = Field(min_length=1, description="the agent to ask: its slug (scout) or "
                       "principal (agent:scout)")
    message: str = Field(min_length=1, max_length=10_000, description="your question")
    wait: int = Field(default=0, ge=0, le=MAX_WAIT, description=(
        "seconds (at most 50) to wait for the agent's answer before returning; 0 returns at "
        "once and you read the answer later with chat_get"))


@tool("agent_chat", ChatArgs, (
    "Ask an agent a quick, interactive question (people only; agents use mail_send). The chat "
    "is kept in the office's index, not on the forge, and starts a `chat` run for the agent if "
    "its run.triggers accept chat runs; otherwise it is refused (409) and nothing is kept. You "
    "need the mail.send permission. Returns {chat: {chat, agent, from, message, sent, answer, "
    "answered}}; `answer` is null until the agent answers: pass `wait` to wait for it, or call "
    "chat_get later. For requests that need an answer on record, send mail instead."))
async def agent_chat(call: Call, args: ChatArgs) -> dict[str, Any]:
    store = call.services.store
    kind, _, ident = call.principal.partition(":")
    if kind != "human":
        raise await call.mailer.deny(call.principal, f"chat to {args.agent}", (
            f"{call.principal} may not chat: agent_chat is for people; an agent writes to "
            "another agent with mail_send"))
    agent = _agent(call, args.agent)
    human = call.office.human(ident)
    if human is None or "mail.send" not in human.permissions:
        raise await call.mailer.deny(call.principal, f"chat to {agent.principal}", (
            f"{call.principal} lacks the mail.send permission, which chatting with an agent "
            "needs; an office admin can add it under humans[].permissions in vaultmail.yml"))

    async def record() -> tuple[int, bool]:
        async with store.transaction() as db:
            cur = await db.execute(
                "INSERT INTO chats(agent, sender, message, created_at) VALUES (?,?,?,?)",
                (agent.principal, call.principal, args.message, time.time()))
            chat_id = int(cur.lastrowid or 0)
            admitted = await runs.admit(db, agent, "chat", f"chat:{chat_id}", call.principal)
            if not admitted:  # refused: the ledger says so, and no chat is kept
                await db.execute("DELETE FROM chats WHERE id=?", (chat_id,))
        return chat_id, admitted

    # Shielded: a long-polling client that leaves cancels the wait, never the write.
    chat_id, admitted = await asyncio.shield(record())
    if not admitted:
        raise Conflict(f"{agent.principal} does not take chat runs (its run.triggers: "
                       f"{list(agent.run.triggers)}); send it mail with mail_send instead",
                       code="run_refused")
    call.services.notifier.notify([agent.principal])
    runs.dispatch(call.services, call.forge, agent, call.office.vault_of(agent).lower(), {
        "kind": "chat", "agent": agent.slug, "chat": chat_id, "from": call.principal,
        "message": args.message})
    row = await _wait_answer(call, chat_id, args.wait)
    return {"chat": _chat_json(row)}


async def _wait_answer(call: Call, chat_id: int, wait: float) -> aiosqlite.Row:
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        row = await get_chat(call.services.store, chat_id)
        assert row is not None
        remaining = deadline - asyncio.get_running_loop().time()
        if row["answered_at"] is not None or remaining <= 0:
            return row
        await call.services.notifier.wait(call.principal, remaining)


class ChatRef(Args):
    chat: int = Field(ge=1, description="the chat's number, from agent_chat or your inbox")


class ChatReplyArgs(ChatRef):
    message: str = Field(min_length=1, max_length=10_000, description="your answer")


async def _visible_chat(call: Call, chat_id: int) -> aiosqlite.Row:
    row = await get_chat(call.services.store, chat_id)
    if row is None or call.principal not in (row["agent"], row["sender"], "office"):
        raise NotFoundError(f"no chat {chat_id} of yours: the chats waiting for you are in "
                            "the `chats` of your inbox")
    return row


@tool("chat_reply", ChatReplyArgs, (
    "Answer a chat a person started with you (agents only: the `chats` in your inbox are the "
    "ones waiting). The answer goes back to the person at once; a chat is answered once."))
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
    async with call.services.store.transaction() as db:
        # Conditional: of two replies racing past the check above, only the first lands.
        cur = await db.execute("UPDATE chats SET answer=?, answered_at=? WHERE id=?"
                               " AND answered_at IS NULL", (args.message, time.time(), args.chat))
        landed = cur.rowcount
    if landed == 0:
        raise already
    call.services.notifier.notify([row["sender"]])
    answered = await get_chat(call.services.store, args.chat)
    assert answered is not None
    return {"chat": _chat_json(answered)}


@tool("chat_get", ChatRef, "A chat you started or that was addressed to you, with its answer "
      "(null while the agent has not answered).")
async def chat_get(call: Call, args: ChatRef) -> dict[str, Any]:
    return {"chat": _chat_json(await _visible_chat(call, args.chat))}


@inbox_provider
async def chats_waiting(call: Call) -> dict[str, Any]:
    """An agent's inbox lists the chats waiting for its answer (answer with chat_reply)."""
    rows = await waiting_for(call.services.store, call.principal)
    return {"chats": [{"chat": r["id"], "from": r["sender"], "message": r["message"],
                       "sent": _iso(r["created_at"])} for r in rows]}

