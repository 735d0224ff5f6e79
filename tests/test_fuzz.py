"""Fuzzing (issue 9): what comes from outside never escapes as a crash or a 500, and every
refusal says what was wrong.

Pure parts (the command parser, the mail header's parser and verifier, the office config
loader) take arbitrary and Markdown-, header- and YAML-shaped text. The running app (the
embedded default, over real HTTP) takes signed webhook deliveries shaped like the forge's own
but broken anywhere, and every tool takes arguments drawn from its own JSON schema, then bent
(a field of the wrong type, a required one missing, an unknown one, a huge number, not an
object at all).

Reproducible and quick: `derandomize=True` (one fixed sequence of examples per test, the same
in CI), no example database, modest `max_examples`, no deadline (the HTTP ones wait on a real
forge).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import uuid
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bot.app.embedded import Embedded, start_embedded
from bot.mail.commands import KNOWN, first_command, parse_commands
from bot.mail.header import (
    VerdictStatus,
    clean_subject,
    normalize_body,
    normalize_subject,
    render_mail_body,
    sign_header,
    split_mail_body,
    verify_mail,
)
from bot.mail.signing import Keyring
from bot.office.config import Office, OfficeConfigError, parse_office
from bot.tools.registry import TOOLS
from tests.items_support import MARCO, SCOUT, TOKEN_TTL, make_item
from tests.support import Actor, ToolClient

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
LIVE = settings(FUZZ, max_examples=40)  # each example is a round trip through app and forge

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
HUGE = st.sampled_from([10**30, -(10**30), 2**63, -(2**63) - 1, 2**53 + 1])
SURROGATE = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)  # "\ud800"


# -- the command parser ----------------------------------------------------------------------

PIECES = ["/close", "/mail scout", "/mail", "/ask", "/answer 1", "/resolve", "/working",
          "/unknown", "\\/close", "> ", ">", "```", "````", "~~~", "    ", "\t", "<!--", "-->",
          "<div>", "</div>", "- ", "1. ", "* ", "# ", "=== ", "---", "`", "**", "[x]: /close",
          "text", "Subject line", "  ", "\n", "\n\n", "\r\n", "\r", "@marco", "&#64;", "\x00"]
MARKDOWN = st.lists(st.sampled_from(PIECES) | st.text(max_size=12), max_size=30).map("".join)
TEXT = MARKDOWN | st.text(max_size=200)


@FUZZ
@given(TEXT)
def test_the_command_parser_takes_any_comment(text: str) -> None:
    for command in parse_commands(text):
        assert command.name in KNOWN
        assert "\n" not in command.args and command.args == command.args.strip()
        assert not command.body.startswith("\n") and not command.body.endswith("\n")


def _fence_for(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


@FUZZ
@given(TEXT)
def test_no_command_runs_from_a_code_fence_a_quote_or_an_html_comment(text: str) -> None:
    lines = text.replace("\r\n", "\n").replace("\r", "\n")
    fence = _fence_for(lines)
    assert parse_commands(f"{fence}\n{lines}\n{fence}") == [], "inside a code fence"
    quoted = "\n".join("> " + line for line in lines.split("\n"))
    assert parse_commands(quoted) == [], "inside a block quote"
    assume("-->" not in lines)
    assert parse_commands(f"<!--\n{lines}\n-->") == [], "inside an HTML comment"


@FUZZ
@given(st.sampled_from(KNOWN), st.from_regex(r"[A-Za-z0-9 ]{0,20}", fullmatch=True), TEXT)
def test_a_command_in_its_own_paragraph_is_taken_whatever_follows(
        name: str, args: str, rest: str) -> None:
    command = first_command(f"/{name} {args}\n\n{rest}")
    assert command is not None and command.name == name and command.args == args.strip()


# -- the mail header: parser and verifier ----------------------------------------------------

KEYS = Keyring.ephemeral()
OTHER_KEYS = Keyring.ephemeral()
VAULT = st.from_regex(r"[A-Za-z0-9_.-]{1,12}/[A-Za-z0-9_.-]{1,12}", fullmatch=True)
PRINCIPAL = st.from_regex(r"agent:[a-z0-9][a-z0-9-]{0,10}|human:[a-z]{1,8}@[a-z]{1,8}\.com",
                          fullmatch=True)
SUBJECT = st.text(min_size=1, max_size=80).filter(lambda s: bool(clean_subject(s)))
APP = "vaultmail[bot]"


def _genuine(vault: str, subject: str, body: str, sender: str) -> tuple[Any, str]:
    header = sign_header(keyring=KEYS, from_principal=sender, to_principal="agent:scout",
                         vault=vault, subject=subject, body=body)
    return header, render_mail_body(header, body)


def _header_comment(fields: Any) -> str:
    payload = json.dumps(fields).replace("<", "\\u003c").replace(">", "\\u003e")
    return f"<!-- vaultmail:header v1 {payload} -->"


@FUZZ
@given(title=st.text(max_size=40), vault=st.text(max_size=30), number=st.integers(1, 10**6),
       body=TEXT | JSON.map(lambda v: _header_comment(v) + "\n\n---\n\nbody"))
def test_verifying_any_issue_gives_a_verdict_never_an_error(
        title: str, vault: str, number: int, body: str) -> None:
    parsed = split_mail_body(body)
    assert parsed.has_header or parsed.body == normalize_body(body)
    if parsed.has_header and parsed.header is None:
        assert parsed.error, "an unreadable header says why"
    verdict = verify_mail(title, body, vault, KEYS, issue_number=number, opened_by="marco",
                          app_login=APP)
    assert verdict.status in VerdictStatus
    assert verdict.valid or verdict.reason


@FUZZ
@given(vault=VAULT, subject=SUBJECT, body=TEXT, sender=PRINCIPAL, number=st.integers(1, 10**6))
def test_a_genuine_mail_verifies_on_the_issue_the_app_opened(
        vault: str, subject: str, body: str, sender: str, number: int) -> None:
    header, issue_body = _genuine(vault, subject, body, sender)
    verdict = verify_mail(header.subject, issue_body, vault, KEYS, issue_number=number,
                          opened_by=APP, app_login=APP)
    assert verdict.valid, verdict.reason
    assert verdict.body == normalize_body(body)


@FUZZ
@given(vault=VAULT, subject=SUBJECT, body=TEXT, sender=PRINCIPAL, other=TEXT,
       title=st.text(max_size=80), field=st.sampled_from(
           ["from_principal", "to_principal", "subject", "hops", "vault", "sent", "mail_id"]),
       value=JSON)
def test_any_change_to_a_signed_mail_is_tampering(
        vault: str, subject: str, body: str, sender: str, other: str, title: str, field: str,
        value: Any) -> None:
    header, issue_body = _genuine(vault, subject, body, sender)
    if normalize_body(other) != normalize_body(body):
        changed = issue_body.replace(normalize_body(body), normalize_body(other)) \
            if normalize_body(body) else issue_body + other
        verdict = verify_mail(header.subject, changed, vault, KEYS)
        assert verdict.status is VerdictStatus.TAMPERED and verdict.reason
    if normalize_subject(title) != header.subject:
        verdict = verify_mail(title, issue_body, vault, KEYS)
        assert verdict.status is VerdictStatus.TAMPERED and "subject" in verdict.reason
    fields = json.loads(header.to_json())
    assume(fields[field] != value)
    fields[field] = value
    forged = issue_body.replace(issue_body.split("\n", 1)[0], _header_comment(fields), 1)
    verdict = verify_mail(header.subject, forged, vault, KEYS)
    assert verdict.status is VerdictStatus.TAMPERED and verdict.reason
    assert not verify_mail(header.subject, issue_body, vault, OTHER_KEYS).valid, "wrong key"


# -- the office config loader ----------------------------------------------------------------

EXAMPLE = yaml.safe_load(resources.files("bot").joinpath("example_office.yml").read_text())
YAML_SCALARS = ["2001-13-01", "!!timestamp 2001-02-30", "!!binary x", "!!python/name:os.system",
                "&a [*a]", "1e400", "~", "'x'", "{a: 1}", "[1, 2]", ".inf", "0x1F", "yes",
                "null", "acme", "{slug}-vault", "[mail.send]", "- x", "|", "*undefined", "@x"]
YAML_VALUE = (st.sampled_from(YAML_SCALARS)
              | st.sampled_from([2, 33, 1500]).map(lambda n: "[" * n + "]" * n)  # deep nesting
              | st.text(st.characters(exclude_characters="\n\r"), max_size=12))
YAML_KEY = st.sampled_from(["org", "vault_pattern", "humans", "teams", "agents", "webhooks",
                            "flavour", "? [1]", "<<"])
YAML_TEXT = st.lists(st.tuples(YAML_KEY, YAML_VALUE), max_size=6).map(
    lambda pairs: "".join(f"{key}: {value}\n" for key, value in pairs))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def bent(draw: st.DrawFn, value: Any, garbage: st.SearchStrategy[Any] = JSON,
         max_changes: int = 3) -> Any:
    """`value` (JSON-shaped) with a few of its parts replaced by garbage or taken out."""
    value = json.loads(json.dumps(value))
    for _ in range(draw(st.integers(1, max_changes))):
        path = draw(st.sampled_from(_paths(value)))
        if not path:
            return draw(garbage)
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            parent[path[-1]] = draw(garbage | HUGE)
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    return value


def _office_answer(text: str) -> Office | None:
    try:
        return parse_office(text, "vaultmail.yml", repository=False)
    except OfficeConfigError as exc:
        assert exc.errors and all(e.startswith("vaultmail.yml: ") for e in exc.errors)
        assert all(e.split(": ", 2)[1:] for e in exc.errors), "each error says where and why"
        return None


@FUZZ
@given(YAML_TEXT | st.text(max_size=200))
def test_any_office_file_loads_or_is_refused_with_its_problems(text: str) -> None:
    _office_answer(text)


@FUZZ
@given(bent(EXAMPLE, garbage=JSON | st.sampled_from(["2001-13-01", "x" * 50, "", "*"])))
def test_a_broken_example_office_is_refused_naming_where(config: Any) -> None:
    office = _office_answer(yaml.safe_dump(config, allow_unicode=True))
    assert office is None or isinstance(office, Office)


# -- the running app: webhooks and tools -----------------------------------------------------

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")  # the app lives as long as the module


class Live(tuple[Embedded, aiohttp.ClientSession, dict[str, list[Any]]]):
    """The app, a client session, and names that exist in it (mails, items, comments, chats)."""

    def __repr__(self) -> str:  # a failing example prints its arguments: keep this one short
        return "<the embedded app>"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Live]:
    """One embedded app for the module, with a mail, an outcome, a question and a chat in it
    (their names go into the fuzz's pool) and real deliveries recorded as templates."""
    emb = await start_embedded(data_dir=Path(tmp_path_factory.mktemp("fuzz")), port=0,
                               forge_port=0)
    worker = emb.worker
    worker.base_backoff, worker.max_attempts = 0.001, 2  # failures end as dead letters at once
    forge = emb.services.forge_for(None)
    forge.config = dataclasses.replace(  # type: ignore[attr-defined]
        forge.config, backoff_base=0.001, max_attempts=2)  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as session:
        marco, scout = ToolClient(session, emb, MARCO), ToolClient(session, emb, SCOUT)
        mail = (await marco("mail_send", to="scout", subject="Prices", body="EU?"))["mail"]
        await Actor(session, emb, "marco").comment("acme/scout-vault", mail["number"],
                                                   "/close")
        outcome = await make_item(emb, Actor(session, emb, "marco"), "outcome", "AC-12: Auth")
        goal = await make_item(emb, Actor(session, emb, "sara"), "goal", "Ship it")
        asked = await scout("add_comment", **{**TOKEN_TTL, "target": outcome})
        chat = await marco("agent_chat", agent="scout", message="EU or US first?")
        await emb.settle()
        refs = [mail["ref"], outcome, goal]
        names: dict[str, list[Any]] = {  # what exists, by the argument that names it
            "target": refs, "outcome": refs, "goal": refs, "inReplyTo": refs,
            "mail": [mail["ref"], mail["mail_id"]], "thread": [mail["thread_id"]],
            "vault": ["acme/scout-vault"], "comment": [asked["comment"]["id"]],
            "parent": [asked["comment"]["id"]], "chat": [chat["chat"]["chat"]],
            "to": WHO, "cc": WHO, "agent": WHO, "option": ["Keep 30 days", 1]}
        yield Live((emb, session, names))
    await emb.stop()


def _templates(emb: Embedded) -> list[tuple[str, dict[str, Any]]]:
    seen: dict[tuple[str, Any], dict[str, Any]] = {}
    for d in emb.forge.state.deliveries.values():
        seen.setdefault((d.event, d.action), d.payload)
    return [(event, payload) for (event, _), payload in sorted(
        seen.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]


EVENTS = st.sampled_from(["issues", "issue_comment", "label", "push", "installation",
                          "installation_repositories", "ping", "meta"]) | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=10)


@MODULE_LOOP
@settings(LIVE, max_examples=80)
@given(data=st.data())
async def test_any_signed_delivery_is_answered_and_ends_handled_ignored_or_dead(
        live: Live, data: st.DataObject) -> None:
    emb, session, _ = live
    templates = _templates(emb)
    event, template = data.draw(st.sampled_from(templates))
    payload = data.draw(st.one_of(  # mostly the forge's own shapes, broken here and there
        bent(template, garbage=JSON | SURROGATE), bent(template, garbage=JSON),
        st.dictionaries(st.sampled_from(list(template)), JSON, max_size=6), JSON))
    event = data.draw(st.one_of(st.just(event), st.just(event), EVENTS))
    body = json.dumps(payload).encode()
    headers = _signed(emb, event, body)
    guid = headers["X-GitHub-Delivery"]
    async with session.post(emb.app_url + "/webhook", data=body, headers=headers) as resp:
        assert resp.content_type == "application/json", (resp.status, await resp.text())
        answer = await resp.json()
        if isinstance(payload, dict):
            assert resp.status == 202, (resp.status, answer)
        else:
            assert resp.status == 400 and answer["error"]["message"], (resp.status, answer)
    await emb.settle(timeout=20)
    task = emb.worker._task
    assert task is not None and not task.done(), "the worker is still running"
    rows = await emb.services.store.fetchall("SELECT state FROM queue WHERE guid=?", (guid,))
    assert [r["state"] for r in rows] in ([], ["done"], ["ignored"], ["dead"]), rows
    async with session.get(emb.app_url + "/healthz") as resp:
        assert resp.status == 200


def _signed(emb: Embedded, event: str, body: bytes) -> dict[str, str]:
    secret = emb.services.settings.webhook_secret.encode()
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
            "Content-Type": "application/json", "X-Hub-Signature-256":
            "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()}


@MODULE_LOOP
async def test_a_signed_delivery_with_a_lone_surrogate_is_queued_not_a_500(live: Live) -> None:
    emb, session, _ = live
    body = b'{"action": "created", "note": "\\ud800"}'  # (a handler takes it: kept)
    async with session.post(emb.app_url + "/webhook", data=body,
                            headers=_signed(emb, "installation", body)) as resp:
        assert resp.status == 202, (resp.status, await resp.text())
        guid = (await resp.json())["delivery"]
    await emb.settle(timeout=20)
    rows = await emb.services.store.fetchall("SELECT state, payload FROM queue WHERE guid=?",
                                             (guid,))
    assert [r["state"] for r in rows] in (["done"], ["ignored"], ["dead"]), rows
    assert json.loads(rows[0]["payload"]) == {"action": "created", "note": "\ufffd"}


PRINCIPALS = ["agent:scout", "agent:critic", "human:marco@acme.com", "human:lee@acme.com"]
WHO = ["scout", "agent:scout", "builder", "critic", "marco@acme.com", "lee@acme.com", "me",
       "agent", "team:pricing", "agent:nobody", "nobody@acme.com"]
POOL = ["acme/scout-vault#1", "acme/scout-vault#99", "acme/nowhere#1", "AC-12", "ac-12",
        "2025-01-31T09:00:00Z", "1", "", " ", "\t", "new", "outcome", "@marco", "x" * 300]


def _for(schema: dict[str, Any], defs: dict[str, Any], names: dict[str, list[Any]],
         name: str = "") -> st.SearchStrategy[Any]:
    """Values the JSON schema (as pydantic writes it) accepts; for an argument that names
    something, often a name that exists (`names`, by argument)."""
    known = [v for v in names.get(name, []) if isinstance(v, int | str)]
    if known and "$ref" not in schema and "anyOf" not in schema:
        fits = [v for v in known if isinstance(v, str) == (schema.get("type") == "string")]
        if fits:
            return st.sampled_from(fits) | _for(schema, defs, {}, name)
    if "$ref" in schema:
        return _for(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, names, name)
    if "anyOf" in schema:
        return st.one_of([_for(s, defs, names, name) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if name == "wait":
        return st.just(0)  # a long poll waits for real: every other value is tried bent
    if kind == "string":
        lo, hi = schema.get("minLength", 0), min(schema.get("maxLength", 80), 80)
        return (st.sampled_from(POOL + WHO) | st.text(min_size=lo, max_size=hi)).filter(
            lambda s: lo <= len(s) <= schema.get("maxLength", 10**9))
    if kind in ("integer", "number"):
        lo, hi = schema.get("minimum", -5), schema.get("maximum", 10**4)
        return st.integers(lo, min(hi, lo + 10**4))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(_for(schema.get("items", {}), defs, names, name), max_size=min(
            schema.get("maxItems", 3), 3))
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: _for(v, defs, names, k) for k, v in props.items() if k in required},
            optional={k: _for(v, defs, names, k) for k, v in props.items() if k not in required})
    return JSON


def _no_long_wait(args: Any) -> Any:
    """A bent `wait` that is still a valid one becomes 0 (a real wait would only be slow)."""
    if isinstance(args, dict) and "wait" in args:
        w = args["wait"]
        if w is True or (isinstance(w, int | float) and not isinstance(w, bool) and 0 < w <= 50):
            args["wait"] = 0
    return args


@MODULE_LOOP
@LIVE
@pytest.mark.parametrize("name", sorted(TOOLS))
@given(data=st.data())
async def test_every_tool_answers_any_arguments_without_a_500_and_names_the_problem(
        live: Live, name: str, data: st.DataObject) -> None:
    emb, session, names = live
    schema = TOOLS[name].args.model_json_schema()
    valid = _for(schema, schema.get("$defs", {}), names)
    args = data.draw(st.one_of(valid, valid, valid.flatmap(
        lambda v: bent(v, JSON | HUGE | SURROGATE, 2)), JSON))
    args = _no_long_wait(args)
    principal = data.draw(st.sampled_from(PRINCIPALS))
    headers = {"Authorization": f"Bearer {emb.api_tokens[principal]}"}
    async with session.post(f"{emb.app_url}/api/v1/tools/{name}", json=args,
                            headers=headers) as resp:
        status, body = resp.status, await resp.json(content_type=None)
    assert status < 500, (name, principal, args, status, body)
    if status == 200:
        assert isinstance(body, dict)
        return
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict) and error.get("code") and error.get("message"), body
    if status == 422:
        fields = list(schema.get("properties", {})) + (
            list(args) if isinstance(args, dict) else [])
        assert "argument" in error["message"] or any(
            f in error["message"] for f in fields), ("a 422 names the field", error)
