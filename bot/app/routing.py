"""gidgethub's webhook router, running an event's handlers in the order they were added.

gidgethub's `Router.dispatch` runs them in the order of a frozenset, and functions hash by
their address: the order changed with how a process's memory was laid out. Where one event
has two handlers that depend on each other (installation.created records the org's account,
then reads its office config, whose first read binds the operator's entries naming the org
by login to that account), about one process in eight ran them the other way round (found
by review, after a full run of the suite failed so). Here a module's handlers run in the
order the module registers them, and combined routers' in the order they are given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gidgethub import sansio
from gidgethub.routing import Router

Handler = Callable[..., Awaitable[None]]


class OrderedRouter(Router):
    """A `Router` whose `dispatch` runs an event's handlers in the order they were added
    (`ordered`); the routers it is made from (each handlers module's) in their own order."""

    def __init__(self, *other_routers: OrderedRouter) -> None:
        self._added: list[tuple[Handler, str, dict[str, Any]]] = []
        self._order: dict[Handler, int] = {}
        super().__init__()
        for other in other_routers:
            for func, event_type, detail in other._added:
                self.add(func, event_type, **detail)

    def add(self, func: Handler, event_type: str, **data_detail: Any) -> None:
        self._added.append((func, event_type, dict(data_detail)))
        self._order.setdefault(func, len(self._order))
        super().add(func, event_type, **data_detail)

    def ordered(self, event: sansio.Event) -> list[Handler]:
        """The handlers `event` runs, in the order they were added."""
        return sorted(self.fetch(event), key=self._order.__getitem__)

    async def dispatch(self, event: sansio.Event, *args: Any, **kwargs: Any) -> None:
        for callback in self.ordered(event):
            await callback(event, *args, **kwargs)
