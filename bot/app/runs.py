"""Runs: the office asking an agent to act, admitted by the agent's `run.triggers`.

Admission is recorded in the same transaction as what caused it; dispatch happens after the
commit (a signed POST, a repository_dispatch on the vault, or nothing: the agent finds the
work in its inbox).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import aiosqlite

from bot.app.signed_post import post_signed
from bot.office.config import Agent
from bot.store import ledger, mails

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge

log = logging.getLogger("vaultmail.runs")
DISPATCH_ATTEMPTS = 4


async def admit(db: aiosqlite.Connection, agent: Agent, kind: str, subject: str,
                actor: str) -> bool:
    """Queue a run of `kind` for `agent` if its triggers admit it; ledger either way."""
    if kind in agent.run.triggers:
        run_id = await mails.add_run(db, agent.slug, kind, subject, "queued")
        await ledger.append(db, "run.queued", actor, subject,
                            {"agent": agent.principal, "kind": kind, "run": run_id})
        return True
    await mails.add_run(db, agent.slug, kind, subject, "refused")
    await ledger.append(db, "run.refused", actor, subject, {
        "agent": agent.principal, "kind": kind,
        "reason": f"{agent.principal} does not accept {kind} runs "
                  f"(run.triggers: {list(agent.run.triggers)})"})
    return False


def dispatch(services: Services, forge: Forge, agent: Agent, vault: str,
             payload: dict[str, Any]) -> None:
    """Tell the agent's runner, in the background; failures are retried, then logged."""
    if agent.run.dispatch == "none":
        return
    task = asyncio.create_task(_dispatch(services, forge, agent, vault, payload))
    services.background.add(task)
    task.add_done_callback(services.background.discard)


async def _dispatch(services: Services, forge: Forge, agent: Agent, vault: str,
                    payload: dict[str, Any]) -> None:
    for attempt in range(1, DISPATCH_ATTEMPTS + 1):
        try:
            if agent.run.dispatch == "repository_dispatch":
                await forge.dispatch(vault, "vaultmail.run", payload)
            else:
                await post_signed(services.keyring, agent.run.dispatch, payload)
            return
        except Exception as exc:  # network or forge failure: retry with backoff
            log.warning("run dispatch failed (attempt %d): %r", attempt, exc,
                        extra={"agent": agent.slug, "subject": payload.get("subject")})
            await asyncio.sleep(0.5 * 2 ** attempt)
    log.error("run dispatch gave up", extra={"agent": agent.slug})
