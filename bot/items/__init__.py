"""Items (goals, outcomes, plans, evidence) and the comments, questions and decisions on them.

The pure core lives in `model`, `address`, `questions`, `threads` and `render` (no I/O, unit
tested in tests/test_items.py); `service` and `inbox` are the thin I/O around it that the
tools (bot.tools.comment_tools) and the webhook handler (handlers.items) share.
"""

from bot.items.model import ITEM_KINDS, Item, item_from_issue

__all__ = ["ITEM_KINDS", "Item", "item_from_issue"]
