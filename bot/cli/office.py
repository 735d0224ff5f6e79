"""Shell commands that act on an office: reindex, verify, keys, tokens, ledger, and `office
check`, which validates an office file here as the app does when it is pushed."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from bot.cli.output import say, say_json
from bot.cli.shell import (
    REFUSED,
    ShellFailure,
    data_path,
    done,
    existing_data_dir,
    fail,
    forge_unreachable,
    wants_json,
)
from bot.store.where import index_of

if TYPE_CHECKING:
    import aiohttp

    from bot.app.services import Services
    from bot.mail.signing import Keyring, Keyrings, Verifier

# (each command loads what it needs: the others start without the app's modules, and those
# that make no HTTP request without aiohttp's client)

_REF = re.compile(r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#([1-9][0-9]*)$")
_PRINCIPAL = re.compile(r"^(human:[^@\s]+@[^@\s]+|agent:[a-z0-9-]+|office)$")


@asynccontextmanager
async def app_services(data: str | None) -> AsyncIterator[Services]:
    import aiohttp

    from bot.app.build import build_services
    from bot.app.settings import Settings

    if data is not None:  # a mistyped --data is refused, not replaced by the environment's
        existing_data_dir(data, needs="")
    settings = Settings.for_cli(data)
    async with aiohttp.ClientSession() as session:
        try:
            services = await build_services(settings, session)
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = (exc.os_error.strerror if isinstance(exc, aiohttp.ClientConnectorError)
                   else type(exc).__name__)
            raise forge_unreachable(settings.api_url, why) from exc
        try:
            yield services
        finally:
            await services.store.close()


def data_dir(args: argparse.Namespace) -> Path:
    """The office's data directory, which must hold its index (never made anew here)."""
    return existing_data_dir(args.data)


async def cmd_reindex(args: argparse.Namespace) -> int:
    from bot.email.keys import comment_key
    from bot.mail.reindex import reindex

    async with app_services(args.data) as services:
        orgs = [args.org.lower()] if args.org else sorted(services.installations)
        if not orgs:
            raise ShellFailure("not_installed", "the App is not installed on any "
                               "organisation: install it, then reindex")
        for org in orgs:  # each installation with its own token, office and ETag cache
            if services.installation_of(org) is None:
                raise ShellFailure("not_installed", f"the App is not installed on {org}")
            forge = services.forge_for_org(org)
            name = "etag-cache.json" if len(services.installations) == 1 else \
                f"etag-cache-{org}.json"
            cache = services.settings.data_dir / name
            forge.load_etag_cache(cache)
            office = await services.offices.get(forge, org)
            if office is None:
                raise ShellFailure("no_office", services.offices.why_none(org))
            report = await reindex(services.store, forge, office, services.keyring,
                                   app_login=services.bot_login, progress=True,
                                   comment_key=comment_key(services.settings.data_dir, org))
            forge.save_etag_cache(cache)
            say(f"{org}: reindexed {report.mails} mail(s) from {report.issues} issue(s) in "
                f"{report.vaults} vault(s); tampered: {', '.join(report.tampered) or 'none'}"
                + (f"; copies of a mail, not indexed: {', '.join(report.copies)}"
                   if report.copies else "")
                + (f"; {w.items} item(s), {w.comments} comment(s) and {w.questions} "
                   "question(s) added" if (w := report.work) is not None else "")
                + (f"; the app's comments edited on the forge, skipped: {', '.join(w.skipped)}"
                   if w is not None and w.skipped else "")
                # (each also in `skipped`: one old seal's text on several items, none taken)
                + (f"; of those, one old-sealed text on several items: {', '.join(w.copied)}"
                   if w is not None and w.copied else ""))
    return 0


async def _published_keys(data: str | None, keys_url: str | None, operator_token: str,
                          session: aiohttp.ClientSession) -> Verifier:
    """Every office's published keys (the app's, or `--keys-url`), else the key files in the
    data directory; the check itself requires the key to speak for the mail's office. The
    app's own published keys are told which keys were revoked by its key files, where they
    are here (run beside the app): a mail signed with one says so."""
    import aiohttp

    from bot.app.settings import SettingsError
    from bot.mail.signing import KEYS_FILE_NAME, OFFICE_KEYS_DIR, Keyrings, PublicKeys

    headers = {}
    revoked = None
    if keys_url is None and data and (Path(data) / "tokens.json").exists():
        revoked = Keyrings.in_data_dir(data).revoked
        app_url = json.loads((Path(data) / "tokens.json").read_text())["app_url"]
        keys_url = f"{app_url}/.well-known/vaultmail-keys.json"
        if operator_token:  # every office's keys are the operator's; only to the app's own URL
            headers["Authorization"] = f"Bearer {operator_token}"
    if keys_url is None:
        folder = data_dir_or_default(data)
        if not (folder / OFFICE_KEYS_DIR).is_dir() and not (folder / KEYS_FILE_NAME).exists():
            raise SettingsError(f"no published keys to check against: give --keys-url "
                                f"https://YOUR-APP/.well-known/vaultmail-keys.json, or --data "
                                f"with the app's data directory ({folder} holds no "
                                f"{OFFICE_KEYS_DIR}/ and no {KEYS_FILE_NAME})")
        return Keyrings.in_data_dir(folder)  # reads them, never makes any
    try:
        async with session.get(keys_url, headers=headers) as resp:
            resp.raise_for_status()
            return PublicKeys.from_jwks(await resp.json(), revoked=revoked)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ShellFailure("keys_unreachable", (
            f"cannot read the published keys at {keys_url} ({type(exc).__name__}): is the app "
            "running? Give --keys-url https://YOUR-APP/.well-known/vaultmail-keys.json")) from exc


def data_dir_or_default(data: str | None) -> Path:
    return data_path(data)


async def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 valid; 1 tampered or unsigned; 2 not found, or a usage or infrastructure
    problem."""
    try:
        return await _verify(args)
    except ShellFailure as exc:
        return fail(args, exc)


async def _verify(args: argparse.Namespace) -> int:
    import aiohttp

    from bot.forge.errors import NotFound
    from bot.mail.header import parse_mail_body, verify_issue
    from bot.mail.signing import kid_office
    from bot.store import mails

    m = _REF.match(args.mail)
    if not m:
        raise ShellFailure("usage", f"{args.mail!r} is not OWNER/REPO#N (e.g. "
                           "acme/scout-vault#12)")
    repo, number = m[1], int(m[2])
    async with app_services(args.data) as services, aiohttp.ClientSession() as session:
        keys = await _published_keys(args.data, args.keys_url,
                                     services.settings.operator_token, session)
        owner = repo.split("/")[0]
        if services.installation_of(owner) is None:
            raise ShellFailure("not_installed", f"the App is not installed on {owner}, so "
                               f"it cannot read {args.mail}")
        try:
            issue = await services.forge_for_org(owner).get_issue(repo, number)
        except NotFound as exc:
            raise ShellFailure("not_found", f"no issue {args.mail} on the forge (or the App "
                               "cannot see it): check OWNER/REPO#N") from exc
        # what the index knows: the mail at this issue, and where the header's mail is in the
        # repository's office (another office's mail is none of this one's to name)
        here = await mails.mail_at(services.store, repo, number)
        header, _ = parse_mail_body(issue.get("body"))
        home = await mails.get_mail(services.store, header.mail_id,
                                    org=owner) if header else None
        verdict = verify_issue(issue, repo, keys, app_login=services.bot_login,
                               expected_mail_id=here.mail_id if here else None,
                               home=home.ref if home else None)
    if verdict.valid and verdict.header is not None:
        h = verdict.header
        legacy = kid_office(h.key_id) is None  # signed before offices had keys of their own
        if wants_json(args):
            done({"status": "valid", "mail": args.mail, "mail_id": h.mail_id,
                  "office": verdict.office, "from": h.from_principal, "to": h.to_principal,
                  "sent": h.sent, "key": h.key_id, "legacy_key": legacy})
        else:
            say(f"valid: {args.mail} signed for office {verdict.office} by "
                f"{'legacy key' if legacy else 'key'} {h.key_id}, from {h.from_principal} "
                f"to {h.to_principal}, sent {h.sent}")
        return 0
    if wants_json(args):
        say_json(ShellFailure(verdict.status.value, verdict.reason).as_json())
    else:
        say(f"{verdict.status.value}: {args.mail}: {verdict.reason}")
    return REFUSED


async def cmd_keys_rotate(args: argparse.Namespace) -> int:
    """A new active key for one office (`--org`, or the one office that has keys), or for the
    legacy keys (`--legacy`: the way to stop using a leaked legacy key that is active)."""
    from bot.mail.signing import KeyringError, Keyrings, office_name

    data = existing_data_dir(args.data, needs="")
    rings = Keyrings.in_data_dir(data)
    if args.legacy:
        legacy = _legacy_keys(rings, data)
        kid = legacy.rotate()
        say(f"legacy keys: new signing key {kid} is active (it signs only records of no "
            f"office, from before offices had keys); kept for verifying: "
            f"{', '.join(k for k in legacy.key_ids if k != kid)}")
        return 0
    offices = rings.offices()
    if args.org is not None:
        try:
            office = office_name(args.org)
        except KeyringError as exc:
            raise ShellFailure("usage", f"--org: {exc}") from exc
        if office not in offices:  # a mistyped org gets no keys of its own
            raise ShellFailure("no_keys", (
                f"office {office} has no signing keys in {data} (an office's keys are made "
                f"when it first signs); offices with keys: {', '.join(offices) or 'none'}"))
    elif len(offices) == 1:
        office = offices[0]
    else:
        raise ShellFailure("usage", (
            f"several offices sign here ({', '.join(offices)}): name one with --org ORG"
            if offices else f"no office has signing keys in {data} yet (an office's keys are "
            "made when it first signs; the legacy signing-keys.json signs nothing any more)"))
    ring = rings.for_office(office)
    kid = ring.rotate()
    say(f"office {office}: new signing key {kid} is active; kept for verifying: "
        f"{', '.join(k for k in ring.key_ids if k != kid)}")
    return 0


def _legacy_keys(rings: Keyrings, data: Path) -> Keyring:
    """The legacy keyring of `data` (from before offices had keys); ShellFailure if none."""
    from bot.mail.signing import KEYS_FILE_NAME

    if rings.legacy is None:
        raise ShellFailure("no_keys", f"{data} has no legacy signing keys ({KEYS_FILE_NAME}, "
                           "from before offices had keys of their own)")
    return rings.legacy


async def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Withdraw a leaked key of one office, or a legacy key (from before offices had keys):
    no longer published, trusted or signed with, by the app and every replica (they share
    the data directory) from their next use of it."""
    from bot.mail.signing import KeyringError, Keyrings, kid_office, office_name

    data = existing_data_dir(args.data, needs="")
    rings = Keyrings.in_data_dir(data)
    named = None
    if args.org is not None:
        try:
            named = office_name(args.org)
        except KeyringError as exc:
            raise ShellFailure("usage", f"--org: {exc}") from exc
    office = kid_office(args.kid)  # a key id names its office; a legacy one none
    if office is None:
        ring, whose = _legacy_keys(rings, data), "the legacy keys'"
        where, rotate, signs = "legacy keys", "--legacy", "records of no office"
        if named is not None and ring.served is not None and named not in ring.served:
            raise ShellFailure("usage", f"legacy key {args.kid} did not sign for office "
                               f"{named} (it served {', '.join(ring.served)})")
    else:
        if named is not None and named != office:
            raise ShellFailure("usage", f"{args.kid} is a key of office {office}, not {named}")
        found = rings.existing(office)
        if found is None:
            raise ShellFailure("no_keys", f"office {office} has no signing keys in {data}")
        ring, whose = found, f"office {office}'s"
        where, rotate, signs = f"office {office}", f"--org {office}", "its mail and POSTs"
    if args.kid == ring.active_kid:  # the only key is always the active one
        raise ShellFailure("active_key", (
            f"{args.kid} is {whose} active key, which signs {signs}: make a new one first "
            f"with `vaultmail keys rotate {rotate} --data {data}`, then revoke {args.kid}"))
    try:
        ring.revoke(args.kid)
    except KeyringError as exc:
        raise ShellFailure("refused", f"{where}: {exc}") from exc
    kept = [k for k in ring.key_ids if k != ring.active_kid]
    say(f"{where}: key {args.kid} revoked: no longer published or trusted, by the "
        f"app and every replica from their next use of it; mail it signed no longer "
        f"verifies (when next checked: edited, read or reindexed, it is flagged tampered). "
        f"Signing: {ring.active_kid}; kept for verifying: {', '.join(kept) or 'none'}")
    return 0


async def cmd_token_create(args: argparse.Namespace) -> int:
    from bot.store import api_tokens, installations, open_store

    if not _PRINCIPAL.match(args.principal):
        return fail(args, ShellFailure("usage", f"{args.principal!r} is not human:<email>, "
                                       "agent:<slug> or office"))
    store = await open_store(index_of(data_dir(args)))
    try:
        # a token belongs to one office from its making: left to its first use, another
        # office declaring the same principal meanwhile could claim it or make it refused
        org = args.org.lower() if args.org else None
        if org is None:
            live = await installations.live_orgs(store)
            if len(live) != 1:
                return fail(args, ShellFailure("usage", (
                    f"the App is installed on several organisations here ({', '.join(live)})"
                    if live else "this index knows no organisation the App is installed on"
                    " (none yet, or a Gitea bot, which keeps no installations)")
                    + f": name the token's office, `vaultmail token create {args.principal}"
                    " --org ORG`"))
            org = live[0]
        token = await api_tokens.create_token(store, args.principal, org)
    finally:
        await store.close()
    say(f"API token for {args.principal} in {org}'s office (shown once, stored hashed):"
        f"\n{token}")
    return 0


async def cmd_token_revoke(args: argparse.Namespace) -> int:
    from bot.store import api_tokens, open_store

    store = await open_store(index_of(data_dir(args)))
    org = args.org.lower() if args.org else None
    try:
        token = await api_tokens.revoke_token(store, args.token_id, org=org)
    finally:
        await store.close()
    if token is None:
        say(f"vaultmail token revoke: no live token {args.token_id} (see `vaultmail token "
            "list`)")
        return 1
    office = f"{token.org}'s office" if token.org else "no office yet (unpinned)"
    if org is not None and token.org != org:
        say(f"vaultmail token revoke: token {args.token_id} ({token.principal}) belongs to "
            f"{office}, not {org}'s: left alive (see `vaultmail token list --org {org}`)")
        return 1
    say(f"token {args.token_id} of {token.principal} in {office} revoked: calls with it are "
        "refused from now on")
    return 0


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t is not None else "never"


async def cmd_token_list(args: argparse.Namespace) -> int:
    from bot.store import api_tokens, open_store

    store = await open_store(index_of(data_dir(args)))
    try:
        tokens = await api_tokens.list_tokens(store, args.org)
    finally:
        await store.close()
    now = time.time()
    if wants_json(args):
        done({"tokens": [{"id": t.id, "principal": t.principal, "org": t.org,
                          "created": _when(t.created_at),
                          "last_used": _when(t.last_used_at) if t.last_used_at else None,
                          "expires": _when(t.expires_at) if t.expires_at else None,
                          "expired": t.expired(now), "run": t.run,
                          "revoked": t.revoked} for t in tokens]})
        return 0
    for t in tokens:
        # acme and evil may both name agent:scout: the office tells which token is which
        run = (f"  run token, {'EXPIRED' if t.expired(now) else 'expires'} "
               f"{_when(t.expires_at)}" if t.run else "")
        say(f"{t.id:>4}  {t.principal:<32} {t.org or '(unpinned)':<16} created "
            f"{_when(t.created_at)}  last used {_when(t.last_used_at)}{run}"
            f"{'  REVOKED' if t.revoked else ''}")
    if not tokens:
        say(f"no API tokens of {args.org.lower()}'s office" if args.org else
            "no API tokens (`vaultmail token create PRINCIPAL` makes one)")
    return 0


async def cmd_ledger(args: argparse.Namespace) -> int:
    from bot.store import ledger, open_store

    store = await open_store(index_of(data_dir(args)))
    try:
        org = args.org.lower() if args.org else None
        entries = await ledger.entries(store, since=args.since, limit=args.limit, org=org)
        broken = await ledger.verify_chain(store, org)
    finally:
        await store.close()
    if wants_json(args):
        if broken is not None:
            say_json(ShellFailure("chain_broken", (
                f"ledger chain broken at entry {broken}")).as_json())
            return REFUSED
        done({"entries": [e.as_json() for e in entries], "chain": "intact"})
        return 0
    for e in entries:
        office = "" if org else f"{e.org or '(before offices)':<14} "
        say(f"{e.seq:>5}  {e.as_json()['time']}  {office}{e.event:<16} {e.actor:<28} "
            f"{e.subject}  {json.dumps(e.data, sort_keys=True)}")
    if broken is not None:
        say(f"ledger chain broken at entry {broken}")
        return REFUSED
    return 0


async def cmd_office_check(args: argparse.Namespace) -> int:
    """Validate an office file as the app validates it (a push to the org's `.github`
    repository, or the operator's `--office` file with `--operator`): the same messages, each
    with its key, line and column; exit 0 valid, 1 invalid, 2 no such file."""
    from bot.app.settings import SettingsError, outbound_setting
    from bot.office.config import OfficeConfigError, parse_office
    from bot.office.source import bound_to_org

    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        return fail(args, ShellFailure("usage", f"cannot read {path}: {why} (give the office "
                                       "file to check, e.g. vaultmail.yml of the org's .github "
                                       "repository)"))
    try:
        policy = outbound_setting(os.environ.get("VAULTMAIL_OUTBOUND_ALLOW"))
    except SettingsError as exc:
        return fail(args, ShellFailure("usage", f"VAULTMAIL_OUTBOUND_ALLOW: {exc}"))
    try:
        # its URLs checked for the org named (--org), else for the org the file says
        office = parse_office(text, str(path), repository=not args.operator,
                              url_refused=policy.url_refusal_offline, office=args.org or None)
        if args.org:
            bound_to_org(office, args.org, str(path), text)
    except OfficeConfigError as exc:
        count = f"{len(exc.errors)} error{'s' if len(exc.errors) != 1 else ''}"
        if wants_json(args):
            say_json({"ok": False, "error": {"code": "invalid_config", "message":
                                             f"{path}: {count}"}, "errors": exc.errors})
        else:
            say("\n".join(exc.errors))
            say(f"{path}: {count}; the app would refuse it and keep the last valid config",
                file=sys.stderr)
        return REFUSED
    if wants_json(args):
        done({"file": str(path), "org": office.org, "humans": len(office.humans),
              "agents": len(office.agents)})
    else:
        say(f"{path}: valid: office {office.org}, {len(office.humans)} people, "
            f"{len(office.agents)} agents")
    return 0


GITHUB_API = "https://api.github.com"
TYPE_TOKEN_ENV = "GITHUB_TOKEN"
_TYPE_LOOK = {"goal": ("green", "Why we work: the goal outcomes serve"),
              "outcome": ("blue", "What must be true when done, with its decisions"),
              "plan": ("purple", "How an outcome is reached"),
              "evidence": ("yellow", "What shows an outcome is reached")}


async def cmd_office_setup_types(args: argparse.Namespace) -> int:
    """`office setup-types`: the organisation's issue types for the four item kinds, made
    where missing (GitHub's `POST /orgs/{org}/issue-types`, which needs an owner of the org:
    a token of theirs in GITHUB_TOKEN, classic with `admin:org`, or fine-grained with the
    organisation's "Issue Types" write; the App's own installation cannot). With `--office`
    naming `waiting: field`, the org's "Waiting on" issue field too (`POST /orgs/{org}/
    issue-fields`, the same owner; fine-grained: the organisation's "Issue Fields" write)."""
    import aiohttp

    from bot.items.model import DEFAULT_TYPES, ITEM_KINDS
    from bot.office.config import OfficeConfigError, load_office

    token = os.environ.get(TYPE_TOKEN_ENV, "").strip()
    if not token:
        return fail(args, ShellFailure("usage", f"set {TYPE_TOKEN_ENV} to a token of an owner "
                                       f"of {args.org} (classic: admin:org; fine-grained: "
                                       "the organisation's Issue Types, write)"))
    names = {k: n for n, k in DEFAULT_TYPES.items()}
    waiting_field = False  # the office's `waiting: field` needs the org's "Waiting on" field
    if args.office:
        try:
            office = load_office(args.office)
        except (OSError, OfficeConfigError) as exc:
            return fail(args, ShellFailure("usage", f"{args.office}: {exc}"))
        names.update(office.item_types)
        waiting_field = office.waiting == "field"
    base = f"{args.forge.rstrip('/')}/orgs/{args.org}/issue-types"
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
               "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "vaultmail"}
    done_: list[dict[str, str]] = []
    fields_: list[dict[str, str]] = []
    try:
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.get(base) as resp:
                if resp.status == 404:
                    return fail(args, ShellFailure("not_found", f"no organisation {args.org} "
                                                   "that this token can see, or it has no "
                                                   "issue types", status=REFUSED))
                resp.raise_for_status()
                have = {str(t["name"]).lower() for t in await resp.json()}
            for kind in ITEM_KINDS:
                name = names[kind]
                if name.lower() in have:
                    done_.append({"kind": kind, "type": name, "done": "exists"})
                    continue
                color, description = _TYPE_LOOK[kind]
                async with http.post(base, json={"name": name, "is_enabled": True,
                                                 "color": color,
                                                 "description": description}) as resp:
                    if resp.status in (401, 403):
                        return fail(args, ShellFailure(
                            "denied", f"the forge refused to create the issue type {name} "
                            f"({resp.status}): it needs an owner of {args.org} (admin:org)",
                            status=REFUSED))
                    resp.raise_for_status()
                done_.append({"kind": kind, "type": name, "done": "created"})
            if waiting_field:
                made = await _waiting_field(http, f"{args.forge.rstrip('/')}/orgs/{args.org}")
                if made is None:
                    return fail(args, ShellFailure(
                        "denied", "the forge refused to create the issue field Waiting on: it "
                        f"needs an owner of {args.org} (admin:org; fine-grained: the "
                        "organisation's Issue Fields, write)", status=REFUSED))
                fields_.append({"field": "Waiting on", "done": made})
    except aiohttp.ClientResponseError as exc:
        return fail(args, ShellFailure("forge", f"{base}: {exc.status} {exc.message}",
                                       status=REFUSED))
    except aiohttp.ClientError as exc:
        raise forge_unreachable(args.forge, type(exc).__name__) from exc
    if wants_json(args):
        done({"org": args.org, "types": done_, "fields": fields_})
    else:
        for row in done_:
            say(f"{row['type']}: {row['done']} ({row['kind']})")
        for row in fields_:
            say(f"{row['field']}: {row['done']} (issue field, waiting: field)")
    return 0


async def _waiting_field(http: aiohttp.ClientSession, org_url: str) -> str | None:
    """The org's "Waiting on" text issue field (`waiting: field`, bot/items/waiting.py): made if
    missing ("exists" / "created"), None when the forge refuses (not an owner)."""
    from bot.items.waiting import FIELD, FIELD_DESCRIPTION

    url = f"{org_url}/issue-fields"
    async with http.get(url, headers={"X-GitHub-Api-Version": "2026-03-10"}) as resp:
        resp.raise_for_status()
        if any(str(f.get("name", "")).lower() == FIELD.lower() for f in await resp.json()):
            return "exists"
    async with http.post(url, json={"name": FIELD, "data_type": "text",
                                    "description": FIELD_DESCRIPTION},
                         headers={"X-GitHub-Api-Version": "2026-03-10"}) as resp:
        if resp.status in (401, 403):
            return None
        resp.raise_for_status()
    return "created"


def add_office_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def with_data(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--data", help="the data dir of `vaultmail up --data` (or VAULTMAIL_DATA)")
        return p

    p = with_data(sub.add_parser("reindex", help="rebuild the index from the forge"))
    p.add_argument("--org", help="only this organisation's office (default: every installation)")
    p.set_defaults(func=cmd_reindex)
    p = with_data(sub.add_parser("verify", help="check a mail's signed header"))
    p.add_argument("mail", metavar="OWNER/REPO#N")
    p.add_argument("--keys-url", help="published keys (default: the app's well-known URL)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)
    keys = sub.add_parser("keys", help="signing keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    p = with_data(ksub.add_parser("rotate", help="add a new active key to an office's keys; "
                                              "old ones keep verifying"))
    which = p.add_mutually_exclusive_group()
    which.add_argument("--org", help="the office (organisation) whose key to rotate (default: "
                                     "the one office that has keys)")
    which.add_argument("--legacy", action="store_true",
                       help="rotate the legacy keys, from before offices had keys")
    p.set_defaults(func=cmd_keys_rotate)
    p = with_data(ksub.add_parser("revoke", help="withdraw a leaked key: no longer "
                                              "published, trusted or signed with"))
    p.add_argument("kid", metavar="KID", help="the key id, vm-<org>-<date>-<hex> (a legacy "
                                              "key's: vm-<date>-<hex>)")
    p.add_argument("--org", help="the office the key must be of (a check: the id names it, "
                                 "a legacy key's file the offices it served)")
    p.set_defaults(func=cmd_keys_revoke)
    token = sub.add_parser("token", help="API tokens")
    tsub = token.add_subparsers(dest="token_command", required=True)
    p = with_data(tsub.add_parser("create", help="issue an API token for a principal"))
    p.add_argument("principal", metavar="PRINCIPAL")
    p.add_argument("--org", help="the token's office (default: the one organisation the "
                                 "App is installed on; with several, or none yet, required)")
    p.set_defaults(func=cmd_token_create)
    p = with_data(tsub.add_parser("revoke", help="revoke an API token by its id (token list)"))
    p.add_argument("token_id", metavar="ID", type=int)
    p.add_argument("--org", help="the office the token must be of: another office's id is "
                                 "refused")
    p.set_defaults(func=cmd_token_revoke)
    p = with_data(tsub.add_parser("list", help="the API tokens: id, principal, office, last "
                                               "use, a run's expiry"))
    p.add_argument("--org", help="only this office's tokens (default: every office's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_token_list)
    office = sub.add_parser("office", help="the office config")
    osub = office.add_subparsers(dest="office_command", required=True)
    p = osub.add_parser("check", help="validate an office file as the app would (exit 1 if "
                                      "invalid, with each error's line and column)")
    p.add_argument("file", metavar="FILE", nargs="?", default="vaultmail.yml",
                   help="the file (default: vaultmail.yml here, as in the org's .github "
                        "repository)")
    p.add_argument("--org", help="the organisation whose .github repository it is for: its "
                                 "org and vaults must be that organisation's")
    p.add_argument("--operator", action="store_true",
                   help="the operator's own file (`up --office`), which may name commands")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_office_check)
    p = osub.add_parser("setup-types", help="create the issue types of the item kinds (Goal, "
                                            "Outcome, Plan, Evidence) in an organisation on "
                                            "GitHub, and the Waiting on issue field for an "
                                            "office with `waiting: field`; needs an owner's "
                                            "token")
    p.add_argument("--org", required=True, help="the organisation")
    p.add_argument("--office", metavar="FILE",
                   help="an office file whose item_types names the types (default: Goal, "
                        "Outcome, Plan, Evidence); with `waiting: field`, the Waiting on "
                        "issue field is made too")
    p.add_argument("--forge", default=GITHUB_API,
                   help=f"the forge's API URL (default {GITHUB_API}; GitHub Enterprise: "
                        "https://HOST/api/v3)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_office_setup_types)
    p = with_data(sub.add_parser("ledger", help="print the ledger: every office's, or one's"))
    p.add_argument("--org", help="only this office's entries, and only its chain checked "
                                 "(default: every office's, each chain checked)")
    p.add_argument("--since", type=int, default=0)
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger)
