"""The forge client against the local forge over HTTP: tokens, conditional reads, faults, limits."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aiohttp
import pytest

from bot.forge import markers
from bot.forge.clock import SystemClock
from bot.forge.errors import NotFound, OutcomeUnknown, RateLimited, TransientError
from labels.catalogue import MAIL_LABELS, Label

from .conftest import REPO, Env, with_config

ISSUES = "POST /repos/{owner}/{repo}/issues"
COMMENTS = "POST /repos/{owner}/{repo}/issues/{issue_number}/comments"
GET_ISSUE = "GET /repos/{owner}/{repo}/issues/{issue_number}"


async def all_issues(inst: Any) -> list[dict[str, Any]]:
    return [i async for i in inst.iter_issues(REPO)]


# -- tokens -------------------------------------------------------------------------------------


async def test_one_token_request_for_20_concurrent_callers(env: Env) -> None:
    client = env.client()
    auth = client.auth
    tokens = await asyncio.gather(
        *(auth.installation_token(env.installation_id) for _ in range(20))
    )
    assert len(set(tokens)) == 1
    assert auth.token_requests == 1
    assert len(env.records("POST", "/access_tokens")) == 1
    # and 20 concurrent reads through the forge share it too
    inst = client.installation(env.installation_id)
    created = await inst.create_issue(REPO, "t", "body")
    await asyncio.gather(*(inst.get_issue(REPO, created["number"]) for _ in range(20)))
    assert auth.token_requests == 1


async def test_token_refreshed_after_clock_advance(env: Env) -> None:
    inst = env.inst()
    auth = inst.client.auth
    issue = await inst.create_issue(REPO, "hello", "first")
    first = await auth.installation_token(env.installation_id)
    env.forge.clock.advance(3600)
    again = await inst.get_issue(REPO, issue["number"])  # refreshed before use: no 401
    assert again["number"] == issue["number"]
    assert auth.token_requests == 2
    assert await auth.installation_token(env.installation_id) != first
    assert not [r for r in env.forge.requests if r.status == 401]
    assert inst.stats.auth_refreshes == 0


async def test_token_refreshed_ahead_of_expiry_margin(env: Env) -> None:
    inst = env.inst()
    auth = inst.client.auth
    first = await auth.installation_token(env.installation_id)
    env.forge.clock.advance(3600 - 400)  # 6:40 left: still good
    assert await auth.installation_token(env.installation_id) == first
    env.forge.clock.advance(100)  # 5:00 left: inside margin (5 min) + skew (1 min)
    assert await auth.installation_token(env.installation_id) != first
    assert auth.token_requests == 2


async def test_401_refreshes_once_and_retries(env: Env) -> None:
    # A client on the system clock cannot see forge.clock move: its token expires under it.
    inst = env.inst(clock=SystemClock())
    issue = await inst.create_issue(REPO, "hello", "first")
    env.forge.clock.advance(3600)
    got = await inst.get_issue(REPO, issue["number"])
    assert got["number"] == issue["number"]
    assert inst.stats.auth_refreshes == 1
    assert inst.client.auth.token_requests == 2
    assert len([r for r in env.forge.requests if r.status == 401]) == 1


async def test_app_jwt_calls(env: Env) -> None:
    client = env.client()
    app = client.app()
    installs = await app.list_installations()
    assert [i["id"] for i in installs] == [env.installation_id]
    assert (await app.repo_installation(REPO))["id"] == env.installation_id
    assert (await app.get_app())["slug"] == "vaultmail"


# -- conditional reads --------------------------------------------------------------------------


async def test_conditional_read_costs_nothing(env: Env) -> None:
    inst = env.inst()
    issue = await inst.create_issue(REPO, "cached", "body")
    first = await inst.get_issue(REPO, issue["number"])
    assert inst.rate_limit is not None
    remaining = inst.rate_limit["remaining"]
    second = await inst.get_issue(REPO, issue["number"])
    assert second == first
    assert inst.stats.not_modified == 1
    reads = [r for r in env.forge.requests if r.route == GET_ISSUE]
    assert [r.status for r in reads] == [200, 304]
    # the 304 did not spend: the next counted request sees remaining - 1, not remaining - 2
    await inst.list_comments(REPO, issue["number"])
    assert inst.rate_limit["remaining"] == remaining - 1
    # a cached result is a copy: mutating it does not poison the cache
    second["title"] = "mutated"
    assert (await inst.get_issue(REPO, issue["number"]))["title"] == "cached"
    # a change invalidates: 200 with the new content
    await inst.update_issue(REPO, issue["number"], title="changed")
    assert (await inst.get_issue(REPO, issue["number"]))["title"] == "changed"


# -- faults ---------------------------------------------------------------------------------------


async def test_write_then_fail_create_issue_yields_one(env: Env) -> None:
    inst = env.inst()
    env.forge.faults.add(route=ISSUES, status=502, count=1, mode="after")
    marker = "vaultmail-id: m-0001"
    issue = await inst.create_issue(REPO, "hello", f"text\n\n{marker}", ["mail:new"], marker=marker)
    assert marker in issue["body"]
    assert [i["number"] for i in await all_issues(inst) if marker in (i["body"] or "")] == [
        issue["number"]
    ]
    assert len(env.records("POST", "/issues")) == 1  # found by marker, not re-posted
    assert inst.stats.marker_recoveries == 1


async def test_fail_before_write_create_issue_retried_once(env: Env) -> None:
    inst = env.inst()
    env.forge.faults.add(route=ISSUES, status=503, count=1, mode="fail")
    marker = "m-0002"
    issue = await inst.create_issue(REPO, "hello", f"body {marker}", marker=marker)
    assert [i["number"] for i in await all_issues(inst) if marker in (i["body"] or "")] == [
        issue["number"]
    ]
    assert len(env.records("POST", "/issues")) == 2
    assert inst.stats.marker_recoveries == 0


async def test_create_without_marker_is_not_retried_blind(env: Env) -> None:
    inst = env.inst()
    env.forge.faults.add(route=ISSUES, status=502, count=1, mode="after")
    with pytest.raises(OutcomeUnknown) as info:
        await inst.create_issue(REPO, "hello", "no marker")
    assert info.value.status == 502 and info.value.method == "POST"
    assert "/repos/acme/vault/issues" in str(info.value)
    assert len(env.records("POST", "/issues")) == 1


async def test_write_then_fail_create_comment_yields_one(env: Env) -> None:
    inst = env.inst()
    issue = await inst.create_issue(REPO, "thread", "body")
    env.forge.faults.add(route=COMMENTS, status=502, count=1, mode="after")
    marker = markers.marker("reply", "7")  # (a comment's marker is found only whole)
    comment = await inst.create_comment(REPO, issue["number"], f"reply {marker}", marker=marker)
    comments = await inst.list_comments(REPO, issue["number"])
    assert [c["id"] for c in comments if marker in c["body"]] == [comment["id"]]
    assert inst.stats.marker_recoveries == 1


async def test_read_5xx_retried(env: Env) -> None:
    inst = env.inst()
    issue = await inst.create_issue(REPO, "hello", "body")
    env.forge.faults.add(route=GET_ISSUE, status=503, count=2)
    got = await inst.get_issue(REPO, issue["number"])
    assert got["number"] == issue["number"]
    assert inst.stats.retries == 2
    assert [r.status for r in env.forge.requests if r.route == GET_ISSUE] == [503, 503, 200]


async def test_read_5xx_gives_up_with_clear_error(env: Env) -> None:
    inst = env.inst()
    env.forge.faults.add(route=GET_ISSUE, status=500)
    with pytest.raises(TransientError) as info:
        await inst.get_issue(REPO, 1)
    assert info.value.status == 500
    assert "gave up after 4 tries" in str(info.value)


async def test_read_timeout_retried(env: Env) -> None:
    inst = env.inst(config=with_config(timeout=0.3))
    issue = await inst.create_issue(REPO, "hello", "body")
    env.forge.faults.delay(GET_ISSUE, 1.0).count = 1
    got = await inst.get_issue(REPO, issue["number"])
    assert got["number"] == issue["number"]
    assert inst.stats.retries == 1


async def test_idempotent_write_5xx_retried(env: Env) -> None:
    inst = env.inst()
    issue = await inst.create_issue(REPO, "hello", "body")
    env.forge.faults.add(route="PATCH /repos/{owner}/{repo}/issues/{issue_number}", count=1)
    got = await inst.update_issue(REPO, issue["number"], state="closed", state_reason="completed")
    assert got["state"] == "closed"
    assert inst.stats.retries == 1


async def test_dispatch_not_retried_blind(env: Env) -> None:
    inst = env.inst()
    await inst.dispatch(REPO, "vaultmail", {"a": 1})
    env.forge.faults.add(route="POST /repos/{owner}/{repo}/dispatches", count=1, mode="after")
    with pytest.raises(OutcomeUnknown):
        await inst.dispatch(REPO, "vaultmail", {"a": 2})


async def test_dispatch_is_tried_again_when_no_connection_was_made(env: Env) -> None:
    """A connection refused sent nothing: a write that must not land twice is tried again
    after it (an answer lost, above, is not)."""
    # a connection each request (none kept to be found closed: a write on one is ambiguous)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        inst = dataclasses.replace(env, session=http).inst()
        await inst.dispatch(REPO, "vaultmail", {"a": 1})  # (its token taken, the forge up)
        await env.forge.stop()  # nothing listens at its port now
        with pytest.raises(TransientError) as info:
            await inst.dispatch(REPO, "vaultmail", {"a": 2})
    assert not isinstance(info.value, OutcomeUnknown), info.value
    assert "gave up after 4 tries" in str(info.value)


# -- rate limits ----------------------------------------------------------------------------------


async def test_secondary_limit_fault_survived_write_once(env: Env) -> None:
    # the forge's fault answers 403 + retry-after: 60; the wait is spent on the forge clock
    inst = env.inst(**env.fast_time())
    start = env.forge.clock.now()
    env.forge.faults.add(route=ISSUES, status=403, count=1, kind="secondary_limit")
    issue = await inst.create_issue(REPO, "hello", "body m-9", marker="m-9")
    assert [i["number"] for i in await all_issues(inst) if "m-9" in (i["body"] or "")] == [
        issue["number"]
    ]
    assert inst.stats.rate_limit_waits == 1
    assert env.forge.clock.now() - start >= 60  # honoured retry-after
    assert [r.status for r in env.records("POST", "/issues")] == [403, 201]


async def test_secondary_limit_gives_up_after_n_tries(env: Env) -> None:
    inst = env.inst(**env.fast_time())
    env.forge.faults.add(route=ISSUES, status=403, kind="secondary_limit")
    with pytest.raises(RateLimited) as info:
        await inst.create_issue(REPO, "hello", "body")
    assert "gave up after 4 tries" in str(info.value)
    assert not await all_issues(inst)


async def test_forge_content_limit_waited_out(env: Env) -> None:
    # Client budget off, forge allows 2 creations a minute: the 3rd and 4th are refused with
    # retry-after and retried after the wait (time moves on the forge clock, not the wall).
    env.forge.limits.secondary_per_minute = 2
    inst = env.inst(config=with_config(content_per_minute=0, content_per_hour=0), **env.fast_time())
    start = env.forge.clock.now()
    made = [
        await inst.create_issue(REPO, f"n{i}", f"body m-{i}", marker=f"m-{i}") for i in range(4)
    ]
    assert len({m["number"] for m in made}) == 4
    assert len(await all_issues(inst)) == 4
    assert inst.stats.rate_limit_waits >= 1
    assert env.forge.clock.now() - start >= 60
    assert [r.status for r in env.records("POST", "/issues") if r.status == 201] == [201] * 4


async def test_client_budget_spreads_burst_without_refusals(env: Env) -> None:
    env.forge.limits.secondary_per_minute = 2
    inst = env.inst(config=with_config(content_per_minute=2), **env.fast_time())
    start = env.forge.clock.now()
    for i in range(5):
        await inst.create_issue(REPO, f"n{i}", "body")
    assert [r.status for r in env.records("POST", "/issues")] == [201] * 5  # never refused
    assert env.forge.clock.now() - start >= 120
    assert inst.stats.paced >= 120


async def test_primary_limit_waits_until_reset_or_reports(env: Env) -> None:
    env.forge.limits.primary = 3
    inst = env.inst()
    for i in range(3):  # writes: none can be a free 304
        await inst.create_issue(REPO, f"n{i}", "body")
    with pytest.raises(RateLimited) as info:  # reset is ~an hour away: more than max_wait
        await inst.permission(REPO, "marco")
    assert info.value.retry_after is not None and info.value.retry_after > 900
    assert not [r for r in env.forge.requests if r.status == 403]  # knew from the headers
    # with time to wait (moved on the forge clock) it waits for the reset and goes on
    waiting = env.inst(config=with_config(max_wait=7200), **env.fast_time())
    assert await waiting.permission(REPO, "marco") == "write"
    assert waiting.stats.rate_limit_waits == 1
    assert waiting.client.stats.snapshot()["by_status"][403] == 1


async def test_writes_paced_by_min_interval(env: Env) -> None:
    inst = env.inst(config=with_config(write_interval=0.2))
    issue = await inst.create_issue(REPO, "hello", "body")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(*(inst.add_labels(REPO, issue["number"], [f"l{i}"]) for i in range(3)))
    assert loop.time() - t0 >= 0.35  # 3 writes after the create, at least 0.2 s apart


# -- the interface --------------------------------------------------------------------------------


async def test_ensure_labels_idempotent(env: Env) -> None:
    inst = env.inst()
    first = await inst.ensure_labels(REPO, MAIL_LABELS)
    assert first == {"created": [lab.name for lab in MAIL_LABELS], "updated": []}
    writes = len([r for r in env.forge.requests if r.method != "GET"])
    second = await inst.ensure_labels(REPO, MAIL_LABELS)
    assert second == {"created": [], "updated": []}
    third = await inst.ensure_labels(REPO, MAIL_LABELS)
    assert third == second
    assert len([r for r in env.forge.requests if r.method != "GET"]) == writes  # no writes
    listing = [
        r.status for r in env.forge.requests if r.route == "GET /repos/{owner}/{repo}/labels"
    ]
    assert listing == [200, 200, 304]  # one list per call; unchanged -> 304, costs nothing
    # a wrong colour / description is corrected, and only that label is written
    wrong = Label(MAIL_LABELS[0].name, "000000", "old")
    assert (await inst.ensure_labels(REPO, [wrong]))["updated"] == [wrong.name]
    fixed = await inst.ensure_labels(REPO, MAIL_LABELS)
    assert fixed == {"created": [], "updated": [MAIL_LABELS[0].name]}


async def test_labels_on_issues(env: Env) -> None:
    inst = env.inst()
    await inst.ensure_labels(REPO, MAIL_LABELS)
    issue = await inst.create_issue(REPO, "hello", "body", ["mail:new"])
    n = issue["number"]
    names = [lab["name"] for lab in await inst.add_labels(REPO, n, ["mail:working"])]
    assert sorted(names) == ["mail:new", "mail:working"]
    assert await inst.remove_label(REPO, n, "mail:new") is True
    assert await inst.remove_label(REPO, n, "mail:new") is False  # 404 ignored
    assert [lab["name"] for lab in await inst.set_labels(REPO, n, ["mail:closed"])] == [
        "mail:closed"
    ]
    by_label = [i["number"] async for i in inst.iter_issues(REPO, labels=["mail:closed"])]
    assert by_label == [n]


async def test_issue_and_comment_round_trip(env: Env) -> None:
    inst = env.inst()
    issue = await inst.create_issue(REPO, "hello", "body")
    c = await inst.create_comment(REPO, issue["number"], "first")
    assert (await inst.get_comment(REPO, c["id"]))["body"] == "first"
    assert (await inst.update_comment(REPO, c["id"], "edited"))["body"] == "edited"
    assert [x["body"] for x in await inst.list_comments(REPO, issue["number"])] == ["edited"]
    with pytest.raises(NotFound) as info:
        await inst.get_issue(REPO, 9999)
    assert info.value.status == 404


async def test_iter_issues_paginates(env: Env) -> None:
    env.forge.limits.secondary_per_minute = 1000
    env.forge.limits.secondary_per_hour = 1000
    inst = env.inst(config=with_config(content_per_minute=0, content_per_hour=0))
    for i in range(101):
        await inst.create_issue(REPO, f"n{i}", "body")
    numbers = [i["number"] async for i in inst.iter_issues(REPO, state="open")]
    assert len(numbers) == 101 == len(set(numbers))
    listing = "GET /repos/{owner}/{repo}/issues"
    assert len([r for r in env.forge.requests if r.route == listing]) == 2


async def test_repository_helpers(env: Env) -> None:
    inst = env.inst()
    env.forge.put_file("acme/vault", "config/vaultmail.yml", "office: acme\n")
    assert await inst.get_file(REPO, "config/vaultmail.yml") == "office: acme\n"
    assert await inst.get_file(REPO, "missing.yml") is None
    assert await inst.permission(REPO, "marco") == "write"
    assert await inst.permission(REPO, "nobody-here") == "none"
    assert await inst.list_installation_repos() == [REPO]


async def test_app_jwt_claims(env: Env) -> None:
    import time

    import jwt as pyjwt

    auth = env.client().auth
    token = auth.app_jwt()
    claims = pyjwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == str(env.app_id)
    assert claims["exp"] - claims["iat"] == 600
    assert claims["iat"] <= time.time() - 59
    assert auth.app_jwt() == token  # reused while fresh


async def test_hook_deliveries_and_redelivery(env: Env) -> None:
    env.forge.set_webhook(env.app_id, url="http://127.0.0.1:9/webhook", secret="s")
    inst = env.inst()
    await inst.create_issue(REPO, "hello", "body")  # issues.opened -> a failed delivery
    await env.forge.webhooks_idle()
    app = inst.client.app()
    failed = [d async for d in app.iter_deliveries(status="failure")]
    assert failed and all(d["status_code"] != 200 for d in failed)
    one = await app.get_delivery(failed[0]["id"])
    assert one["guid"] == failed[0]["guid"]
    await app.redeliver(failed[0]["id"])
    await env.forge.webhooks_idle()
    again = [d async for d in app.iter_deliveries()]
    assert [d for d in again if d["guid"] == failed[0]["guid"] and d["redelivery"]]


async def test_create_gives_up_cleanly_when_it_never_lands(env: Env) -> None:
    inst = env.inst()
    env.forge.faults.add(route=ISSUES, status=503, mode="fail")
    with pytest.raises(TransientError) as info:
        await inst.create_issue(REPO, "hello", "body m-x", marker="m-x")
    assert info.value.status == 503 and "gave up after 4 tries" in str(info.value)
    assert len(env.records("POST", "/issues")) == 4  # each retry only after the marker search
    assert not await all_issues(inst)


async def test_search_issues(env: Env) -> None:
    inst = env.inst()
    await inst.create_issue(REPO, "findme please", "body")
    found = await inst.search_issues(f"repo:{REPO} is:issue findme")
    assert [i["title"] for i in found] == ["findme please"]


async def test_a_creation_waiting_for_the_shared_budget_holds_no_other_write(
        env: Env, tmp_path: Any) -> None:
    """Issue 27: with the creation budget spent, the next creation waits for its place, but
    outside the installation's write turn: a label move (no content creation) goes on."""
    from bot.store import open_store
    from bot.store.budget import Limits, SharedWriteBudget

    store = await open_store(tmp_path / "index.sqlite3")
    released = asyncio.Event()
    waiting = asyncio.Event()

    async def sleep(seconds: float) -> None:  # a long pacing wait: held until released
        if seconds > 5:
            waiting.set()
            await released.wait()
        else:
            await asyncio.sleep(0)

    try:
        client = env.client(sleep=sleep)
        client.shared_budget = SharedWriteBudget(store, Limits(
            per_minute=1, per_hour=1, endpoint_points_per_minute=0))
        inst = client.installation(env.installation_id)
        first = await inst.create_issue(REPO, "first", "x")  # the hour's one creation
        second = asyncio.create_task(inst.create_issue(REPO, "second", "x"))
        await asyncio.wait_for(waiting.wait(), 10)  # it waits for the next hour's place
        from bot.forge.caller import budget_waits

        count, longest = budget_waits()  # seen by /readyz's detail and the metric
        assert count == 1 and longest > 5
        moved = await asyncio.wait_for(
            inst.update_issue(REPO, first["number"], labels=["mail:new"]), 10)
        assert [lb["name"] for lb in moved["labels"]] == ["mail:new"]
        released.set()
        assert (await asyncio.wait_for(second, 10))["title"] == "second"
    finally:
        released.set()
        await store.close()
