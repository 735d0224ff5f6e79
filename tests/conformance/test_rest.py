"""Every operation of the REST subset, driven over real HTTP against the local forge, with each
response held to GitHub's official description (status documented, body schema, documented
headers, rate-limit headers).

One scenario per operationId; the suite fails if an operation of the subset has none, so
coverage cannot silently shrink. Scenarios also check the error statuses a client relies on
(404 for what is missing, 422 for bad input, 304 for conditional GETs) and a few behaviours the
schemas cannot express (reference/forge-facts.md)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

from . import validator
from .conftest import ORG, VAULT, World

Scenario = Callable[[World], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(operation_id: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        assert operation_id not in SCENARIOS, operation_id
        SCENARIOS[operation_id] = fn
        return fn

    return register


def subset_operation_ids() -> set[str]:
    return {op.operation_id for op in validator.rest_operations()}


def error_message(body: object) -> str:
    return body.get("message", "") if isinstance(body, dict) else ""


# --------------------------------------------------------------------------------------------
# App authentication (App JWT)


@scenario("apps/get-authenticated")
async def _get_app(w: World) -> None:
    r = await w.call("GET", "/app", auth="jwt", expect=200)
    app = r.json
    assert app["id"] == w.app_id and app["slug"] == "vaultmail"
    assert set(app["events"]) >= {"issues", "issue_comment", "label"}


@scenario("apps/list-installations")
async def _list_installations(w: World) -> None:
    r = await w.call("GET", "/app/installations", auth="jwt", expect=200)
    assert [i["id"] for i in r.json] == [w.installation_id]
    assert r.json[0]["account"]["login"] == ORG
    # a page at a time, following Link; a suspended installation is listed, marked so
    w.forge.add_org("beta", owner="admin")
    beta = w.forge.install_app(w.app_id, "beta")
    w.forge.suspend_app(beta)
    r = await w.call("GET", "/app/installations", auth="jwt", params={"per_page": "1"},
                     expect=200)
    assert [i["suspended_at"] for i in r.json] == [None]
    nxt = r.headers["Link"].split(">;")[0].lstrip("<")
    r = await w.call("GET", nxt, auth="jwt", expect=200)
    assert [(i["id"], i["suspended_by"]["login"]) for i in r.json] == [(beta, "admin")]
    assert r.json[0]["suspended_at"] and 'rel="next"' not in r.headers["Link"]


@scenario("apps/create-installation-access-token")
async def _create_token(w: World) -> None:
    r = await w.call("POST", f"/app/installations/{w.installation_id}/access_tokens",
                     auth="jwt", expect=201)
    assert r.json["token"] and r.json["expires_at"]
    await w.call("POST", "/app/installations/999999/access_tokens", auth="jwt", expect=404)
    w.forge.suspend_app(w.installation_id)
    r = await w.call("POST", f"/app/installations/{w.installation_id}/access_tokens",
                     auth="jwt", expect=403)
    assert error_message(r.json) == "This installation has been suspended"
    w.forge.unsuspend_app(w.installation_id)
    # A JWT more than 10 minutes ahead is refused (forge-facts 1.4).
    too_long = w.jwt(exp=int(time.time()) + 3600)
    r = await w.call("POST", f"/app/installations/{w.installation_id}/access_tokens",
                     auth=None, headers={"Authorization": f"Bearer {too_long}"}, expect=401,
                     validate=False)
    validator.validate_response("POST", w.url + f"/app/installations/{w.installation_id}"
                                "/access_tokens", r.status, r.headers, r.raw,
                                rate_limit_headers=False)


@scenario("apps/get-repo-installation")
async def _repo_installation(w: World) -> None:
    r = await w.call("GET", f"/repos/{VAULT}/installation", auth="jwt", expect=200)
    assert r.json["id"] == w.installation_id
    await w.call("GET", f"/repos/{ORG}/no-such-repo/installation", auth="jwt", expect=404)


@scenario("apps/list-webhook-deliveries")
async def _list_deliveries(w: World) -> None:
    r = await w.call("GET", "/app/hook/deliveries", auth="jwt", expect=200)
    assert any(d["event"] == "installation" and d["action"] == "created" for d in r.json)


@scenario("apps/get-webhook-delivery")
async def _get_delivery(w: World) -> None:
    listed = await w.call("GET", "/app/hook/deliveries", auth="jwt", expect=200)
    d = listed.json[0]
    r = await w.call("GET", f"/app/hook/deliveries/{d['id']}", auth="jwt", expect=200)
    assert r.json["guid"] == d["guid"]
    assert r.json["request"]["payload"]["action"] == d["action"]


@scenario("apps/redeliver-webhook-delivery")
async def _redeliver(w: World) -> None:
    listed = await w.call("GET", "/app/hook/deliveries", auth="jwt", expect=200)
    d = listed.json[0]
    w.receiver.take()
    await w.call("POST", f"/app/hook/deliveries/{d['id']}/attempts", auth="jwt", expect=202)
    await w.forge.webhooks_idle()
    again = w.receiver.take()
    assert [x.headers.get("X-GitHub-Delivery") for x in again] == [d["guid"]], \
        "a redelivery keeps the X-GitHub-Delivery of the original (forge-facts 1.1)"


@scenario("apps/create-from-manifest")
async def _create_from_manifest(w: World) -> None:
    manifest = {"name": "Manifest App", "url": "https://example.com",
                "hook_attributes": {"url": w.receiver.url},
                "redirect_url": "https://example.com/setup/callback",
                "default_events": ["issues"], "default_permissions": {"issues": "write"}}
    codes = []
    for _ in range(2):
        async with w.http.post(f"{w.url}/organizations/{ORG}/settings/apps/new?state=st",
                               data={"manifest": json.dumps(manifest)},
                               headers={"Authorization": f"token {w.tokens['admin']}"},
                               allow_redirects=False) as resp:
            assert resp.status == 302, await resp.text()
            codes.append(parse_qs(urlsplit(resp.headers["Location"]).query)["code"][0])
    r = await w.call("POST", f"/app-manifests/{codes[0]}/conversions", auth=None, expect=201)
    assert r.json["slug"] == "manifest-app" and "PRIVATE KEY-----" in r.json["pem"]
    assert r.json["owner"]["login"] == ORG and r.json["webhook_secret"]
    await w.call("POST", f"/app-manifests/{codes[0]}/conversions", auth=None, expect=404)
    # the second code's App would take a name that the first has taken since
    r = await w.call("POST", f"/app-manifests/{codes[1]}/conversions", auth=None, expect=422)
    assert r.json["errors"] == ["Name is already in use"]


# --------------------------------------------------------------------------------------------
# Installation, org and users


@scenario("apps/list-repos-accessible-to-installation")
async def _installation_repos(w: World) -> None:
    r = await w.call("GET", "/installation/repositories", expect=200)
    names = {repo["full_name"] for repo in r.json["repositories"]}
    assert {VAULT, f"{ORG}/.github"} <= names and r.json["total_count"] == len(names)
    etag = r.headers.get("ETag")
    assert etag, "ETag on a GET that documents 304"
    await w.call("GET", "/installation/repositories", headers={"If-None-Match": etag},
                 expect=304)


@scenario("rate-limit/get")
async def _rate_limit(w: World) -> None:
    r = await w.call("GET", "/rate_limit", expect=200)
    core = r.json["resources"]["core"]
    assert core["limit"] >= 5000
    if w.version == "2022-11-28":
        assert r.json["rate"]["limit"] == core["limit"]
    else:  # 2026-03-10 dropped the duplicate of resources.core
        assert "rate" not in r.json


@scenario("orgs/list-members")
async def _org_members(w: World) -> None:
    r = await w.call("GET", f"/orgs/{ORG}/members", expect=200)
    assert {m["login"] for m in r.json} >= {"admin", "marco", "sara", "scout-bot"}


@scenario("teams/list-members-in-org")
async def _team_members(w: World) -> None:
    r = await w.call("GET", f"/orgs/{ORG}/teams/pricing/members", expect=200)
    assert {m["login"] for m in r.json} == {"sara", "marco"}


@scenario("users/get-by-username")
async def _get_user(w: World) -> None:
    r = await w.call("GET", "/users/marco", expect=200)
    assert r.json["login"] == "marco" and r.json["type"] == "User"
    await w.call("GET", "/users/nobody-here", expect=404)


# --------------------------------------------------------------------------------------------
# Repositories


@scenario("repos/list-for-org")
async def _org_repos(w: World) -> None:
    r = await w.call("GET", f"/orgs/{ORG}/repos", expect=200)
    assert {x["full_name"] for x in r.json} >= {VAULT, f"{ORG}/.github"}


@scenario("repos/create-in-org")
async def _create_repo(w: World) -> None:
    r = await w.call("POST", f"/orgs/{ORG}/repos", auth="admin",
                     json_body={"name": "ledger-vault", "private": True}, expect=201)
    assert r.json["full_name"] == f"{ORG}/ledger-vault" and r.json["private"] is True
    r = await w.call("POST", f"/orgs/{ORG}/repos", auth="admin",
                     json_body={"name": "ledger-vault"}, expect=422)
    assert r.json["errors"]


@scenario("repos/get")
async def _get_repo(w: World) -> None:
    r = await w.call("GET", f"/repos/{VAULT}", expect=200)
    assert r.json["full_name"] == VAULT and r.json["has_issues"] is True
    await w.call("GET", f"/repos/{ORG}/no-such-repo", expect=404)


@scenario("repos/get-content")
async def _get_content(w: World) -> None:
    r = await w.call("GET", f"/repos/{ORG}/.github/contents/vaultmail.yml", expect=200)
    assert r.json["type"] == "file" and r.json["encoding"] == "base64"
    assert base64.b64decode(r.json["content"]).decode().startswith("org: acme")
    etag = r.headers.get("ETag")
    assert etag
    before = int(r.headers["X-RateLimit-Remaining"])
    r304 = await w.call("GET", f"/repos/{ORG}/.github/contents/vaultmail.yml",
                        headers={"If-None-Match": etag}, expect=304)
    assert int(r304.headers["X-RateLimit-Remaining"]) == before, \
        "a 304 does not count against the primary limit (forge-facts 1.3)"
    await w.call("GET", f"/repos/{ORG}/.github/contents/missing.yml", expect=404)


@scenario("repos/get-collaborator-permission-level")
async def _permission(w: World) -> None:
    r = await w.call("GET", f"/repos/{VAULT}/collaborators/marco/permission", expect=200)
    assert r.json["permission"] == "write" and r.json["user"]["login"] == "marco"
    r = await w.call("GET", f"/repos/{VAULT}/collaborators/sara/permission", expect=200)
    assert r.json["permission"] == "read"
    await w.call("GET", f"/repos/{VAULT}/collaborators/nobody-here/permission", expect=404)


@scenario("repos/create-dispatch-event")
async def _dispatch(w: World) -> None:
    await w.call("POST", f"/repos/{VAULT}/dispatches", auth="marco",
                 json_body={"event_type": "vaultmail.run", "client_payload": {"mail": "m1"}},
                 expect=204)
    await w.call("POST", f"/repos/{VAULT}/dispatches", auth="marco",
                 json_body={"client_payload": {}}, expect=422)


# --------------------------------------------------------------------------------------------
# Issues


@scenario("issues/create")
async def _create_issue(w: World) -> None:
    r = await w.call("POST", f"/repos/{VAULT}/issues", auth="marco",
                     json_body={"title": "Pricing review", "body": "Hi", "labels": ["mail:new"]},
                     expect=201)
    issue = r.json
    assert issue["number"] >= 1 and issue["state"] == "open" and issue["user"]["login"] == "marco"
    assert r.headers["Location"].endswith(f"/repos/{VAULT}/issues/{issue['number']}")
    # An unknown label is created on the fly, ededed with no description (forge-facts 1.5).
    assert [(x["name"], x["color"], x["description"]) for x in issue["labels"]] == \
        [("mail:new", "ededed", None)]
    # Labels from a user without push access are silently dropped.
    r = await w.call("POST", f"/repos/{VAULT}/issues", auth="sara",
                     json_body={"title": "From sara", "labels": ["mail:new"]}, expect=201)
    assert r.json["labels"] == []
    # The app's own issue is authored by its bot account.
    r = await w.call("POST", f"/repos/{VAULT}/issues", json_body={"title": "From the app"},
                     expect=201)
    assert r.json["user"]["login"] == "vaultmail[bot]" and r.json["user"]["type"] == "Bot"
    assert r.json["performed_via_github_app"]["id"] == w.app_id
    bad = {"body": "no title"}
    assert validator.check_request_body("issues/create", bad)
    await w.call("POST", f"/repos/{VAULT}/issues", json_body=bad, expect=422)
    await w.call("POST", f"/repos/{ORG}/no-such-repo/issues", json_body={"title": "x"},
                 expect=404)


@scenario("issues/get")
async def _get_issue(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new"])
    r = await w.call("GET", f"/repos/{VAULT}/issues/{issue['number']}", expect=200)
    assert r.json["id"] == issue["id"] and r.json["labels"][0]["name"] == "mail:new"
    etag = r.headers.get("ETag")
    assert etag
    await w.call("GET", f"/repos/{VAULT}/issues/{issue['number']}",
                 headers={"If-None-Match": etag}, expect=304)
    await w.call("GET", f"/repos/{VAULT}/issues/9999", expect=404)


@scenario("issues/update")
async def _update_issue(w: World) -> None:
    issue = await w.new_issue()
    n = issue["number"]
    r = await w.call("PATCH", f"/repos/{VAULT}/issues/{n}",
                     json_body={"state": "closed", "state_reason": "completed"}, expect=200)
    assert r.json["state"] == "closed" and r.json["state_reason"] == "completed"
    assert r.json["closed_at"] and r.json["closed_by"]["login"] == "vaultmail[bot]"
    r = await w.call("PATCH", f"/repos/{VAULT}/issues/{n}",
                     json_body={"state": "open", "title": "Renamed"}, expect=200)
    assert r.json["state"] == "open" and r.json["state_reason"] == "reopened"
    assert r.json["title"] == "Renamed" and r.json["closed_at"] is None
    bad = {"state": "finished"}
    assert validator.check_request_body("issues/update", bad)
    await w.call("PATCH", f"/repos/{VAULT}/issues/{n}", json_body=bad, expect=422)
    await w.call("PATCH", f"/repos/{VAULT}/issues/9999", json_body={"title": "x"}, expect=404)


@scenario("issues/list-for-repo")
async def _list_issues(w: World) -> None:
    a = await w.new_issue("first", labels=["mail:new", "goal"])
    b = await w.new_issue("second", labels=["mail:new"])
    await w.new_issue("third")
    r = await w.call("GET", f"/repos/{VAULT}/issues", params={"per_page": "2"}, expect=200)
    assert len(r.json) == 2 and 'rel="next"' in r.headers.get("Link", "")
    r = await w.call("GET", f"/repos/{VAULT}/issues",
                     params={"labels": "mail:new,goal", "state": "all"}, expect=200)
    assert [i["number"] for i in r.json] == [a["number"]], "labels= is AND on GitHub"
    r = await w.call("GET", f"/repos/{VAULT}/issues", params={"labels": "mail:new"}, expect=200)
    assert {i["number"] for i in r.json} == {a["number"], b["number"]}
    await w.call("GET", f"/repos/{ORG}/no-such-repo/issues", expect=404)


@scenario("issues/list-events-for-timeline")
async def _timeline(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new"])
    n = issue["number"]
    await w.call("POST", f"/repos/{VAULT}/issues/{n}/comments", auth="scout-bot",
                 json_body={"body": "On it"}, expect=201)
    await w.call("DELETE", f"/repos/{VAULT}/issues/{n}/labels/mail:new", expect=200)
    await w.call("PATCH", f"/repos/{VAULT}/issues/{n}", json_body={"title": "Renamed"},
                 expect=200)
    await w.call("PATCH", f"/repos/{VAULT}/issues/{n}", json_body={"state": "closed"},
                 expect=200)
    await w.call("PATCH", f"/repos/{VAULT}/issues/{n}", json_body={"state": "open"},
                 expect=200)
    r = await w.call("GET", f"/repos/{VAULT}/issues/{n}/timeline", expect=200)
    events = [e["event"] for e in r.json]
    for wanted in ("labeled", "commented", "unlabeled", "renamed", "closed", "reopened"):
        assert wanted in events, f"timeline lacks a {wanted} event: {events}"
    # The operation's anyOf admits almost any object; hold each event to its own schema.
    schema_of = {"labeled": "labeled-issue-event", "unlabeled": "unlabeled-issue-event",
                 "renamed": "renamed-issue-event", "closed": "state-change-issue-event",
                 "reopened": "state-change-issue-event", "commented": "timeline-comment-event"}
    problems = []
    for e in r.json:
        if e["event"] in schema_of:
            problems += validator.check_component(schema_of[e["event"]], e,
                                                  "rest:issues/list-events-for-timeline")
    assert not problems, "\n".join(problems)
    await w.call("GET", f"/repos/{VAULT}/issues/9999/timeline", expect=404)


# --------------------------------------------------------------------------------------------
# Issue labels


@scenario("issues/list-labels-on-issue")
async def _issue_labels(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new", "goal"])
    r = await w.call("GET", f"/repos/{VAULT}/issues/{issue['number']}/labels", expect=200)
    assert sorted(x["name"] for x in r.json) == ["goal", "mail:new"]
    await w.call("GET", f"/repos/{VAULT}/issues/9999/labels", expect=404)


@scenario("issues/add-labels")
async def _add_labels(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new"])
    n = issue["number"]
    r = await w.call("POST", f"/repos/{VAULT}/issues/{n}/labels",
                     json_body={"labels": ["mail:working"]}, expect=200)
    assert sorted(x["name"] for x in r.json) == ["mail:new", "mail:working"]
    r = await w.call("POST", f"/repos/{VAULT}/issues/{n}/labels",
                     json_body={"labels": [{"name": "goal"}]}, expect=200)
    assert "goal" in {x["name"] for x in r.json}
    for bad in ({"labels": 5}, {"labels": [{"color": "ff0000"}]}):
        assert validator.check_request_body("issues/add-labels", bad), bad
        await w.call("POST", f"/repos/{VAULT}/issues/{n}/labels", json_body=bad, expect=422)
    await w.call("POST", f"/repos/{VAULT}/issues/9999/labels",
                 json_body={"labels": ["x"]}, expect=404)


@scenario("issues/set-labels")
async def _set_labels(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new", "goal"])
    n = issue["number"]
    r = await w.call("PUT", f"/repos/{VAULT}/issues/{n}/labels",
                     json_body={"labels": ["mail:replied"]}, expect=200)
    assert [x["name"] for x in r.json] == ["mail:replied"]
    r = await w.call("PUT", f"/repos/{VAULT}/issues/{n}/labels", json_body={"labels": []},
                     expect=200)
    assert r.json == []
    bad = {"labels": 5}
    assert validator.check_request_body("issues/set-labels", bad)
    await w.call("PUT", f"/repos/{VAULT}/issues/{n}/labels", json_body=bad, expect=422)


@scenario("issues/remove-label")
async def _remove_label(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new", "goal"])
    n = issue["number"]
    r = await w.call("DELETE", f"/repos/{VAULT}/issues/{n}/labels/{quote('mail:new')}",
                     expect=200)
    assert [x["name"] for x in r.json] == ["goal"], "returns the labels that remain"
    # 404 when the label is not on the issue (forge-facts 1.5).
    await w.call("DELETE", f"/repos/{VAULT}/issues/{n}/labels/{quote('mail:new')}", expect=404)


@scenario("issues/remove-all-labels")
async def _remove_all_labels(w: World) -> None:
    issue = await w.new_issue(labels=["mail:new", "goal"])
    n = issue["number"]
    await w.call("DELETE", f"/repos/{VAULT}/issues/{n}/labels", expect=204)
    r = await w.call("GET", f"/repos/{VAULT}/issues/{n}/labels", expect=200)
    assert r.json == []
    await w.call("DELETE", f"/repos/{VAULT}/issues/9999/labels", expect=404)


# --------------------------------------------------------------------------------------------
# Repository labels


@scenario("issues/list-labels-for-repo")
async def _repo_labels(w: World) -> None:
    await w.new_issue(labels=["mail:new"])
    r = await w.call("GET", f"/repos/{VAULT}/labels", expect=200)
    assert "mail:new" in {x["name"] for x in r.json}
    await w.call("GET", f"/repos/{ORG}/no-such-repo/labels", expect=404)


@scenario("issues/create-label")
async def _create_label(w: World) -> None:
    r = await w.call("POST", f"/repos/{VAULT}/labels",
                     json_body={"name": "mail:working", "color": "fbca04",
                                "description": "The recipient is on it"}, expect=201)
    assert (r.json["name"], r.json["color"], r.json["default"]) == ("mail:working", "fbca04",
                                                                     False)
    assert unquote(r.headers["Location"]).endswith(f"/repos/{VAULT}/labels/mail:working")
    await w.call("POST", f"/repos/{VAULT}/labels",
                 json_body={"name": "mail:working", "color": "fbca04"}, expect=422)
    await w.call("POST", f"/repos/{VAULT}/labels",
                 json_body={"name": "bad colour", "color": "#zzzzzz"}, expect=422)


@scenario("issues/get-label")
async def _get_label(w: World) -> None:
    await w.call("POST", f"/repos/{VAULT}/labels",
                 json_body={"name": "mail:closed", "color": "cccccc"}, expect=201)
    r = await w.call("GET", f"/repos/{VAULT}/labels/{quote('mail:closed')}", expect=200)
    assert r.json["name"] == "mail:closed"
    await w.call("GET", f"/repos/{VAULT}/labels/no-such-label", expect=404)


@scenario("issues/update-label")
async def _update_label(w: World) -> None:
    await w.call("POST", f"/repos/{VAULT}/labels",
                 json_body={"name": "mail:old", "color": "cccccc"}, expect=201)
    r = await w.call("PATCH", f"/repos/{VAULT}/labels/{quote('mail:old')}",
                     json_body={"new_name": "mail:replied", "color": "0e8a16",
                                "description": "Answered"}, expect=200)
    assert (r.json["name"], r.json["color"], r.json["description"]) == \
        ("mail:replied", "0e8a16", "Answered")


@scenario("issues/delete-label")
async def _delete_label(w: World) -> None:
    await w.call("POST", f"/repos/{VAULT}/labels",
                 json_body={"name": "temporary", "color": "cccccc"}, expect=201)
    await w.call("DELETE", f"/repos/{VAULT}/labels/temporary", expect=204)
    r = await w.call("GET", f"/repos/{VAULT}/labels/temporary", expect=404)
    assert error_message(r.json) == "Not Found"


# --------------------------------------------------------------------------------------------
# Comments


@scenario("issues/create-comment")
async def _create_comment(w: World) -> None:
    issue = await w.new_issue()
    r = await w.call("POST", f"/repos/{VAULT}/issues/{issue['number']}/comments",
                     auth="scout-bot", json_body={"body": "/working"}, expect=201)
    assert r.json["body"] == "/working" and r.json["user"]["login"] == "scout-bot"
    assert r.headers["Location"].endswith(f"/issues/comments/{r.json['id']}")
    await w.call("POST", f"/repos/{VAULT}/issues/9999/comments", json_body={"body": "x"},
                 expect=404)
    await w.call("POST", f"/repos/{VAULT}/issues/{issue['number']}/comments", json_body={},
                 expect=422)


@scenario("issues/list-comments")
async def _list_comments(w: World) -> None:
    issue = await w.new_issue()
    for body in ("one", "two", "three"):
        await w.call("POST", f"/repos/{VAULT}/issues/{issue['number']}/comments",
                     json_body={"body": body}, expect=201)
    r = await w.call("GET", f"/repos/{VAULT}/issues/{issue['number']}/comments",
                     params={"per_page": "2"}, expect=200)
    assert [c["body"] for c in r.json] == ["one", "two"] and "Link" in r.headers
    await w.call("GET", f"/repos/{VAULT}/issues/9999/comments", expect=404)


@scenario("issues/list-comments-for-repo")
async def _repo_comments(w: World) -> None:
    a = await w.new_issue("a")
    b = await w.new_issue("b")
    for issue in (a, b):
        await w.call("POST", f"/repos/{VAULT}/issues/{issue['number']}/comments",
                     json_body={"body": f"on {issue['title']}"}, expect=201)
    r = await w.call("GET", f"/repos/{VAULT}/issues/comments",
                     params={"sort": "created", "direction": "asc"}, expect=200)
    assert [c["body"] for c in r.json] == ["on a", "on b"]


async def _comment(w: World, body: str = "A reply") -> dict:
    issue = await w.new_issue()
    r = await w.call("POST", f"/repos/{VAULT}/issues/{issue['number']}/comments",
                     json_body={"body": body}, expect=201)
    return r.json  # type: ignore[no-any-return]


@scenario("issues/get-comment")
async def _get_comment(w: World) -> None:
    c = await _comment(w)
    r = await w.call("GET", f"/repos/{VAULT}/issues/comments/{c['id']}", expect=200)
    assert r.json["body"] == "A reply"
    await w.call("GET", f"/repos/{VAULT}/issues/comments/99999999", expect=404)


@scenario("issues/update-comment")
async def _update_comment(w: World) -> None:
    c = await _comment(w)
    r = await w.call("PATCH", f"/repos/{VAULT}/issues/comments/{c['id']}",
                     json_body={"body": "Edited"}, expect=200)
    assert r.json["body"] == "Edited" and r.json["updated_at"] >= c["updated_at"]
    await w.call("PATCH", f"/repos/{VAULT}/issues/comments/{c['id']}", json_body={},
                 expect=422)


@scenario("issues/delete-comment")
async def _delete_comment(w: World) -> None:
    c = await _comment(w)
    await w.call("DELETE", f"/repos/{VAULT}/issues/comments/{c['id']}", expect=204)
    await w.call("GET", f"/repos/{VAULT}/issues/comments/{c['id']}", expect=404)


# --------------------------------------------------------------------------------------------
# Reactions


@scenario("reactions/create-for-issue")
async def _react_issue(w: World) -> None:
    issue = await w.new_issue()
    path = f"/repos/{VAULT}/issues/{issue['number']}/reactions"
    r = await w.call("POST", path, auth="marco", json_body={"content": "eyes"}, expect=201)
    assert r.json["content"] == "eyes" and r.json["user"]["login"] == "marco"
    r2 = await w.call("POST", path, auth="marco", json_body={"content": "eyes"}, expect=200)
    assert r2.json["id"] == r.json["id"], "the same reaction again answers 200 with it"
    await w.call("POST", path, json_body={"content": "thumbs_sideways"}, expect=422)


@scenario("reactions/list-for-issue")
async def _list_issue_reactions(w: World) -> None:
    issue = await w.new_issue()
    path = f"/repos/{VAULT}/issues/{issue['number']}/reactions"
    await w.call("POST", path, auth="marco", json_body={"content": "+1"}, expect=201)
    r = await w.call("GET", path, expect=200)
    assert [x["content"] for x in r.json] == ["+1"]
    await w.call("GET", f"/repos/{VAULT}/issues/9999/reactions", expect=404)


@scenario("reactions/create-for-issue-comment")
async def _react_comment(w: World) -> None:
    c = await _comment(w)
    path = f"/repos/{VAULT}/issues/comments/{c['id']}/reactions"
    r = await w.call("POST", path, auth="sara", json_body={"content": "rocket"}, expect=201)
    assert r.json["content"] == "rocket"
    await w.call("POST", path, auth="sara", json_body={"content": "rocket"}, expect=200)
    await w.call("POST", path, json_body={"content": "nope"}, expect=422)


@scenario("reactions/list-for-issue-comment")
async def _list_comment_reactions(w: World) -> None:
    c = await _comment(w)
    path = f"/repos/{VAULT}/issues/comments/{c['id']}/reactions"
    await w.call("POST", path, auth="sara", json_body={"content": "heart"}, expect=201)
    r = await w.call("GET", path, expect=200)
    assert [x["content"] for x in r.json] == ["heart"]
    await w.call("GET", f"/repos/{VAULT}/issues/comments/99999999/reactions", expect=404)


# --------------------------------------------------------------------------------------------
# Search


@scenario("search/issues-and-pull-requests")
async def _search(w: World) -> None:
    a = await w.new_issue("needle in the vault", labels=["mail:new"])
    await w.new_issue("something else")
    r = await w.call("GET", "/search/issues",
                     params={"q": f"repo:{VAULT} is:issue label:mail:new"}, expect=200)
    assert r.json["incomplete_results"] is False
    assert [i["number"] for i in r.json["items"]] == [a["number"]]
    assert r.json["total_count"] == 1
    assert r.headers.get("X-RateLimit-Resource") == "search"
    await w.call("GET", "/search/issues", expect=422)


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", validator.API_VERSIONS)
@pytest.mark.parametrize("operation_id", sorted(subset_operation_ids()))
async def test_operation(world: World, operation_id: str, api_version: str) -> None:
    """Each scenario in each REST API version GitHub serves, held to that version's
    description (and the forge must say it selected that version)."""
    world.version = api_version
    fn = SCENARIOS.get(operation_id)
    assert fn is not None, f"no scenario for {operation_id}"
    await fn(world)
    assert operation_id in {op for op, _ in world.exercised}, \
        f"the scenario for {operation_id} never validated a response of it"
    # held to this version's description: with one test per operation and version, and one
    # scenario per operation (below), every operation is validated in every version, whichever
    # worker of pytest-xdist runs which test
    assert operation_id in validator.STATS.by_version.get(api_version, set()), \
        f"the scenario for {operation_id} never validated a response in {api_version}"


def test_every_operation_has_a_scenario() -> None:
    """The subset's operations and the scenarios are the same set (45)."""
    assert set(SCENARIOS) == subset_operation_ids()
    assert len(SCENARIOS) == 45
