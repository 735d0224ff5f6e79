"""WritePacer on a fake clock: minimum interval and the content-creation budget."""

from __future__ import annotations

from bot.forge.pacing import WritePacer


class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def pacer(ft: FakeTime, **kw: float) -> WritePacer:
    return WritePacer(monotonic=ft.monotonic, sleep=ft.sleep, **kw)  # type: ignore[arg-type]


async def test_min_interval_between_writes() -> None:
    ft = FakeTime()
    p = pacer(ft, min_interval=1.0)
    assert await p.wait() == 0.0
    assert await p.wait() == 1.0
    ft.t += 5
    assert await p.wait() == 0.0
    assert p.waited == 1.0


async def test_content_budget_spreads_a_burst() -> None:
    ft = FakeTime()
    p = pacer(ft, min_interval=0.0, content_per_minute=3, content_per_hour=5, slack=0.0)
    waits = [await p.wait(content=True) for _ in range(3)]
    assert waits == [0.0, 0.0, 0.0]
    assert await p.wait(content=True) == 60.0  # 4th waits for the minute window
    assert await p.wait(content=False) == 0.0  # non-content writes are not budgeted
    assert await p.wait(content=True) == 0.0  # 5th: the 2nd and 3rd are still within the minute
    # 6th: the hour budget (5) is exhausted until the first creation is an hour old
    w = await p.wait(content=True)
    assert w == 3600.0 - 60.0
    assert ft.t == 1000.0 + 3600.0


async def test_slack_past_each_window() -> None:
    ft = FakeTime()
    p = pacer(ft, min_interval=0.0, content_per_minute=1, content_per_hour=100, slack=1.0)
    await p.wait(content=True)
    assert await p.wait(content=True) == 61.0


async def test_writes_to_one_endpoint_wait_for_its_minute_of_points() -> None:
    """GitHub: 900 points a minute per endpoint, 5 a write, so 180 writes a minute to one
    route; another route has its own budget (issue 14)."""
    ft = FakeTime()
    p = pacer(ft, min_interval=0.0, endpoint_points_per_minute=900, slack=1.0)
    patch = "PATCH /repos/{owner}/{repo}/issues/{number}"
    waits = [await p.wait(endpoint=patch) for _ in range(180)]
    assert waits == [0.0] * 180
    assert await p.wait(endpoint="POST /repos/{owner}/{repo}/labels") == 0.0
    assert await p.wait(endpoint=patch) == 61.0  # the 181st: once the first is a minute old
    assert await p.wait(endpoint=patch) == 0.0  # the rest of the first second's writes went too


async def test_a_turn_waits_for_its_endpoint_while_another_endpoint_goes() -> None:
    ft = FakeTime()
    p = pacer(ft, min_interval=0.0, endpoint_points_per_minute=10, slack=0.0)  # 2 writes
    patch = "PATCH /repos/{owner}/{repo}/issues/{number}"
    for _ in range(2):
        async with p.turn(endpoint=patch) as waited:
            assert waited == 0.0
    assert p.delay(False, None, patch) == 60.0
    assert p.delay(False, None, "POST /repos/{owner}/{repo}/labels") == 0.0


async def test_a_write_in_line_longer_than_its_context_may_wait_is_put_off() -> None:
    """Writes that join the line together each pass the check of their own delay; the one
    whose turn, behind the others, is an hour off is put off once it has waited as long as
    its context may (the worker's), not left in line for the hour."""
    import asyncio

    import pytest

    from bot.forge.errors import PutOff
    from bot.forge.pacing import waiting_at_most

    pacer = WritePacer(min_interval=0, content_per_minute=80, content_per_hour=2, slack=0.0)

    async def write() -> float:
        with waiting_at_most(0.2):
            async with pacer.turn(content=True) as waited:
                return waited

    outcomes = await asyncio.gather(*(write() for _ in range(3)), return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == ["float", "float", "PutOff"], outcomes
    put_off = outcomes[2]
    assert isinstance(put_off, PutOff) and put_off.retry_after is not None
    assert put_off.retry_after > 3000
    assert pacer.waiting() == 0  # out of the line
    with pytest.raises(PutOff):  # and one asked alone now is told at once
        await write()
