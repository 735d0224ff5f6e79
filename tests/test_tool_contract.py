"""Every tool as MCP clients expect it: a title, annotations that match what it does, an output
schema its results validate against, and every parameter described with its limits; the same
in `GET /api/v1/tools`, MCP's tools/list and `vaultmail tools`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from jsonschema import Draft202012Validator

from bot.app.embedded import Embedded
from bot.tools import http as _http  # noqa: F401  (registers every tool)
from bot.tools.registry import TOOLS, Hints, Tool
from tests.items_support import MARCO, SCOUT, make_item
from tests.support import ToolClient, check_output
from tests.test_cli_tools import vaultmail
from tests.test_mcp import mcp_http

BUILDER = "agent:builder"
TABLES = ("mails", "comments", "threads", "chats", "runs", "ledger")
PERMISSION = "GET /repos/{owner}/{repo}/collaborators/{username}/permission"


# -- the declarations ------------------------------------------------------------------------

def _defs(schema: dict[str, Any]) -> dict[str, Any]:
    return dict(schema.get("$defs", {}))


def _branches(prop: dict[str, Any]) -> list[dict[str, Any]]:
    """Each type a parameter takes, with the keywords beside `anyOf` (which hold for all)."""
    outer = {k: v for k, v in prop.items() if k != "anyOf"}
    return [{**outer, **b} for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]


def _unlimited(name: str, prop: dict[str, Any], defs: dict[str, Any]) -> Iterator[str]:
    """What a parameter's schema leaves unbounded."""
    for branch in _branches(prop):
        if "$ref" in branch:
            yield from _model_gaps(name, defs[branch["$ref"].rsplit("/", 1)[-1]], defs)
            continue
        kind = branch.get("type")
        if "enum" in branch or "const" in branch or kind == "boolean":
            continue
        if kind == "string" and "maxLength" not in branch:
            yield f"{name}: a string without maxLength"
        elif kind in ("integer", "number") and not (
                {"minimum", "exclusiveMinimum"} & set(branch)
                and {"maximum", "exclusiveMaximum"} & set(branch)):
            yield f"{name}: a number without minimum and maximum"
        elif kind == "array":
            if "maxItems" not in branch:
                yield f"{name}: an array without maxItems"
            yield from _unlimited(f"{name}[]", branch.get("items", {}), defs)
        elif kind not in ("string", "integer", "number", "array"):
            yield f"{name}: no type the schema bounds ({kind})"


def _model_gaps(where: str, model: dict[str, Any], defs: dict[str, Any]) -> Iterator[str]:
    for name, prop in model.get("properties", {}).items():
        if not prop.get("description"):
            yield f"{where}.{name}: no description"
        yield from _unlimited(f"{where}.{name}", prop, defs)


def _gaps(spec: Tool) -> list[str]:
    gaps = []
    if not spec.title or len(spec.title) > 60:
        gaps.append(f"{spec.name}: a title of at most 60 characters")
    if not isinstance(spec.hints, Hints):
        gaps.append(f"{spec.name}: hints (readOnly, destructive, idempotent, openWorld)")
    elif spec.hints.read_only and spec.hints.destructive:
        gaps.append(f"{spec.name}: read-only and destructive at once")
    output = spec.output_schema()
    if output is None:
        gaps.append(f"{spec.name}: an output model (bot/tools/outputs.py)")
    else:
        Draft202012Validator.check_schema(output)
        if output.get("type") != "object":
            gaps.append(f"{spec.name}: an output schema of type object")
    schema = spec.input_schema()
    gaps += list(_model_gaps(spec.name, schema, _defs(schema)))
    return gaps


def test_every_tool_declares_a_title_hints_an_output_schema_and_bounded_parameters() -> None:
    assert len(TOOLS) >= 15
    gaps = [gap for spec in TOOLS.values() for gap in _gaps(spec)]
    assert gaps == [], "\n".join(gaps)


def test_the_walk_finds_what_a_tool_leaves_out() -> None:
    """The check above can fail: a tool without its declarations is caught."""
    from pydantic import Field

    from bot.tools.registry import Args

    class Loose(Args):
        text: str
        many: list[str] = Field(default_factory=list, description="no limit")
        n: int = Field(default=0, ge=0, description="no maximum")

    async def nothing(call: Any, args: Any) -> dict[str, Any]:
        return {}

    gaps = _gaps(Tool("loose", "d", Loose, nothing))
    assert gaps == ["loose: a title of at most 60 characters",
                    "loose: hints (readOnly, destructive, idempotent, openWorld)",
                    "loose: an output model (bot/tools/outputs.py)",
                    "loose.text: no description", "loose.text: a string without maxLength",
                    "loose.many: an array without maxItems",
                    "loose.many[]: a string without maxLength",
                    "loose.n: a number without minimum and maximum"]


async def test_the_http_listing_mcp_and_the_shell_show_the_same_declarations(
        embedded: Embedded) -> None:
    expected = {name: json.loads(json.dumps(spec.listing())) for name, spec in TOOLS.items()}
    async with aiohttp.ClientSession() as s, s.get(embedded.app_url + "/api/v1/tools") as resp:
        assert resp.status == 200
        listed = {t["name"]: t for t in (await resp.json())["tools"]}
    assert listed == expected

    async with mcp_http(embedded, embedded.api_tokens[SCOUT]) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == set(TOOLS)
    for name, t in tools.items():
        want = expected[name]
        assert t.title == want["title"] and t.description == want["description"]
        assert t.input_schema == want["inputSchema"]
        assert t.output_schema == want["outputSchema"]
        assert t.annotations is not None
        assert t.annotations.model_dump(by_alias=True, exclude_none=True) == want["annotations"]

    code, out, err = await vaultmail("tools", "--data", str(embedded.data_dir), "--json")
    assert code == 0, err
    assert json.loads(out) == {"ok": True, "result": {"tools": list(expected.values())}}
    code, out, err = await vaultmail("tools", "--data", str(embedded.data_dir))
    assert code == 0, err
    assert "mail_close mail: Close a mail  [writes, destructive, open world]" in out
    assert "mail_open mail: Open a mail  [writes, idempotent, open world]" in out
    assert "mail_list [state] [vault] [thread] [mailsBefore]: List mail  [read-only]" in out
    assert "mail_get mail: Read a mail and its thread  [read-only, open world]" in out


# -- what the tools do -----------------------------------------------------------------------

@dataclass
class Seen:
    """What one call changed: forge requests by route, tables whose rows changed, issues closed."""

    routes: list[str]
    tables: list[str]
    closed: int

    @property
    def writes(self) -> list[str]:
        return [r for r in self.routes if not r.startswith("GET ")]


async def _rows(embedded: Embedded) -> dict[str, list[tuple[Any, ...]]]:
    store = embedded.services.store
    return {t: sorted((tuple(r) for r in await store.fetchall(f"SELECT * FROM {t}")), key=repr)
            for t in TABLES}


def _closed(embedded: Embedded) -> int:
    return sum(1 for repo in embedded.forge.state.repos.values()
               for issue in repo.issues.values() if issue.state == "closed")


class Recorder:
    """Calls the tools over HTTP, validating each result against the tool's output schema,
    and notes what each call changed (after what it caused has settled)."""

    def __init__(self, embedded: Embedded, session: aiohttp.ClientSession) -> None:
        self.embedded, self.session = embedded, session
        self.seen: dict[str, list[Seen]] = {}
        self.validated: set[str] = set()

    async def __call__(self, who: str, tool: str, expect: int = 200,
                       **args: Any) -> dict[str, Any]:
        before_rows, before_log = await _rows(self.embedded), len(self.embedded.forge.requests)
        before_closed = _closed(self.embedded)
        status, body = await ToolClient(self.session, self.embedded, who).raw(tool, args)
        assert status == expect, (tool, status, body)
        await self.embedded.settle()
        after = await _rows(self.embedded)
        self.seen.setdefault(tool, []).append(Seen(
            [r.route for r in self.embedded.forge.requests.records[before_log:]],
            [t for t in TABLES if after[t] != before_rows[t]],
            _closed(self.embedded) - before_closed))
        if status == 200:
            assert TOOLS[tool].output_schema() is not None
            check_output(tool, body)
            self.validated.add(tool)
        result: dict[str, Any] = body
        return result


async def test_every_tool_does_what_its_annotations_say_and_returns_its_output_schema(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    call = Recorder(embedded, session)
    sent = (await call(BUILDER, "mail_send", to="scout", subject="Spec", body="v1"))["mail"]
    await call(SCOUT, "mail_list")
    await call(SCOUT, "mail_get", mail=sent["ref"])
    await call(SCOUT, "mail_open", mail=sent["ref"])
    await call(SCOUT, "mail_open", mail=sent["ref"])
    await call(SCOUT, "mail_reply", mail=sent["ref"], body="Looks good")
    [reply] = (await call(BUILDER, "list_inbox"))["inbox"]["mail"]
    await call(BUILDER, "mail_close", mail=reply["ref"])
    await call(BUILDER, "mail_close", mail=reply["ref"])

    marco = person("marco")
    goal = await make_item(embedded, marco, "goal", "Launch")
    outcome = await make_item(embedded, marco, "outcome", "Checkout",
                              body=f"Part of #{goal.rsplit('#', 1)[1]}", assignees=["scout-bot"])
    asked = await call(SCOUT, "add_comment", targetType="outcome", target=outcome,
                       body="Card or invoice first?", to=["marco@acme.com"],
                       options=[{"label": "Card"}, {"label": "Invoice"}])
    [card] = (await call(MARCO, "list_inbox"))["you"]["yourTurn"]
    await call(MARCO, "add_comment", targetType="outcome", target=outcome,
               parent=card["thread"], option=1)
    await call(SCOUT, "resolve_comment", comment=asked["comment"]["id"])
    await call(SCOUT, "resolve_comment", comment=asked["comment"]["id"])
    await call(SCOUT, "get_outcome", outcome=outcome)
    await call(SCOUT, "get_tree", goal=goal)
    await call(SCOUT, "list_changes", since=0)
    chat = (await call(MARCO, "agent_chat", agent="scout", message="EU or US?"))["chat"]
    await call(SCOUT, "chat_reply", chat=chat["chat"], message="EU")
    await call(SCOUT, "chat_reply", expect=409, chat=chat["chat"], message="EU")
    await call(MARCO, "chat_get", chat=chat["chat"])

    assert call.validated == set(TOOLS), f"not called: {set(TOOLS) - call.validated}"
    wrong = []
    for name, calls in call.seen.items():
        hints = TOOLS[name].hints
        assert hints is not None
        changed = [c for c in calls if c.writes or c.tables]
        if hints.read_only and changed:
            wrong.append(f"{name} is read-only but wrote {changed[0]}")
        if not hints.read_only and not changed:
            wrong.append(f"{name} is not read-only but changed nothing in {len(calls)} calls")
        if hints.idempotent and len(calls) > 1 and any(c.writes or c.tables for c in calls[1:]):
            wrong.append(f"{name} is idempotent but a second call wrote {calls[1]}")
        if not hints.destructive and any(c.closed for c in calls):
            wrong.append(f"{name} is not destructive but closed an issue")
        if hints.destructive and not any(c.closed for c in calls):
            wrong.append(f"{name} is destructive but closed nothing")
        outside = [r for c in calls for r in c.routes if r != PERMISSION]
        if not hints.open_world and outside:
            wrong.append(f"{name} keeps to the index but asked the forge {outside[0]}")
        if hints.open_world and name.startswith(("mail_", "get_")) and not outside:
            wrong.append(f"{name} reaches the forge, says its hint, but never did")
    assert wrong == [], "\n".join(wrong)
