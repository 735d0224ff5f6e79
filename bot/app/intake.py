"""Webhook intake: verify, dedupe by delivery id, persist, answer at once.

Nothing is stored for a delivery whose signature does not verify. The worker does the rest.

Before the signature is checked, anyone can send: the body's HMAC is computed as it arrives,
a missing or malformed signature is refused before any of it is read, a Content-Length over
the limit before any of it is read, a body not sent whole within `webhook_read_seconds` is
answered 408 and its connection closed, and the process holds at most UNVERIFIED_LIMIT bytes
of bodies not verified yet, all connections together (past it: 503, and the forge's failed
delivery is asked for again by the reconciler).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from gidgethub import sansio

from bot import jsontext, metrics
from bot.app.bodies import (
    WEBHOOK_BODY_LIMIT,
    MiB,
    json_response,
    loads_json,
    lone_surrogate_at,
    may_hold_surrogates,
    over_limit,
    replace_surrogates,
    size_text,
    too_large,
)
from bot.app.gitea_orgs import LOOK_AGAIN_AFTER
from bot.app.hook_generations import AHEAD, grace_text
from bot.app.services import SERVICES_KEY, Services
from bot.errors import PayloadTooLarge, VaultmailError, retry_headers
from bot.forge import gitea_events as gitea
from bot.mail.signing import name_now
from bot.names import RULE, is_name
from bot.office.source import CONFIG_REPO
from bot.store.hook_secrets import Generation
from bot.store.queue import (
    installation_of,
    issue_key,
    office_of,
    office_of_key,
    payload_org,
)

log = logging.getLogger("vaultmail.intake")

WHAT = "the webhook body"
_HEX_MAC = re.compile(r"[0-9a-f]{64}")


def _github_mac(header: str | None) -> str | None:
    """The hex HMAC-SHA256 an `X-Hub-Signature-256` claims (`sha256=<hex>`), or None."""
    if not header or not header.startswith("sha256="):
        return None
    claimed = header.removeprefix("sha256=")
    return claimed if _HEX_MAC.fullmatch(claimed) else None


def _gitea_mac(header: str | None) -> str | None:
    """The hex HMAC-SHA256 an `X-Gitea-Signature` claims (bare hex, any case), or None."""
    claimed = (header or "").strip().lower()
    return claimed if _HEX_MAC.fullmatch(claimed) else None


def org_webhook_secret(secret: str, org: str, org_id: int | None, generation: int = 0) -> str:
    """The secret of `org`'s own webhook (Gitea: POST /webhook/<org>), made from the operator's
    (GITEA_WEBHOOK_SECRET), the org's id on the forge and its generation (bot.store.hook_secrets):
    an org's admins set theirs and learn nothing that signs another org's deliveries, their own
    org's once it is rotated, or those of an org made again under its name once it is deleted
    (`vaultmail gitea-hook ORG [--rotate]` prints it). `org_id` None: the secret made from the
    name alone, as before ids (generation 0 the one before rotation existed; a later one names
    its number in the first line, so no org's name and number give another's)."""
    if org_id is None:
        first = "vaultmail org webhook" + (f" {generation}" if generation else "")
    else:  # (a first line no name-made secret has)
        first = f"vaultmail org webhook {generation} for org {org_id}"
    message = f"{first}\n{org.lower()}"
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def org_secrets(master: str, org: str, known: Generation, *numbers: int) -> list[str]:
    """`org`'s secrets of the generations `numbers` (those below 0 left out), made for the org
    `known` says holds its name now; none while the app has not seen the org (no id)."""
    if known.org_id is None:
        return []
    made_for = None if known.by_name else known.org_id
    return [org_webhook_secret(master, org, made_for, n) for n in numbers if n >= 0]


class SignedBody:
    """A webhook body as it arrives: its HMAC-SHA256 under each secret it may be signed with
    computed chunk by chunk, its size held to `limit` (sans-I/O: `receive_webhook` feeds it)."""

    def __init__(self, *secrets: str, limit: int = WEBHOOK_BODY_LIMIT) -> None:
        self._macs = [hmac.new(s.encode(), digestmod=hashlib.sha256) for s in secrets]
        self._chunks: list[bytes] = []
        self.size, self.limit = 0, limit

    @classmethod
    def whole(cls, body: bytes, *secrets: str) -> SignedBody:
        signed = cls(*secrets, limit=len(body))
        signed.add(body)
        return signed

    def add(self, chunk: bytes) -> None:
        """Take the next chunk; PayloadTooLarge (413) once the body passes the limit."""
        if self.size + len(chunk) > self.limit:
            raise over_limit(WHAT, self.limit)
        for mac in self._macs:
            mac.update(chunk)
        self._chunks.append(chunk)
        self.size += len(chunk)

    def signed_with(self, claimed: str | None) -> int | None:
        """Which secret's HMAC `claimed` (hex) is (its place), compared in constant time."""
        if claimed is None:
            return None
        return next((n for n, mac in enumerate(self._macs)
                     if hmac.compare_digest(mac.hexdigest(), claimed)), None)

    def matches(self, claimed: str | None) -> bool:
        return self.signed_with(claimed) is not None

    def body(self) -> bytes:
        return b"".join(self._chunks)


def signature_valid(body: bytes, header: str | None, secret: str) -> bool:
    """Check `X-Hub-Signature-256` (sha256=<hex HMAC of the raw body>) in constant time."""
    return SignedBody.whole(body, secret).matches(_github_mac(header))


class Unverified:
    """Bytes of webhook bodies held before their signature could be checked, counted across
    every connection of the process: what a sender without the secret can make it hold."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


# room for two of the largest bodies GitHub sends at once, and every usual one beside them
UNVERIFIED_LIMIT = 64 * MiB
UNVERIFIED = Unverified(UNVERIFIED_LIMIT)


@dataclass(frozen=True)
class Dialect:
    """How one forge's deliveries are read: their headers, signature and payload shape."""

    names: tuple[str, str, str]  # delivery id, event and signature headers, for errors
    delivery_of: Callable[[Mapping[str, str]], tuple[str, str, str]]
    claimed_mac: Callable[[str | None], str | None]  # the signature header's hex HMAC
    to_github: Callable[[str, dict[str, Any], str], dict[str, Any]] | None = None


def _github_delivery(headers: Mapping[str, str]) -> tuple[str, str, str]:
    return (headers.get("X-GitHub-Delivery", ""), headers.get("X-GitHub-Event", ""),
            headers.get("X-Hub-Signature-256", ""))


GITHUB = Dialect(("X-GitHub-Delivery", "X-GitHub-Event", "X-Hub-Signature-256"),
                 _github_delivery, _github_mac)
GITEA = Dialect(("X-Gitea-Delivery", "X-Gitea-Event", "X-Gitea-Signature"),
                gitea.delivery_of, _gitea_mac, gitea.to_github)


def _error(status: int, code: str, message: str) -> web.Response:
    return json_response({"error": {"code": code, "message": message}}, status=status)


async def _answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send `response`, then close the connection rather than read what is left of the body
    (aiohttp would otherwise linger up to 10 s reading it: a body refused for its size, or
    for the time it took, would hold its connection that long)."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # the answer is flushed first, then the socket closed
    return response


async def _receive(request: web.Request, signed: SignedBody, read_seconds: float,
                   guid: str) -> web.Response | None:
    """Read the body into `signed`, within the time and memory it may take; None once all of
    it is there, else the refusal to answer."""
    declared = request.content_length
    if declared is not None and declared > signed.limit:  # refused before a byte is read
        exc = too_large(WHAT, f"{declared:,} bytes", signed.limit)
        log.warning("webhook refused: too large", extra={"reason": exc.message})
        return await _answer_and_close(request, _error(exc.status, exc.code, exc.message))
    held = 0

    def take(chunk: bytes) -> bool:
        nonlocal held
        if not UNVERIFIED.take(len(chunk)):
            return False
        held += len(chunk)
        signed.add(chunk)
        return True

    try:
        if request.content.is_eof():  # all of it came with the headers (the usual webhook):
            taken = take(request.content.read_nowait())  # nothing to wait for, or to time
        else:
            taken = True
            async with asyncio.timeout(read_seconds):
                async for chunk in request.content.iter_any():
                    if not (taken := take(chunk)):
                        break
        if not taken:
            log.warning("webhook refused: too many unverified bytes held",
                        extra={"delivery_id": guid, "held": UNVERIFIED.held})
            response = _error(503, "busy", (
                f"the app holds {size_text(UNVERIFIED.limit)} of webhook bodies not "
                "verified yet, the most it takes at once; send it again shortly"))
            response.headers.update(retry_headers(503))
            return await _answer_and_close(request, response)
    except PayloadTooLarge as exc:
        log.warning("webhook refused: too large", extra={"reason": exc.message})
        return await _answer_and_close(request, _error(exc.status, exc.code, exc.message))
    except TimeoutError:
        log.warning("webhook refused: body not sent in time", extra={
            "delivery_id": guid, "received": signed.size, "read_seconds": read_seconds})
        return await _answer_and_close(request, _error(408, "body_timeout", (
            f"{WHAT} did not arrive whole within {read_seconds:g} s ({signed.size:,} bytes "
            "came); send it in one go")))
    finally:
        UNVERIFIED.give(held)
    return None


# events of GitHub Apps alone, which no Gitea or Forgejo webhook sends
GITHUB_APP_ONLY = frozenset({"installation", "installation_repositories",
                             "installation_target", "github_app_authorization"})


async def receive_webhook(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    settings = services.settings
    dialect = GITEA if settings.dialect == "gitea" else GITHUB
    guid, event, signature = dialect.delivery_of(request.headers)
    delivery_header, event_header, signature_header = dialect.names
    claimed = dialect.claimed_mac(signature)
    org = request.match_info.get("org")  # an org's own webhook (Gitea), signed with its secret
    if org is not None and dialect is not GITEA:
        return await _answer_and_close(request, _error(
            404, "not_found", "a GitHub App's deliveries go to /webhook"))
    if org is not None and not is_name(org):  # (its secret is made from the name)
        return await _answer_and_close(request, _error(
            404, "not_an_org", f"/webhook/<org> takes the name of a forge org ({RULE}), and "
            "this path names none: run `vaultmail gitea-hook ORG` for ORG's webhook URL"))
    generation = None if org is None else await services.hook_generations.of(org)
    office = org  # whose webhook it is: the org's office, under its name now
    if org is not None and generation is not None and generation.org_id is None and \
            (now := renamed_to(services, org)) is not None:
        # no org holds the name now, and its org renamed itself: Gitea posts to the URL the
        # hook had (a redelivery, a delivery queued before, a hook not updated yet), signed
        # with the secret made for that name and the org's id, which only its admins hold
        office, generation = now, await services.hook_generations.of(now)
    signed = SignedBody(*_secrets(settings.webhook_secret, org, generation))
    # no signature to check: nothing of the body is worth reading
    refusal = (None if claimed is None else
               await _receive(request, signed, settings.webhook_read_seconds, guid))
    if refusal is not None:
        return refusal
    signed_with = signed.signed_with(claimed)
    if signed_with is None and org is not None and generation is not None and \
            claimed is not None and SignedBody.whole(signed.body(), *org_secrets(
                settings.webhook_secret, org, generation,
                *range(generation.number + 1, generation.number + AHEAD + 1))
            ).signed_with(claimed) is not None:
        # signed with a secret the org is given at its next rotation: one not read here yet
        generation = await services.hook_generations.recheck(office or org)
        signed_with = SignedBody.whole(signed.body(), *_secrets(
            settings.webhook_secret, org, generation)).signed_with(claimed)
    if signed_with is None:
        log.warning("webhook refused: bad or missing signature",
                    extra={"delivery_id": guid, "event": event})
        # (without a signature its body was never read: answered and closed, not lingered on)
        return await _answer_and_close(request, _error(
            401, "bad_signature",
            f"{signature_header} is missing or does not match the webhook secret" + (
                "" if org is None else
                f" of {org}: {org}'s admins ask the operator for it (`vaultmail gitea-hook "
                f"{org}`) and set it on {org}'s webhook. It is made for the org that holds "
                "the name on the forge now: one given to an org deleted since, whose name "
                "another org took, signs nothing")))
    if signed_with == 1 and org is not None and generation is not None and \
            (refused := _rotated_out(org, generation, settings.webhook_grace_seconds,
                                     services.hook_generations.since_rotation(generation),
                                     signature_header, guid, event)) is not None:
        return await _answer_and_close(request, refused)
    body = signed.body()
    if not guid or not event:
        return _error(400, "missing_headers", f"{delivery_header} and {event_header} are required")
    if dialect is GITEA and event in GITHUB_APP_ONLY:
        # Gitea has no App installations: the app makes its own at start; one over a webhook
        # is an org's admins' (who sign their org's), and would act on every org's vaults
        return _error(403, "not_from_gitea", f"Gitea sends no {event} events: the app "
                      "finds its organisations itself, at start and every few minutes")
    glanced = jsontext.glance(body)
    if dialect.to_github is None and isinstance(glanced, dict) and \
            (why := _ignored(services, guid, event, glanced)) is not None:
        # (told apart at a glance, before the checks of what is kept: two webhooks of three)
        return await _answer_ignored(services, guid, guid, event, glanced, why)
    try:
        payload = loads_json(body, WHAT, glanced)
    except VaultmailError as exc:  # nested too deep
        return _error(exc.status, exc.code, exc.message)
    except ValueError:
        return _error(400, "bad_json", "the webhook body is not JSON")
    if not isinstance(payload, dict):
        return _error(400, "bad_json", "the webhook body must be a JSON object")
    if may_hold_surrogates(body) and lone_surrogate_at(payload) is not None:
        payload = replace_surrogates(payload)  # signed: kept, as text that can be stored
        body = json.dumps(payload).encode()
    if dialect.to_github is not None:  # the handlers read GitHub's shapes only
        try:
            payload = dialect.to_github(event, payload, services.bot_login)
            body = gitea.encode(payload)
        except Exception:  # malformed: queued as it came, it fails alone and dead-letters
            log.warning("webhook payload not in the forge's shape; queued as it came",
                        extra={"delivery_id": guid, "event": event}, exc_info=True)
    if org is not None and (about := _org_about(payload)) not in (org.lower(), office):
        # signed with one org's secret: about that org only, never another's repositories
        log.warning("webhook refused: about another org than its webhook's",
                    extra={"delivery_id": guid, "event": event, "org": org})
        return _error(403, "wrong_org", f"this is {org}'s webhook, and the delivery is about "
                      f"{about or 'no one org'}: each org's webhook posts to /webhook/<its "
                      "org>, about that org alone")
    # an org's own webhook names its deliveries, and its admins, who sign them, may choose the
    # name: recorded as that org's, no other org's delivery can make one a redelivery
    # (under the office's name now, as a rename moves the ids recorded before: bot.store.offices)
    recorded_as = guid if office is None else f"{office.lower()}/{guid}"
    # (before an idle event's id is recorded: the system webhook sends every org's pushes)
    if dialect is GITEA and (outsider := office_of(payload, issue_key(payload))) is not None \
            and await _no_office_after_a_look(services, outsider):
        return _no_office(services, guid, event, outsider, own_webhook=org is not None)
    if (why := _ignored(services, guid, event, payload)) is not None:
        return await _answer_ignored(services, guid, recorded_as, event, payload, why)
    # signed, so the forge sent it: queued even when malformed (it then fails in the worker,
    # counts its attempts and ends in dead letters, and takes no other delivery with it)
    queued = await services.store.enqueue_delivery(recorded_as, event, payload, body,
                                                   key=issue_now(services, payload))
    installation_id = installation_of(payload)
    log.info("webhook accepted" if queued else "webhook redelivered: already recorded",
             extra={"delivery_id": guid, "installation_id": installation_id, "event": event,
                    "action": payload.get("action")})
    metrics.deliveries(event, "received" if queued else "redelivered").inc()
    if queued:
        services.wake_worker()
    return json_response({"delivery": guid, "queued": queued}, status=202)


def renamed_to(services: Services, login: str) -> str | None:
    """The office installed now whose org was once called `login` (it renamed itself), when
    one alone was: what `login`'s webhook, as its URL still names it, now posts for."""
    offices = services.named_before(login, services.installations)
    return offices[0] if len(offices) == 1 else None


def issue_now(services: Services, payload: dict[str, Any]) -> str | None:
    """The issue a delivery is about (`issue_key`), under the names now: one sent before its
    org or its vault was renamed (queued at the forge then, or redelivered as it was sent)
    names them as they were called, and must run in order with the issue's deliveries under
    the new names (the handlers read it there too: handlers.common.repo_now). An old name is
    followed within the office whose name before it is (its installation's, when the org's
    login is no office's now); one another repository took since is that one's."""
    key = issue_key(payload)
    if key is None:
        return None
    base, _, number = key.rpartition("#")
    owner = office_of_key(key)
    installed = services.installations
    offices = [owner] if owner in installed else [
        org for org, inst in installed.items() if inst == installation_of(payload)]
    for org in offices:
        now = name_now(services.keyring.renamed(org), base)
        if now != base.lower():
            return f"{now}#{number}"
    return key


def _secrets(master: str, org: str | None, generation: Generation | None) -> list[str]:
    """What a delivery may be signed with: at /webhook the operator's secret; at an org's
    own webhook its generation's and, once rotated, the one before (`_rotated_out`)."""
    if org is None or generation is None:
        return [master]
    return org_secrets(master, org, generation, generation.number, generation.number - 1)


def _rotated_out(org: str, generation: Generation, grace: float, since: float, header: str,
                 guid: str, event: str) -> web.Response | None:
    """A delivery signed with `org`'s secret from before its rotation, `since` seconds ago
    (the database's clock: rotated_at is by it): None within the grace (its admins are
    setting the new one), else the refusal, saying what to do."""
    rotated_at = generation.rotated_at or 0.0
    extra = {"delivery_id": guid, "event": event, "org": org,
             "generation": generation.number - 1}
    if since < grace:
        log.info("webhook signed with the org's secret from before its rotation, accepted "
                 "within the grace", extra=extra)
        return None
    log.warning("webhook refused: signed with the org's secret from before its rotation",
                extra=extra)
    return _error(401, "webhook_secret_rotated", (
        f"{org}'s webhook secret was rotated at {utc_text(rotated_at)}: {header} is made with the "
        f"one before, accepted for {grace_text(grace)} after the rotation only; run "
        f"`vaultmail gitea-hook {org}` for the current one and set it on {org}'s webhook"))


def utc_text(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _org_about(payload: dict[str, Any]) -> str | None:
    """The one org an org's own webhook delivery is about: the org its fields name, and the
    owner of the issue it is queued under (a `sub_issue_repo` names another repository: acme's
    admins, who sign acme's deliveries, must not queue one in globex's issue's order, or count
    it against globex's share of the worker)."""
    org = payload_org(payload)
    key = issue_key(payload)
    return org if key is None or office_of_key(key) == org else None


def _ignored(services: Services, guid: str, event: str, payload: dict[str, Any]
             ) -> str | None:
    """Why no handler would act on the delivery, or None. "own": the app's own write coming
    back (each PATCH of a mail sends `edited` and `labeled`) that no handler of its own
    reads; "idle": an event no handler takes (a ping, a star, an issue pinned), or a push or
    pull request to a repository other than the org's `.github`, the one whose pushes and
    pull requests the app reads (a busy org sends one for every push to any repository)."""
    own = services.is_own_event(payload)
    router = services.own_router if own else services.router
    try:
        handled = router.fetch(sansio.Event(payload, event=event, delivery_id=guid))
    except TypeError:  # an action no one could have sent (a list, an object): kept, and it
        return None  # fails in the worker alone, as a malformed delivery does
    if handled and not _elsewhere(event, payload):
        return None
    return "own" if own else "idle"


async def _answer_ignored(services: Services, guid: str, recorded_as: str, event: str,
                          payload: dict[str, Any], why: str) -> web.Response:
    """202, nothing queued: no worker turn. The app's own echo is not even recorded (two
    webhooks of three); another's id is (one commit for many, with intake's others), so that
    the reconciler, finding it among the forge's failed deliveries, knows it came."""
    metrics.deliveries(event, "ignored").inc()
    if why == "idle":
        await services.store.enqueue_delivery(recorded_as, event, payload, b"", run=False)
    log.debug("webhook ignored: caused by the app itself" if why == "own" else
              "webhook ignored: no handler acts on it",
              extra={"delivery_id": guid, "event": event, "action": payload.get("action")})
    return json_response({"delivery": guid, "queued": False, "ignored": True}, status=202)


async def _no_office_after_a_look(services: Services, org: str) -> bool:
    """Whether `org` has no office here, even after a look at the bot's orgs (when none was
    made lately): the bot may have been added to it since the last."""
    if not await services.no_office(org):
        return False
    look = services.look_for_orgs
    return look is None or not await look() or await services.no_office(org)


def _no_office(services: Services, guid: str, event: str, org: str, *,
               own_webhook: bool) -> web.Response:
    """The answer to a delivery about `org`, which has no office here (Gitea: the bot is not
    in it, or left it): nothing queued or recorded, and no forge read. The system webhook
    sends every org's comments, so there it is accepted and ignored (202); an org's own
    webhook, still posting, is told (503, Retry-After: when the app looks at the bot's orgs
    again, which makes an org the bot was added to since an office)."""
    metrics.deliveries(event, "ignored").inc()
    log.debug("webhook ignored: no office for its org",
              extra={"delivery_id": guid, "event": event, "org": org})
    every = services.installs_looked_for_every
    message = (f"no office for {org} here: the bot is not a member of {org}, so the delivery "
               "is ignored (the app looks at the bot's organisations "
               + (f"every {every:g} s, and at a delivery about an org it does not know at "
                  f"most every {LOOK_AGAIN_AFTER:g} s" if every else "at start")
               + "; an org it was added to since is an office from its next look)")
    if not own_webhook:
        return json_response({"delivery": guid, "queued": False, "ignored": True,
                      "code": "no_office", "message": message}, status=202)
    response = _error(503, "no_office", message + f"; {org}'s admins add the bot again, or "
                      "remove this webhook")
    response.headers.update(retry_headers(503, LOOK_AGAIN_AFTER if every else None))
    return response


def _elsewhere(event: str, payload: dict[str, Any]) -> bool:
    """A push or pull request to a repository other than an org's `.github`."""
    repo = payload.get("repository")
    return event in ("push", "pull_request") and isinstance(repo, dict) and \
        isinstance(repo.get("name"), str) and repo["name"].lower() != CONFIG_REPO


