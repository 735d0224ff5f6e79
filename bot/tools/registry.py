"""Tool registry: each tool is a pydantic input model plus one async function.

`call_tool` validates the arguments (an error names the field and what it takes), runs the
tool as a principal, and adds the `inbox` field to every result for an agent, errors included.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bot import metrics
from bot.app.bodies import lone_surrogate_at
from bot.errors import (
    Denied,
    InvalidArguments,
    NotFoundError,
    Unauthenticated,
    VaultmailError,
    forge_refusal,
)
from bot.forge.errors import ForgeError
from bot.forge.pacing import acting_for
from bot.mail.mailer import Mailer
from bot.office.config import Office
from bot.store import ledger
from bot.store.idempotency import fingerprint

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge


# The largest integer every JSON client reads exactly (2**53 - 1): ids, sequence numbers and
# cursors stay below it, and every integer argument is bounded by it, or tighter, in its Args
# model. `_numbers_in_range` holds the same line for any number anywhere in the arguments, so
# a field that forgot its bounds still answers 422, never a database overflow (500).
MAX_ID = 2**53 - 1


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _numbers_in_range(value: Any, where: str = "") -> str | None:
    """Why a number in the arguments is out of range (naming where it is), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if -MAX_ID <= value <= MAX_ID:
            return None
        size = int(abs(value).bit_length() * math.log10(2))
        shown = str(value) if size < 20 else f"{'-' if value < 0 else ''}about 10^{size}"
        return (f"{where or '(arguments)'}: {shown} is out of range; integers here are at most "
                f"{MAX_ID:,} in size")
    if isinstance(value, float):
        return None if math.isfinite(value) else (
            f"{where or '(arguments)'}: {value} is not a number JSON allows; give a finite one")
    if isinstance(value, dict):
        for key, item in value.items():
            found = _numbers_in_range(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _numbers_in_range(item, f"{where}.{i}" if where else str(i))
            if found:
                return found
    return None


@dataclass
class Call:
    """One tool call: who makes it, with the office and forge it acts on."""

    services: Services
    principal: str
    office: Office
    forge: Forge
    # what a tool already computed for the `inbox` field of its own result, by provider name
    inbox_ready: dict[str, dict[str, Any]] = field(default_factory=dict)
    token_key: str | None = None  # the API token's `polls.token_key`: long polls per token
    woken_by: str | None = None  # a run's token: the mail that woke the run (its hops climb)
    # asks again who the caller is (its token, its office), raising when it may act no more:
    # a long poll asks after each sleep (`still_acting`)
    recheck: Callable[[], Awaitable[object]] | None = None

    @property
    def mailer(self) -> Mailer:
        return Mailer(self.services, self.forge, self.office)

    @property
    def is_agent(self) -> bool:
        return self.principal.startswith("agent:")


ToolFn = Callable[[Call, Any], Awaitable[dict[str, Any]]]
ThenFn = Callable[[Call, Any, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Hints:
    """A tool's MCP annotations: what a call does, for clients deciding what to confirm.

    read_only: changes nothing on the forge or in the office's record (moving the caller's own
    read marks, as every agent result's `inbox` does, is not a change); destructive: may end or
    undo something (close a mail) rather than only add; idempotent: a second call with the
    same arguments changes nothing more; open_world: reaches beyond the office's index (the
    forge's issues, an agent's dispatch), not only what vaultmail keeps."""

    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool

    def as_json(self) -> dict[str, bool]:
        return {"readOnlyHint": self.read_only, "destructiveHint": self.destructive,
                "idempotentHint": self.idempotent, "openWorldHint": self.open_world}


READS_INDEX = Hints(read_only=True, destructive=False, idempotent=True, open_world=False)
READS_FORGE = Hints(read_only=True, destructive=False, idempotent=True, open_world=True)


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema, made once: pydantic builds it anew at each call, which cost a
    tools/list (and every test's check of a result) milliseconds a tool. Handed out as copies."""
    return model.model_json_schema(by_alias=True)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[Args]
    fn: ToolFn
    then: ThenFn | None = None  # after `fn` and after each retry of it: what is read fresh
    # declared at registration, for MCP clients and people: `tests/test_tool_contract.py`
    # fails for a tool without all three
    title: str | None = None
    hints: Hints | None = None
    output: type[BaseModel] | None = None  # the result's model (`bot.tools.outputs`)

    def input_schema(self) -> dict[str, Any]:
        return copy.deepcopy(_schema(self.args))

    def output_schema(self) -> dict[str, Any] | None:
        return None if self.output is None else copy.deepcopy(_schema(self.output))

    def annotations(self) -> dict[str, Any]:
        return {"title": self.title, **(self.hints.as_json() if self.hints else {})}

    def listing(self) -> dict[str, Any]:
        """The tool as `GET /api/v1/tools`, MCP's tools/list and `vaultmail tools` show it,
        under MCP's names (`inputSchema`, `outputSchema`)."""
        return {"name": self.name, "title": self.title, "description": self.description,
                "annotations": self.annotations(), "inputSchema": self.input_schema(),
                "outputSchema": self.output_schema()}


log = logging.getLogger("vaultmail.tools")
TOOLS: dict[str, Tool] = {}
InboxFn = Callable[[Call], Awaitable[dict[str, Any]]]
_inbox: list[InboxFn] = []


def tool(name: str, args: type[Args], description: str, *, title: str | None = None,
         hints: Hints | None = None, output: type[BaseModel] | None = None,
         then: ThenFn | None = None) -> Callable[[ToolFn], ToolFn]:
    def register(fn: ToolFn) -> ToolFn:
        TOOLS[name] = Tool(name, description, args, fn, then, title, hints, output)
        return fn
    return register


def inbox_provider(fn: InboxFn) -> InboxFn:
    _inbox.append(fn)
    return fn


def _field_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


async def agent_inbox(call: Call) -> dict[str, Any]:
    inbox: dict[str, Any] = {}
    for provider in _inbox:
        inbox.update(await provider(call))
    return inbox


async def _run(call: Call, spec: Tool, args: Args) -> dict[str, Any]:
    """Run the tool; with an `idempotencyKey`, once per key and principal (the store's
    `once`: claimed before any forge write, a concurrent retry waits for the first call, a
    later one gets its result). `wait` says how long to wait, not what to do: a retry may
    change it, and `spec.then` (what is read fresh) runs after every call, retries included."""
    key = getattr(args, "idempotencyKey", None)
    if key is None:
        result = await spec.fn(call, args)
    else:
        what = fingerprint(args.model_dump(exclude={"idempotencyKey", "wait"}))
        result = await call.services.store.once(
            f"tool:{spec.name}:{call.office.org.lower()}:{call.principal}", key, what,
            lambda: spec.fn(call, args))
    return result if spec.then is None else await spec.then(call, args, result)


async def _call_tool(call: Call, name: str, raw: Any) -> dict[str, Any]:
    spec = TOOLS.get(name)
    if spec is None:
        raise NotFoundError(f"no tool {name!r}; tools: {', '.join(sorted(TOOLS))}",
                            code="unknown_tool")
    if not isinstance(raw, dict):
        raise InvalidArguments("the arguments must be a JSON object")
    out_of_range = _numbers_in_range(raw)
    if out_of_range:
        raise InvalidArguments(f"{name}: {out_of_range}")
    broken = lone_surrogate_at(raw)
    if broken is not None:
        raise InvalidArguments(f"{name}: argument {broken} holds a lone UTF-16 surrogate "
                               "(such as \\ud800), which is no character: send text as "
                               "valid UTF-8, or both halves of a surrogate pair",
                               code="invalid_text")
    try:
        args = spec.args.model_validate(raw)
    except ValidationError as exc:
        raise InvalidArguments(f"{name}: {_field_errors(exc)}") from exc
    call.inbox_ready.clear()
    result = await _run(call, spec, args)
    if call.is_agent:
        result["inbox"] = await agent_inbox(call)
    return result


async def call_tool(call: Call, name: str, raw: Any) -> dict[str, Any]:
    """Run a tool; every result for an agent, errors included, carries its `inbox`, and every
    refusal outside a permission (403) is ledgered as `run.denied` (once)."""
    known = name if name in TOOLS else "unknown"  # a metric label per tool, not per typo
    try:
        # its forge writes take this principal's turns; a long poll counts against its token
        # (the principal of its office: on Gitea one bot's pacer serves every org, and another
        # office's principal of the same name has turns of its own)
        with acting_for(f"{call.office.org.lower()}/{call.principal}"), \
                call.services.long_polls.hold(call.token_key, name, raw,
                                              (call.office.org, call.principal)):
            result = await _call_tool(call, name, raw)
        metrics.TOOL_CALLS.labels(tool=known, outcome="ok").inc()
        return result
    except ForgeError as exc:
        failed = forge_refusal(exc, name)
        metrics.TOOL_CALLS.labels(tool=known, outcome=failed.code).inc()
        await _shape_error(call, name, failed)
        raise failed from exc
    except VaultmailError as exc:
        metrics.TOOL_CALLS.labels(tool=known, outcome=exc.code).inc()
        await _shape_error(call, name, exc)
        raise


async def still_acting(call: Call) -> None:
    """After a long poll's sleep, before it looks: the caller may still act (its token not
    revoked nor expired, its principal still in the office), else Unauthenticated saying why,
    so a poll never outlives its right to what it would show."""
    if call.recheck is None:
        return
    try:
        await call.recheck()
    except Denied as exc:  # out of the office (its tokens were revoked as it was found so)
        raise Unauthenticated(exc.message) from exc


async def _shape_error(call: Call, name: str, exc: VaultmailError) -> None:
    if isinstance(exc, Denied) and not exc.ledgered:
        await ledger.record(call.services.store, "run.denied", call.principal,
                            exc.subject or f"tool:{name}", {"reason": exc.message, "tool": name},
                            org=call.office.org)
        exc.ledgered = True
    if call.is_agent and not isinstance(exc, Unauthenticated):  # (never to whom may not read it)
        try:
            exc.extra["inbox"] = await agent_inbox(call)
        except Exception:  # the refusal matters more than the inbox beside it
            log.exception("the inbox for an error result failed", extra={"tool": name})
