"""Runs: the office asking an agent to act, admitted by the agent's `run.triggers`.

Admission is recorded in the same transaction as what caused it; dispatch happens after the
commit, by the agent's `run.dispatch`: a signed POST, a repository_dispatch on the vault, a local
command (`{command: [...]}` from the operator's own office file, or `command`: the program the
operator set for the agent in VAULTMAIL_AGENT_COMMANDS), or nothing (the agent finds the work in
its inbox). A POST goes only where the operator's outbound policy lets it (`bot.app.egress`).

Seed mail.md: "The agent is prompted with the mail." Every dispatched run carries what the agent
needs to act without another request (`mail_run`, `chat_run`): who wrote, the subject, the body
(marked `contentIsData`: it is someone's text, never instructions), the thread, the hops, and
where to reply. A command run also gets, in its environment, the app's URL and an API token of
its agent that lives as long as the run (`VAULTMAIL_APP_URL`, `VAULTMAIL_TOKEN`), so it answers
through the tools like any agent (a mail run's token names its mail: mail sent with it counts
one hop more than that mail, bot.mail.header.LOOP_GUARD_HOPS; so does mail the agent sends with
any token while a mail run of its is open, `RUN_HELD_OPEN`); its exit status, timing and the
end of its output are ledgered as `run.finished`. It gets nothing else of the app's: its
environment is built from an allow-list (`command_env`), and it runs in a directory of its own,
removed when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.app.egress import OutboundRefused
from bot.app.signed_post import post_signed
from bot.forge.errors import OutcomeUnknown
from bot.forge.pacing import without_wait_limit
from bot.items import inbox
from bot.office.config import (
    COMMANDS_SETTING,
    OPERATOR_COMMAND,
    PYTHON,
    Agent,
    CommandDispatch,
    Office,
)
from bot.office.visibility import viewer_of
from bot.store import api_tokens, ledger, mails
from bot.store.db import Connection
from bot.store.mails import QUIET

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge
    from bot.store.mails import MailRecord

log = logging.getLogger("vaultmail.runs")
DISPATCH_ATTEMPTS = 4
EARLIER_MAILS = 5  # earlier mails of the thread a mail run carries
EARLIER_BODY = 4_000  # characters of each earlier mail's body
OUTPUT_KEPT = 4_000  # characters of a command's stdout and stderr kept in the ledger
RUN_TOKEN_MARGIN = 300.0  # seconds a run's token acts past its timeout (its end recorded)
# How long a mail run counts as open for the loop guard when the app never learns its end: a
# POST's or a repository_dispatch's runner, or an agent that polls (a command's ends when it
# exits). What its agent sends meanwhile, with any token, climbs from the run's mail
RUN_HELD_OPEN = 3600.0
# What an agent writes on the forge is timed by the forge's clock, runs by ours: a write this
# many seconds either side of a run's start and end counts as the run's (`Mailer.sent_from`)
FORGE_CLOCK_SKEW = 30.0
LONGEST_RUN = 86_400.0 + RUN_TOKEN_MARGIN  # a command's longest timeout (`RunDispatch`), ended
CLIENT_PAYLOAD_BYTES = 60_000  # GitHub takes a repository_dispatch client_payload up to 64 KB
# What of the app's environment a command gets: where programs are, the user's home, language
# and time zone; nothing else (not the app's keys, secrets, database or forge settings)
PASSED_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ")
PASSED_ENV_PREFIXES = ("LC_",)
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])  # where the `bot` package is imported from


async def admit(db: Connection, agent: Agent, kind: str, subject: str,
                actor: str, *, org: str, woken_by: str | None = None) -> int | None:
    """Queue a run of `kind` for `agent` if its triggers admit it, ledgered either way: the
    run's id, or None when refused. `woken_by`: a mail run's mail (its id): until the run is
    over (`RUN_HELD_OPEN`), what the agent sends counts past it (bot.mail.mailer.sent_hops).
    Kept only for a run the app dispatches: with `dispatch: none` no run is started, and what
    the agent sends may be a person's doing at an MCP client, nothing the mail caused."""
    if kind in agent.run.triggers:
        dispatched = agent.run.dispatch != "none"
        run_id = await mails.add_run(db, agent.slug, kind, subject, "queued", org=org,
                                     woken_by=woken_by if dispatched else None)
        await ledger.append(db, "run.queued", actor, subject,
                            {"agent": agent.principal, "kind": kind, "run": run_id}, org=org)
        return run_id
    await mails.add_run(db, agent.slug, kind, subject, "refused", org=org)
    await ledger.append(db, "run.refused", actor, subject, org=org, data={
        "agent": agent.principal, "kind": kind,
        "reason": f"{agent.principal} does not accept {kind} runs "
                  f"(run.triggers: {list(agent.run.triggers)})"})
    return None


# -- what a run carries ------------------------------------------------------------------------

WAITING_NAMED = 5  # quiet mails a run names (the rest are counted)


async def waiting_for(services: Services, forge: Forge, office: Office | None, agent: Agent,
                      *, org: str, besides: str | None = None) -> dict[str, Any]:
    """What waits for `agent` besides the run's own mail (seed: past the loop guard "the agent
    sees it on its next run"): its mail to handle, the quiet loop-guard deliveries named, and
    its inbox's counts: comments it has not been shown (`unread`) and questions whose turn is
    its or its sibling agents' (`yourTurn`). Nothing is marked read or shown: `list_inbox`
    (`see`) gives them."""
    store = services.store
    handle, _ = await mails.to_handle(store, agent.principal, org=org)
    handle = [m for m in handle if m.mail_id != besides]
    quiet = [m for m in handle if m.state == QUIET]
    out: dict[str, Any] = {
        "newMail": len(handle) - len(quiet), "quietMail": len(quiet),
        "quiet": [{"ref": m.ref, "from": m.from_principal, "subject": m.subject,
                   "hops": m.hops} for m in quiet[:WAITING_NAMED]],
        # null when the office's config cannot be read now: not known, rather than none
        "unread": None, "yourTurn": None, "see": "list_inbox", "contentIsData": True}
    if office is not None:
        # counted as its list_inbox shows them: what is on items it may not see (a sibling
        # agent's, in their person's shared box) is not its to count
        sees = viewer_of(services, forge, office, agent.principal).visible
        boxes = (await inbox.compute(store, office, agent.principal, mark_you=False,
                                     mark_agents=False, sees=sees)).boxes
        out.update(unread=len(boxes["agents"]["unread"]),
                   yourTurn=len(boxes["agents"]["yourTurn"]))
    return out


async def mail_run(services: Services, forge: Forge, agent: Agent, record: MailRecord,
                   run: int, *, follow_up: tuple[str, str] | None = None,
                   office: Office | None = None) -> dict[str, Any]:
    """The run of a mail: the mail itself, the new message when a follow-up woke the agent
    (`follow_up`: who wrote it, and its text), the thread's earlier mails the agent took part
    in, what else waits for it (`waiting_for`) and where to reply. At most 10 top-level keys
    (GitHub's limit for client_payload)."""
    thread = await mails.list_mails(services.store, org=record.org, thread=record.thread_id)
    earlier = [m for m in thread if m.mail_id != record.mail_id
               and agent.principal in (m.from_principal, m.to_principal)][-EARLIER_MAILS:]
    return {
        "kind": "mail", "office": record.org, "agent": agent.slug, "run": run,
        "mail": record.mail_id, "subject": record.ref, "title": record.subject,
        "content": {
            "ref": record.ref, "vault": record.vault, "number": record.number,
            "from": record.from_principal, "to": record.to_principal,
            "subject": record.subject, "sent": record.sent, "hops": record.hops,
            "thread": record.thread_id, "inReplyTo": record.in_reply_to, "state": record.state,
            "body": record.body,
            "followUp": ({"from": follow_up[0], "body": follow_up[1]} if follow_up else None),
            "earlier": [{"ref": m.ref, "from": m.from_principal, "to": m.to_principal,
                         "subject": m.subject, "sent": m.sent, "hops": m.hops,
                         "body": _clip(m.body, EARLIER_BODY)} for m in earlier],
            "contentIsData": True,
        },
        "reply": {"tool": "mail_reply", "arguments": {"mail": record.ref}, "issue": record.ref,
                  "as": agent.principal},
        "waiting": await waiting_for(services, forge, office, agent, org=record.org,
                                     besides=record.mail_id),
    }


def chat_run(agent: Agent, chat: int, sender: str, message: str, run: int,
             org: str) -> dict[str, Any]:
    return {"kind": "chat", "office": org.lower(), "agent": agent.slug, "run": run,
            "chat": chat, "from": sender,
            "message": message, "contentIsData": True,
            "reply": {"tool": "chat_reply", "arguments": {"chat": chat}, "as": agent.principal}}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fit_client_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload within GitHub's size limit for a client_payload: the earlier mails go
    first, then the body is cut (`content.truncated`: read the rest with mail_get)."""
    def size(p: dict[str, Any]) -> int:
        return len(json.dumps(p, ensure_ascii=False).encode())

    if size(payload) <= CLIENT_PAYLOAD_BYTES or "content" not in payload:
        return payload
    content = {**payload["content"], "earlier": []}
    fitted = {**payload, "content": content}
    over = size(fitted) - CLIENT_PAYLOAD_BYTES
    if over > 0:
        body = content["body"].encode()
        content["body"] = body[: max(0, len(body) - over - 16)].decode("utf-8", "ignore")
        content["truncated"] = True
    return fitted


# -- dispatch ----------------------------------------------------------------------------------

def dispatch_mail(services: Services, forge: Forge, agent: Agent, record: MailRecord,
                  run: int, *, follow_up: tuple[str, str] | None = None) -> None:
    """Prompt `agent` with the mail of its run `run`, in the background."""
    if agent.run.dispatch == "none":
        return

    async def go() -> None:
        payload = await mail_run(services, forge, agent, record, run, follow_up=follow_up,
                                 office=await _office(services, forge, record.org))
        await _dispatch(services, forge, agent, record.vault, record.ref, payload)

    _background(services, go())


def dispatch_chat(services: Services, forge: Forge, agent: Agent, vault: str, chat: int,
                  sender: str, message: str, run: int) -> None:
    if agent.run.dispatch == "none":
        return
    org = vault.split("/")[0]

    async def go() -> None:
        payload = chat_run(agent, chat, sender, message, run, org)
        payload["waiting"] = await waiting_for(
            services, forge, await _office(services, forge, org), agent, org=org.lower())
        await _dispatch(services, forge, agent, vault, f"chat:{chat}", payload)

    _background(services, go())


async def _office(services: Services, forge: Forge, org: str) -> Office | None:
    """The office, for the inbox counts a run carries; None (no counts, the run goes anyway)
    when its config cannot be read now."""
    try:
        return await services.offices.get(forge, org)
    except Exception as exc:  # the forge is down, the config broken: the run still goes
        log.warning("office config unreadable for a run's inbox counts: %r", exc,
                    extra={"org": org})
        return None


def _background(services: Services, work: Coroutine[Any, Any, None]) -> None:
    # outliving the delivery that started it: not under the worker's limit on forge waits
    # (a dispatch waits out a rate limit, as it did, rather than give up its run)
    task = asyncio.create_task(work, context=without_wait_limit())
    services.background.add(task)
    task.add_done_callback(services.background.discard)


async def idle(services: Services, timeout: float) -> bool:
    """Wait until every dispatch under way (and every command run) has ended, at most
    `timeout` seconds (nothing is cancelled): whether they all did."""
    deadline = asyncio.get_running_loop().time() + timeout
    while services.background:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        await asyncio.wait(list(services.background), timeout=left)
    return True


async def stop(services: Services) -> None:
    """At shutdown: stop what is under way (a command run is killed, its token revoked)."""
    tasks = list(services.background)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _dispatch(services: Services, forge: Forge, agent: Agent, vault: str, subject: str,
                    payload: dict[str, Any]) -> None:
    how = agent.run.dispatch
    org = vault.split("/")[0].lower()  # the vault's org: the office the run belongs to
    # the org as the operator's entries apply to it now (its command, the hosts its URL may
    # reach): one set for its login alone is for the account the login was bound to, not
    # whoever took the login since (Services.behalf); asked once, not at every attempt
    behalf = await services.behalf(org)
    if how == OPERATOR_COMMAND:
        # another account's run is refused as one with none set, and the operator is told
        # what to write
        granted = services.settings.agent_commands.command_for(behalf, agent.slug)
        if granted is None:
            await _refused(services, agent, subject, payload, org, (
                f"no command is set for {org}'s agent {agent.slug}: `dispatch: command` runs "
                f"the program the operator names for it in {COMMANDS_SETTING}"))
            return
        how = granted
    if isinstance(how, CommandDispatch):
        await run_command(services, agent, how, subject, payload, org)
        return
    started, last = time.monotonic(), ""
    for attempt in range(1, DISPATCH_ATTEMPTS + 1):
        if attempt > 1:
            await asyncio.sleep(0.5 * 2 ** (attempt - 1))
        try:
            if how == "repository_dispatch":
                await forge.dispatch(vault, "vaultmail.run", fit_client_payload(payload))
            else:
                # signed as delivery run-<n>: a runner drops a replay, or a retry it took
                await post_signed(await services.keyring.ready_for(org), how, payload,
                                  outbound=services.settings.outbound, office=behalf,
                                  event="run",
                                  delivery=f"run-{payload['run']}")
            return
        except OutboundRefused as exc:  # nothing was sent, and no retry would send it
            await _refused(services, agent, subject, payload, org,
                           f"run.dispatch: {exc}", url=how)
            return
        except OutcomeUnknown as exc:
            # the forge may have taken it (an answer lost, a 5xx after the write): a
            # repository_dispatch has no id and GitHub no idempotency key, nor any way to look
            # for the event, so a second try could start a second run of the same mail. A
            # POST is tried again (its runner drops a delivery it took); this is not. The run
            # stays open, as one whose end the app never learns (RUN_HELD_OPEN)
            await _unknown(services, agent, subject, payload, org, attempt, started, exc)
            return
        except Exception as exc:  # network or forge failure: retry with backoff
            last = str(exc) or type(exc).__name__
            log.warning("run dispatch failed (attempt %d): %r", attempt, exc,
                        extra={"agent": agent.slug, "subject": subject})
    # the run's end, as a refusal's: left `queued`, nothing told the office it never went
    await _refused(services, agent, subject, payload, org,
                   f"run.dispatch: gave up after {DISPATCH_ATTEMPTS} tries: {last}",
                   url=None if how == "repository_dispatch" else how, refused=False,
                   extra={"tries": DISPATCH_ATTEMPTS,
                          "seconds": round(time.monotonic() - started, 3)})


async def _unknown(services: Services, agent: Agent, subject: str, payload: dict[str, Any],
                   org: str, tries: int, started: float, exc: Exception) -> None:
    """A repository_dispatch that may or may not have landed: ledgered as
    `run.dispatch_unknown`, the run left `queued` (it may be running)."""
    data = {"agent": agent.principal, "kind": payload["kind"], "run": int(payload["run"]),
            "tries": tries, "seconds": round(time.monotonic() - started, 3),
            "error": f"run.dispatch: {exc}"}
    for attempt in range(1, FINISH_TRIES + 1):
        try:
            await ledger.record(services.store, "run.dispatch_unknown", "office", subject, data,
                                org=org)
            break
        except Exception:
            if attempt == FINISH_TRIES:
                raise
            await asyncio.sleep(0.2 * attempt)
    log.warning("run dispatch outcome unknown; not tried again",
                extra={"agent": agent.slug, "subject": subject, "error": data["error"]})


async def _refused(services: Services, agent: Agent, subject: str, payload: dict[str, Any],
                   org: str, reason: str, *, url: str | None = None, refused: bool = True,
                   extra: dict[str, Any] | None = None) -> None:
    """A run the app would not dispatch (`refused`), or could not (every try failed): `failed`,
    ledgered as `run.finished` with the reason (its `error`), so the office sees it where it
    sees every run end."""
    run = int(payload["run"])
    data: dict[str, Any] = {"agent": agent.principal, "kind": payload["kind"], "run": run,
                            "exit": None, "timed_out": False, "seconds": 0.0,
                            **({"refused": True} if refused else {}), "error": reason,
                            **(extra or {})}
    if url is not None:
        data["url"] = url
    await _record_finished(services, run, "failed", subject, data, org)
    log.warning("run dispatch refused" if refused else "run dispatch gave up",
                extra={"agent": agent.slug, "subject": subject, "error": reason})


FINISH_TRIES = 3  # a run's end is recorded by nobody else: a write that lost a lock race retries


async def _record_finished(services: Services, run: int, state: str, subject: str,
                           data: dict[str, Any], org: str) -> None:
    """The run's end, ledgered as `run.finished`. Nothing retries a run, so its end is tried
    again here should the write fail (a lock wait timed out, a deadlock the database broke)."""
    for attempt in range(1, FINISH_TRIES + 1):
        try:
            async with services.store.transaction(ledger.key(org)) as db:
                await mails.finish_run(db, run, state, org=org)
                await ledger.append(db, "run.finished", "office", subject, data, org=org)
            return
        except Exception:
            if attempt == FINISH_TRIES:
                raise
            log.warning("could not record a run's end; trying again", exc_info=True,
                        extra={"run": run, "subject": subject})
            await asyncio.sleep(0.2 * attempt)


# -- a local command per run -------------------------------------------------------------------

def app_url(services: Services) -> str:
    """Where a command on this machine reaches the app's tools."""
    host = services.settings.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{services.settings.port}"


def command_env(services: Services, agent: Agent, token: str, run: int, workdir: str,
                argv: list[str]) -> dict[str, str]:
    """A command's whole environment: PASSED_ENV of the app's, TMPDIR its own directory, the
    run's VAULTMAIL_APP_URL, VAULTMAIL_TOKEN, VAULTMAIL_AGENT and VAULTMAIL_RUN, and for a
    `{python}` command PYTHONPATH, so it imports the `bot` the app runs from its own cwd."""
    env = {k: v for k, v in os.environ.items()
           if k in PASSED_ENV or k.startswith(PASSED_ENV_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    env.update(TMPDIR=workdir, VAULTMAIL_APP_URL=app_url(services), VAULTMAIL_TOKEN=token,
               VAULTMAIL_AGENT=agent.principal, VAULTMAIL_RUN=str(run))
    if argv[0] == sys.executable:
        env["PYTHONPATH"] = _SOURCE_ROOT
    return env


async def _tail(stream: asyncio.StreamReader | None) -> str:
    """The end of what a stream says, at most OUTPUT_KEPT characters."""
    if stream is None:
        return ""
    kept = bytearray()
    while chunk := await stream.read(65_536):
        kept += chunk
        if len(kept) > 8 * OUTPUT_KEPT:
            del kept[: len(kept) - 4 * OUTPUT_KEPT]
    text = kept.decode("utf-8", "replace")
    return text if len(text) <= OUTPUT_KEPT else "…" + text[-(OUTPUT_KEPT - 1):]


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: children go with it


async def run_command(services: Services, agent: Agent, how: CommandDispatch, subject: str,
                      payload: dict[str, Any], org: str) -> None:
    """Run the agent's command with the run as JSON on stdin; one run of an agent at a time.
    Never retried (a second run could act twice): the work stays in the agent's inbox."""
    run = int(payload["run"])
    async with services.lock_for(f"run:{org}:{agent.slug}"):
        # it acts for the run's time and a margin, whatever becomes of its revocation; it
        # names what woke the run, so what the agent mails from it counts from there: a mail
        # run's mail (the loop guard climbs), a chat run's chat (a person's: from 0)
        woke = payload.get("mail") or f"chat:{payload.get('chat')}"
        token = await api_tokens.create_token(services.store, agent.principal, org,
                                              lasts=how.timeout + RUN_TOKEN_MARGIN,
                                              woken_by=woke)
        argv = [sys.executable if i == 0 and word == PYTHON else word
                for i, word in enumerate(how.command)]
        started = time.monotonic()
        data: dict[str, Any] = {"agent": agent.principal, "kind": payload["kind"], "run": run,
                                "command": argv, "exit": None, "timed_out": False}
        # a directory of its own, never the app's data directory, gone when the run ends
        workdir = tempfile.TemporaryDirectory(prefix=f"vaultmail-run-{agent.slug}-",
                                              ignore_cleanup_errors=True)
        try:
            data.update(await _execute(
                argv, how.timeout, command_env(services, agent, token, run, workdir.name, argv),
                json.dumps(payload).encode(), workdir.name))
        except OSError as exc:  # the program is missing or cannot run
            data["error"] = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        finally:
            workdir.cleanup()
            await asyncio.shield(api_tokens.revoke_token_value(services.store, token))
        data["seconds"] = round(time.monotonic() - started, 3)
        ok = data["exit"] == 0 and not data["timed_out"]
        await _record_finished(services, run, "done" if ok else "failed", subject, data, org)
        if not ok:
            log.warning("run command failed", extra={
                "agent": agent.slug, "subject": subject, "exit": data["exit"],
                "timed_out": data["timed_out"], "error": data.get("error")})


def _inherit_nothing() -> None:
    """Mark every descriptor above stdin, stdout and stderr close-on-exec, so an agent's command
    gets its own three pipes and nothing else of this process. Python opens its own
    descriptors that way already, but not those it was started with (a supervisor's socket,
    a launcher's pipe), and uvloop, which runs `serve`, ignores subprocess's close_fds."""
    try:
        held = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number a descriptor may have
        held = list(range(3, os.sysconf("SC_OPEN_MAX")))
    for fd in held:
        if fd > 2:
            with contextlib.suppress(OSError):  # (closed meanwhile: the listing's own)
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)


async def _execute(argv: list[str], timeout: float, env: dict[str, str],
                   stdin: bytes, cwd: str) -> dict[str, Any]:
    _inherit_nothing()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
    out = asyncio.create_task(_tail(proc.stdout))
    err = asyncio.create_task(_tail(proc.stderr))
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            assert proc.stdin is not None
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # it did not read its input: its business
            finally:
                proc.stdin.close()
            code = await proc.wait()
    except TimeoutError:
        timed_out = True
        _kill(proc)
        code = await proc.wait()
    except asyncio.CancelledError:  # shutting down
        _kill(proc)
        await proc.wait()
        out.cancel()
        err.cancel()
        raise
    # a child that kept the pipes open is given a moment, then left
    done, pending = await asyncio.wait({out, err}, timeout=5)
    for task in pending:
        task.cancel()
    return {"exit": code, "timed_out": timed_out,
            "stdout": out.result() if out in done else "",
            "stderr": err.result() if err in done else ""}
