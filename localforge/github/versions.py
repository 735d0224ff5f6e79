"""REST API versions as GitHub serves them (docs: "API Versions"; "Breaking changes").

A request names its version in `X-GitHub-Api-Version`; without the header it gets 2022-11-28.
The answer carries `X-GitHub-Api-Version-Selected`. A version GitHub does not serve is a 400.
What 2026-03-10 drops from the shapes of the operations the forge serves (as the 2026-03-10
description, read through githubkit's generated models, lists them): `assignee` on issues and
search results, `rate` on `GET /rate_limit`, `has_downloads` on repositories. New fields
(labels' `archived_at` / `archived_by`) are in every version, as additive changes are.
"""

from __future__ import annotations

from typing import Any

V2022 = "2022-11-28"
V2026 = "2026-03-10"
SUPPORTED = (V2026, V2022)  # newest first
DEFAULT = V2022
HEADER = "X-GitHub-Api-Version"


class UnsupportedVersion(ValueError):
    """A version GitHub does not serve: the message is GitHub's (answered with a 400)."""


def select(value: str | None) -> str:
    """The version a request asks for; UnsupportedVersion for one GitHub does not serve."""
    if value is None or not value.strip():
        return DEFAULT
    wanted = value.strip()
    if wanted in SUPPORTED:
        return wanted
    listed = ", ".join(f'"{v}"' + (" (most recent)" if i == 0 else "")
                       for i, v in enumerate(SUPPORTED))
    raise UnsupportedVersion(f'The version you specified in the "X-GitHub-API-Version" request '
                             f'header, "{wanted}", is not a supported version. The following '
                             f"versions are currently supported: {listed}.")


# what 2026-03-10 no longer sends: (field, a key that only the objects losing it carry)
REMOVED_2026 = (("assignee", "assignees"),  # issues and search results
                ("rate", "resources"),  # GET /rate_limit
                ("has_downloads", "full_name"))  # repositories


def shape(version: str, data: Any) -> Any:
    """Trim an answer rendered in 2022-11-28's shapes to `version`'s (in place)."""
    if version == V2026:
        _drop(data, REMOVED_2026)
    return data


def _drop(obj: Any, fields: tuple[tuple[str, str], ...]) -> None:
    if isinstance(obj, dict):
        for name, marker in fields:
            if marker in obj:
                obj.pop(name, None)
        for value in obj.values():
            _drop(value, fields)
    elif isinstance(obj, list):
        for value in obj:
            _drop(value, fields)
