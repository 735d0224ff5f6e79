"""Writing files through the contents API, as GitHub answers it ("Create or update file
contents", `PUT /repos/{owner}/{repo}/contents/{path}`): one commit on the default branch per
write, the push webhook sent.

- `message` and `content` (base64) are required; a `branch` other than the default one is
  refused (the forge keeps one branch, no history);
- creating needs no `sha`; replacing an existing file needs its blob `sha`: without it 422
  `Invalid request. "sha" wasn't supplied.`, with another file's 409 `<path> does not match
  <sha>`;
- `committer` and `author` need a name and an email (422 without); the author defaults to the
  committer, the committer to the authenticated account;
- 201 with the file-commit for a new file, 200 for a replaced one (the shapes as Octokit's
  `repos/create-or-update-file-contents` types them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from aiohttp import web

from ..clock import iso
from .http import ApiError, Ctx, Routes, json_response
from .render import blob_sha


def _who(value: Any, fallback: dict[str, str]) -> dict[str, str]:
    if not isinstance(value, dict):
        return fallback
    name, email = value.get("name"), value.get("email")
    if not isinstance(name, str) or not isinstance(email, str):
        raise ApiError(422, "Invalid request.\n\n\"name\" and \"email\" are required")
    return {"name": name, "email": email}


def _bad_path(path: str) -> bool:
    parts = path.split("/")
    return not path or any(p in ("", ".", "..", ".git") for p in parts)


async def put_content(request: web.Request) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo(scope="contents", need="write")
    body = await ctx.body()
    path = request.match_info["path"].strip("/")
    message, content = body.get("message"), body.get("content")
    for name, value in (("message", message), ("content", content)):
        if not isinstance(value, str):
            raise ApiError(422, f"Invalid request.\n\n\"{name}\" wasn't supplied.")
    assert isinstance(message, str) and isinstance(content, str)
    branch = body.get("branch")
    if branch not in (None, repo.default_branch):
        raise ApiError(404, f"Branch {branch} not found")
    if _bad_path(path):
        raise ApiError(422, f"Invalid request.\n\npath {path!r} is not a file path")
    try:
        raw = base64.b64decode(content.replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "Invalid request.\n\ncontent is not valid Base64") from None
    existing = repo.file_bytes(path)
    sha = body.get("sha")
    if existing is not None:
        if not isinstance(sha, str) or not sha:
            raise ApiError(422, "Invalid request.\n\n\"sha\" wasn't supplied.")
        if sha != blob_sha(existing):
            raise ApiError(409, f"{path} does not match {sha}")
    elif any(p.startswith(path + "/") for p in repo.paths()):
        raise ApiError(422, f"Invalid request.\n\n{path} is a directory")
    user = ctx.forge.state.account(ctx.sender)
    who = {"name": ctx.sender,
           "email": getattr(user, "email", None) or f"{ctx.sender}@users.noreply.github.com"}
    committer = _who(body.get("committer"), who)
    author = _who(body.get("author"), committer)  # GitHub: the committer when omitted
    now = ctx.forge.clock.now()
    repo.write_file(path, raw)
    repo.pushed_at = repo.updated_at = now
    commit_sha = hashlib.sha1(f"{repo.full_name}\n{path}\n{blob_sha(raw)}\n{now}".encode()
                              ).hexdigest()
    repo.head_sha = commit_sha  # the default branch's new head (the push webhook's `after`)
    ctx.forge.save()
    ctx.forge.dialect.pushed(ctx.forge, repo, ctx.sender, path, existing is not None)
    tree_sha = hashlib.sha1(f"tree\n{commit_sha}".encode()).hexdigest()
    api = ctx.r.repo_url(repo)
    web_url = f"{ctx.forge.url}/{repo.full_name}"
    stamp = {"date": iso(now)}
    commit = {
        "sha": commit_sha, "node_id": f"C_{commit_sha[:20]}",
        "url": f"{api}/git/commits/{commit_sha}", "html_url": f"{web_url}/commit/{commit_sha}",
        "author": {**stamp, **author}, "committer": {**stamp, **committer},
        "message": message, "tree": {"url": f"{api}/git/trees/{tree_sha}", "sha": tree_sha},
        "parents": [],
        "verification": {"verified": False, "reason": "unsigned", "signature": None,
                         "payload": None, "verified_at": None},
    }
    return json_response({"content": ctx.r.file_commit_content(repo, path, raw),
                          "commit": commit}, status=200 if existing is not None else 201)


def register(routes: Routes) -> None:
    routes.add("PUT", "/repos/{owner}/{repo}/contents/{path}", put_content)
