"""The webhook router: an event's handlers run in the order they were added (handlers/)."""

from __future__ import annotations

from typing import Any

from gidgethub import sansio

from bot.app.routing import OrderedRouter
from handlers import build_router


def _created() -> sansio.Event:
    return sansio.Event({"action": "created"}, event="installation", delivery_id="d-1")


async def test_an_events_handlers_run_in_the_order_their_modules_added_them() -> None:
    """gidgethub's Router runs an event's handlers in the order of a frozenset: functions
    hash by their address, so the order changed with how a process's memory was laid out.
    installation.created's handler that reads the office config ran before the one that
    records the org's account in about one process in eight, and the operator's entries
    naming the org by its login were then bound to no account (a full run of the suite failed
    so; found by review). Each module's order is kept, by event and by action alike, and the
    modules' order where several are combined."""
    calls: list[int] = []

    def handler(n: int) -> Any:
        async def handle(event: sansio.Event, *args: Any) -> None:
            calls.append(n)
        return handle

    first, second = OrderedRouter(), OrderedRouter()
    for n in range(24):  # by event and by action, interleaved
        (first if n < 12 else second).add(handler(n), "installation",
                                          **({"action": "created"} if n % 2 else {}))
    await OrderedRouter(first, second).dispatch(_created())
    assert calls == list(range(24))


def test_an_installation_is_recorded_before_its_office_config_is_read() -> None:
    names = [f.__name__ for f in build_router().ordered(_created())]
    assert names.index("remember_installation") < names.index("provision_labels_on_install")
