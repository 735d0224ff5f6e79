"""The mail state machine: every event from every state, every label move, hand-made changes."""

from __future__ import annotations

import pytest

from labels.catalogue import MAIL_LABEL_NAMES
from labels.states import (
    IllegalTransition,
    LabelChanges,
    MailEvent,
    MailState,
    initial_state,
    is_legal,
    labels_for,
    review_label_change,
    state_from_labels,
    transition,
)

NEW, WORKING, REPLIED, CLOSED = (
    MailState.NEW,
    MailState.WORKING,
    MailState.REPLIED,
    MailState.CLOSED,
)
E = MailEvent

# (current, event) -> resulting state; None as result means the event is refused.
EXPECTED: dict[tuple[MailState | None, MailEvent], MailState | None] = {
    (None, E.DELIVER): NEW,
    (NEW, E.DELIVER): NEW,
    (WORKING, E.DELIVER): WORKING,  # redelivery changes nothing
    (REPLIED, E.DELIVER): REPLIED,
    (CLOSED, E.DELIVER): CLOSED,
    (None, E.OPEN): WORKING,
    (NEW, E.OPEN): WORKING,
    (WORKING, E.OPEN): WORKING,
    (REPLIED, E.OPEN): REPLIED,  # opening is reading: it never takes back a reply
    (CLOSED, E.OPEN): None,
    (None, E.REPLY): REPLIED,
    (NEW, E.REPLY): REPLIED,  # a reply may come straight from new
    (WORKING, E.REPLY): REPLIED,
    (REPLIED, E.REPLY): REPLIED,  # more replies
    (CLOSED, E.REPLY): REPLIED,  # the recipient writing reopens it, as replied
    (None, E.FOLLOW_UP): NEW,
    (NEW, E.FOLLOW_UP): NEW,
    (WORKING, E.FOLLOW_UP): NEW,
    (REPLIED, E.FOLLOW_UP): NEW,  # a follow-up wakes the recipient again
    (CLOSED, E.FOLLOW_UP): NEW,  # closed + new message reopens as new
    (None, E.CLOSE): CLOSED,
    (NEW, E.CLOSE): CLOSED,
    (WORKING, E.CLOSE): CLOSED,
    (REPLIED, E.CLOSE): CLOSED,
    (CLOSED, E.CLOSE): CLOSED,
    (None, E.REOPEN): NEW,
    (NEW, E.REOPEN): NEW,
    (WORKING, E.REOPEN): WORKING,
    (REPLIED, E.REOPEN): REPLIED,
    (CLOSED, E.REOPEN): NEW,
    # held (outside mail, the agent's person's turn): released (a follow-up) or dropped
    (MailState.HELD, E.DELIVER): MailState.HELD,
    (MailState.HELD, E.OPEN): None,  # the agent may not take it before its person releases it
    (MailState.HELD, E.REPLY): None,
    (MailState.HELD, E.FOLLOW_UP): NEW,  # Release
    (MailState.HELD, E.CLOSE): CLOSED,  # Drop
    (MailState.HELD, E.REOPEN): MailState.HELD,
}


def test_table_covers_every_state_and_event() -> None:
    assert set(EXPECTED) == {(s, e) for s in (None, *MailState) for e in MailEvent}


@pytest.mark.parametrize(("current", "event"), list(EXPECTED))
def test_transition(current: MailState | None, event: MailEvent) -> None:
    expected = EXPECTED[(current, event)]
    if expected is None:
        with pytest.raises(IllegalTransition):
            transition(current, event)
    else:
        assert transition(current, event) is expected
        assert is_legal(current, expected)


def test_opening_a_closed_mail_says_how_to_reopen() -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(CLOSED, E.OPEN)
    assert str(info.value) == "mail:closed cannot go to mail:working: reopen it by writing to it"
    assert info.value.current is CLOSED and info.value.target is WORKING


HELD = MailState.HELD
# held: only outside mail enters it (as it arrives); only a release or a drop leaves it
ILLEGAL = {(REPLIED, WORKING), (CLOSED, WORKING), (HELD, WORKING), (HELD, REPLIED),
           *((state, HELD) for state in (NEW, WORKING, REPLIED, CLOSED))}


@pytest.mark.parametrize("current", [None, *MailState])
@pytest.mark.parametrize("target", list(MailState))
def test_is_legal(current: MailState | None, target: MailState) -> None:
    assert is_legal(current, target) is ((current, target) not in ILLEGAL)


def test_states_are_the_catalogue_labels() -> None:
    assert {s.value for s in MailState} == MAIL_LABEL_NAMES


def test_loop_guarded_delivery_has_no_new_label() -> None:
    assert initial_state() is NEW
    assert initial_state(past_loop_guard=True) is None


# -- labels ----------------------------------------------------------------------------------


def test_state_from_labels() -> None:
    assert state_from_labels(["bug", "mail:working"]) is WORKING
    assert state_from_labels(["Mail:Replied "]) is REPLIED
    assert state_from_labels(["bug"]) is None
    assert state_from_labels([]) is None
    assert state_from_labels(["mail:new", "mail:closed"]) is None  # ambiguous


def test_labels_for_swaps_the_mail_label_and_keeps_others() -> None:
    changes = labels_for(WORKING, ["bug", "mail:new"])
    assert changes == LabelChanges(add=("mail:working",), remove=("mail:new",))
    assert changes.apply(["bug", "mail:new"]) == ["bug", "mail:working"]


def test_labels_for_nothing_to_do() -> None:
    changes = labels_for(NEW, ["mail:new", "x"])
    assert changes.empty
    assert changes.apply(["mail:new", "x"]) == ["mail:new", "x"]


def test_labels_for_cleans_up_extras_and_odd_spelling() -> None:
    changes = labels_for(CLOSED, ["mail:new", "mail:closed", "Mail:Working"])
    assert changes.add == ()
    assert set(changes.remove) == {"mail:new", "Mail:Working"}
    changes = labels_for(NEW, ["Mail:New"])
    assert changes == LabelChanges(add=("mail:new",), remove=("Mail:New",))


def test_labels_for_none_removes_every_mail_label() -> None:
    changes = labels_for(None, ["mail:new", "goal"])
    assert changes == LabelChanges(add=(), remove=("mail:new",))
    assert changes.apply(["mail:new", "goal"]) == ["goal"]


# -- hand-made label changes -----------------------------------------------------------------


def test_legal_hand_change_is_accepted() -> None:
    review = review_label_change(NEW, ["mail:working"])
    assert review.accepted and review.state is WORKING and review.changes.empty


def test_new_label_added_beside_old_one_is_taken_as_the_change() -> None:
    review = review_label_change(WORKING, ["mail:working", "mail:closed", "bug"])
    assert review.accepted and review.state is CLOSED
    assert review.changes == LabelChanges(remove=("mail:working",))


def test_illegal_hand_change_is_undone_with_reason() -> None:
    review = review_label_change(CLOSED, ["mail:working"])
    assert not review.accepted
    assert review.state is CLOSED
    assert review.reason == "mail:closed cannot go to mail:working: reopen it by writing to it"
    assert review.changes == LabelChanges(add=("mail:closed",), remove=("mail:working",))


def test_replied_to_working_by_hand_is_undone() -> None:
    review = review_label_change(REPLIED, ["mail:replied", "mail:working"])
    assert not review.accepted and review.state is REPLIED
    assert "mail:replied cannot go to mail:working" in review.reason
    assert review.changes == LabelChanges(remove=("mail:working",))


def test_removing_the_mail_label_is_undone() -> None:
    review = review_label_change(REPLIED, ["bug"])
    assert not review.accepted and review.state is REPLIED
    assert "mail:replied was removed by hand" in review.reason
    assert review.changes == LabelChanges(add=("mail:replied",))


def test_two_new_labels_at_once_are_undone() -> None:
    review = review_label_change(NEW, ["mail:working", "mail:closed"])
    assert not review.accepted and review.state is NEW
    assert "mail:working and mail:closed were set together" in review.reason
    assert set(review.changes.remove) == {"mail:working", "mail:closed"}
    assert review.changes.add == ("mail:new",)


def test_unchanged_labels_are_accepted() -> None:
    review = review_label_change(NEW, ["mail:new", "bug"])
    assert review.accepted and review.state is NEW and review.changes.empty


def test_unlabelled_mail_may_take_any_label() -> None:
    for state in MailState:
        review = review_label_change(None, [state.value])
        assert review.accepted and review.state is state
    assert review_label_change(None, []).accepted


@pytest.mark.parametrize("previous", list(MailState))
@pytest.mark.parametrize("target", list(MailState))
def test_hand_change_matches_is_legal(previous: MailState, target: MailState) -> None:
    review = review_label_change(previous, [target.value])
    assert review.accepted is is_legal(previous, target)
    assert review.state is (target if review.accepted else previous)
