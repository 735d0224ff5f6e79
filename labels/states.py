"""The mail state machine (DESIGN §3.3): pure, no I/O.

A mail carries exactly one of five labels, and the label says whose turn it is:

    mail:new      the recipient has something to read (a new mail, or a new message on it)
    mail:working  the recipient opened it and is on it
    mail:replied  the recipient answered; it is the sender's turn
    mail:closed   handled
    mail:held     mail from outside (email) the agent's policy holds: the agent's person's
                  turn, to release it (-> new, a run) or drop it (-> closed)

Events and what they do (``transition``):

    DELIVER    the office created or adopted the mail .... (none) -> new;
               on a mail that already has a state it is a redelivery and changes nothing
    OPEN       the recipient opened it (/working, mail_open) ...... new|working -> working;
               replied stays replied (opening is reading, it never takes back a reply);
               closed is refused: "reopen it by writing to it"
    REPLY      the recipient wrote (a reply, mail_reply) .......... any -> replied
               (a reply may come straight from new; more replies stay replied; the
               recipient writing on a closed mail reopens it as replied, not as new,
               because waking the recipient with its own words would only loop)
    FOLLOW_UP  someone other than the recipient wrote ........... any -> new
               (a follow-up wakes the recipient again, whether the mail was working,
               replied or closed: closed + new message reopens as new)
    CLOSE      /close, mail_close, or the issue was closed ....... any -> closed
    REOPEN     the issue was reopened in the forge ............... closed -> new;
               on an open mail it changes nothing

mail:held is a state only outside mail enters, when the office delivers it (bot.email.intake,
`Mailer.hold`): no move leads to it, so every X -> held is refused (a mail with no mail label
may still take it, as it may take any). From held, FOLLOW_UP (the release) and CLOSE (the
drop) are the ways out; OPEN and REPLY are refused until a person releases it.

So replied -> working is *not* a legal move: once answered, the mail goes back to the
recipient only through a new message (-> new), and the recipient then opens it again.
The illegal label moves are therefore replied -> working, closed -> working, held -> working
or replied, and anything -> held; every state may stay as it is, and a mail with no mail
label (never labelled, or delivered past the loop guard) may take any of the five.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from labels.catalogue import MAIL_CLOSED, MAIL_HELD, MAIL_NEW, MAIL_REPLIED, MAIL_WORKING


class MailState(StrEnum):
    """The five mail states; each value is its label's name."""

    NEW = MAIL_NEW.name
    WORKING = MAIL_WORKING.name
    REPLIED = MAIL_REPLIED.name
    CLOSED = MAIL_CLOSED.name
    HELD = MAIL_HELD.name


class MailEvent(StrEnum):
    DELIVER = "deliver"
    OPEN = "open"
    REPLY = "reply"
    FOLLOW_UP = "follow_up"
    CLOSE = "close"
    REOPEN = "reopen"


ALL_STATES: tuple[MailState, ...] = tuple(MailState)

_BY_NAME: dict[str, MailState] = {s.value: s for s in MailState}

# (from, to) pairs that are not allowed, with the reason a person reads.
_ILLEGAL: dict[tuple[MailState, MailState], str] = {
    (MailState.CLOSED, MailState.WORKING): (
        "mail:closed cannot go to mail:working: reopen it by writing to it"
    ),
    (MailState.REPLIED, MailState.WORKING): (
        "mail:replied cannot go to mail:working: it has been answered; a new message "
        "hands it back to the recipient as mail:new"
    ),
    (MailState.HELD, MailState.WORKING): (
        "mail:held cannot go to mail:working: the agent's person releases it first "
        "(mail:new) or drops it (close it)"
    ),
    (MailState.HELD, MailState.REPLIED): (
        "mail:held cannot go to mail:replied: the agent's person releases it first "
        "(mail:new) or drops it (close it)"
    ),
    **{(state, MailState.HELD): (
        f"{state.value} cannot go to mail:held: only mail from outside is held, by the "
        "office, as it arrives") for state in (MailState.NEW, MailState.WORKING,
                                               MailState.REPLIED, MailState.CLOSED)},
}


class IllegalTransition(ValueError):
    """A move the state machine refuses; str(exc) is a sentence a person can read."""

    def __init__(self, current: MailState | None, target: MailState, message: str) -> None:
        self.current = current
        self.target = target
        self.message = message
        super().__init__(message)


def _name(state: MailState | None) -> str:
    return state.value if state is not None else "(no mail label)"


def is_legal(current: MailState | None, target: MailState) -> bool:
    """Whether a mail in ``current`` may carry ``target`` next (staying put is legal)."""
    if current is None:
        return True
    return (current, target) not in _ILLEGAL


def why_illegal(current: MailState | None, target: MailState) -> str | None:
    """The readable reason ``current -> target`` is refused, or None when it is legal."""
    if current is None:
        return None
    return _ILLEGAL.get((current, target))


def transition(current: MailState | None, event: MailEvent) -> MailState:
    """The state after ``event``; raises IllegalTransition when the event is refused.

    ``current`` is None for a mail that carries no mail label yet.
    """
    if event is MailEvent.DELIVER:
        target = MailState.NEW if current is None else current
    elif event is MailEvent.OPEN:
        target = MailState.REPLIED if current is MailState.REPLIED else MailState.WORKING
    elif event is MailEvent.REPLY:
        target = MailState.REPLIED
    elif event is MailEvent.FOLLOW_UP:
        target = MailState.NEW
    elif event is MailEvent.CLOSE:
        target = MailState.CLOSED
    else:  # MailEvent.REOPEN
        target = MailState.NEW if current in (None, MailState.CLOSED) else current
    reason = why_illegal(current, target)
    if reason is not None:
        raise IllegalTransition(current, target, reason)
    return target


def initial_state(*, past_loop_guard: bool = False) -> MailState | None:
    """The state a freshly delivered mail gets: mail:new, or no mail label at all when it was
    delivered past the loop guard (so it starts no run; the recipient sees it on its next)."""
    return None if past_loop_guard else MailState.NEW


# -- labels ----------------------------------------------------------------------------------


def _mail_states_in(names: Iterable[str]) -> list[tuple[str, MailState]]:
    """(label as found, state) for each mail label in ``names``, matched case-insensitively."""
    found: list[tuple[str, MailState]] = []
    for name in names:
        state = _BY_NAME.get(name.strip().lower())
        if state is not None and all(s is not state for _, s in found):
            found.append((name, state))
    return found


def mail_states_in(names: Iterable[str]) -> list[MailState]:
    """Every mail state whose label is in ``names`` (normally one)."""
    return [state for _, state in _mail_states_in(names)]


def state_from_labels(names: Iterable[str]) -> MailState | None:
    """The mail state a label set says, or None when it carries no mail label or more than
    one (ambiguous: settle it with ``review_label_change``)."""
    found = _mail_states_in(names)
    return found[0][1] if len(found) == 1 else None


@dataclass(frozen=True)
class LabelChanges:
    """Labels to add and remove so that an issue carries exactly one mail label."""

    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.add and not self.remove

    def apply(self, current: Iterable[str]) -> list[str]:
        """The full label list after the changes (other labels kept, in order), for forges
        that replace an issue's labels in one request."""
        gone = set(self.remove)
        out = [name for name in current if name not in gone]
        out.extend(name for name in self.add if name not in out)
        return out


def labels_for(state: MailState | None, current: Iterable[str] = ()) -> LabelChanges:
    """What to add and remove to go from the ``current`` label names to exactly ``state``'s
    label (or to no mail label when ``state`` is None). Labels other than mail:* are kept."""
    current = list(current)
    wanted = state.value if state is not None else None
    remove = tuple(name for name in current if name.strip().lower() in _BY_NAME and name != wanted)
    add = (wanted,) if wanted is not None and wanted not in current else ()
    return LabelChanges(add=add, remove=remove)


@dataclass(frozen=True)
class LabelReview:
    """The verdict on a label change the office did not make.

    ``state`` is what the mail should carry from now on; ``accepted`` says whether that is
    the person's change (True) or the previous state restored (False, with ``reason`` for the
    comment that says why); ``changes`` brings the issue's labels to exactly ``state`` (it may
    be non-empty even when accepted, e.g. to drop the old label a person left beside the new).
    """

    state: MailState | None
    accepted: bool
    reason: str
    changes: LabelChanges


def review_label_change(previous: MailState | None, labels: Iterable[str]) -> LabelReview:
    """Decide on a hand-made label change: ``previous`` is the state the office knew, and
    ``labels`` the issue's label names now.

    One mail label that is a legal move from ``previous`` is accepted. A person who adds a
    new mail label and leaves the old one is taken to mean the new one. No mail label, more
    than one new one, or an illegal move restores ``previous``.

    Forges report a swap made in the UI as two events (unlabeled, then labeled): review
    against the issue's newest label set, not each event's in turn.
    """
    labels = list(labels)
    states = mail_states_in(labels)
    added = [s for s in states if s is not previous]

    def restore(reason: str) -> LabelReview:
        return LabelReview(previous, False, reason, labels_for(previous, labels))

    def accept(state: MailState | None) -> LabelReview:
        return LabelReview(state, True, "", labels_for(state, labels))

    if not states:
        if previous is None:
            return accept(None)
        return restore(
            f"{previous.value} was removed by hand; a mail always carries exactly one of "
            + ", ".join(s.value for s in MailState)
        )
    if not added:  # only the previous label is there
        return accept(previous)
    if len(added) > 1:
        return restore(
            " and ".join(s.value for s in added)
            + " were set together; a mail carries exactly one mail label"
        )
    target = added[0]
    reason = why_illegal(previous, target)
    if reason is not None:
        return restore(reason)
    return accept(target)


__all__ = [
    "ALL_STATES",
    "IllegalTransition",
    "LabelChanges",
    "LabelReview",
    "MailEvent",
    "MailState",
    "initial_state",
    "is_legal",
    "labels_for",
    "mail_states_in",
    "review_label_change",
    "state_from_labels",
    "transition",
    "why_illegal",
]
