"""Webhook deliveries: queued in order, sent by one background task, each attempted once with
a 10 s timeout and recorded (never retried automatically). Faults can drop or duplicate them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp

from .clock import Clock
from .faults import Faults
from .state import App, Delivery, State

HeaderBuilder = Callable[[App, Delivery, bytes], dict[str, str]]
TIMEOUT_SECONDS = 10.0


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


class Dispatcher:
    def __init__(self, state: State, clock: Clock, faults: Faults, headers: HeaderBuilder,
                 on_change: Callable[[], None]) -> None:
        self.state = state
        self.clock = clock
        self.faults = faults
        self.headers = headers
        self.on_change = on_change
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.timeout = TIMEOUT_SECONDS
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        # a load balancer in front of an app's replicas: its address -> the replicas' hooks
        self.balanced: dict[str, list[str]] = {}
        self._turn: dict[str, int] = {}
        self.took: dict[int, str] = {}  # delivery id -> the replica that took it
        self._deferred: set[int] = set()  # deliveries the reorder fault put back once

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._session = aiohttp.ClientSession()
        for d in sorted(self.state.deliveries.values(), key=lambda d: d.id):
            if d.status == "pending":
                self.queue.put_nowait(d.id)
        self._task = asyncio.create_task(self._run(), name="localforge-webhooks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def idle(self) -> None:
        """Return once every queued delivery has been attempted."""
        if self._task is None:
            return
        await self.queue.join()

    # -- queueing ----------------------------------------------------------------------
    def enqueue(self, app: App, event: str, action: str | None, payload: dict[str, Any],
                installation_id: int | None, repository_id: int | None,
                guid: str | None = None, redelivery: bool = False) -> Delivery | None:
        if not app.webhook_url:
            return None
        delivery = Delivery(
            id=self.state.next_id("delivery"), guid=guid or str(uuid.uuid4()), app_id=app.id,
            event=event, action=action, installation_id=installation_id,
            repository_id=repository_id, url=app.webhook_url, redelivery=redelivery,
            payload=payload, delivered_at=self.clock.now(),
        )
        delivery.request_headers = self.headers(app, delivery, encode(payload))
        self.state.deliveries[delivery.id] = delivery
        self.queue.put_nowait(delivery.id)
        return delivery

    def redeliver(self, original: Delivery) -> Delivery | None:
        app = self.state.apps.get(original.app_id)
        if app is None:
            return None
        return self.enqueue(app, original.event, original.action, original.payload,
                            original.installation_id, original.repository_id,
                            guid=original.guid, redelivery=True)

    # -- sending -----------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            delivery_id = await self.queue.get()
            delivery = self.state.deliveries.get(delivery_id)
            try:
                if (delivery is not None and not self.queue.empty()
                        and delivery_id not in self._deferred
                        and self.faults.reorder.fire(self.faults.rng)):
                    self._deferred.add(delivery_id)  # behind the ones queued after it
                    self.queue.put_nowait(delivery_id)
                elif delivery is not None:
                    await self._deliver(delivery)
                    self.on_change()
            except Exception as exc:  # a bad delivery must not stop the sender; record it
                if delivery is not None:
                    delivery.status, delivery.status_code = f"forge error: {exc!r}", 0
            finally:
                self.queue.task_done()

    async def _deliver(self, d: Delivery) -> None:
        d.delivered_at = self.clock.now()
        sender = d.payload.get("sender")
        login = sender.get("login") if isinstance(sender, dict) else None
        if self.faults.drop.fire(self.faults.rng, login, d.redelivery):
            d.status, d.status_code, d.duration = "failed to connect to host (dropped)", 0, 0.0
            return
        times = 2 if self.faults.duplicate.fire(self.faults.rng) else 1
        body = encode(d.payload)
        for attempt in range(times):
            result = await self._post(d, body)
            if attempt == 0:
                d.status, d.status_code, d.duration = result[0], result[1], result[2]
                d.response_headers, d.response_payload = result[3], result[4]

    async def _post(self, d: Delivery, body: bytes,
                    ) -> tuple[str, int, float, dict[str, str], str | None]:
        """One attempt. Behind a load balancer (`balanced`), the replicas in turn; one that
        refuses the connection (it is down) is passed over for the next, as a balancer's
        health checks would; one that answers, whatever it answers, has the delivery."""
        targets = self.balanced.get(d.url)
        if not targets:
            return await self._post_to(d.url, d, body)
        first = self._turn.get(d.url, 0)
        self._turn[d.url] = first + 1
        result: tuple[str, int, float, dict[str, str], str | None] | None = None
        for n in range(len(targets)):
            target = targets[(first + n) % len(targets)]
            result = await self._post_to(target, d, body)
            if not result[0].startswith("failed to connect"):
                self.took[d.id] = target
                break
        assert result is not None
        return result

    async def _post_to(self, url: str, d: Delivery, body: bytes,
                       ) -> tuple[str, int, float, dict[str, str], str | None]:
        assert self._session is not None
        started = time.monotonic()
        try:
            async with self._session.post(
                    url, data=body, headers=d.request_headers,
                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                text = await resp.text(errors="replace")
                ok = 200 <= resp.status < 300
                status = "OK" if ok else f"Invalid HTTP Response: {resp.status}"
                return (status, resp.status, round(time.monotonic() - started, 3),
                        dict(resp.headers), text[:10000])
        except TimeoutError:
            return ("timed out", 0, round(time.monotonic() - started, 3), {}, None)
        except aiohttp.ClientError as exc:
            return (f"failed to connect to host: {exc.__class__.__name__}", 0,
                    round(time.monotonic() - started, 3), {}, None)
