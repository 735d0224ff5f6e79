"""Writing files through Gitea's contents API (routers/api/v1/repo/file.go): `POST
/repos/{owner}/{repo}/contents/{filepath}` creates a file, `PUT` replaces one; each is one
commit on the default branch, the push webhook sent.

As Gitea answers them (CreateFileOptions / UpdateFileOptions, handleChangeRepoFilesError):

- `content` (base64) is required; `message` may be left out (Gitea writes "Add <path>" or
  "Update <path>"); a `branch` other than the default one is 404 (the forge keeps one branch);
- POST over an existing file is 422 `repository file already exists [path: <path>]`;
- PUT needs the file's blob `sha` (422 without it), 422 `sha does not match [given: <sha>,
  expected: <sha>]` for another, 404 when there is no file to update;
- an archived repository is 423;
- 201 (POST) or 200 (PUT) with a FileResponse: `content` (the file as GET gives it), `commit`
  (FileCommitResponse) and `verification`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from aiohttp import web

from ..clock import iso
from ..github.http import ApiError, Ctx
from ..github.render import blob_sha
from .http import Routes, json_response
from .render import GiteaRenderer


def _bad_path(path: str) -> bool:
    parts = path.split("/")
    return not path or any(p in ("", ".", "..", ".git") for p in parts)


def _who(value: Any, fallback: dict[str, str]) -> dict[str, str]:
    if not isinstance(value, dict):
        return fallback
    name, email = value.get("name"), value.get("email")
    return {"name": name if isinstance(name, str) and name else fallback["name"],
            "email": email if isinstance(email, str) and email else fallback["email"]}


async def _change(request: web.Request, operation: str) -> web.Response:
    ctx = Ctx.of(request)
    ctx.require_auth()
    repo = ctx.repo(scope="contents", need="write", archived_ok=True)
    if repo.archived:
        raise ApiError(423, "repo is archived")
    body = await ctx.body()
    path = request.match_info["filepath"].strip("/")
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(422, "[ContentBase64]: Required")
    branch = body.get("branch")
    if branch not in (None, "", repo.default_branch):
        raise ApiError(404, f"branch does not exist [name: {branch}]")
    if _bad_path(path):
        raise ApiError(422, f"path contains a malformed path component [path: {path}]")
    try:
        raw = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "illegal base64 data") from None
    existing = repo.file_bytes(path)
    if operation == "create":
        if existing is not None:
            raise ApiError(422, f"repository file already exists [path: {path}]")
        if any(p.startswith(path + "/") for p in repo.paths()):
            raise ApiError(422, f"a directory exists where a file is wanted [path: {path}]")
    else:
        if existing is None:
            raise ApiError(404, f"repository file does not exist [path: {path}]")
        sha = body.get("sha")
        if not isinstance(sha, str) or not sha:
            raise ApiError(422, "a SHA or commit ID must be provided when updating a file")
        if sha != blob_sha(existing):
            raise ApiError(422, f"sha does not match [given: {sha}, expected: "
                                f"{blob_sha(existing)}]")
    message = body.get("message")
    if not isinstance(message, str) or not message:
        message = f"{'Add' if operation == 'create' else 'Update'} {path}"
    user = ctx.forge.state.account(ctx.sender)
    who = {"name": ctx.sender,
           "email": getattr(user, "email", None) or f"{ctx.sender}@noreply.localhost"}
    committer = _who(body.get("committer"), who)
    author = _who(body.get("author"), committer)
    now = ctx.forge.clock.now()
    repo.write_file(path, raw)
    repo.pushed_at = repo.updated_at = now
    commit_sha = hashlib.sha1(f"{repo.full_name}\n{path}\n{blob_sha(raw)}\n{now}".encode()
                              ).hexdigest()
    parent = repo.head_sha
    repo.head_sha = commit_sha  # the default branch's new head (the push webhook's `after`)
    ctx.forge.save()
    ctx.forge.dialect.pushed(ctx.forge, repo, ctx.sender, path, existing is not None)
    r = GiteaRenderer(ctx.forge, viewer=ctx.sender)
    api, web_url = r.repo_url(repo), f"{ctx.forge.url}/{repo.full_name}"
    tree_sha = hashlib.sha1(f"tree\n{commit_sha}".encode()).hexdigest()
    stamp = iso(now)
    commit = {
        "url": f"{api}/git/commits/{commit_sha}", "sha": commit_sha,
        "html_url": f"{web_url}/commit/{commit_sha}", "created": stamp,
        "author": {**author, "date": stamp}, "committer": {**committer, "date": stamp},
        "parents": [{"url": f"{api}/git/commits/{parent}", "sha": parent}] if parent else [],
        "message": message + "\n", "tree": {"url": f"{api}/git/trees/{tree_sha}",
                                            "sha": tree_sha},
    }
    verification = {"verified": False, "reason": "gpg.error.not_signed_commit",
                    "signature": "", "signer": None, "payload": ""}
    return json_response({"content": r.content_file(repo, path, raw), "commit": commit,
                          "verification": verification},
                         status=201 if operation == "create" else 200)


async def create_file(request: web.Request) -> web.Response:
    return await _change(request, "create")


async def update_file(request: web.Request) -> web.Response:
    return await _change(request, "update")


def register(routes: Routes) -> None:
    base = "/repos/{owner}/{repo}"
    routes.add("POST", f"{base}/contents/{{filepath}}", create_file)
    routes.add("PUT", f"{base}/contents/{{filepath}}", update_file)
