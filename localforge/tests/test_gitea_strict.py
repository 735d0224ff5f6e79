"""The Gitea dialect as strict as Gitea: each behaviour below was read in Gitea's source (see
localforge/README.md, "Gitea dialect: checked against Gitea's source") and is held here over
real HTTP, with a webhook receiver that records which hook each delivery was for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from localforge import LocalForge
from localforge.gitea.seed import make_site_admin

API = "/api/v1"
VAULT = f"{API}/repos/acme/vault"


@dataclass
class Delivery:
    hook: str  # the path the hook was registered with
    headers: CIMultiDict[str]
    body: bytes

    @property
    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data

    @property
    def kind(self) -> tuple[str, str, str | None]:
        """(X-Gitea-Event, X-Gitea-Event-Type, action)."""
        return (self.headers["X-Gitea-Event"], self.headers["X-Gitea-Event-Type"],
                self.payload.get("action"))


@dataclass
class G:
    forge: LocalForge
    session: aiohttp.ClientSession
    receiver: str
    tokens: dict[str, str]
    received: list[Delivery] = field(default_factory=list)

    async def call(self, method: str, path: str, who: str | None = None, body: Any = None,
                   redirects: bool = True) -> tuple[int, CIMultiDict[str], Any]:
        headers = {"Authorization": f"token {self.tokens[who]}"} if who else {}
        async with self.session.request(method, self.forge.url + path, json=body,
                                        headers=headers, allow_redirects=redirects) as resp:
            raw = await resp.read()
            data = json.loads(raw) if raw and resp.content_type == "application/json" else None
            return resp.status, CIMultiDict(resp.headers), data

    async def hook(self, name: str, events: list[str], secret: str | None = "s3cret") -> Any:
        config = {"url": f"{self.receiver}/{name}", "content_type": "json"}
        if secret is not None:
            config["secret"] = secret
        status, _, body = await self.call("POST", f"{API}/orgs/acme/hooks", "admin", {
            "type": "gitea", "config": config, "events": events, "active": True})
        assert status == 201, body
        return body

    async def deliveries(self, hook: str) -> list[Delivery]:
        await self.forge.webhooks_idle()
        return [d for d in self.received if d.hook == hook]

    async def issue(self, title: str = "t", labels: list[int] | None = None) -> int:
        status, _, body = await self.call("POST", f"{VAULT}/issues", "marco",
                                          {"title": title, "body": "b", "labels": labels or []})
        assert status == 201, body
        return int(body["number"])

    async def label(self, name: str) -> int:
        status, _, body = await self.call("POST", f"{VAULT}/labels", "admin",
                                          {"name": name, "color": "#00aabb"})
        assert status == 201, body
        return int(body["id"])


@pytest.fixture
async def g() -> AsyncIterator[G]:
    received: list[Delivery] = []

    async def receive(request: web.Request) -> web.Response:
        received.append(Delivery(request.match_info["hook"], CIMultiDict(request.headers),
                                 await request.read()))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{hook}", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    forge = LocalForge(dialect="gitea")
    await forge.start("127.0.0.1", 0)
    tokens = {"admin": forge.add_user("admin", email="admin@acme.com")}
    forge.add_org("acme", owner="admin")
    for login in ("marco", "rita"):
        tokens[login] = forge.add_user(login, email=f"{login}@acme.com")
        forge.add_org_member("acme", login)
    tokens["olga"] = forge.add_user("olga", email="olga@example.com")
    tokens["root"] = forge.add_user("root", email="root@example.com")
    make_site_admin(forge, "root")
    forge.add_repo("acme", "vault")
    forge.set_permission("acme/vault", "marco", "write")
    forge.add_repo("olga", "public-notes", private=False)
    try:
        async with aiohttp.ClientSession() as session:
            yield G(forge, session, f"http://127.0.0.1:{port}", tokens, received)
    finally:
        await forge.stop()
        await runner.cleanup()


# -- issue lists -------------------------------------------------------------------------------
async def test_labels_filter_on_issue_lists_is_and(g: G) -> None:
    """routers/api/v1/repo/issue.go ListIssues: the names become IncludedLabelIDs (every one
    must be on the issue); names that do not exist are discarded, and none left is no filter."""
    a, b = await g.label("a"), await g.label("b")
    only_a, only_b, both = (await g.issue("A", [a]), await g.issue("B", [b]),
                            await g.issue("AB", [a, b]))
    unlabelled = await g.issue("none")

    async def numbers(labels: str) -> list[int]:
        status, _, body = await g.call("GET", f"{VAULT}/issues?state=all&labels={labels}",
                                       "marco")
        assert status == 200, body
        return [i["number"] for i in body]

    assert await numbers("a,b") == [both]
    assert await numbers("a") == [both, only_a]
    assert await numbers("b,a") == [both]
    assert await numbers("a,nosuch") == [both, only_a], "unknown names are discarded"
    assert await numbers("nosuch") == [unlabelled, both, only_b, only_a], "nothing left"


# -- organisations -----------------------------------------------------------------------------
async def test_get_org(g: G) -> None:
    status, _, org = await g.call("GET", f"{API}/orgs/acme", "olga")
    assert status == 200
    assert org["username"] == org["name"] == "acme" and isinstance(org["id"], int)
    assert {"full_name", "email", "avatar_url", "description", "website", "location",
            "visibility", "repo_admin_change_team_access"} <= set(org)
    status, _, _ = await g.call("GET", f"{API}/orgs/acme")
    assert status == 200, "a public org is visible without a token"
    status, _, body = await g.call("GET", f"{API}/orgs/nosuch", "olga")
    assert status == 404 and "message" in body


async def test_org_membership_check(g: G) -> None:
    """routers/api/v1/org/member.go IsMember: a member (or site admin) asking gets 204 or
    404; a user asking about themselves gets 404; anyone else is redirected (303) to
    public_members, where the membership is not public (DEFAULT_ORG_MEMBER_VISIBLE=false)."""
    members = f"{API}/orgs/acme/members"
    assert (await g.call("GET", f"{members}/marco", "rita"))[0] == 204
    assert (await g.call("GET", f"{members}/admin", "marco"))[0] == 204, "owners are members"
    assert (await g.call("GET", f"{members}/olga", "rita"))[0] == 404
    assert (await g.call("GET", f"{members}/marco", "root"))[0] == 204, "site admin"
    assert (await g.call("GET", f"{members}/olga", "olga"))[0] == 404
    status, headers, _ = await g.call("GET", f"{members}/marco", "olga", redirects=False)
    assert status == 303
    assert headers["Location"].endswith(f"{API}/orgs/acme/public_members/marco")
    assert (await g.call("GET", f"{members}/marco", "olga"))[0] == 404, "not public"
    status, headers, _ = await g.call("GET", f"{members}/marco", redirects=False)
    assert status == 303
    assert (await g.call("GET", f"{members}/nosuch", "rita"))[0] == 404
    assert (await g.call("GET", f"{API}/orgs/nosuch/members/marco", "rita"))[0] == 404


# -- org hooks ---------------------------------------------------------------------------------
async def test_org_hook_issues_event_expands_as_events_array(g: G) -> None:
    """routers/api/v1/utils/hook.go: `issues` switches on every issue hook type (issues_only,
    issue_assign, issue_label, issue_milestone, issue_comment); the hook answers with
    Webhook.EventsArray, in its order."""
    hook = await g.hook("all", ["issues"])
    expanded = ["issues", "issue_assign", "issue_label", "issue_milestone", "issue_comment"]
    assert hook["events"] == expanded
    _, _, hooks = await g.call("GET", f"{API}/orgs/acme/hooks", "admin")
    assert [h["events"] for h in hooks if h["id"] == hook["id"]] == [expanded]
    assert (await g.hook("label", ["issue_label"]))["events"] == ["issue_label"]
    assert (await g.hook("only", ["issues_only"]))["events"] == ["issues"]
    assert (await g.hook("mixed", ["push", "issue_comment", "nonsense"]))["events"] == [
        "push", "issue_comment"], "unknown names are dropped, known ones in Gitea's order"
    assert (await g.hook("default", []))["events"] == ["push"]

    lid = await g.label("mail:new")
    n = await g.issue()
    await g.call("POST", f"{VAULT}/issues/{n}/labels", "admin", {"labels": [lid]})
    await g.call("POST", f"{VAULT}/issues/{n}/comments", "marco", {"body": "hi"})
    assert [d.kind for d in await g.deliveries("all")] == [
        ("issues", "issues", "opened"), ("issues", "issue_label", "label_updated"),
        ("issue_comment", "issue_comment", "created")]
    assert [d.kind for d in await g.deliveries("label")] == [
        ("issues", "issue_label", "label_updated")]
    assert [d.kind for d in await g.deliveries("only")] == [("issues", "issues", "opened")]
    assert [d.kind for d in await g.deliveries("mixed")] == [
        ("issue_comment", "issue_comment", "created")]


async def test_org_hook_needs_content_type(g: G) -> None:
    """checkCreateHookOption: `url` and `content_type` must both be in config, 422 otherwise."""
    base = {"type": "gitea", "events": ["issues"], "active": True}
    status, _, body = await g.call("POST", f"{API}/orgs/acme/hooks", "admin",
                                   {**base, "config": {"url": f"{g.receiver}/x"}})
    assert status == 422 and body["message"] == "Missing config option: content_type"
    status, _, body = await g.call("POST", f"{API}/orgs/acme/hooks", "admin",
                                   {**base, "config": {"content_type": "json"}})
    assert status == 422 and body["message"] == "Missing config option: url"
    status, _, body = await g.call("POST", f"{API}/orgs/acme/hooks", "admin", {
        **base, "config": {"url": f"{g.receiver}/x", "content_type": "xml"}})
    assert status == 422 and body["message"] == "Invalid content type"
    status, _, body = await g.call("POST", f"{API}/orgs/acme/hooks", "admin", {
        **base, "type": "nope", "config": {"url": f"{g.receiver}/x", "content_type": "json"}})
    assert status == 422 and body["message"] == "Invalid hook type: nope"
    _, _, hooks = await g.call("GET", f"{API}/orgs/acme/hooks", "admin")
    assert hooks == [], "nothing was created"


async def test_unsigned_hooks_carry_empty_signature_headers(g: G) -> None:
    """services/webhook/deliver.go addDefaultHeaders: without a secret the signatures are
    empty, so X-Gitea-Signature is sent empty and X-Hub-Signature(-256) as the bare prefix."""
    await g.hook("plain", ["issues"], secret=None)
    await g.hook("signed", ["issues"])
    await g.issue()
    [plain] = await g.deliveries("plain")
    assert plain.headers.getall("X-Gitea-Signature") == [""]
    assert plain.headers.getall("X-Gogs-Signature") == [""]
    assert plain.headers.getall("X-Hub-Signature") == ["sha1="]
    assert plain.headers.getall("X-Hub-Signature-256") == ["sha256="]
    [signed] = await g.deliveries("signed")
    assert len(signed.headers["X-Gitea-Signature"]) == 64
    assert signed.headers["X-Hub-Signature"].startswith("sha1=")


# -- webhook sequences -------------------------------------------------------------------------
async def test_edit_of_title_and_body_is_two_deliveries(g: G) -> None:
    """EditIssue calls ChangeTitle (skipped when the title is unchanged), then ChangeContent
    (whenever `body` is given, changed or not): one `edited` each, title first."""
    await g.hook("h", ["issues"])
    n = await g.issue("old title")
    await g.call("PATCH", f"{VAULT}/issues/{n}", "marco", {"title": "new title", "body": "nb"})
    await g.call("PATCH", f"{VAULT}/issues/{n}", "marco", {"title": "new title", "body": "nb"})
    await g.call("PATCH", f"{VAULT}/issues/{n}", "marco", {"title": "new title"})
    edits = [d.payload for d in await g.deliveries("h") if d.payload["action"] == "edited"]
    assert [e["changes"] for e in edits] == [
        {"title": {"from": "old title"}}, {"body": {"from": "b"}}, {"body": {"from": "nb"}}]
    assert edits[0]["issue"]["title"] == "new title" and edits[0]["issue"]["body"] == "b", \
        "each payload is rendered when its change is made (the body changes after the title)"
    assert edits[1]["issue"]["body"] == "nb"


async def test_label_updated_is_sent_even_when_nothing_changed(g: G) -> None:
    """services/issue/label.go: AddLabels, ReplaceLabels and RemoveLabel notify after the
    write whatever it changed; ClearLabels always sends label_cleared; NewIssue sends
    label_updated after opened when the issue was created with labels."""
    await g.hook("h", ["issues"])
    a, b = await g.label("a"), await g.label("b")
    n = await g.issue("t", [a])
    path = f"{VAULT}/issues/{n}/labels"
    assert (await g.call("POST", path, "admin", {"labels": [a]}))[0] == 200  # already on it
    assert (await g.call("PUT", path, "admin", {"labels": [a]}))[0] == 200  # the same set
    assert (await g.call("DELETE", f"{path}/{b}", "admin"))[0] == 204  # not on the issue
    assert (await g.call("DELETE", path, "admin"))[0] == 204
    assert (await g.call("DELETE", path, "admin"))[0] == 204  # no labels left
    seen = [(d.payload["action"], [lb["name"] for lb in d.payload["issue"]["labels"]])
            for d in await g.deliveries("h")]
    assert seen == [("opened", ["a"]), ("label_updated", ["a"]), ("label_updated", ["a"]),
                    ("label_updated", ["a"]), ("label_updated", ["a"]),
                    ("label_cleared", []), ("label_cleared", [])]


async def test_issue_comment_payload_has_no_pull_request_key_on_issues(g: G) -> None:
    """IssueCommentPayload.PullRequest is `json:"pull_request,omitempty"`: absent on issues."""
    await g.hook("h", ["issue_comment"])
    n = await g.issue()
    _, _, comment = await g.call("POST", f"{VAULT}/issues/{n}/comments", "marco",
                                 {"body": "one"})
    await g.call("PATCH", f"{VAULT}/issues/comments/{comment['id']}", "marco", {"body": "two"})
    await g.call("DELETE", f"{VAULT}/issues/comments/{comment['id']}", "marco")
    got = [d.payload for d in await g.deliveries("h")]
    assert [p["action"] for p in got] == ["created", "edited", "deleted"]
    assert all("pull_request" not in p and p["is_pull"] is False for p in got)
    assert got[0]["issue"]["pull_request"] is None, "the issue's own field stays (not omitempty)"


# -- comment lists -----------------------------------------------------------------------------
async def test_issue_comment_list_carries_total_count(g: G) -> None:
    """ListIssueComments: every comment at once, with SetTotalCountHeader (no Link)."""
    n = await g.issue()
    for i in range(3):
        await g.call("POST", f"{VAULT}/issues/{n}/comments", "marco", {"body": f"c{i}"})
    status, headers, body = await g.call("GET", f"{VAULT}/issues/{n}/comments", "marco")
    assert status == 200 and len(body) == 3
    assert headers["X-Total-Count"] == "3" and "Link" not in headers
    status, headers, body = await g.call("GET", f"{VAULT}/issues/comments", "marco")
    assert headers["X-Total-Count"] == "3"


# -- users as Gitea shows them -----------------------------------------------------------------
async def test_private_user_fields_only_for_themselves_and_site_admins(g: G) -> None:
    """services/convert/user.go toUser: `email` is the real one only for a signed-in caller
    (else the no-reply placeholder); `active`, `is_admin`, `login_name`, `language`,
    `last_login`, `prohibit_login` only for the user themselves or a site admin."""
    path = f"{API}/users/marco"
    _, _, other = await g.call("GET", path, "rita")
    assert other["email"] == "marco@acme.com" and other["active"] is False
    assert other["last_login"] == "0001-01-01T00:00:00Z"
    _, _, anonymous = await g.call("GET", path)
    assert anonymous["email"] == "marco@noreply.localhost" and anonymous["active"] is False
    _, _, me = await g.call("GET", f"{API}/user", "marco")
    assert me["email"] == "marco@acme.com" and me["active"] is True and me["is_admin"] is False
    assert me["last_login"] == "1970-01-01T00:00:00Z", "never signed in: LastLoginUnix 0"
    _, _, by_admin = await g.call("GET", path, "root")
    assert by_admin["active"] is True
    _, _, root = await g.call("GET", f"{API}/users/root", "root")
    assert root["is_admin"] is True
    _, _, root_by_other = await g.call("GET", f"{API}/users/root", "marco")
    assert root_by_other["is_admin"] is False, "only an admin or the user sees is_admin"


async def test_repository_owner_email_and_active(g: G) -> None:
    """convert.ToRepo renders the owner with ToUserWithAccessMode: signed when the caller has
    any access to the repository, never authed (so `active` is never shown there)."""
    path = f"{API}/repos/olga/public-notes"
    _, _, by_owner = await g.call("GET", path, "olga")
    assert by_owner["owner"]["email"] == "olga@example.com"
    assert by_owner["owner"]["active"] is False, "not even to the owner"
    _, _, by_admin = await g.call("GET", path, "root")
    assert by_admin["owner"]["active"] is False
    _, _, anonymous = await g.call("GET", path)
    assert anonymous["owner"]["email"] == "olga@example.com", "a public repo: read access"


async def test_webhook_users_are_rendered_without_a_viewer(g: G) -> None:
    """Webhook senders are ToUser(doer, nil): the placeholder email, nothing private."""
    await g.hook("h", ["issues", "issue_comment"])
    n = await g.issue()
    await g.call("POST", f"{VAULT}/issues/{n}/comments", "marco", {"body": "x"})
    for d in await g.deliveries("h"):
        assert d.payload["sender"]["email"] == "marco@noreply.localhost"
        assert d.payload["sender"]["active"] is False
    status, _, comments = await g.call("GET", f"{VAULT}/issues/{n}/comments", "marco")
    assert comments[0]["user"]["email"] == "marco@noreply.localhost", \
        "ToAPIComment renders the poster with no viewer either"
