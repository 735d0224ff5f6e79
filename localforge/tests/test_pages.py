"""Read-only HTML pages for the `html_url`s the forge hands out: an issue (title, Markdown body,
labels, state, comments at their anchors), a repository and its issue list, a user or org;
private repositories 404 unless the viewer may read them; everything escaped; landmarks,
headings and labels for screen readers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from localforge import LocalForge

from .conftest import World
from .webclient import Browser, accessible


@pytest.fixture
async def browser(world: World) -> AsyncIterator[Browser]:
    b = Browser.open(world.forge)
    yield b
    await b.close()


async def new_issue(world: World, who: str = "marco", **body: Any) -> dict[str, Any]:
    status, _, issue = await world.call("POST", "/repos/acme/vault/issues", who,
                                        json_body=body)
    assert status == 201, issue
    return issue


async def comment(world: World, number: int, text: str, who: str = "rita") -> dict[str, Any]:
    status, _, c = await world.call(
        "POST", f"/repos/acme/vault/issues/{number}/comments", who, json_body={"body": text})
    assert status == 201, c
    return c


async def test_issue_page_shows_title_body_labels_state_and_comments(
        world: World, browser: Browser) -> None:
    issue = await new_issue(world, title="Pricing review", labels=["mail:new", "urgent"],
                            body="Please **check** the `tiers`.\n\n- one\n- two")
    world.forge.state.repo("acme", "vault").label_named("urgent").color = "b60205"  # type: ignore[union-attr]
    first = await comment(world, issue["number"], "Looks _fine_ to me.")
    second = await comment(world, issue["number"], "Agreed.", who="marco")
    await browser.sign_in("rita")
    reply = await browser.get(urlsplit(issue["html_url"]).path)
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/html")
    page = reply.page
    accessible(page)
    assert "Pricing review" in page.find("h1")[0].text
    assert f"#{issue['number']}" in page.find("h1")[0].text
    assert "Open" in page.text
    assert "<strong>check</strong>" in reply.body and "<code>tiers</code>" in reply.body
    assert "<li>one</li>" in reply.body
    labels = {e.text.strip(): e.attrs.get("style", "") for e in page.find(class_="label")}
    assert set(labels) == {"mail:new", "urgent"}
    assert "#b60205" in labels["urgent"] and "#ededed" in labels["mail:new"]
    assert "color: #ffffff" in labels["urgent"] and "color: #1f2328" in labels["mail:new"]
    ids = page.ids()
    for c in (first, second):
        anchor = urlsplit(c["html_url"]).fragment
        assert anchor == f"issuecomment-{c['id']}" and anchor in ids
    articles = page.find("article")
    assert [a.attrs["id"] for a in articles[1:]] == [f"issuecomment-{first['id']}",
                                                    f"issuecomment-{second['id']}"]
    assert "rita" in articles[1].text and "<em>fine</em>" in reply.body
    times = page.find("time")
    assert times and all(t.attrs["datetime"].endswith("Z") for t in times)


async def test_closed_issue_says_so(world: World, browser: Browser) -> None:
    issue = await new_issue(world, title="Done")
    await world.call("PATCH", f"/repos/acme/vault/issues/{issue['number']}", "marco",
                     json_body={"state": "closed", "state_reason": "completed"})
    reply = await browser.get(urlsplit(issue["html_url"]).path,
                              headers={"Authorization": f"token {world.tokens['marco']}"})
    assert "Closed" in reply.page.find(class_="state")[0].text


async def test_everything_is_escaped(world: World, browser: Browser) -> None:
    body = ("<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n"
            "[click](javascript:alert(3)) <b onclick=alert(4)>bold</b>\n\n"
            "<!-- vaultmail:header v1 {\"secret\": 1} -->\n\n"
            "<details><summary>Context</summary>\n\nhidden <i>words</i>\n\n</details>\n\n"
            "```\n<!-- kept in code -->\n```\n\n<details><summary>never closed")
    issue = await new_issue(world, title="<script>alert('t')</script> & co", body=body)
    await comment(world, issue["number"], "<iframe src=//evil></iframe>")
    reply = await browser.get(urlsplit(issue["html_url"]).path,
                              headers={"Authorization": f"token {world.tokens['admin']}"})
    html = reply.body
    assert "<script" not in html.replace("&lt;script", "")
    assert "&lt;script&gt;alert(&#x27;t&#x27;)&lt;/script&gt; &amp; co" in html
    assert "<img" not in html and "onerror=" not in html.replace("onerror=alert(2)&gt;", "")
    assert "<iframe" not in html and "onclick" not in html.replace("onclick=alert(4)&gt;", "")
    assert 'href="javascript' not in html
    assert "vaultmail:header" not in html  # an HTML comment is hidden, as on GitHub
    assert "&lt;!-- kept in code --&gt;" in html  # ...but code shows what it holds
    assert "<details><summary>Context</summary>" in html and "<i>words</i>" in html
    assert html.count("<details>") == html.count("</details>")
    assert reply.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    accessible(reply.page)


async def test_private_repositories_are_404_unless_readable(
        world: World, browser: Browser) -> None:
    issue = await new_issue(world, title="secret plans")
    path = urlsplit(issue["html_url"]).path
    for url in (path, "/acme/vault", "/acme/vault/issues"):
        reply = await browser.get(url)
        assert reply.status == 404 and "secret plans" not in reply.body, url
        accessible(reply.page)
    await browser.sign_in("olga")
    assert (await browser.get(path)).status == 404
    assert "vault" not in (await browser.get("/acme")).page.text
    await browser.sign_in("rita")  # an org member reads
    assert (await browser.get(path)).status == 200
    assert (await browser.get(path.replace(str(issue["number"]), "999"))).status == 404
    world.forge.add_repo("acme", "open", private=False)
    anon = Browser.open(world.forge)
    try:
        assert (await anon.get("/acme/open")).status == 200
        acme = (await anon.get("/acme")).page
        assert "open" in acme.text and "vault" not in acme.text
    finally:
        await anon.close()


async def test_repository_page_and_issue_list(world: World, browser: Browser) -> None:
    a = await new_issue(world, title="first one", labels=["mail:new"])
    b = await new_issue(world, title="second one")
    await world.call("PATCH", f"/repos/acme/vault/issues/{b['number']}", "marco",
                     json_body={"state": "closed"})
    world.forge.put_file("acme/vault", "README.md", "# Vault\n")
    await browser.sign_in("marco")
    repo = await browser.get("/acme/vault")
    assert repo.status == 200
    accessible(repo.page)
    assert "acme/vault" in repo.page.find("h1")[0].text.replace(" ", "")
    assert any(e.attrs.get("href") == "/acme/vault/issues" for e in repo.page.find("a"))
    assert "README.md" in repo.page.text
    listing = await browser.get("/acme/vault/issues")
    accessible(listing.page)
    links = {e.text.strip(): e.attrs["href"] for e in listing.page.find("a")}
    assert links["first one"] == f"/acme/vault/issues/{a['number']}"
    assert "second one" not in links  # open by default, as GitHub
    closed = await browser.get("/acme/vault/issues?state=closed")
    names = {e.text.strip() for e in closed.page.find("a")}
    assert "second one" in names and "first one" not in names
    every = await browser.get("/acme/vault/issues?state=all")
    assert {"first one", "second one"} <= {e.text.strip() for e in every.page.find("a")}
    bad = await browser.get("/acme/vault/issues?state=maybe")
    assert bad.status == 400 and "state" in bad.page.text


async def test_user_and_org_pages_list_visible_repositories(
        world: World, browser: Browser) -> None:
    world.forge.add_repo("marco", "notes", private=False)
    world.forge.add_repo("marco", "diary")
    await browser.sign_in("rita")
    org = await browser.get("/acme")
    assert org.status == 200
    accessible(org.page)
    assert "vault" in org.page.text and "Organization" in org.page.text
    marco = await browser.get("/marco")
    accessible(marco.page)
    assert "notes" in marco.page.text and "diary" not in marco.page.text
    assert (await browser.get("/nobody-here")).status == 404


async def test_every_html_url_the_api_hands_out_opens(world: World, browser: Browser) -> None:
    issue = await new_issue(world, title="links", labels=["mail:new"])
    await comment(world, issue["number"], "a comment")
    world.forge.put_file("acme/vault", "docs/a.md", "hello")
    auth = f"Bearer {world.jwt()}"
    admin = {"Authorization": f"token {world.tokens['admin']}"}
    bodies: list[Any] = []
    for path in ("/repos/acme/vault", f"/repos/acme/vault/issues/{issue['number']}",
                 f"/repos/acme/vault/issues/{issue['number']}/comments",
                 f"/repos/acme/vault/issues/{issue['number']}/timeline",
                 "/repos/acme/vault/contents/docs", "/repos/acme/vault/contents/docs/a.md",
                 "/users/marco", "/orgs/acme/members"):
        status, _, body = await world.call("GET", path, "admin")
        assert status == 200, path
        bodies.append(body)
    for path in ("/app", "/app/installations"):
        bodies.append((await world.call("GET", path, auth=auth))[2])
    urls: set[str] = set()

    def collect(value: Any, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                collect(v, k)
        elif isinstance(value, list):
            for v in value:
                collect(v, key)
        elif key in ("html_url", "html", "download_url", "avatar_url") and isinstance(
                value, str) and value.startswith(world.url):
            urls.add(value)

    collect(bodies)
    assert len(urls) >= 10
    for url in sorted(urls):
        parts = urlsplit(url)
        reply = await browser.get(parts.path + (f"?{parts.query}" if parts.query else ""),
                                  headers=admin)
        assert reply.status == 200, url
        if parts.fragment:
            assert parts.fragment in reply.page.ids(), url
        if reply.headers["Content-Type"].startswith("text/html"):
            accessible(reply.page)


async def test_api_paths_keep_json_404s(world: World) -> None:
    for path in ("/repos/acme", "/users", "/api/v3/nothing", "/orgs/acme/nothing",
                 "/repositories/1"):
        status, headers, body = await world.call("GET", path, "marco")
        assert status == 404 and headers["Content-Type"].startswith("application/json"), path
        assert body["message"] == "Not Found"


async def test_gitea_dialect_serves_the_same_pages(hooks: object) -> None:
    forge = LocalForge(dialect="gitea")
    await forge.start()
    b = Browser.open(forge)
    try:
        token = forge.add_user("ana")
        forge.add_repo("ana", "box")
        async with b.session.post(forge.url + "/api/v1/repos/ana/box/issues",
                                  json={"title": "gitea issue", "body": "*hi*"},
                                  headers={"Authorization": f"token {token}"}) as resp:
            issue = await resp.json()
        assert resp.status == 201
        assert (await b.get(urlsplit(issue["html_url"]).path)).status == 404
        await b.sign_in("ana")
        reply = await b.get(urlsplit(issue["html_url"]).path)
        assert reply.status == 200 and "gitea issue" in reply.page.find("h1")[0].text
        assert "<em>hi</em>" in reply.body
        status = (await b.get("/api/v1/nothing")).status
        assert status == 404
    finally:
        await b.close()
        await forge.stop()
