"""Tool registry: each tool is a pydantic input model plus one async function.

`call_tool` validates the arguments (an error names the field and what it takes), runs the
tool as a principal, and adds the `inbox` field to every result for an agent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bot.errors import InvalidArguments, NotFoundError
from bot.mail.mailer import Mailer
from bot.office.config import Office

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


@dataclass
class Call:
    """One tool call: who makes it, with the office and forge it acts on."""

    services: Services
    principal: str
    office: Office
    forge: Forge
    # what a tool already computed for the `inbox` field of its own result, by provider name
    inbox_ready: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def mailer(self) -> Mailer:
        return Mailer(self.services, self.forge, self.office)

    @property
    def is_agent(self) -> bool:
        return self.principal.startswith("agent:")


ToolFn = Callable[[Call, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[Args]
    fn: ToolFn


TOOLS: dict[str, Tool] = {}
InboxFn = Callable[[Call], Awaitable[dict[str, Any]]]
_inbox: list[InboxFn] = []


def tool(name: str, args: type[Args], description: str) -> Callable[[ToolFn], ToolFn]:
    def register(fn: ToolFn) -> ToolFn:
        TOOLS[name] = Tool(name, description, args, fn)
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


async def call_tool(call: Call, name: str, raw: Any) -> dict[str, Any]:
    spec = TOOLS.get(name)
    if spec is None:
        raise NotFoundError(f"no tool {name!r}; tools: {', '.join(sorted(TOOLS))}",
                            code="unknown_tool")
    if not isinstance(raw, dict):
        raise InvalidArguments("the arguments must be a JSON object")
    try:
        args = spec.args.model_validate(raw)
    except ValidationError as exc:
        raise InvalidArguments(f"{name}: {_field_errors(exc)}") from exc
    call.inbox_ready.clear()
    result = await spec.fn(call, args)
    if call.is_agent:
        result["inbox"] = await agent_inbox(call)
    return result
