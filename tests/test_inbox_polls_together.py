"""Long polls woken together (issue 22): one viewer's `list_inbox` polls that one wake-up ends
share one look at the inbox; another viewer's, another office's or another wake-up's never do,
and unread comments are still shown once."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded
from bot.app.notify import Notifier, Together
from bot.items import inbox
from tests.items_support import MARCO, SARA, SCOUT, make_item


def _counting_computes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    looks: Counter[str] = Counter()
    real = inbox.compute

    async def compute(store: Any, office: Any, viewer: str, **kw: Any) -> inbox.Computed:
        looks[viewer] += 1
        return await real(store, office, viewer, **kw)

    monkeypatch.setattr(inbox, "compute", compute)
    return looks


async def _all_waiting(embedded: Embedded, polls: list[asyncio.Task[Any]], n: int) -> None:
    """Until n long polls are registered and asleep (a condition, with a deadline)."""
    notifier = embedded.services.notifier
    deadline = time.monotonic() + 10
    while notifier.waiting() < n:
        for poll in polls:
            assert not poll.done(), poll.result()
        assert time.monotonic() < deadline, "the long polls never started waiting"
        await asyncio.sleep(0.01)


async def test_one_viewers_polls_woken_together_share_one_look_never_another_viewers(
        embedded: Embedded, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    looks = _counting_computes(monkeypatch)
    marco, sara = tools(MARCO), tools(SARA)
    await marco("list_inbox")  # what the seeded office left unread: read now
    await sara("list_inbox")
    polls = [asyncio.create_task(marco("list_inbox", wait=20)) for _ in range(3)]
    polls += [asyncio.create_task(sara("list_inbox", wait=20)) for _ in range(2)]
    await _all_waiting(embedded, polls, 5)
    looks.clear()
    embedded.services.notifier.notify(
        [inbox.wake_key(MARCO, "you"), inbox.wake_key(SARA, "you")], org="acme")
    answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert looks == {MARCO: 1, SARA: 1}  # one look each: never one for both
    assert answers[0] == answers[1] == answers[2] and answers[3] == answers[4]
    assert embedded.services.notifier.together.shared == 3
    # each its own: the top level of an answer is not shared
    assert len({id(a) for a in answers}) == 5


async def test_polls_woken_together_get_the_bytes_a_fresh_look_gets_never_another_viewers(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    """Over HTTP, byte for byte: two of marco's polls woken together (one look for both, its
    JSON made once) get what a call without `wait` gets after them, with the same headers;
    sara's poll, ended by the same wake-up, gets hers, never his (here their answers differ:
    marco owes sara an answer)."""
    goal = await make_item(embedded, person("sara"), "goal", "Quiet")
    await tools(SARA)("add_comment", targetType="goal", target=goal, body="Which way?",
                      to=["marco@acme.com"], needsReply=True)
    await tools(MARCO)("list_inbox")  # what is unread: read now, so a woken poll finds it read
    await tools(SARA)("list_inbox")

    async def raw(principal: str, args: dict[str, Any]) -> tuple[int, str, bytes]:
        async with session.post(f"{embedded.app_url}/api/v1/tools/list_inbox", json=args,
                                headers={"Authorization":
                                         f"Bearer {embedded.api_tokens[principal]}"}) as resp:
            return resp.status, resp.headers["Content-Type"], await resp.read()

    notifier = embedded.services.notifier
    polls = [asyncio.create_task(raw(who, {"wait": 20})) for who in (MARCO, MARCO, SARA)]
    await _all_waiting(embedded, polls, 3)
    notifier.notify([inbox.wake_key(MARCO, "you"), inbox.wake_key(SARA, "you")], org="acme")
    marco_1, marco_2, sara = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert notifier.together.shared == 1  # marco's second poll had the first's look
    assert marco_1 == marco_2 == await raw(MARCO, {})
    assert sara == await raw(SARA, {})
    assert marco_1[:2] == (200, "application/json; charset=utf-8")
    turns = [[t["item"] for t in json.loads(body)["you"]["yourTurn"]]
             for _, _, body in (marco_1, sara)]
    assert turns == [[goal], []]  # each viewer's own: the bytes differ


async def test_polls_woken_by_different_wake_ups_do_not_share(
        embedded: Embedded, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    looks = _counting_computes(monkeypatch)
    marco = tools(MARCO)
    await marco("list_inbox")
    looks.clear()
    first = asyncio.create_task(marco("list_inbox", wait=20))
    await _all_waiting(embedded, [first], 1)
    embedded.services.notifier.notify([inbox.wake_key(MARCO, "you")], org="acme")
    await asyncio.wait_for(first, 10)
    second = asyncio.create_task(marco("list_inbox", wait=20))
    await _all_waiting(embedded, [second], 1)
    embedded.services.notifier.notify([inbox.wake_key(MARCO, "you")], org="acme")
    await asyncio.wait_for(second, 10)
    assert looks[MARCO] == 2 and embedded.services.notifier.together.shared == 0


async def test_an_agents_polls_look_each_for_itself(
        embedded: Embedded, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    looks = _counting_computes(monkeypatch)
    scout = tools(SCOUT)
    await scout("list_inbox")
    await scout("mail_list")
    polls = [asyncio.create_task(scout("list_inbox", wait=20)) for _ in range(2)]
    await _all_waiting(embedded, polls, 4)  # each on its principal and the agents' box
    looks.clear()
    embedded.services.notifier.notify([SCOUT], org="acme")
    answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert looks[SCOUT] == 2 and embedded.services.notifier.together.shared == 0
    assert all("inbox" in a for a in answers)


async def test_unread_woken_together_is_still_shown_once(
        embedded: Embedded, person: Any, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three polls of marco woken by one comment to him: the one that looks first shows it
    (and marks it read); the others look again after it, together, and find it read."""
    goal = await make_item(embedded, person("sara"), "goal", "Quiet")
    marco = tools(MARCO)
    await marco("list_inbox")
    looks = _counting_computes(monkeypatch)
    polls = [asyncio.create_task(marco("list_inbox", wait=20)) for _ in range(3)]
    await _all_waiting(embedded, polls, 3)
    await tools(SARA)("add_comment", targetType="goal", target=goal, body="Ping",
                      to=["marco@acme.com"])
    answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
    shown = sorted(len(a["you"]["unread"]) for a in answers)
    assert shown == [0, 0, 1]
    assert looks[MARCO] == 2 and embedded.services.notifier.together.shared == 1


async def test_a_look_without_marking_read_is_shared_unread_and_all(
        embedded: Embedded, person: Any, tools: Any) -> None:
    goal = await make_item(embedded, person("sara"), "goal", "Quiet")
    marco = tools(MARCO)
    await marco("list_inbox")
    polls = [asyncio.create_task(marco("list_inbox", wait=20, markRead=False))
             for _ in range(2)]
    await _all_waiting(embedded, polls, 2)
    await tools(SARA)("add_comment", targetType="goal", target=goal, body="Ping",
                      to=["marco@acme.com"])
    answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
    assert [[c["body"] for c in a["you"]["unread"]] for a in answers] == [["Ping"], ["Ping"]]
    assert embedded.services.notifier.together.shared == 1
    # nothing was marked: the next look still shows it
    assert [c["body"] for c in (await marco("list_inbox"))["you"]["unread"]] == ["Ping"]


# -- the notifier's wake-ups and the single flight, alone --------------------------------------
async def _registered(notifier: Notifier, n: int) -> None:
    for _ in range(100):  # turns of the loop, not time: each wait registers in its first
        if notifier.waiting() >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"only {notifier.waiting()} of {n} waits registered")


async def test_each_wake_up_is_its_own_and_shared_by_the_waits_it_ends() -> None:
    notifier = Notifier()
    waits = [asyncio.create_task(notifier.wait_woken([key], 10, org="acme"))
             for key in ("you:a", "you:a", "you:b")]
    await _registered(notifier, 3)
    notifier.notify(["you:a"], org="acme")
    a1, a2 = await asyncio.gather(*waits[:2])
    notifier.notify(["you:b"], org="acme")
    b = await waits[2]
    assert a1 is not None and a1 is a2 and b is not None and b is not a1
    assert await notifier.wait_woken(["you:a"], 0.001, org="acme") is None  # timed out
    late = asyncio.create_task(notifier.wait_woken(["you:a"], 10, org="acme"))
    await _registered(notifier, 1)
    notifier.close()  # shutting down: no wake-up to share
    assert await late is None


async def test_together_a_follower_looks_for_itself_when_the_first_fails_or_is_cancelled(
        ) -> None:
    together: Together[str] = Together()
    started, release = asyncio.Event(), asyncio.Event()
    computed: list[str] = []

    async def slow(name: str) -> str:
        computed.append(name)
        started.set()
        await release.wait()
        return name

    async def own(name: str) -> str:
        computed.append(name)
        return name

    first = asyncio.create_task(together.once("k", lambda: slow("first"), lambda _: True))
    await started.wait()
    follower = asyncio.create_task(together.once("k", lambda: own("follower"), lambda _: True))
    await asyncio.sleep(0)  # (one turn: the follower finds the first's flight)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await follower == ("follower", False)
    assert computed == ["first", "follower"]

    async def fails() -> str:
        started.set()
        await release.wait()
        raise RuntimeError("the index is away")

    started.clear()
    first = asyncio.create_task(together.once("k", fails, lambda _: True))
    await started.wait()
    follower = asyncio.create_task(together.once("k", lambda: own("again"), lambda _: True))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(RuntimeError):
        await first
    assert await follower == ("again", False)

    started.clear()
    release.clear()
    first = asyncio.create_task(together.once("k", lambda: slow("shared"), lambda _: True))
    await started.wait()
    follower = asyncio.create_task(together.once("k", lambda: own("not"), lambda _: True))
    other = asyncio.create_task(together.once("other", lambda: own("other"), lambda _: True))
    await asyncio.sleep(0)
    release.set()
    assert await first == ("shared", False)
    assert await follower == ("shared", True)
    assert await other == ("other", False)
    assert together.shared == 1

    # an answer not to share: the followers start again, and share the next one's
    started.clear()
    release.clear()
    computed.clear()
    first = asyncio.create_task(together.once("k", lambda: slow("consumed"),
                                              lambda r: r != "consumed"))
    await started.wait()
    async def looks_again(name: str) -> str:  # reads, as a look does: not done at once
        computed.append(name)
        await asyncio.sleep(0)
        return name

    def again(n: int) -> Callable[[], Awaitable[str]]:
        return lambda: looks_again(f"again {n}")

    followers = [asyncio.create_task(together.once("k", again(n), lambda r: r != "consumed"))
                 for n in range(3)]
    await asyncio.sleep(0)
    release.set()
    assert await first == ("consumed", False)
    assert await asyncio.gather(*followers) == [
        ("again 0", False), ("again 0", True), ("again 0", True)]
    assert computed == ["consumed", "again 0"]
