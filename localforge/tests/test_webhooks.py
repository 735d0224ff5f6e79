"""Webhooks as GitHub sends them to an App: events, order, signatures, sender, deliveries."""

from __future__ import annotations

import uuid

from .conftest import SECRET, World, verify_signature

ISSUES = "/repos/acme/vault/issues"


async def test_issue_with_labels_sends_opened_then_one_labeled_per_label(world: World) -> None:
    await world.call("POST", ISSUES, "marco", {"title": "t", "labels": ["mail:new", "x"]})
    await world.idle()
    issue_events = [r for r in world.hooks.received if r.event == "issues"]
    assert [r.action for r in issue_events] == ["opened", "labeled", "labeled"]
    assert [r.payload["label"]["name"] for r in issue_events[1:]] == ["mail:new", "x"]
    # the labels land with the issue; each labeled carries one label and the full list
    assert [lb["name"] for lb in issue_events[1].payload["issue"]["labels"]] == ["mail:new",
                                                                                  "x"]
    assert [lb["name"] for lb in issue_events[2].payload["issue"]["labels"]] == ["mail:new",
                                                                                  "x"]
    assert len(issue_events[0].payload["issue"]["labels"]) == 2
    label_created = [r.payload["label"]["name"] for r in world.hooks.received
                     if r.event == "label"]
    assert label_created == ["mail:new", "x"]


async def test_deliveries_are_signed_and_carry_githubs_headers(world: World) -> None:
    await world.call("POST", ISSUES, "marco", {"title": "t"})
    await world.idle()
    (delivery,) = world.hooks.received
    h = delivery.headers
    assert verify_signature(SECRET, delivery.body, h["X-Hub-Signature-256"])
    assert not verify_signature("wrong secret", delivery.body, h["X-Hub-Signature-256"])
    assert h["X-Hub-Signature"].startswith("sha1=")
    assert h["X-GitHub-Event"] == "issues"
    assert uuid.UUID(h["X-GitHub-Delivery"]).version == 4
    assert h["X-GitHub-Hook-Installation-Target-Type"] == "integration"
    assert h["X-GitHub-Hook-Installation-Target-ID"] == str(world.app_id)
    assert h["X-GitHub-Hook-ID"].isdigit()
    assert h["User-Agent"].startswith("GitHub-Hookshot/")
    assert h["Content-Type"] == "application/json"
    p = delivery.payload
    assert p["installation"]["id"] == world.installation_id and p["installation"]["node_id"]
    assert p["repository"]["full_name"] == "acme/vault"
    assert p["organization"]["login"] == "acme"
    assert p["sender"]["login"] == "marco" and p["sender"]["type"] == "User"


async def test_the_apps_own_write_is_sent_by_its_bot(world: World) -> None:
    token = await world.installation_token()
    await world.call("POST", ISSUES, auth=f"token {token}", json_body={"title": "by the app"})
    await world.idle()
    (delivery,) = world.hooks.received
    assert delivery.payload["sender"]["login"] == "vaultmail[bot]"
    assert delivery.payload["sender"]["type"] == "Bot"


async def test_edits_close_reopen_and_comments(world: World) -> None:
    _, _, issue = await world.call("POST", ISSUES, "marco", {"title": "old", "body": "b0"})
    n = issue["number"]
    await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"title": "new", "body": "b1"})
    await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"state": "closed"})
    await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"state": "open"})
    _, _, c = await world.call("POST", f"{ISSUES}/{n}/comments", "rita", {"body": "c0"})
    await world.call("PATCH", f"/repos/acme/vault/issues/comments/{c['id']}", "rita",
                     {"body": "c1"})
    await world.call("DELETE", f"/repos/acme/vault/issues/comments/{c['id']}", "rita")
    await world.idle()
    assert world.hooks.events() == [
        ("issues", "opened"), ("issues", "edited"), ("issues", "closed"),
        ("issues", "reopened"), ("issue_comment", "created"), ("issue_comment", "edited"),
        ("issue_comment", "deleted")]
    edited = world.hooks.received[1].payload
    assert edited["changes"] == {"title": {"from": "old"}, "body": {"from": "b0"}}
    comment_edited = world.hooks.received[5].payload
    assert comment_edited["changes"] == {"body": {"from": "c0"}}
    assert comment_edited["comment"]["body"] == "c1"


async def test_label_changes_send_one_event_per_label(world: World) -> None:
    _, _, issue = await world.call("POST", ISSUES, "marco", {"title": "t", "labels": ["a"]})
    await world.idle()
    world.hooks.clear()
    await world.call("PUT", f"{ISSUES}/{issue['number']}/labels", "marco",
                     {"labels": ["b", "c"]})
    await world.call("PATCH", "/repos/acme/vault/labels/b", "marco", {"color": "000000"})
    await world.call("DELETE", "/repos/acme/vault/labels/c", "marco")
    await world.idle()
    assert world.hooks.events() == [
        ("label", "created"), ("label", "created"), ("issues", "unlabeled"),
        ("issues", "labeled"), ("issues", "labeled"), ("label", "edited"),
        ("label", "deleted")]
    assert world.hooks.received[5].payload["changes"] == {"color": {"from": "ededed"}}


async def test_installation_events(world: World) -> None:
    world.forge.add_repo("acme", "new-vault")
    await world.idle()
    (added,) = world.hooks.received
    assert (added.event, added.action) == ("installation_repositories", "added")
    assert added.payload["repositories_added"][0]["full_name"] == "acme/new-vault"
    world.hooks.clear()
    world.forge.add_org("beta", owner="admin")
    world.forge.install_app(world.app_id, "beta")
    await world.idle()
    (created,) = world.hooks.received
    assert (created.event, created.action) == ("installation", "created")
    assert created.payload["installation"]["account"]["login"] == "beta"
    assert created.payload["sender"]["login"] == "admin"


async def test_creating_a_repo_over_http_tells_the_installation(world: World) -> None:
    status, _, repo = await world.call("POST", "/orgs/acme/repos", "marco",
                                       {"name": "made", "private": True})
    assert status == 201 and repo["private"] is True
    await world.idle()
    assert world.hooks.events() == [("installation_repositories", "added")]


async def test_failed_delivery_is_recorded_not_retried_and_redelivered_with_same_guid(
        world: World) -> None:
    world.hooks.status = 500
    await world.call("POST", ISSUES, "marco", {"title": "t"})
    await world.idle()
    assert len(world.hooks.received) == 1
    first = world.hooks.received[0]
    auth = f"Bearer {world.jwt()}"
    status, _, items = await world.call("GET", "/app/hook/deliveries?status=failure", auth=auth)
    assert status == 200 and len(items) == 1
    assert (items[0]["status_code"], items[0]["event"], items[0]["action"]) == (500, "issues",
                                                                                "opened")
    status, _, ok = await world.call("GET", "/app/hook/deliveries?status=success", auth=auth)
    assert [d["event"] for d in ok] == ["installation"]
    world.hooks.status = 200
    status, _, _ = await world.call(
        "POST", f"/app/hook/deliveries/{items[0]['id']}/attempts", auth=auth)
    assert status == 202
    await world.idle()
    assert len(world.hooks.received) == 2
    again = world.hooks.received[1]
    assert again.headers["X-GitHub-Delivery"] == first.headers["X-GitHub-Delivery"]
    assert again.body == first.body
    _, _, items = await world.call("GET", "/app/hook/deliveries", auth=auth)
    items = [d for d in items if d["event"] == "issues"]
    assert [(d["redelivery"], d["status_code"]) for d in items] == [(True, 200), (False, 500)]
    status, _, one = await world.call("GET", f"/app/hook/deliveries/{items[0]['id']}",
                                      auth=auth)
    assert one["request"]["payload"]["action"] == "opened"
    assert one["request"]["headers"]["X-GitHub-Event"] == "issues"
    assert one["response"]["payload"] == "ok"


async def test_delivery_list_cursor_pagination(world: World) -> None:
    for i in range(5):
        await world.call("POST", ISSUES, "marco", {"title": str(i)})
    await world.idle()
    auth = f"Bearer {world.jwt()}"
    ids: list[int] = []
    url = "/app/hook/deliveries?per_page=2"
    while url:
        status, headers, items = await world.call("GET", url, auth=auth)
        assert status == 200 and len(items) <= 2
        ids += [d["id"] for d in items]
        link = headers.get("Link", "")
        url = link[1:link.index(">")] if 'rel="next"' in link else ""
    assert len(ids) == 6 and ids == sorted(ids, reverse=True)  # 5 + installation.created
    status, _, _ = await world.call("GET", "/app/hook/deliveries?per_page=101", auth=auth)
    assert status == 422


async def test_drop_and_duplicate_faults(world: World) -> None:
    world.forge.faults.drop_webhooks(count=1)
    await world.call("POST", ISSUES, "marco", {"title": "lost"})
    await world.call("POST", ISSUES, "marco", {"title": "kept"})
    await world.idle()
    assert [r.payload["issue"]["title"] for r in world.hooks.received] == ["kept"]
    auth = f"Bearer {world.jwt()}"
    _, _, failed = await world.call("GET", "/app/hook/deliveries?status=failure", auth=auth)
    assert len(failed) == 1  # a dropped delivery shows as failed, so it can be redelivered
    world.hooks.clear()
    status, _, _ = await world.call("POST", "/_forge/faults",
                                    json_body={"webhooks": {"duplicate": {"count": 1}}})
    assert status == 200
    await world.call("POST", ISSUES, "marco", {"title": "twice"})
    await world.idle()
    assert len(world.hooks.received) == 2
    a, b = world.hooks.received
    assert a.headers["X-GitHub-Delivery"] == b.headers["X-GitHub-Delivery"]
    assert a.body == b.body


async def test_reorder_fault_puts_a_delivery_behind_those_queued_after_it(
        world: World) -> None:
    await world.call("POST", ISSUES, "marco", {"title": "first", "labels": ["a", "b"]})
    await world.idle()
    world.hooks.clear()
    status, _, _ = await world.call("POST", "/_forge/faults",
                                    json_body={"webhooks": {"reorder": {"count": 1}}})
    assert status == 200
    await world.call("POST", ISSUES, "marco", {"title": "second", "labels": ["a", "b"]})
    await world.idle()
    # opened, labeled a, labeled b queued at once: opened goes last, sent once
    assert [r.action for r in world.hooks.received] == ["labeled", "labeled", "opened"]
    assert world.forge.faults.reorder.count == 0
    world.hooks.clear()
    await world.call("POST", ISSUES, "marco", {"title": "third", "labels": ["a", "b"]})
    await world.idle()
    assert [r.action for r in world.hooks.received] == ["opened", "labeled", "labeled"]


async def test_unsubscribed_events_and_hookless_apps_get_nothing(world: World) -> None:
    world.forge.state.apps[world.app_id].events = ["issue_comment"]
    await world.call("POST", ISSUES, "marco", {"title": "t", "labels": ["a"]})
    await world.call("POST", f"{ISSUES}/1/comments", "marco", {"body": "c"})
    await world.idle()
    assert world.hooks.events() == [("issue_comment", "created")]


async def test_a_slow_receiver_times_out_and_is_not_retried(world: World) -> None:
    world.forge.webhooks.timeout = 0.2  # GitHub waits 10 s; shortened for the test
    world.hooks.delay = 0.5
    await world.call("POST", ISSUES, "marco", {"title": "slow"})
    await world.idle()
    status, _, items = await world.call("GET", "/app/hook/deliveries?status=failure",
                                        auth=f"Bearer {world.jwt()}")
    assert [(d["status"], d["status_code"]) for d in items] == [("timed out", 0)]
    assert len(world.hooks.received) == 1


async def test_a_repository_renamed_by_its_admin_leads_from_its_old_name(world: World) -> None:
    """PATCH /repos/{owner}/{repo} with `name`, as GitHub's API renames a repository: an
    admin's alone, a name the owner has already is 422, the old name leads to the new one
    (301), and the App hears `repository.renamed` with the name it had."""
    world.forge.state.apps[world.app_id].events.append("repository")
    world.forge.add_repo("acme", "other")
    status, _, _ = await world.call("PATCH", "/repos/acme/vault", "marco", {"name": "mail"})
    assert status == 403, "a writer renames nothing"
    status, _, body = await world.call("PATCH", "/repos/acme/vault", "admin", {"name": "other"})
    assert status == 422 and body["errors"][0]["field"] == "name", body
    status, _, body = await world.call("PATCH", "/repos/acme/vault", "admin", {"name": "a b"})
    assert status == 422, body
    status, _, body = await world.call("PATCH", "/repos/acme/vault", "admin", {"name": "mail"})
    assert status == 200 and body["full_name"] == "acme/mail", body
    status, _, body = await world.call("GET", "/repos/acme/vault", "admin")  # (followed)
    assert status == 200 and body["full_name"] == "acme/mail", body
    await world.idle()
    (renamed,) = [r for r in world.hooks.received if r.event == "repository"]
    assert renamed.action == "renamed"
    assert renamed.payload["changes"]["repository"]["name"]["from"] == "vault"
    assert renamed.payload["repository"]["full_name"] == "acme/mail"
    assert renamed.payload["sender"]["login"] == "admin"
