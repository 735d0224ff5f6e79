"""The labels vaultmail provisions in every vault: the mail states, and the item kinds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Label:
    name: str
    color: str  # hex without '#', as GitHub takes it
    description: str


MAIL_NEW = Label("mail:new", "0e8a16", "New mail, not yet opened by its recipient")
MAIL_WORKING = Label("mail:working", "fbca04", "The recipient opened this mail and is on it")
MAIL_REPLIED = Label("mail:replied", "1d76db", "The recipient replied")
MAIL_CLOSED = Label("mail:closed", "6a737d", "Handled; a new message reopens it")
MAIL_HELD = Label("mail:held", "d93f0b",
                  "Mail from outside held for the agent's person: release it (mail:new) or "
                  "drop it (close)")

MAIL_LABELS: tuple[Label, ...] = (MAIL_NEW, MAIL_WORKING, MAIL_REPLIED, MAIL_CLOSED, MAIL_HELD)
MAIL_LABEL_NAMES = frozenset(label.name for label in MAIL_LABELS)
