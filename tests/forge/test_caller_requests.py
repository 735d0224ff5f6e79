"""The forge client's requests are made and read as gidgethub makes and reads them: the same
value, the same next page, the same error, whatever the answer. The two are asked the same
thing of one real HTTP server, each through its own client, and must agree."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import cachetools
import gidgethub.abc
import pytest
from aiohttp import web

from bot.forge.caller import ACCEPT, _GitHubAPI
from bot.forge.errors import MovedAway, NotFound
from tests.support import redirected_elsewhere, served

# path -> (status, headers, body) the server answers
ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/object": (200, {"Content-Type": "application/json; charset=utf-8"},
                json.dumps({"a": [1, {"b": "é中😀", "c": None}], "n": 2.5,
                            "t": True}).encode()),
    "/plain-json": (201, {"Content-Type": "application/json"}, b'{"id": 7}'),
    "/quoted-charset": (200, {"Content-Type": 'application/json; charset="UTF-8"'},
                        b"[1, 2]"),
    "/latin": (200, {"Content-Type": "application/json; charset=iso-8859-1"},
               '{"name": "caf\xe9"}'.encode("iso-8859-1")),
    "/long-number": (200, {"Content-Type": "application/json"},
                     b'{"id": 123456789012345678901234567890, "x": 0.1000000000000000055511}'),
    "/empty": (204, {}, b""),
    "/text": (200, {"Content-Type": "text/plain; charset=utf-8"}, b"hello"),
    "/page": (200, {"Content-Type": "application/json",
                    "Link": '<http://x/page?p=2>; rel="next", <http://x/page?p=9>; rel="last"'},
              b"[{}]"),
    "/missing": (404, {"Content-Type": "application/json"}, b'{"message": "Not Found"}'),
    "/invalid": (422, {"Content-Type": "application/json"},
                 b'{"message": "Validation Failed", "errors": '
                 b'[{"code": "invalid", "field": "labels"}]}'),
    "/limited": (403, {"Content-Type": "application/json", "X-RateLimit-Limit": "5000",
                       "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1900000000"},
                 b'{"message": "API rate limit exceeded"}'),
    "/broken": (502, {"Content-Type": "text/html"}, b"<html>bad gateway</html>"),
    "/not-json": (200, {"Content-Type": "application/json"}, b"{not json"),
}


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append({"method": request.method, "path": request.path,
                     "headers": dict(request.headers), "body": body})
        if request.path == "/etag":
            if request.headers.get("If-None-Match") == '"v1"':
                return web.Response(status=304, headers={"ETag": '"v1"'})
            return web.Response(body=b'{"labels": [{"name": "mail:new"}], "user": {"l": "m"}}',
                                headers={"ETag": '"v1"', "Content-Type": "application/json"})
        status, headers, text = ANSWERS[request.path]
        return web.Response(status=status, headers=headers, body=text)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with served(app) as url:
        yield url, seen


def _client(session: aiohttp.ClientSession, base: str) -> _GitHubAPI:
    return _GitHubAPI(session, "vaultmail-test", base_url=base,
                      cache=cachetools.LRUCache(maxsize=16), timeout=5.0,
                      observe=lambda *_: None)


async def _outcome(call: Any) -> Any:
    try:
        return ("value", await call)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(exc), getattr(exc, "status_code", None), str(exc),
                getattr(exc, "errors", None))


@pytest.mark.parametrize("path", sorted(ANSWERS))
@pytest.mark.parametrize("method,data", [("GET", b""), ("PATCH", {"body": "é\n", "labels": ["x"]})])
async def test_every_answer_is_read_as_gidgethub_reads_it(
        server: tuple[str, list[dict[str, Any]]], path: str, method: str, data: Any) -> None:
    base, seen = server
    async with aiohttp.ClientSession() as session:
        ours, theirs = _client(session, base), _client(session, base)
        mine = await _outcome(ours._make_request(method, base + path, None, data, ACCEPT,
                                                 oauth_token="t0ken"))
        gidgethubs = await _outcome(gidgethub.abc.GitHubAPI._make_request(
            theirs, method, base + path, None, data, ACCEPT, oauth_token="t0ken"))
    assert mine == gidgethubs
    sent, reference = seen
    assert sent["method"] == reference["method"] and sent["path"] == reference["path"]
    for header in ("Authorization", "Accept", "User-Agent", "Content-Type"):
        assert sent["headers"].get(header) == reference["headers"].get(header)
    assert sent["headers"]["Content-Length"] == str(len(sent["body"]))  # (UTF-8, not \u escapes)
    assert (json.loads(sent["body"]) if sent["body"] else None) == (
        json.loads(reference["body"]) if reference["body"] else None)


async def test_a_read_served_from_the_etag_cache_is_the_callers_own(
        server: tuple[str, list[dict[str, Any]]]) -> None:
    base, seen = server
    async with aiohttp.ClientSession() as session:
        api = _client(session, base)
        first, _, status = await api._make_request("GET", base + "/etag", None, b"", ACCEPT,
                                                   oauth_token="t0ken")
        assert status == 200
        first["labels"].append({"name": "mutated"})
        first["user"]["l"] = "changed"
        second, more, status = await api._make_request("GET", base + "/etag", None, b"",
                                                       ACCEPT, oauth_token="t0ken")
        assert status == 304 and more is None  # as gidgethub answers a 304 it had cached
        assert seen[1]["headers"]["If-None-Match"] == '"v1"'
        assert second == {"labels": [{"name": "mail:new"}], "user": {"l": "m"}}
        assert second is not first


async def test_a_body_orjson_refuses_is_sent_as_the_standard_library_writes_it(
        server: tuple[str, list[dict[str, Any]]]) -> None:
    base, seen = server
    odd = {"body": "half \ud800 a pair", "n": 2 ** 70}
    async with aiohttp.ClientSession() as session:
        await _client(session, base)._make_request("PATCH", base + "/object", None, odd, ACCEPT,
                                                   oauth_token="t0ken")
    assert seen[0]["body"] == json.dumps(odd).encode()


async def test_a_saved_cache_serves_the_next_process(
        server: tuple[str, list[dict[str, Any]]], tmp_path: Any) -> None:
    """`vaultmail reindex` keeps its cache in a file: the next run's read is a 304 answered
    from it. A file of the format before (values, not texts) is not read."""
    from bot.forge.caller import load_etag_cache, save_etag_cache

    base, seen = server
    path = tmp_path / "etags.json"
    async with aiohttp.ClientSession() as session:
        first = _client(session, base)
        value, _, _ = await first._make_request("GET", base + "/etag", None, b"", ACCEPT,
                                                oauth_token="t0ken")
        save_etag_cache(first._cache, 7, path)
        later = _client(session, base)
        load_etag_cache(later._cache, 7, path)
        again, _, status = await later._make_request("GET", base + "/etag", None, b"", ACCEPT,
                                                     oauth_token="t0ken")
        assert (status, again) == (304, value)
        other = _client(session, base)
        load_etag_cache(other._cache, 8, path)  # another installation's file: not read
        path.write_text(json.dumps({"installation_id": 7, "entries": [
            [base + "/etag", ['"v1"', None, {"labels": []}, None]]]}))  # the format before
        old = _client(session, base)
        load_etag_cache(old._cache, 7, path)
        for client in (other, old):
            assert len(client._cache) == 0  # type: ignore[arg-type]
            _, _, status = await client._make_request("GET", base + "/etag", None, b"", ACCEPT,
                                                      oauth_token="t0ken")
            assert status == 200
    assert [s["headers"].get("If-None-Match") for s in seen] == [None, '"v1"', None, None]


async def test_a_next_page_named_on_another_host_is_asked_of_the_forge_itself(
        env: Any, server: tuple[str, list[dict[str, Any]]]) -> None:
    """A forge's `Link: rel="next"` names a URL; followed to another host, it would hand that
    host the installation's token. A page under the API's path is asked of the forge at its
    own URL (Gitea names itself by its ROOT_URL, behind a proxy another name); one outside
    it is refused, saying why."""
    from bot.forge.errors import ForgeError
    from bot.forge.github import ForgeClient
    from bot.forge.tokens import AppAuth

    from .conftest import FAST

    elsewhere, stolen = server  # a host the forge's answers point at
    pages: list[str] = []

    async def listing(request: web.Request) -> web.Response:
        pages.append(request.path_qs)
        if request.query.get("page") == "2":
            return web.json_response([{"number": 2}])
        return web.json_response([{"number": 1}], headers={
            "Link": f'<{elsewhere}{request.path}?page=2>; rel="next"'})

    async def outside(request: web.Request) -> web.Response:
        return web.json_response([{"number": 1}], headers={
            "Link": f'<{elsewhere}/object?page=2>; rel="next"'})

    app = web.Application()
    app.router.add_get("/api/v1/repos/acme/vault/issues", listing)
    app.router.add_get("/api/v1/repos/acme/other/issues", outside)
    # tokens from the local forge; the listings from a forge that names other hosts
    async with served(app) as url:
        auth = AppAuth(env.app_id, env.private_pem, env.forge.url, env.session,
                       clock=env.forge.clock)
        forge = ForgeClient(auth, env.session, f"{url}/api/v1",
                            config=FAST).installation(env.installation_id)
        assert [i async for i in forge.iter_issues("acme/vault")] == [
            {"number": 1}, {"number": 2}]
        assert pages[-1] == "/api/v1/repos/acme/vault/issues?page=2"
        seen: list[Any] = []
        with pytest.raises(ForgeError, match="outside the forge's URL.*not followed"):
            async for issue in forge.iter_issues("acme/other"):
                seen.append(issue)
        assert seen == [{"number": 1}] and stolen == []


@pytest.mark.parametrize("url,on_forge", [
    ("http://127.0.0.1:8080/api/v3/x?page=2", "http://127.0.0.1:8080/api/v3/x?page=2"),
    ("http://gitea.example/api/v3/x?page=2", "http://127.0.0.1:8080/api/v3/x?page=2"),
    ("https://evil.test/api/v3/repos", "http://127.0.0.1:8080/api/v3/repos"),
    ("https://evil.test/api/v3x/repos", None), ("https://evil.test/other", None),
    ("http://127.0.0.1:8080@evil.test/x", None), ("//evil.test/x", None),
    ("/api/v3/x?page=2", "http://127.0.0.1:8080/api/v3/x?page=2"),  # (was joined twice)
])
def test_next_on_forge(url: str, on_forge: str | None) -> None:
    from bot.forge.caller import next_on_forge

    assert next_on_forge(url, "http://127.0.0.1:8080/api/v3") == on_forge


@pytest.mark.parametrize("url,same", [
    ("http://127.0.0.1:8080/api/v3/x?page=2", True), ("/api/v3/x?page=2", True),
    ("HTTP://127.0.0.1:8080/other", True), ("http://127.0.0.1/x", False),
    ("https://127.0.0.1:8080/x", False), ("http://evil.test:8080/x", False),
    ("http://127.0.0.1:8080@evil.test/x", False), ("//evil.test/x", False),
    ("http://127.0.0.1:notaport/x", False),
])
def test_same_origin(url: str, same: bool) -> None:
    from bot.forge.caller import same_origin

    assert same_origin(url, "http://127.0.0.1:8080/api/v3") is same


async def test_redirects_are_followed_on_the_forges_origin_only(
        server: tuple[str, list[dict[str, Any]]]) -> None:
    """A write the forge answers with 307 elsewhere is not sent there (before, aiohttp followed
    every redirect: the body went where the answer said); one on the forge's own origin
    (GitHub's, of a renamed repository) is sent again as it was; a read follows the forge's
    own redirects too, and no other."""
    elsewhere, stolen = server
    seen: list[tuple[str, str, bytes, str | None]] = []

    async def moved(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, await request.read(),
                     request.headers.get("Authorization")))
        if request.path.startswith("/renamed"):
            return web.json_response({"number": 1, "title": "moved"})
        to = {"/away": f"{elsewhere}/object", "/away-read": f"{elsewhere}/object",
              "/here": "/renamed/1", "/here-read": "/renamed/2", "/other-way": "/renamed/3"}
        status = 301 if request.path == "/other-way" else 307
        return web.Response(status=status, headers={"Location": to[request.path]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", moved)
    async with served(app) as url, aiohttp.ClientSession() as session:
        client = _client(session, url)
        value, _, status = await client._make_request(
            "PATCH", url + "/here", None, {"title": "x"}, ACCEPT, oauth_token="t0ken")
        assert (status, value) == (200, {"number": 1, "title": "moved"})
        assert seen[-1] == ("PATCH", "/renamed/1", b'{"title":"x"}', "token t0ken")
        value, _, _ = await client._make_request("GET", url + "/here-read", None, b"", ACCEPT,
                                                 oauth_token="t0ken")
        assert value == {"number": 1, "title": "moved"} and seen[-1][1] == "/renamed/2"
        for method, path, body in (("PATCH", "/away", {"title": "x"}),
                                   ("GET", "/away-read", b""),
                                   ("POST", "/other-way", {"title": "x"})):
            with pytest.raises(gidgethub.RedirectionException):
                await client._make_request(method, url + path, None, body, ACCEPT,
                                           oauth_token="t0ken")
            assert seen[-1][1] == path, "not followed"
    assert stolen == []


async def test_a_repositorys_old_name_is_followed_into_its_owners_repositories_only() -> None:
    """Gitea leads a repository's old name to `/api/v1/repos/{owner}/{name}/...` (renamed, or
    transferred): followed within the owner asked of; to another owner's, MovedAway (a
    NotFound naming it) and nothing asked there (before, its issues read as the old owner's);
    and a Location under /repos/ that names no repository is not followed."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.path)
        to = {"/api/v1/repos/acme/old/issues/1": "/api/v1/repos/ACME/new/issues/1",
              "/api/v1/repos/acme/gone/issues/1": "/api/v1/repos/eve/gone/issues/1",
              "/api/v1/repos/acme/odd/issues/1": "/api/v1/repos/"}.get(request.path)
        if to is None:
            return web.json_response({"number": 1, "at": request.path})
        return web.Response(status=307, headers={"Location": to})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with served(app) as url, aiohttp.ClientSession() as session:
        client = _client(session, url + "/api/v1")
        value, _, _ = await client._make_request(
            "GET", url + "/api/v1/repos/acme/old/issues/1", None, b"", ACCEPT,
            oauth_token="t0ken")
        assert value == {"number": 1, "at": "/api/v1/repos/ACME/new/issues/1"}
        with pytest.raises(MovedAway, match="acme/gone now belongs to another owner") as gone:
            await client._make_request("PATCH", url + "/api/v1/repos/acme/gone/issues/1",
                                       None, {"title": "x"}, ACCEPT, oauth_token="t0ken")
        assert isinstance(gone.value, NotFound) and gone.value.now == "eve/gone"
        with pytest.raises(gidgethub.RedirectionException):
            await client._make_request("GET", url + "/api/v1/repos/acme/odd/issues/1", None,
                                       b"", ACCEPT, oauth_token="t0ken")
    assert seen == ["/api/v1/repos/acme/old/issues/1", "/api/v1/repos/ACME/new/issues/1",
                    "/api/v1/repos/acme/gone/issues/1", "/api/v1/repos/acme/odd/issues/1"]


async def test_a_write_answered_303_was_made_and_its_result_is_read() -> None:
    """303 See Other to a write: it was made, and its result is where the answer says (RFC
    9110 15.4.4), read with a GET (found by review: raised as an error, the write was made
    again by the retry)."""
    made: list[tuple[str, bytes]] = []

    async def answer(request: web.Request) -> web.Response:
        made.append((request.method, await request.read()))
        if request.method == "POST":
            return web.Response(status=303, headers={"Location": "/comments/7"})
        return web.json_response({"id": 7})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with served(app) as url, aiohttp.ClientSession() as session:
        value, _, status = await _client(session, url)._make_request(
            "POST", url + "/comments", None, {"body": "hi"}, ACCEPT, oauth_token="t0ken")
    assert (value, status) == ({"id": 7}, 200)
    assert made == [("POST", b'{"body":"hi"}'), ("GET", b"")]


async def test_a_redirect_chain_is_timed_as_one_request() -> None:
    """The timeout covers the whole chain of redirects (found by review: each hop had its
    own, eleven times the time)."""
    async def answer(request: web.Request) -> web.Response:
        n = int(request.path.strip("/") or 0)
        await asyncio.sleep(0.3)
        if n < 5:
            return web.Response(status=302, headers={"Location": f"/{n + 1}"})
        return web.json_response({"n": n})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with served(app) as url, aiohttp.ClientSession() as session:
        client = _GitHubAPI(session, "vaultmail-test", base_url=url, cache=None, timeout=1.0,
                            observe=lambda *_: None)
        with pytest.raises(TimeoutError):  # 6 hops of 0.3 s
            await client._make_request("GET", url + "/0", None, b"", ACCEPT,
                                       oauth_token="t0ken")


@pytest.mark.parametrize("location", [
    "http://u:p@{host}/x", "http://evil.test\\@{host}/x", "http://{host}\\@evil.test/x",
    "/\\evil.test/x", "\\\\evil.test/x", "//evil.test/x", "http://{host}%2F@evil.test/x",
    "http://{host}\t@evil.test/x",
])
async def test_a_location_read_two_ways_is_not_followed(location: str) -> None:
    """A Location a URL parser could read as another host, or with credentials, is not
    followed: the answer is the redirect itself."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.path)
        host = request.host
        return web.Response(status=307, headers={"Location": location.format(host=host)})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with served(app) as url, aiohttp.ClientSession() as session:
        with pytest.raises(gidgethub.RedirectionException):
            await _client(session, url)._make_request("PATCH", url + "/away", None, {"a": 1},
                                                      ACCEPT, oauth_token="t0ken")
    assert seen == ["/away"]


async def test_an_installation_token_is_never_asked_for_where_a_redirect_points(
        server: tuple[str, list[dict[str, Any]]]) -> None:
    """The token request (the App's JWT, answered with a token every later call sends) goes to
    the forge alone: a redirect is refused as the answer, not followed (found by review:
    gidgethub's plain client let aiohttp follow a 307 elsewhere, and the token that came
    back from there was sent with every later call)."""
    from bot.forge.errors import ForgeError
    from bot.forge.tokens import AppAuth
    from tests.support import app_key

    elsewhere, seen_elsewhere = server
    asked: list[str] = []

    async def moved(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(status=307, headers={"Location": f"{elsewhere}/object"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", moved)
    async with served(app) as url, aiohttp.ClientSession() as session:
        auth = AppAuth(1, app_key(), url, session, attempts=1)
        with pytest.raises(ForgeError, match="307"):
            await auth.installation_token(7)
    assert asked == ["/app/installations/7/access_tokens"]
    assert seen_elsewhere == []


async def test_the_installations_list_is_not_taken_from_where_a_redirect_points() -> None:
    """GET /app/installations (the App's JWT) maps each org to its installation at start-up:
    from the forge alone (found by review: a 307 elsewhere was followed, and its answer
    taken)."""
    from bot.forge.github import ForgeClient
    from bot.forge.tokens import AppAuth
    from tests.support import app_key

    async with redirected_elsewhere() as (url, seen), aiohttp.ClientSession() as session:
        auth = AppAuth(1, app_key(), url, session, attempts=1)
        with pytest.raises(Exception):  # noqa: B017 (any refusal will do)
            await ForgeClient(auth, session, url).app().list_installations()
    assert seen == [], f"asked elsewhere: {seen}"
