"""The office config (DESIGN §3.2): who works here, their vaults, permissions and capabilities.

Pure: parsing and validation only. Errors name the file, the key and why, all at once.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.names import Behalf, check_name, org_entry

HumanPermission = Literal["mail.send", "editor"]
RunKind = Literal["mail", "chat"]

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,38}$")
MAX_EMAIL = 254  # the longest address a mail path carries (RFC 5321 4.5.3.1.3)
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
MAX_WEBHOOKS = 16  # an office's outbound webhook URLs
_VAULT_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{0,60}\{slug\}[A-Za-z0-9_.-]{0,60}$")


def _is_email(v: str) -> bool:
    """local@domain.tld: no whitespace, one @, a dot inside the domain. In one pass: a
    repository's config is another office's text (a regex for it backtracked quadratically)."""
    local, _, domain = v.partition("@")
    return (bool(local) and "@" not in domain and "." in domain[1:-1]
            and not any(c.isspace() for c in v))


class OfficeConfigError(ValueError):
    """An office config that cannot be used; `errors` lists every problem as 'file: key: why'."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"invalid office config {source}:\n  " + "\n  ".join(errors))


def shortened(error: str, width: int = 400) -> str:
    """One error cut in the middle to `width` characters, for the forge: it may quote any
    value the file holds; its key (first) and its line and column (last) stay."""
    if len(error) <= width:
        return error
    head = (width - 1) // 2
    return error[:head] + "…" + error[len(error) - (width - 1 - head):]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _login(v: str) -> str:
    return check_name(v, "a login")


Login = Annotated[str, AfterValidator(_login)]  # a person's or an agent's forge account


class Human(_Strict):
    email: str
    login: Login
    permissions: list[HumanPermission] = Field(default_factory=list)

    @field_validator("email")
    @classmethod
    def _email(cls, v: str) -> str:
        if len(v) > MAX_EMAIL:
            raise ValueError(f"{v[:40]!r}... is longer than {MAX_EMAIL} characters, the most "
                             "an email address may be")
        if not _is_email(v):
            raise ValueError(f"{v!r} is not an email address")
        return v.lower()

    @property
    def principal(self) -> str:
        return f"human:{self.email}"


PYTHON = "{python}"  # in a dispatch command: the Python that runs vaultmail (sys.executable)
OPERATOR_COMMAND = "command"  # `dispatch: command`: the program the operator set for the agent
COMMANDS_SETTING = "VAULTMAIL_AGENT_COMMANDS"
_DISPATCH_FORMS = ("must be none, repository_dispatch, command, an http(s) URL, or "
                   "{command: [...]}")
# A repository config is written by an org's admin, and one deployment serves many orgs: a
# program it named would run on the app's host, beside the app's keys and database.
_NO_COMMANDS = (
    "a repository config cannot name a command: commands run on the app's host, so they are "
    f"the operator's to set ({COMMANDS_SETTING}: org, agent, command). Write `dispatch: "
    "command` to run the one the operator set for this agent")

# What parsing a config from an org's repository is given (pydantic's validation context):
# `repository` (no commands) and `url_refused` (the operator's outbound policy: why a URL may
# not be sent to on the office's behalf, or None).
UrlCheck = Callable[[str, str], str | None]  # (url, office): bot.app.egress url_refusal


def _context(info: ValidationInfo) -> dict[str, Any]:
    return info.context if isinstance(info.context, dict) else {}


def _from_repository(info: ValidationInfo) -> bool:
    """Whether the config is read as an org's (untrusted): unless the caller said it is the
    operator's (`repository: False`), it is, so a validation that forgets to say names no
    command for the app's host."""
    return _context(info).get("repository") is not False


def _outbound_url(url: str, info: ValidationInfo) -> str:
    context = _context(info)
    check = context.get("url_refused")
    why = check(url, context.get("office", "")) if check is not None else None
    if why:
        raise ValueError(f"{url}: {why}")
    return url


OutboundUrl = Annotated[str, AfterValidator(_outbound_url)]


class CommandDispatch(_Strict):
    """`dispatch: {command: [...]}`: run a local command per run, the run as JSON on stdin."""

    command: list[str] = Field(min_length=1, description=(
        "the program and its arguments, run without a shell; a first word {python} is the "
        "Python that runs vaultmail"))
    timeout: float = Field(default=300.0, gt=0, le=86_400, description=(
        "seconds the command may run before it is stopped"))

    @field_validator("command")
    @classmethod
    def _words(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the first word names the program to run: it must not be empty")
        if any("\x00" in word for word in v):
            raise ValueError("words must not contain NUL characters")
        return v


def _dispatch_form(v: Any) -> str | None:
    if isinstance(v, dict | CommandDispatch):
        return "command"
    return "url" if isinstance(v, str) else None


# The union's tags show up in error locations; `_locate` leaves them out.
_UNION_TAGS = {("dispatch", "url"), ("dispatch", "command")}
Dispatch = Annotated[
    Annotated[str, Tag("url")] | Annotated[CommandDispatch, Tag("command")],
    Discriminator(_dispatch_form, custom_error_type="dispatch",
                  custom_error_message=_DISPATCH_FORMS),
]


class RunConfig(_Strict):
    triggers: list[RunKind] = Field(default_factory=lambda: list[RunKind](["mail"]))
    dispatch: Dispatch = "none"

    @field_validator("dispatch", mode="before")
    @classmethod
    def _no_command_from_a_repository(cls, v: Any, info: ValidationInfo) -> Any:
        if _from_repository(info) and isinstance(v, dict | CommandDispatch):
            raise ValueError(_NO_COMMANDS)
        return v

    @field_validator("dispatch")
    @classmethod
    def _dispatch(cls, v: str | CommandDispatch,
                  info: ValidationInfo) -> str | CommandDispatch:
        if isinstance(v, CommandDispatch):
            return v
        if v in ("none", "repository_dispatch", OPERATOR_COMMAND):
            return v
        if v.startswith(("http://", "https://")):
            return _outbound_url(v, info)
        raise ValueError(_DISPATCH_FORMS)


class Agent(_Strict):
    slug: str
    login: Login
    person: str | None = None
    vault: str | None = None
    run: RunConfig = Field(default_factory=RunConfig)
    capabilities: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("slug")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _SLUG.match(v):
            raise ValueError("must be lowercase letters, digits and dashes (at most 39)")
        return v

    @field_validator("vault")
    @classmethod
    def _vault(cls, v: str | None) -> str | None:
        if v is not None and not _REPO.match(v):
            raise ValueError("must be owner/repo")
        return v

    @property
    def principal(self) -> str:
        return f"agent:{self.slug}"

    def may_mail(self, recipient_slug: str) -> bool:
        allowed = self.capabilities.get("mail.send", [])
        return "*" in allowed or recipient_slug in allowed


_HOSTNAME = re.compile(r"^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_LOCAL_PART = re.compile(r"^[a-z0-9](?:[a-z0-9._+-]{0,62}[a-z0-9])?$")


_EMAIL_SEND = re.compile(
    r"^email:(\*|@[a-z0-9-]+(\.[a-z0-9-]+)+|[^@\s]+@[a-z0-9-]+(\.[a-z0-9-]+)+)$")
_ACCEPT_ENTRY = re.compile(r"^(@?[a-z0-9-]+(\.[a-z0-9-]+)+|[^@\s]+@[a-z0-9-]+(\.[a-z0-9-]+)+)$")


class EmailPolicy(_Strict):
    """Who outside may write to one agent by email (bot/email/policy.py): `accept` anyone,
    the office only (the humans' addresses), or the listed domains (`example.org`, also its
    subdomains) and addresses; mail from anyone else is refused at SMTP time or held
    (`otherwise`); `wake`: whether outside mail starts a run."""

    accept: Literal["anyone", "office"] | list[str] = "anyone"
    otherwise: Literal["refuse", "hold"] = "refuse"
    wake: bool = True

    @field_validator("accept")
    @classmethod
    def _entries(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str):
            return v
        lowered = [e.strip().lower() for e in v]
        bad = [e for e in lowered if not _ACCEPT_ENTRY.match(e)]
        if bad:
            raise ValueError(f"{bad[0]!r} is neither a domain (example.org) nor an address "
                             "(bob@example.org)")
        return lowered


class EmailConfig(_Strict):
    """`email:` real mailboxes (bot/email): each agent is reachable at `<slug>@<domain>` and
    at each of its `aliases` (`{slug: [local part, ...]}`). Where the SMTP listener and the
    relay are is the operator's (host settings), never the repository's."""

    domain: str
    aliases: dict[str, list[str]] = Field(default_factory=dict)
    policy: dict[str, EmailPolicy] = Field(default_factory=dict)  # agent slug -> its policy

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        v = v.strip().lower().rstrip(".")
        if not _HOSTNAME.match(v):
            raise ValueError(f"{v!r} is not a mail domain (like mail.acme.example)")
        return v

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for slug, parts in v.items():
            lowered = [p.strip().lower() for p in parts]
            bad = [p for p in lowered if not _LOCAL_PART.match(p)]
            if bad:
                raise ValueError(f"{slug}: {bad[0]!r} is not a local part (letters, digits, "
                                 "dots, dashes, plus and underscores)")
            out[slug] = lowered
        return out


class Office(_Strict):
    org: str
    vault_pattern: str = "{slug}-vault"
    humans: list[Human] = Field(default_factory=list)
    teams: dict[str, list[str]] = Field(default_factory=dict)
    agents: list[Agent] = Field(default_factory=list)
    # (each URL has a sender of its own: a few per office, not a list an org makes long)
    webhooks: list[OutboundUrl] = Field(default_factory=list, max_length=MAX_WEBHOOKS)
    email: EmailConfig | None = None
    # the org's issue type for each item kind, where it names its own (bot/items/model.py;
    # without it: Goal, Outcome, Plan, Evidence), e.g. {outcome: Epic, plan: Task}
    item_types: dict[Literal["goal", "outcome", "plan", "evidence"], str] = Field(
        default_factory=dict)
    # how the forge shows an outcome whose open questions wait on someone (bot/items/waiting.py):
    # "dependency", blocked by a "Waiting on <who>" tracking issue while a question waits,
    # cleared once it is answered; "field", the org's "Waiting on" issue field (GitHub) names
    # who instead; "none" (the default, the least noise): nothing in the forge
    waiting: Literal["dependency", "field", "none"] = "none"

    @field_validator("org")
    @classmethod
    def _org(cls, v: str) -> str:
        return check_name(v, "an organisation's name")

    @field_validator("vault_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        # a repository name with {slug} once in it, filled by replacement (never str.format:
        # a field's width or index in the org's file would be the host's work)
        if not _VAULT_PATTERN.match(v):
            raise ValueError("must be a repository name with {slug} once in it (letters, "
                             "digits, '-', '_' and '.' around it), e.g. {slug}-vault")
        return v

    @model_validator(mode="after")
    def _cross_refs(self) -> Office:
        emails = {h.email for h in self.humans}
        slugs = [a.slug for a in self.agents]
        problems: list[str] = []
        if len(set(slugs)) != len(slugs):
            problems.append("agents: slugs must be unique")
        logins = [h.login for h in self.humans] + [a.login for a in self.agents]
        if len(set(logins)) != len(logins):
            problems.append("logins must be unique across humans and agents")
        for team, members in self.teams.items():
            for m in members:
                if m.lower() not in emails:
                    problems.append(f"teams.{team}: {m} is not one of the humans")
        for i, a in enumerate(self.agents):
            if a.person is not None and a.person.lower() not in emails:
                problems.append(f"agents[{i}].person: {a.person} is not one of the humans")
            for who in a.capabilities.get("mail.send", []):
                if who.startswith("email:"):  # mail to outside addresses (bot/email/sending)
                    if not _EMAIL_SEND.match(who):
                        problems.append(f"agents[{i}].capabilities.mail.send: {who!r} is not "
                                        "email:*, email:@domain or email:address")
                elif who != "*" and who not in slugs:
                    problems.append(f"agents[{i}].capabilities.mail.send: no agent {who!r}")
        if self.email is not None:
            taken = set(slugs)
            for slug, parts in self.email.aliases.items():
                if slug not in slugs:
                    problems.append(f"email.aliases.{slug}: no agent {slug!r}")
                for part in parts:
                    if part in taken:
                        problems.append(f"email.aliases.{slug}: {part}@{self.email.domain} "
                                        "is already another address of this office")
                    taken.add(part)
            problems += [f"email.policy.{slug}: no agent {slug!r}"
                         for slug in self.email.policy if slug not in slugs]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- lookups -------------------------------------------------------------------------
    def vault_of(self, agent: Agent) -> str:
        return agent.vault or f"{self.org}/{self.vault_pattern.replace('{slug}', agent.slug)}"

    def agent(self, slug: str) -> Agent | None:
        return _lookups(self).agents.get(slug)

    def human(self, email: str) -> Human | None:
        return _lookups(self).humans.get(email.lower())

    def by_login(self, login: str) -> Human | Agent | None:
        return _lookups(self).logins.get(login.lower())

    def agent_for_vault(self, full_name: str) -> Agent | None:
        return _lookups(self).vaults.get(full_name.lower())

    def vaults(self) -> list[str]:
        return [self.vault_of(a) for a in self.agents]


@dataclass(frozen=True)
class _Lookups:
    """An office's members by what each lookup goes by, the first in the file winning as a
    pass over the lists would (an office may list 10,000 people: each delivery looks its
    sender up, and more)."""

    agents: dict[str, Agent]
    humans: dict[str, Human]
    logins: dict[str, Human | Agent]
    vaults: dict[str, Agent]

    @classmethod
    def of(cls, office: Office) -> _Lookups:
        agents: dict[str, Agent] = {}
        humans: dict[str, Human] = {}
        logins: dict[str, Human | Agent] = {}
        vaults: dict[str, Agent] = {}
        for h in office.humans:
            humans.setdefault(h.email, h)
            logins.setdefault(h.login.lower(), h)
        for a in office.agents:
            agents.setdefault(a.slug, a)
            logins.setdefault(a.login.lower(), a)
            vaults.setdefault(office.vault_of(a).lower(), a)
        return cls(agents, humans, logins, vaults)


# id(office) -> its lookups, for as long as it lives (an Office is frozen: made once each).
# Not an attribute of the model: pydantic compares those, and offices are compared.
_LOOKUPS: dict[int, _Lookups] = {}


def _lookups(office: Office) -> _Lookups:
    found = _LOOKUPS.get(id(office))
    if found is None:
        found = _LOOKUPS[id(office)] = _Lookups.of(office)
        weakref.finalize(office, _LOOKUPS.pop, id(office), None)
    return found


def _locate(loc: tuple[int | str, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if i and (loc[i - 1], part) in _UNION_TAGS:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


MAX_DEPTH = 32  # an office config nests a few levels; one nested far deeper is none
# What an org's file may make the host build, in the one process every office shares. A real
# office's config is a few KB: tens of people and agents, a few hundred values.
MAX_CONFIG_BYTES = 2 * 1024 * 1024
MAX_VALUES = 250_000  # keys, values and list entries, an alias counted as all its anchor holds
MAX_AGENTS = 1_000  # (and so vaults: one an agent)
MAX_HUMANS = 10_000
MAX_ENTRIES = 10_000  # in any one list or mapping


_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # (without libyaml: Python's)


def too_big(source: str) -> str:
    """The error of a config over MAX_CONFIG_BYTES (the forge's refused unread: `source`)."""
    return (f"{source}: more than {MAX_CONFIG_BYTES:,} bytes (2 MiB), the most a config may "
            "be: a real office's is a few KB; remove what is not the office's")


def _beyond_limits(text: str, source: str) -> str | None:
    """Why `text` is more YAML than a config may be, and where, if it is: too many bytes, too
    deep, or too many values once its aliases are expanded. Read as a stream of events,
    without building it: building recurses once per level, and an alias is one event however
    much its anchor holds (PyYAML shares it, but validation copies each use: n aliases of n
    aliases of a list of n are n³ values from n² bytes)."""
    head = text[:MAX_CONFIG_BYTES + 1].encode("utf-8", "replace")  # (past it: over, whatever)
    if len(head) > MAX_CONFIG_BYTES:
        line = head[:MAX_CONFIG_BYTES].count(b"\n") + 1
        return f"{too_big(source)} (line {line}, column 1)"
    try:  # libyaml's events (it keeps its own stack, no recursion); Python's where it refuses
        return _count_events(yaml.parse(text, Loader=_FAST_LOADER), source)
    except yaml.YAMLError:
        return _count_events(yaml.parse(text, Loader=yaml.SafeLoader), source)


def _count_events(events: Iterator[yaml.Event], source: str) -> str | None:
    values = through_aliases = 0
    open_: list[tuple[str | None, int]] = []  # each collection open: its anchor, values before
    held: dict[str, int] = {}  # each anchor closed: the values it holds, its aliases expanded
    for event in events:
        alias = None
        if isinstance(event, yaml.AliasEvent):
            alias = event.anchor
            if any(anchor == alias for anchor, _ in open_):  # (then nothing could walk it)
                return (f"{source}: *{alias} is inside &{alias}, a value that holds itself: "
                        f"write it out instead{_at(event.start_mark)}")
            size = held.get(alias or "", 1)
            values, through_aliases = values + size, through_aliases + size
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
            if event.anchor:
                held[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(open_) == MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else 1
                return (f"{source}: nested more than {MAX_DEPTH} levels deep: an office config "
                        f"is a mapping of lists of mappings (line {line}, column 1)")
            if event.anchor:
                held.pop(event.anchor, None)  # (a name used again: the new one from here)
            open_.append((event.anchor, values))
            values += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, before = open_.pop()
            if anchor:
                held[anchor] = values - before
        if values > MAX_VALUES:
            if alias is not None:
                return (f"{source}: holds more than {MAX_VALUES:,} values once its aliases are "
                        f"expanded (*{alias} repeats all that &{alias} holds, each time): write "
                        f"it without repeating a large anchor{_at(event.start_mark)}")
            if through_aliases:
                return (f"{source}: holds more than {MAX_VALUES:,} values once its aliases are "
                        f"expanded ({through_aliases:,} through aliases): write it without "
                        f"repeating a large anchor{_at(event.start_mark)}")
            return (f"{source}: holds more than {MAX_VALUES:,} values (keys, values and list "
                    "entries), the most a config may: a real office's holds a few hundred; "
                    f"remove what is not the office's{_at(event.start_mark)}")
    return None


def _unreadable_value(text: str) -> str:
    """Where a scalar that YAML reads as a date, but that is none (2001-13-01), sits."""
    loader = yaml.SafeLoader(text)
    try:
        nodes, seen = [loader.get_single_node()], set()
        while nodes:
            node = nodes.pop()
            if id(node) in seen:  # an alias: looked at already
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode):
                try:
                    loader.construct_object(node)
                except ValueError as exc:
                    return (f"{node.value!r} reads as a date or time but is none ({exc}): "
                            f"quote it if it is text{_at(node.start_mark)}")
            elif isinstance(node, yaml.SequenceNode):
                nodes.extend(node.value)
            elif isinstance(node, yaml.MappingNode):
                nodes.extend(part for pair in node.value for part in pair)
    finally:
        loader.dispose()
    return "a value cannot be read"


class _Mark(Protocol):  # a place in the file, as Python's parser and libyaml's give it
    line: int
    column: int


def _at(mark: _Mark | None) -> str:
    """Where in the file, as every error says it."""
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's complaint in one line, with its line and column."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc)
    what = exc.problem or "cannot be read"
    if exc.context:
        started = _at(exc.context_mark).strip(" ()").replace("line", "at line", 1)
        what += f", {exc.context}" + (f" {started}" if started else "")
    return what + _at(exc.problem_mark)


def _load_yaml(text: str, source: str) -> Any:
    try:
        beyond = _beyond_limits(text, source)
        if beyond is not None:
            raise OfficeConfigError(source, [beyond])
        try:  # libyaml's parser, ten times as fast; its refusals are read again below
            return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 (a safe loader)
        except yaml.YAMLError:
            pass
        return yaml.safe_load(text)  # what is wrong, in the words every error here uses
    except yaml.YAMLError as exc:
        raise OfficeConfigError(source, [f"{source}: not valid YAML: {_yaml_problem(exc)}"]) \
            from exc
    except OfficeConfigError:
        raise
    except ValueError as exc:  # a scalar YAML takes for a date that does not exist
        raise OfficeConfigError(source, [
            f"{source}: not valid YAML: {_unreadable_value(text)}"]) from exc


_PATH_PART = re.compile(r"\[(\d+)\]|\.?([^.\[\]]+)")
_PATH_FIRST = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*(?:\[\d+\]|\.[^\s.:\[\]]+)*): (.+)$", re.S)


def _path(text: str) -> list[int | str]:
    """`agents[0].capabilities.mail.send` as its parts (a key with a dot is joined again
    where the file has one)."""
    return [int(i) if i is not None else key for i, key in
            ((m.group(1), m.group(2)) for m in _PATH_PART.finditer(text))]


def node_at(root: yaml.Node | None, loc: list[int | str] | tuple[int | str, ...], *,
            key: bool = False) -> yaml.Node | None:
    """The YAML node `loc` leads to, or the deepest one on the way that the file has (a
    missing key: the mapping that lacks it); `key`: the last part's key rather than its
    value (a key that is not allowed)."""
    node, rest = root, list(loc)
    while node is not None and rest:
        if isinstance(node, yaml.SequenceNode) and isinstance(rest[0], int):
            if not 0 <= rest[0] < len(node.value):
                return node
            node, rest = node.value[rest[0]], rest[1:]
        elif isinstance(node, yaml.MappingNode):
            # the longest run of parts that is one key (`mail.send`)
            for n in range(len(rest), 0, -1):
                name = ".".join(str(p) for p in rest[:n])
                found = next(((k, v) for k, v in node.value
                              if isinstance(k, yaml.ScalarNode) and k.value == name), None)
                if found is not None:
                    rest = rest[n:]
                    node = found[0] if key and not rest else found[1]
                    break
            else:
                if isinstance(rest[0], str) and len(rest) > 1:
                    rest = rest[1:]  # a union's tag (dispatch.url): not in the file
                    continue
                return node
        else:
            return node
    return node


def _compose(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, ValueError, RecursionError):
        return None


def _schema_errors(exc: ValidationError, text: str, source: str) -> list[str]:
    """Each error as `file: key: why (line L, column C)`; a check across keys (the office's
    own validator) is split into its problems, each at the key it names."""
    root = _compose(text)
    start = root.start_mark if root is not None else None
    errors: list[str] = []
    for e in exc.errors():
        loc = tuple(e["loc"])
        if loc or not e["msg"].startswith("Value error, "):
            node = node_at(root, loc, key=e["type"] == "extra_forbidden")
            errors.append(f"{source}: {_locate(loc)}: {e['msg']}"
                          f"{_at(node.start_mark if node is not None else start)}")
            continue
        for problem in e["msg"].removeprefix("Value error, ").split("; "):
            named = _PATH_FIRST.match(problem)
            if named:
                node = node_at(root, _path(named.group(1)))
                errors.append(f"{source}: {named.group(1)}: {named.group(2)}"
                              f"{_at(node.start_mark if node is not None else start)}")
            else:
                errors.append(f"{source}: (top level): {problem}{_at(start)}")
    return errors


def locate_errors(text: str, source: str, problems: list[tuple[str, str]]) -> list[str]:
    """`(key path, why)` problems found after parsing, located in `text` like the schema's."""
    root = _compose(text)
    start = root.start_mark if root is not None else None
    out = []
    for where, why in problems:
        node = node_at(root, _path(where))
        out.append(f"{source}: {where}: {why}{_at(node.start_mark if node else start)}")
    return out


_PER_OFFICE = {  # key: (limit, what it holds, whose limit that is and what to do)
    "agents": (MAX_AGENTS, "agents (a vault each)",
               "an office may have: keep those in use, or give some an org of their own"),
    "humans": (MAX_HUMANS, "people",
               "an office may have: list only those who work with its agents")}
_PER_LIST = (MAX_ENTRIES, "entries", "one list or mapping may hold: keep the entries in use")


def _too_many(raw: dict[Any, Any]) -> list[tuple[str, str]]:
    """`(key path, why)` for each list or mapping past its limit: the agents, the people, or
    any other's entries. (`raw` is within MAX_VALUES, its aliases expanded, and holds no
    cycle: walked whole.)"""
    problems: list[tuple[str, str]] = []
    todo: list[tuple[str, Any]] = [("", raw)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, dict):
            todo += [(f"{where}.{k}" if where else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        limit, what, then = _PER_OFFICE.get(where, _PER_LIST)
        if len(value) > limit:
            problems.append((where, f"{len(value):,} {what}, more than the {limit:,} {then}"))
    return sorted(problems)


def parse_office(text: str, source: str = "office.yml", *, repository: bool,
                 url_refused: UrlCheck | None = None, office: str | None = None) -> Office:
    """Parse and validate; raise OfficeConfigError listing every problem with its location:
    the key, and the line and column in the file.

    `repository`: the config comes from an org's repository, not from the operator, so it may
    not name a command (no default: each caller says whose text it reads, the operator's side
    never taken by leaving it out); `url_refused`: why the operator's policy refuses a URL (a
    dispatch URL or a webhook) on behalf of `office`, the org whose config this is (by
    default, the org the file says: what the operator allowed another office is not this
    one's), or None."""
    raw = _load_yaml(text, source)
    if not isinstance(raw, dict):
        raise OfficeConfigError(source, [f"{source}: (top level): must be a mapping with org:"
                                         f"{_at(getattr(_compose(text), 'start_mark', None))}"])
    too_many = _too_many(raw)
    if too_many:
        raise OfficeConfigError(source, locate_errors(text, source, too_many))
    try:
        said = raw.get("org")
        whose = office if office is not None else said if isinstance(said, str) else ""
        return Office.model_validate(raw, context={"repository": repository,
                                                   "url_refused": url_refused,
                                                   "office": whose})
    except ValidationError as exc:
        raise OfficeConfigError(source, _schema_errors(exc, text, source)) from exc


def load_office(path: str | Path | None = None) -> Office:
    """Load an office file, or the built-in example office when path is None."""
    if path is None:
        text = resources.files("bot").joinpath("example_office.yml").read_text()
        return parse_office(text, "built-in example office", repository=False)
    p = Path(path)  # a file the operator named (--office, VAULTMAIL_OFFICE): theirs
    return parse_office(p.read_text(), str(p), repository=False)


# -- the operator's commands (VAULTMAIL_AGENT_COMMANDS) -----------------------------------------

_COMMANDS = TypeAdapter(dict[str, dict[str, CommandDispatch]])


@dataclass(frozen=True)
class AgentCommands:
    """Which agent of which org may run which program on the app's host: the operator's
    setting, never a repository's. An agent whose config says `dispatch: command` runs the
    one set here for its org and slug. An org is written by its login (`acme`: bound to the
    first forge account the index recorded under the login, as VAULTMAIL_OUTBOUND_ALLOW's
    are: bot.names.Behalf) or with its account (`acme#1234`)."""

    by_org: Mapping[str, Mapping[str, CommandDispatch]] = field(default_factory=dict)

    def command_for(self, office: Behalf, slug: str) -> CommandDispatch | None:
        """The program set for `office`'s agent `slug`: the one under its org and account
        (`acme#1234`), else under its login alone (`acme`) where the login is bound to its
        account. A login another account held first runs nothing of what was set for it."""
        found = [(entry[1] is None, cmds[slug]) for org, cmds in self.by_org.items()
                 if slug in cmds and (entry := org_entry(org)) is not None
                 and office.is_for(entry)]
        return min(found, key=lambda f: f[0])[1] if found else None

    def by_login(self, org: str) -> list[str]:
        """The agents of `org` given a program under its login alone (`acme:`): those bound to
        the first account the index recorded under the login."""
        return sorted({slug for key, cmds in self.by_org.items()
                       if org_entry(key) == (org.lower(), None) for slug in cmds})

    def merged(self, other: AgentCommands) -> AgentCommands:
        """These commands with `other`'s added (an agent in both: `other`'s)."""
        out: dict[str, dict[str, CommandDispatch]] = {}
        for by_org in (self.by_org, other.by_org):
            for org, cmds in by_org.items():
                out.setdefault(org.lower(), {}).update(cmds)
        return AgentCommands(out)


def parse_agent_commands(text: str, source: str) -> AgentCommands:
    """A commands file: `org: {slug: {command: [words], timeout: seconds}}`, each org by its
    login (`acme`) or with its forge account id (`acme#1234`). OfficeConfigError lists every
    problem as `file: key: why`."""
    raw = _load_yaml(text, source)
    if raw is None:
        return AgentCommands()
    try:
        parsed = _COMMANDS.validate_python(raw)
    except ValidationError as exc:
        errors = [f"{source}: {_locate(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise OfficeConfigError(source, errors) from exc
    errors = [f"{source}: {org}: not an org as the forge spells it (acme), nor one with its "
              "forge account id, a number from 1 (acme#1234)"
              for org in parsed if org_entry(org) is None]
    errors += [f"{source}: {org}.{slug}: not an agent slug (lowercase letters, digits and "
               "dashes)" for org, cmds in parsed.items() for slug in cmds
               if not _SLUG.match(slug)]
    if errors:
        raise OfficeConfigError(source, errors)
    out: dict[str, dict[str, CommandDispatch]] = {}
    for org, cmds in parsed.items():  # (Acme and acme are one org: the forge's logins are)
        login, account = org_entry(org) or (org, None)
        out.setdefault(login if account is None else f"{login}#{account}", {}).update(cmds)
    return AgentCommands(out)


def load_agent_commands(path: str | Path) -> AgentCommands:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise OfficeConfigError(str(p), [f"{p}: cannot be read ({exc.strerror or exc})"]) from exc
    return parse_agent_commands(text, str(p))


def repository_form(office: Office) -> tuple[Office, AgentCommands]:
    """An office from the operator's own file, as it is put in an org's repository: each
    `{command: [...]}` becomes `dispatch: command`, and the commands go to the operator's
    setting (the embedded default and `vaultmail forge --seed` set a forge up this way)."""
    commands: dict[str, CommandDispatch] = {}
    agents = []
    for agent in office.agents:
        if isinstance(agent.run.dispatch, CommandDispatch):
            commands[agent.slug] = agent.run.dispatch
            run = agent.run.model_copy(update={"dispatch": OPERATOR_COMMAND})
            agent = agent.model_copy(update={"run": run})
        agents.append(agent)
    found = AgentCommands({office.org.lower(): commands} if commands else {})
    return office.model_copy(update={"agents": agents}), found
