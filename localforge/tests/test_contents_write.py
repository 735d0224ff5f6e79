"""Create or update file contents (`PUT /repos/{owner}/{repo}/contents/{path}`) as GitHub
answers it: 201 creating, 200 replacing with the file's blob sha, 422 without it, 409 with a
stale one; binary files as they were sent, read back through GET; kept across a restart
(the push webhook it sends is `LocalForge.put_file`'s)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import aiohttp

from localforge import LocalForge
from localforge.persist import Snapshotter

from .conftest import Hooks, Keys, World, make_world

BINARY = bytes(range(256)) * 4


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_file_is_created_replaced_and_read_back_as_github_answers(
        world: World) -> None:
    token = await world.installation_token()
    auth = f"token {token}"
    url = "/repos/acme/vault/contents/attachments/m1/blob.bin"
    status, _, body = await world.call("PUT", url, auth=auth,
                                       json_body={"message": "add", "content": b64(BINARY)})
    assert status == 201
    assert set(body) == {"content", "commit"}
    content = body["content"]
    assert content["sha"] == blob_sha(BINARY) and content["size"] == len(BINARY)
    assert content["path"] == "attachments/m1/blob.bin" and content["name"] == "blob.bin"
    assert "content" not in content and content["type"] == "file"
    assert content["html_url"].endswith("/acme/vault/blob/main/attachments/m1/blob.bin")
    assert body["commit"]["message"] == "add" and body["commit"]["sha"]
    status, _, got = await world.call("GET", url, auth=auth)
    assert status == 200 and base64.b64decode(got["content"]) == BINARY
    assert got["sha"] == blob_sha(BINARY)
    status, _, listing = await world.call("GET", "/repos/acme/vault/contents/attachments/m1",
                                          auth=auth)
    assert status == 200 and [(e["name"], e["sha"], e["size"]) for e in listing] == [
        ("blob.bin", blob_sha(BINARY), len(BINARY))]
    # replacing: the sha is required, and must be the file's
    status, _, err = await world.call("PUT", url, auth=auth,
                                      json_body={"message": "again", "content": b64(b"new")})
    assert status == 422 and err["message"] == 'Invalid request.\n\n"sha" wasn\'t supplied.'
    status, _, err = await world.call("PUT", url, auth=auth, json_body={
        "message": "stale", "content": b64(b"new"), "sha": blob_sha(b"other")})
    assert status == 409 and err["message"] == \
        f"attachments/m1/blob.bin does not match {blob_sha(b'other')}"
    status, _, body = await world.call("PUT", url, auth=auth, json_body={
        "message": "replace", "content": b64(b"text now\n"), "sha": blob_sha(BINARY)})
    assert status == 200 and body["content"]["sha"] == blob_sha(b"text now\n")
    status, _, got = await world.call("GET", url, auth=auth)
    assert base64.b64decode(got["content"]) == b"text now\n"


async def test_a_write_is_refused_as_github_refuses_it(world: World) -> None:
    auth = f"token {await world.installation_token()}"
    base = "/repos/acme/vault/contents"
    status, _, err = await world.call("PUT", f"{base}/a.txt", auth=auth,
                                      json_body={"content": b64(b"x")})
    assert status == 422 and "\"message\" wasn't supplied" in err["message"]
    status, _, _ = await world.call("PUT", f"{base}/a.txt", auth=auth,
                                    json_body={"message": "m", "content": "not base64!"})
    assert status == 422
    status, _, _ = await world.call("PUT", f"{base}/a.txt", auth=auth, json_body={
        "message": "m", "content": b64(b"x"), "branch": "elsewhere"})
    assert status == 404
    status, _, _ = await world.call("PUT", f"{base}/a.txt",
                                    json_body={"message": "m", "content": b64(b"x")})
    assert status == 401, "no token, no write"


async def test_a_binary_file_stays_across_a_restart(
        tmp_path: Path, hooks: Hooks, keys: Keys) -> None:
    forge = LocalForge(data_dir=tmp_path)
    await forge.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            world = await make_world(forge, hooks, keys, session)
            auth = f"token {await world.installation_token()}"
            status, _, _ = await world.call(
                "PUT", "/repos/acme/vault/contents/attachments/m1/blob.bin", auth=auth,
                json_body={"message": "add", "content": b64(BINARY)})
            assert status == 201
    finally:
        await forge.stop()
    snap = Snapshotter(tmp_path)
    try:
        loaded = snap.load()
    finally:
        snap.close()
    assert loaded is not None
    repo = loaded[0].repo("acme", "vault")
    assert repo is not None and repo.file_bytes("attachments/m1/blob.bin") == BINARY
