"""Hold the local forge to GitHub's official API descriptions.

Loads the vendored REST subset (OpenAPI 3.0.3) and webhooks subset (OpenAPI 3.1) once per
process and checks:

- ``validate_response(method, url_or_template, status, headers, body)``: the operation exists,
  the status is documented for it, the body matches the response schema (or is empty where no
  content is documented), and the documented headers are present and well-formed;
- ``validate_webhook(event, action, payload, headers=..., secret=...)``: the payload matches
  ``webhook-<event>-<action>`` and the 7 headers the description marks required are present,
  with the HMAC verified when the secret is given;
- ``compare_keys_with_examples(event, action, payload)``: key sets of the payload and of its
  main objects against GitHub's real example payloads.

Schemas do not forbid extra properties, so a schema check catches a missing or mistyped field,
not an invented one: the key comparison covers that side.

Deviations of real GitHub from its own description are accepted only where a named entry of
``KNOWN_DRIFTS`` says so, for one field and one kind of error, never by loosening a check.

Both validators are plain jsonschema validators (openapi-schema-validator's OAS 3.0 dialect
for REST, Draft 2020-12 for webhooks) over the component tree, built once: a check costs
well under 10 ms warm.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend
from openapi_schema_validator import OAS30ReadValidator, OAS30WriteValidator
from rfc3339_validator import validate_rfc3339

DATA = Path(__file__).parent / "data"

__all__ = [
    "KNOWN_DRIFTS",
    "STALE_EXAMPLE_FIELDS",
    "ALLOWED_EXTRA_KEYS",
    "ConformanceError",
    "STATS",
    "check_component",
    "check_request_body",
    "check_response",
    "check_webhook",
    "compare_keys_with_examples",
    "examples",
    "find_operation",
    "rest_operations",
    "validate_response",
    "validate_webhook",
    "verify_signature",
    "webhook_names",
]


class ConformanceError(AssertionError):
    """A response or payload that does not conform; the message lists every problem."""


# --------------------------------------------------------------------------------------------
# Figures for the lead (printed by conftest.pytest_terminal_summary)


@dataclass
class Stats:
    operations: set[str] = field(default_factory=set)  # operationIds with a valid response
    by_version: dict[str, set[str]] = field(default_factory=dict)  # API version -> the same
    responses: int = 0  # responses validated
    statuses: set[tuple[str, int]] = field(default_factory=set)  # (operationId, status)
    webhooks: int = 0  # webhook payloads validated (forge's, not the examples)
    webhook_names: set[str] = field(default_factory=set)  # e.g. "issues-opened"
    drifts_applied: Counter[str] = field(default_factory=Counter)  # drift name -> uses
    allowances_applied: Counter[str] = field(default_factory=Counter)  # ALLOWED_EXTRA_KEYS


STATS = Stats()


# --------------------------------------------------------------------------------------------
# Formats. jsonschema checks no format unless told; these are the ones GitHub's payloads
# rely on. uri: absolute (RFC 3986: a scheme, then no spaces), so a relative path fails.


FORMATS = FormatChecker(formats=())


@FORMATS.checks("date-time")
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or bool(validate_rfc3339(value))


@FORMATS.checks("uri")
def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    parts = urlsplit(value)
    if parts.scheme in ("http", "https"):
        return bool(parts.netloc) and not any(c in value for c in " \t\n<>\"")
    return re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*:[^\s]+", value) is not None


@FORMATS.checks("email")
def _is_email(value: object) -> bool:
    return not isinstance(value, str) or re.fullmatch(r"[^@\s]+@[^@\s]+", value) is not None


# --------------------------------------------------------------------------------------------
# Known drifts: real GitHub payloads differ from GitHub's own description. Each entry is one
# field and one kind of error, with why. Never loosen a check globally.


@dataclass(frozen=True)
class Drift:
    name: str
    why: str
    scope: str  # fnmatch on "webhook:<event>-<action>" or "rest:<operationId>"
    where: str  # regex, full match on the error's field path ("installation/created_at")
    keyword: str  # the jsonschema keyword that fails: type, format, required, enum
    accepts: Callable[[Any], bool] = lambda value: True  # the offending value it allows

    def covers(self, scope: str, fieldpath: str, keyword: str, value: Any) -> bool:
        return (
            fnmatchcase(scope, self.scope)
            and keyword == self.keyword
            and re.fullmatch(self.where, fieldpath) is not None
            and self.accepts(value)
        )


def _is_epoch(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1_000_000_000


KNOWN_DRIFTS: tuple[Drift, ...] = (
    Drift(
        name="installation-epoch-timestamps",
        why=(
            "real installation payloads carry installation.created_at/updated_at as epoch "
            "integers (every installation and installation_repositories example does); the "
            "official webhooks description types them as date-time strings"
        ),
        scope="webhook:installation*",
        where=r"installation/(created_at|updated_at)",
        keyword="type",
        accepts=_is_epoch,
    ),
    Drift(
        name="repository-homepage-empty-string",
        why=(
            "GitHub sends homepage \"\" for a repository whose homepage was cleared (examples "
            "label-created and issues-transferred); the description says format uri"
        ),
        scope="webhook:*",
        where=r"(.*/)?(repository|new_repository)/homepage",
        keyword="format",
        accepts=lambda value: value == "",
    ),
    Drift(
        name="list-installations-account-allOf",
        why=(
            "the description inlines installation.account for GET /app/installations as "
            "allOf[simple-user, enterprise] (elsewhere anyOf), so a user or organisation "
            "account would need an enterprise's name/slug/created_at/updated_at; GitHub's own "
            "example response for the operation lacks them"
        ),
        scope="rest:apps/list-installations",
        where=r"\d+/account/(name|slug|created_at|updated_at)",
        keyword="required",
    ),
)

# Fields the official description requires that the real examples, being older than the
# requirement, do not carry. Accepted on the examples only: the forge must send them.
_STALE = ("required by the current webhooks description; some of the older real examples "
          "do not carry it")
STALE_EXAMPLE_FIELDS: tuple[Drift, ...] = (
    Drift("stale:installation.app_slug", _STALE, "webhook:installation*",
          r"installation/app_slug", "required"),
    Drift("stale:installation.suspension", _STALE, "webhook:installation*",
          r"installation/(suspended_by|suspended_at)", "required"),
    Drift("stale:installation_repositories.requester", _STALE,
          "webhook:installation-repositories-*", r"requester", "required"),
    Drift("stale:comment.app-and-reactions", _STALE, "webhook:issue-comment-*",
          r"comment/(performed_via_github_app|reactions)", "required"),
    Drift("stale:issue.lock-and-reactions", _STALE, "webhook:issue*",
          r"issue/(active_lock_reason|reactions)", "required"),
    Drift("stale:label.description", _STALE, "webhook:*",
          r"(issue/labels/\d+|label)/description", "required"),
    Drift("stale:repository.has_discussions", _STALE, "webhook:issues-transferred",
          r"changes/new_repository/has_discussions", "required"),
    # required since the description of 2026 (data/patch_newer.py); no real example has them
    Drift("stale:label.archived", _STALE, "webhook:*",
          r"(issue/labels/\d+|label)/(archived_at|archived_by)", "required"),
)

# Two readings of the REST description that are not drifts of GitHub but of the description's
# own conventions; named here so that the figures list them.
SPEC_PATCHES: tuple[tuple[str, str], ...] = (
    ("nullable-enum-null", "slice_rest.py appends null to the 6 enums marked nullable that "
     "leave it out (issue.state_reason among them), in data/github-rest-subset.json"),
    ("nullable-composition", "GitHub writes {nullable: true, allOf|anyOf|oneOf: [...]} for "
     "optional objects; OAS 3.0.3 honours nullable only beside type, so the validator "
     "accepts null there (_nullable_composition)"),
)

# Keys our payloads may carry although neither the official description declares them there
# nor (for webhooks) a real payload has them. Keys the description declares are accepted
# without being listed (GitHub lists them itself). Entries: "rest:<operationId>:<path>",
# "webhook:<name>:<path>" or, for the section comparison, "<section>/<key>" -> why.
# Patterns are fnmatch-style.
ALLOWED_EXTRA_KEYS: dict[str, str] = {
    "rest:*:status": (
        "GitHub's error bodies carry status, the HTTP code as a string (e.g. a real 422: "
        "{message, errors, documentation_url, status: \"422\"}, r-lib/gh#229); basic-error "
        "declares it, validation-error does not"),
    "rest:apps/list-installations:[]/client_id": (
        "the installation component declares client_id; the copy inlined for GET "
        "/app/installations is older and lacks it"),
    "rest:*:*labels[]/archived_at": (
        "the newest description (data/patch_newer.py) declares archived_at on the label "
        "component and on the labels of webhook issues, but on a REST issue's labels only "
        "archived_by; GitHub renders both with one label serializer"),
    "webhook:issue*:issue/labels[]/archived_*": (
        "the newest webhooks description requires archived_at/archived_by on every label "
        "object and on the issue's labels in issues-labeled, but its other issue events still "
        "inline an older label; GitHub renders an issue's labels one way in all of them"),
    "rest:apps/list-installations:[]/account/user_view_type": (
        "simple-user declares user_view_type (GitHub sends \"public\"); the user inlined in "
        "GET /app/installations' account is an older copy without it"),
    "rest:apps/list-installations:[]/suspended_by/user_view_type": (
        "as the account's: a suspended installation's suspended_by there is the same older "
        "copy of simple-user"),
}


def _allowed_extra(key: str) -> bool:
    for pattern in ALLOWED_EXTRA_KEYS:
        if fnmatchcase(key, pattern):
            STATS.allowances_applied[pattern] += 1
            return True
    return False


# --------------------------------------------------------------------------------------------
# REST


def _nullable_composition(keyword: Callable[..., Iterable[ValidationError]]) -> Callable:
    """GitHub writes ``{"nullable": true, "allOf": [{"$ref": ...}]}`` (and anyOf/oneOf) for
    optional objects: null is meant to be valid there. OAS 3.0.3 only honours ``nullable``
    beside ``type``, so apply it to the composition keywords of the same schema object."""

    def check(validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]):
        if instance is None and schema.get("nullable") is True:
            return
        yield from keyword(validator, value, instance, schema)

    return check


def _oas30(base: Any) -> Any:
    return extend(
        base,
        {k: _nullable_composition(base.VALIDATORS[k]) for k in ("allOf", "anyOf", "oneOf")},
    )


_OAS30Read = _oas30(OAS30ReadValidator)
_OAS30Write = _oas30(OAS30WriteValidator)


@dataclass(frozen=True, eq=False)
class Operation:
    method: str
    template: str
    operation_id: str
    regex: re.Pattern[str]
    literals: int
    spec: Mapping[str, Any]
    version: str = "2022-11-28"

    def response(self, status: int) -> Mapping[str, Any] | None:
        responses = self.spec["responses"]
        found = responses.get(str(status)) or responses.get(f"{str(status)[0]}XX")
        if found is None:
            found = responses.get("default")
        return _deref(rest_spec(self.version), found) if found is not None else None


def _deref(spec: Mapping[str, Any], obj: Any) -> Any:
    while isinstance(obj, dict) and "$ref" in obj and len(obj) == 1:
        _, _, kind, name = obj["$ref"].split("/", 3)
        obj = spec["components"][kind][name]
    return obj


# The REST API versions GitHub serves, each with its own description (data/PROVENANCE.md).
API_VERSIONS = ("2022-11-28", "2026-03-10")
REST_FILES = {"2022-11-28": "github-rest-subset.json",
              "2026-03-10": "github-rest-subset-2026-03-10.json"}


@cache
def rest_spec(version: str = "2022-11-28") -> dict[str, Any]:
    with open(DATA / REST_FILES[version], encoding="utf-8") as f:
        return json.load(f)


@cache
def rest_operations(version: str = "2022-11-28") -> tuple[Operation, ...]:
    ops = []
    for template, item in rest_spec(version)["paths"].items():
        pattern = ""
        literals = 0
        for seg in template.strip("/").split("/"):
            if seg == "{path}":
                pattern += "/(?P<path>.+)"
            elif seg.startswith("{") and seg.endswith("}"):
                pattern += f"/(?P<{seg[1:-1]}>[^/]+)"
            else:
                pattern += "/" + re.escape(seg)
                literals += 1
        rx = re.compile(pattern + "/?")
        for method, op in item.items():
            if method == "parameters":
                continue
            ops.append(Operation(method.upper(), template, op["operationId"], rx, literals, op,
                                 version))
    return tuple(ops)


def find_operation(method: str, url_or_template: str,
                   version: str = "2022-11-28") -> Operation | None:
    """The documented operation for a method and a URL (absolute or path) or path template.
    When several templates match, the one with more literal segments wins (so
    ``/issues/comments`` is not taken for ``/issues/{issue_number}``)."""
    method = method.upper()
    path = urlsplit(url_or_template).path or url_or_template
    for op in rest_operations(version):
        if op.method == method and op.template == path:
            return op
    best = None
    for op in rest_operations(version):
        if (op.method == method and op.regex.fullmatch(path)
                and (best is None or op.literals > best.literals)):
            best = op
    return best


@cache
def _rest_validator(operation_id: str, status: str, media: str, write: bool = False,
                    version: str = "2022-11-28") -> Any:
    op = next(o for o in rest_operations(version) if o.operation_id == operation_id)
    body = (_deref(rest_spec(version), op.spec["requestBody"]) if write
            else op.response(int(status)))
    schema = body["content"][media]["schema"]
    # Give the schema the component tree as its root so that "#/components/..." resolves.
    root = {"allOf": [schema], "components": rest_spec(version)["components"]}
    cls = _OAS30Write if write else _OAS30Read
    return cls(root, format_checker=FORMATS)


def _lower(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for k, v in items:
        out.setdefault(k.lower(), v)
    return out


_LINK_ITEM = re.compile(r'\s*<([^>]+)>\s*((?:;\s*[a-zA-Z]+="?[^",;]*"?\s*)+)')


def _check_link(value: str) -> list[str]:
    problems = []
    for item in value.split(","):
        m = _LINK_ITEM.fullmatch(item)
        if not m:
            problems.append(f"Link item {item!r} is not '<url>; rel=\"...\"'")
            continue
        if not _is_uri(m.group(1)):
            problems.append(f"Link target {m.group(1)!r} is not an absolute URL")
        rel = re.search(r'rel="?([a-z]+)', m.group(2))
        if not rel or rel.group(1) not in ("next", "prev", "first", "last"):
            problems.append(f"Link item {item!r} has no rel of next/prev/first/last")
    return problems


# Response headers GitHub sends on every authenticated REST response (forge-facts 1.2).
RATE_LIMIT_HEADERS = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-used",
                      "x-ratelimit-reset")


def check_response(
    method: str,
    url: str,
    status: int,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: Any,
    *,
    rate_limit_headers: bool = True,
    used: set[str] | None = None,
    version: str | None = None,
) -> tuple[Operation | None, list[str]]:
    """Every problem with one response, as readable lines (empty when it conforms).

    ``body`` is the raw bytes/str or already-parsed JSON (``None`` for no body). ``version``
    is the REST API version the request asked for (its description is the one applied); by
    default the one the response says it selected, else 2022-11-28."""
    h = _lower(headers)
    selected = h.get("x-github-api-version-selected")
    if version is None:
        version = selected if selected in API_VERSIONS else API_VERSIONS[0]
    op = find_operation(method, url, version)
    if op is None:
        return None, [f"{method} {urlsplit(url).path}: no such operation in the description"]
    where = f"{op.operation_id} ({method} {op.template}) -> {status}"
    if version != API_VERSIONS[0]:
        where += f" [{version}]"
    problems: list[str] = []
    if selected is not None and selected != version:
        problems.append(f"{where}: X-GitHub-Api-Version-Selected is {selected!r}, "
                        f"not the {version!r} asked for")
    resp = op.response(status)
    if resp is None:
        documented = ", ".join(op.spec["responses"])
        return op, [f"{where}: status {status} is not documented (documented: {documented})"]

    # Body
    raw = body
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8")
    content = resp.get("content")
    if content:
        media = next(iter(content))
        ctype = h.get("content-type", "")
        if not any(ctype.split(";")[0].strip() == m for m in content):
            problems.append(f"{where}: content-type {ctype!r}, expected {list(content)}")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                problems.append(f"{where}: body is not JSON ({exc}): {raw[:200]!r}")
                return op, problems
        if media in content and "schema" in content[media]:
            validator = _rest_validator(op.operation_id, str(status), media, False, version)
            problems += [f"{where}: {p}" for p in _schema_problems(
                validator, raw, f"rest:{op.operation_id}", KNOWN_DRIFTS, used)]
            documented = rest_example_paths(op.operation_id, str(status), media, version)
            invented = [p for p in undeclared_fields(rest_spec(version),
                                                     content[media]["schema"], raw)
                        if p not in documented
                        and not _allowed_extra(f"rest:{op.operation_id}:{p}")]
            if invented:
                problems.append(f"{where}: fields the description does not declare: "
                                f"{invented[:20]}")
    elif raw not in (None, "", b""):
        problems.append(f"{where}: no content is documented but the body is {str(raw)[:200]!r}")

    # Documented headers
    for name, hspec in (resp.get("headers") or {}).items():
        hspec = _deref(rest_spec(version), hspec)
        value = h.get(name.lower())
        if value is None:
            # Link appears only when there is another page; Location always on a creation.
            if name.lower() == "location":
                problems.append(f"{where}: documented header Location is missing")
            continue
        typ = hspec.get("schema", {}).get("type")
        if typ == "integer" and not re.fullmatch(r"-?\d+", value):
            problems.append(f"{where}: header {name}: {value!r} is not an integer")
        if name.lower() == "link":
            problems += [f"{where}: {p}" for p in _check_link(value)]
        if name.lower() == "location" and not _is_uri(value):
            problems.append(f"{where}: header Location {value!r} is not an absolute URL")
    if "link" in h and "Link" not in (resp.get("headers") or {}):
        problems += [f"{where}: {p}" for p in _check_link(h["link"])]

    # Headers GitHub sends on every API response
    if rate_limit_headers:
        for name in RATE_LIMIT_HEADERS:
            value = h.get(name)
            if value is None:
                problems.append(f"{where}: header {name} is missing")
            elif not re.fullmatch(r"\d+", value):
                problems.append(f"{where}: header {name}: {value!r} is not an integer")
        if "x-ratelimit-resource" not in h:
            problems.append(f"{where}: header x-ratelimit-resource is missing")
    return op, problems


def validate_response(
    method: str,
    url: str,
    status: int,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: Any,
    *,
    rate_limit_headers: bool = True,
    version: str | None = None,
) -> Operation:
    """Raise ConformanceError listing every problem; record the operation as exercised."""
    used: set[str] = set()
    op, problems = check_response(method, url, status, headers, body,
                                  rate_limit_headers=rate_limit_headers, used=used,
                                  version=version)
    STATS.drifts_applied.update(used)
    if problems:
        raise ConformanceError("\n".join(problems))
    assert op is not None
    STATS.responses += 1
    STATS.operations.add(op.operation_id)
    STATS.by_version.setdefault(op.version, set()).add(op.operation_id)
    STATS.statuses.add((op.operation_id, status))
    return op


def check_request_body(operation_id: str, body: Any) -> list[str]:
    """Problems of a request body against the operation's documented request schema (used to
    make sure that a test's "bad input" really is invalid by GitHub's description)."""
    op = next(o for o in rest_operations() if o.operation_id == operation_id)
    validator = _rest_validator(operation_id, "", "application/json", True)
    return _schema_problems(validator, body, f"rest-request:{op.operation_id}")


# --------------------------------------------------------------------------------------------
# Schema errors, with drifts applied


def _fieldpath(err: ValidationError) -> tuple[str, Any]:
    """The field an error is about: for ``required``, the missing property itself."""
    path = "/".join(str(p) for p in err.absolute_path)
    value = err.instance
    if err.validator == "required":
        m = re.match(r"^'(.+)' is a required property", err.message)
        name = m.group(1) if m else "?"
        path = f"{path}/{name}" if path else name
        value = None
    return path, value


def _residual(err: ValidationError, scope: str, drifts: tuple[Drift, ...],
              used: set[str]) -> list[ValidationError]:
    """The errors left once the drifts are applied; anyOf/oneOf pass when one branch does."""
    if err.validator in ("anyOf", "oneOf") and err.context:
        branches: dict[Any, list[ValidationError]] = {}
        for sub in err.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        candidates = []
        for subs in branches.values():
            branch_used: set[str] = set()
            left = [r for s in subs for r in _residual(s, scope, drifts, branch_used)]
            if not left:
                used |= branch_used
                return []
            # A branch refused at the instance itself for its type is the wrong branch,
            # not the interesting failure: report a deeper one if there is one.
            wrong_type = all(r.validator == "type" and r.absolute_path == err.absolute_path
                             for r in left)
            candidates.append((wrong_type, len(left), left))
        candidates.sort(key=lambda c: (c[0], c[1]))
        return candidates[0][2]
    fieldpath, value = _fieldpath(err)
    for drift in drifts:
        if drift.covers(scope, fieldpath, str(err.validator), value):
            used.add(drift.name)
            return []
    return [err]


def _describe(err: ValidationError) -> str:
    fieldpath, _ = _fieldpath(err)
    schema_path = "/".join(str(p) for p in err.absolute_schema_path)
    schema_path = schema_path.replace("allOf/0/", "", 1)
    msg = err.message
    shown = repr(err.instance)
    if len(shown) > 80:
        msg = msg.replace(shown, f"<{type(err.instance).__name__}>")
    msg = msg if len(msg) < 300 else msg[:300] + "..."
    return f"field {fieldpath or '(root)'}: {msg} [schema {schema_path}]"


def _schema_problems(validator: Any, instance: Any, scope: str,
                     drifts: Iterable[Drift] = KNOWN_DRIFTS,
                     used: set[str] | None = None) -> list[str]:
    """Problems left after the drifts; the names of the drifts that applied go to ``used``."""
    used = used if used is not None else set()
    left: list[ValidationError] = []
    for err in validator.iter_errors(instance):
        left += _residual(err, scope, tuple(drifts), used)
    return [_describe(e) for e in left]


# --------------------------------------------------------------------------------------------
# Webhooks


@cache
def webhooks_spec() -> dict[str, Any]:
    with open(DATA / "github-webhooks-subset.json", encoding="utf-8") as f:
        return json.load(f)


@cache
def examples() -> tuple[dict[str, Any], ...]:
    with open(DATA / "github-webhook-examples.json", encoding="utf-8") as f:
        return tuple(json.load(f))


def webhook_names() -> list[str]:
    return sorted(webhooks_spec()["webhooks"])


def webhook_name(event: str, action: str | None) -> str:
    if event == "ping":
        return "ping"
    return f"{event}-{action}".replace("_", "-")


@cache
def _webhook_validator(name: str) -> Any:
    hook = webhooks_spec()["webhooks"][name]["post"]
    schema = hook["requestBody"]["content"]["application/json"]["schema"]
    root = {"allOf": [schema], "components": webhooks_spec()["components"]}
    return Draft202012Validator(root, format_checker=FORMATS)


def required_webhook_headers(name: str) -> list[str]:
    hook = webhooks_spec()["webhooks"][name]["post"]
    return [p["name"] for p in hook.get("parameters", [])
            if p.get("in") == "header" and p.get("required")]


TARGET_TYPES = frozenset({"integration", "app", "repository", "organization", "business"})


def verify_signature(secret: str | bytes, body: bytes, header: str | None) -> bool:
    if not header or not header.startswith("sha256="):
        return False
    key = secret.encode() if isinstance(secret, str) else secret
    expected = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def check_webhook(
    event: str,
    action: str | None,
    payload: Any,
    *,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    raw_body: bytes | None = None,
    secret: str | bytes | None = None,
    drifts: Iterable[Drift] = KNOWN_DRIFTS,
    used: set[str] | None = None,
) -> list[str]:
    name = webhook_name(event, action)
    where = f"webhook {name}"
    if name not in webhooks_spec()["webhooks"]:
        return [f"{where}: no such webhook in the description"]
    problems = [f"{where}: {p}" for p in _schema_problems(
        _webhook_validator(name), payload, f"webhook:{name}", drifts, used)]
    if headers is not None:
        h = _lower(headers)
        for hname in required_webhook_headers(name):
            if not h.get(hname.lower()):
                problems.append(f"{where}: required header {hname} is missing")
        if h.get("x-github-event", event) != event:
            problems.append(f"{where}: X-GitHub-Event is {h.get('x-github-event')!r}")
        ua = h.get("user-agent", "")
        if ua and not ua.startswith("GitHub-Hookshot/"):
            problems.append(f"{where}: User-Agent {ua!r} is not GitHub-Hookshot/<id>")
        guid = h.get("x-github-delivery", "")
        if guid and not re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                                     r"[0-9a-f]{12}", guid):
            problems.append(f"{where}: X-GitHub-Delivery {guid!r} is not a GUID")
        ctype = h.get("content-type", "")
        if ctype.split(";")[0].strip() != "application/json":
            problems.append(f"{where}: Content-Type {ctype!r}, expected application/json")
        # GitHub does not document the values; "integration" is what App hooks are seen to
        # carry (a docs PR proposes "app"), the others are repository/org/business hooks.
        ttype = h.get("x-github-hook-installation-target-type")
        if ttype is not None and ttype not in TARGET_TYPES:
            problems.append(f"{where}: X-GitHub-Hook-Installation-Target-Type {ttype!r} is "
                            f"none of {sorted(TARGET_TYPES)}")
        for idh in ("x-github-hook-id", "x-github-hook-installation-target-id"):
            if h.get(idh) and not h[idh].isdigit():
                problems.append(f"{where}: {idh} {h[idh]!r} is not a numeric id")
        if secret is not None:
            if raw_body is None:
                problems.append(f"{where}: raw body needed to verify the signature")
            elif not verify_signature(secret, raw_body, h.get("x-hub-signature-256")):
                problems.append(f"{where}: X-Hub-Signature-256 does not verify "
                                f"({h.get('x-hub-signature-256')!r})")
    return problems


def validate_webhook(
    event: str,
    action: str | None,
    payload: Any,
    *,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    raw_body: bytes | None = None,
    secret: str | bytes | None = None,
) -> None:
    used: set[str] = set()
    problems = check_webhook(event, action, payload, headers=headers, raw_body=raw_body,
                             secret=secret, used=used)
    STATS.drifts_applied.update(used)
    if problems:
        raise ConformanceError("\n".join(problems))
    STATS.webhooks += 1
    STATS.webhook_names.add(webhook_name(event, action))


# --------------------------------------------------------------------------------------------
# Key sets against the real examples

# The objects compared; "[]" means every element of a list.
KEY_SECTIONS = (
    "",
    "issue",
    "issue/user",
    "issue/labels[]",
    "issue/reactions",
    "comment",
    "comment/user",
    "comment/reactions",
    "label",
    "changes",
    "repository",
    "repository/owner",
    "organization",
    "sender",
    "installation",
    "installation/account",
)


def _section(obj: Any, section: str) -> list[dict[str, Any]]:
    nodes = [obj]
    for part in [p for p in section.split("/") if p]:
        many = part.endswith("[]")
        key = part[:-2] if many else part
        nxt = []
        for n in nodes:
            v = n.get(key) if isinstance(n, dict) else None
            if many and isinstance(v, list):
                nxt += [x for x in v if isinstance(x, dict)]
            elif isinstance(v, dict):
                nxt.append(v)
        nodes = nxt
    return [n for n in nodes if isinstance(n, dict)]


def examples_for(event: str, action: str | None) -> list[dict[str, Any]]:
    for ev in examples():
        if ev["name"] == event:
            same = [e for e in ev["examples"] if e.get("action") == action]
            return same or list(ev["examples"])
    return []


def _schema_keys(name: str, section: str) -> set[str]:
    """Property names the official schema declares for a section (through $ref, allOf,
    anyOf/oneOf branches)."""
    spec = webhooks_spec()
    hook = spec["webhooks"].get(name)
    if not hook:
        return set()
    schemas = [hook["post"]["requestBody"]["content"]["application/json"]["schema"]]
    for part in [p for p in section.split("/") if p]:
        key = part.rstrip("[]")
        many = part.endswith("[]")
        nxt = []
        for s in _expand(spec, schemas):
            sub = s.get("properties", {}).get(key)
            if sub is None:
                continue
            if many:
                nxt += [i for x in _expand(spec, [sub]) for i in
                        ([x["items"]] if "items" in x else [])]
            else:
                nxt.append(sub)
        schemas = nxt
    return {k for s in _expand(spec, schemas) for k in s.get("properties", {})}


def _expand(spec: Mapping[str, Any], schemas: list[Any]) -> list[Mapping[str, Any]]:
    out, todo = [], list(schemas)
    while todo:
        s = todo.pop()
        if not isinstance(s, dict):
            continue
        if "$ref" in s:
            _, _, kind, nm = s["$ref"].split("/", 3)
            todo.append(spec["components"][kind][nm])
        for k in ("allOf", "anyOf", "oneOf"):
            todo += s.get(k, [])
        out.append(s)
    return out


def compare_keys_with_examples(event: str, action: str | None, payload: Any) -> list[str]:
    """Keys GitHub's real payloads of this event always carry that ours lacks, and keys ours
    carries that neither any real payload nor the official schema knows (unless listed in
    ALLOWED_EXTRA_KEYS). Sections absent from every example are not compared."""
    exs = examples_for(event, action)
    name = webhook_name(event, action)
    where = f"webhook {name}"
    if not exs:
        return [f"{where}: no real example of event {event!r} to compare with"]
    problems = []
    hook = webhooks_spec()["webhooks"].get(name)
    if hook is not None:
        schema = hook["post"]["requestBody"]["content"]["application/json"]["schema"]
        real = example_paths(event, action)
        invented = [p for p in undeclared_fields(webhooks_spec(), schema, payload)
                    if p not in real and not _allowed_extra(f"webhook:{name}:{p}")]
        if invented:
            problems.append(f"{where}: fields neither the description nor a real payload "
                            f"has: {invented[:20]}")
    for section in KEY_SECTIONS:
        ours = _section(payload, section)
        theirs = [_section(e, section) for e in exs]
        present_in = [t for t in theirs if t]
        if not present_in:
            continue
        label = section or "(top level)"
        if not ours:
            if len(present_in) == len(exs) and section.count("/") == 0 and section:
                problems.append(f"{where}: {label} is missing (every real example has it)")
            continue
        always = set.intersection(*[set.intersection(*(set(o) for o in t)) for t in present_in])
        seen = set().union(*[set().union(*(set(o) for o in t)) for t in present_in])
        ours_keys = set.intersection(*(set(o) for o in ours))
        ours_any = set().union(*(set(o) for o in ours))
        missing = sorted(always - ours_keys)
        if missing:
            problems.append(f"{where}: {label} lacks {missing} (present in every real example)")
        extra = ours_any - seen - _schema_keys(name, section)
        extra = {k for k in extra if not _allowed_extra(f"webhook:{name}:{section}/{k}")}
        if extra:
            problems.append(
                f"{where}: {label} has {sorted(extra)} that no real example and not the "
                "official schema has")
    return problems


# --------------------------------------------------------------------------------------------
# Single components (where an operation's schema is too loose to say much, e.g. the timeline's
# anyOf, whose branches include schemas with no required field)


@cache
def _component_validator(name: str) -> Any:
    root = {"allOf": [{"$ref": f"#/components/schemas/{name}"}],
            "components": rest_spec()["components"]}
    return _OAS30Read(root, format_checker=FORMATS)


def check_component(name: str, instance: Any, scope: str = "rest:component") -> list[str]:
    """Problems of an instance against one REST component schema, e.g. 'labeled-issue-event'."""
    return [f"{name}: {p}" for p in _schema_problems(_component_validator(name), instance,
                                                     scope)]


# --------------------------------------------------------------------------------------------
# Invented fields: keys the description does not declare at that place, at any depth. Schemas
# allow extra properties, so this is the only check that catches a field the forge made up.


def undeclared_fields(spec: Mapping[str, Any], schema: Any, instance: Any,
                      path: str = "") -> list[str]:
    """Paths ("issue/closed_by", "labels[]/foo") of keys no schema branch declares there.
    Free-form objects (no properties, or additionalProperties given) are not looked into."""
    out: list[str] = []
    schemas = _expand(spec, [schema])
    if isinstance(instance, dict):
        declared: dict[str, list[Any]] = {}
        free = False
        for s in schemas:
            props = s.get("properties")
            if props:
                for k, sub in props.items():
                    declared.setdefault(k, []).append(sub)
            ap = s.get("additionalProperties")
            if ap not in (None, False):
                free = True
        if not declared or free:
            return out
        for k, v in instance.items():
            here = f"{path}/{k}" if path else k
            if k not in declared:
                out.append(here)
            else:
                for sub in declared[k][:1] if len(declared[k]) == 1 else [
                        {"anyOf": declared[k]}]:
                    out += undeclared_fields(spec, sub, v, here)
    elif isinstance(instance, list):
        items = [s["items"] for s in schemas if isinstance(s.get("items"), dict)]
        if items:
            item_schema = items[0] if len(items) == 1 else {"anyOf": items}
            seen: set[str] = set()
            for v in instance:
                for p in undeclared_fields(spec, item_schema, v, f"{path}[]"):
                    if p not in seen:
                        seen.add(p)
                        out.append(p)
    return out


def _key_paths(objs: Iterable[Any]) -> set[str]:
    paths: set[str] = set()

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                here = f"{path}/{k}" if path else k
                paths.add(here)
                walk(v, here)
        elif isinstance(obj, list):
            for v in obj:
                walk(v, f"{path}[]")

    for obj in objs:
        walk(obj, "")
    return paths


def example_paths(event: str, action: str | None) -> set[str]:
    """Every key path in GitHub's real payloads of this event (list indices as [])."""
    return _key_paths(examples_for(event, action))


@cache
def rest_example_paths(operation_id: str, status: str, media: str,
                       version: str = "2022-11-28") -> frozenset[str]:
    """Every key path in the example responses GitHub publishes for an operation and status:
    GitHub's own documentation of fields its schema leaves out (e.g. network_count on
    installation repositories)."""
    op = next(o for o in rest_operations(version) if o.operation_id == operation_id)
    resp = op.response(int(status)) or {}
    content = (resp.get("content") or {}).get(media) or {}
    values = [_deref(rest_spec(version), ex).get("value") for ex in
              (content.get("examples") or {}).values()]
    return frozenset(_key_paths(v for v in values if v is not None))
