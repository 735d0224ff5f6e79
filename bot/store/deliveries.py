"""Reads of the webhook deliveries the queue recorded (the `deliveries` table of
`bot.store.db`)."""

from __future__ import annotations

from bot.store.db import Store


async def delivery_recorded(store: Store, guid: str) -> bool:
    """Whether a delivery with this id reached the queue."""
    row = await store.fetchone(
        "SELECT 1 FROM deliveries WHERE guid=?", (guid,))
    return row is not None
