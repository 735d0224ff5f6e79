"""A thread's state machine: who is in it, whose turn it is, the answer and its history.

A question waits on the people asked until one of them replies; the first such reply is the
answer and the turn goes back to the asker. Only those asked answer (or an agent of a person
asked, relaying their answer with `confirmedWithPerson`): a reply from anyone else, a sibling
agent's "FYI" or the asked agent's own person included, is a reply in the thread that reaches
everyone in it and changes no one's turn. The asker's follow-up (the asker's own, not its
person's) hands it back, and the next reply from someone asked gives it to the asker again
(seed: "the people asked, until one of them replies; then yours"). A reply `to`
someone new passes the question on: they join and it waits on them too (an agent passing to
its own person steps out of the turn, as the question is now theirs). `amend` replaces the
answer, keeps the old one in the history, hands the turn to the asker and reopens the thread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from bot.errors import Conflict, Denied, InvalidArguments
from bot.items.address import Reached, Way, person_of, way_of_writer
from bot.items.questions import Question

if TYPE_CHECKING:  # (annotations only: the index loads this module, not the office's models)
    from bot.office.config import Office

ReplyKind = Literal["answer", "amend", "follow_up", "pass_on", "comment"]
_HUMAN_ONLY = ("this question is humanOnly: your person must decide. Tell them, then reply with "
               'what they said and confirmedWithPerson: true (or pass it to them with to: '
               '["me"])')
_HUMAN_ONLY_ON_FORGE = ("this question is humanOnly: your person must decide. Tell them, then "
                        "relay what they said with `/confirmed <what they said>` (or pass it "
                        "to them with a line `to: me` above `/answer`)")


@dataclass(frozen=True)
class Answer:
    comment: str
    by: str  # who replied
    at: float
    option: str | None = None  # the chosen option's label
    body: str = ""
    confirmed_with_person: bool = False
    person: str | None = None  # whose answer it was, when an agent relayed its person's
    withdrawn: bool = False  # its comment was deleted on the forge (its words gone with it)

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"comment": self.comment, "by": self.by, "option": self.option,
                               "body": self.body, "at": self.at}
        if self.withdrawn:
            out["withdrawn"] = True
        if self.confirmed_with_person:
            out.update(confirmedWithPerson=True, personsAnswer=self.person)
        return out


@dataclass(frozen=True)
class ThreadState:
    asker: str
    members: dict[str, Way]
    asked: tuple[str, ...] = ()
    waiting_on: tuple[str, ...] = ()
    question: Question | None = None
    answer: Answer | None = None
    history: tuple[Answer, ...] = field(default_factory=tuple)
    resolved: bool = False
    # who has replied since the answer (its asker aside): an agent sharing the asker's person
    # carries the answer as history until it does (`inbox._turns`); a new answer clears it
    replied_since: tuple[str, ...] = ()
    # those asked who have left the office since (no longer in its config), by the name
    # people knew them by: the question waits on them no more (`without`)
    left: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"asker": self.asker, "members": self.members, "asked": list(self.asked),
                "waiting_on": list(self.waiting_on),
                "question": self.question.to_json() if self.question else None,
                "answer": asdict(self.answer) if self.answer else None,
                "history": [asdict(a) for a in self.history], "resolved": self.resolved,
                "replied_since": list(self.replied_since), "left": self.left}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ThreadState:
        return cls(asker=d["asker"], members=dict(d["members"]), asked=tuple(d["asked"]),
                   waiting_on=tuple(d["waiting_on"]),
                   question=Question.from_json(d["question"]) if d["question"] else None,
                   answer=Answer(**d["answer"]) if d["answer"] else None,
                   history=tuple(Answer(**a) for a in d["history"]), resolved=d["resolved"],
                   replied_since=tuple(d.get("replied_since", ())),  # absent in older rows
                   left=dict(d.get("left", {})))

    @property
    def returned(self) -> bool:
        """Asked only of people who have left: nobody can answer it, so it is its asker's
        again (the one way an unanswered question waits on its asker)."""
        return self.answer is None and self.waiting_on == (self.asker,) and bool(self.left)

    @property
    def is_question(self) -> bool:
        return self.question is not None


def start(asker: str, *, question: Question | None, to: list[Reached],
          cc: list[Reached], reached: list[Reached]) -> ThreadState:
    """A new thread from its first comment. Everyone it reaches is in the thread (so replies
    reach them too); a question asks `to`, else whom the item reaches (a plan's author, the
    agent holding the claim)."""
    members: dict[str, Way] = {asker: way_of_writer(asker)}
    for r in [*to, *cc, *reached]:
        members.setdefault(r.principal, r.way)
    if question is None:
        return ThreadState(asker=asker, members=members)
    asked = _unique(r.principal for r in (to or reached) if r.principal != asker)
    if not asked:
        raise InvalidArguments('to: a question needs someone to answer it: address them with '
                               'to (an email, team:<key>, "agent" or "me")')
    for p in asked:
        members.setdefault(p, "agents" if p.startswith("agent:") else "personal")
    return ThreadState(asker=asker, members=members, asked=asked, waiting_on=asked,
                       question=question)


def without(state: ThreadState, gone: dict[str, str]) -> ThreadState:
    """The thread once those in `gone` (principal: the name people knew them by) have left
    the office: it reaches them no more and waits on them no more; a question that then
    waits on nobody goes back to its asker (unless they left too). The same state when none
    of them is in it."""
    out = [p for p in gone if p in state.members or p in state.waiting_on]
    if not out:
        return state
    members = {p: w for p, w in state.members.items() if p not in gone}
    waiting = tuple(p for p in state.waiting_on if p not in gone)
    left = dict(state.left)
    if state.is_question:
        left.update({p: gone[p] for p in out if p in state.asked})
        if not waiting and state.asker not in gone and not state.resolved:
            waiting = (state.asker,)
    return replace(state, members=members, waiting_on=waiting, left=left)


def left_names(state: ThreadState, hidden: str | None) -> list[str]:
    """The names of those asked who have left the office, but `hidden`, a claim holder the
    reader may not be told of (`views.hidden_claims`, `claim_unnamed`)."""
    return sorted((n for p, n in state.left.items() if p != hidden), key=str.lower)


def left_note(state: ThreadState, hidden: str | None) -> str:
    """Who of those asked has left the office (`left_names`), and what that did: "" when
    nobody has."""
    if not state.left:
        return ""
    names = left_names(state, hidden)
    back = "nobody is asked now, so the question is back with its asker (pass it on with a " \
           "reply `to` someone, or resolve it)"
    if not names:  # only a claim holder it may not name: what it did, not who
        return back[0].upper() + back[1:] if state.returned else ""
    text = f"{', '.join(names)} {'has' if len(names) == 1 else 'have'} left the office"
    return f"{text}: {back}" if state.returned else text


def _said(a: Answer) -> str:
    what = " and ".join(repr(w) for w in (a.option, a.body) if w)
    return what or "that"


def _unique(items: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def may_answer(state: ThreadState, office: Office, who: str, *,
               confirmed: bool = False) -> bool:
    """Whether a reply of `who` can be the answer (seed: "The first reply from someone asked
    is the answer"): someone asked, or, relaying their person's answer (`confirmed`), an agent
    of a person asked. Nobody else's reply is an answer, however close to those asked."""
    if not state.is_question or who == state.asker:
        return False
    if who in state.asked:
        return True
    return confirmed and _relays(state, office, who)


def _relays(state: ThreadState, office: Office, who: str) -> bool:
    """An agent whose person the question asks: it may pass on their answer."""
    mine = person_of(office, who) if who.startswith("agent:") else None
    return who != state.asker and mine is not None and mine in state.asked


def may_reply(state: ThreadState, office: Office, who: str) -> bool:
    """Who may write in a question's thread without contributor access (seed: "anyone a
    question is addressed to can reply to it"): those asked, those who share a person with
    them (an agent of a person asked relays their answer), and an asking agent's siblings (its
    answer reaches them in the box they share, and they may reply to pass it on). Replying is
    not answering (see `may_answer`)."""
    if not state.is_question or who == state.asker:
        return False
    mine = person_of(office, who) if who.startswith("agent:") else None
    sibling = state.asker.startswith("agent:") and mine is not None \
        and person_of(office, state.asker) == mine
    return sibling or speaks_for_asked(state, office, who)


def speaks_for_asked(state: ThreadState, office: Office, who: str) -> bool:
    """Someone asked, or someone who shares a person with someone asked."""
    if who in state.asked:
        return True
    mine = person_of(office, who)
    return mine is not None and any(person_of(office, a) == mine for a in state.asked)


def may_resolve(state: ThreadState, office: Office, who: str, *, editor: bool) -> bool:
    """Resolving a question says its answer was used, so only its asker (or an editor) can
    (seed: "Resolve"): not the asker's person, who did not ask it and may not have used it."""
    return not state.is_question or editor or who == state.asker


def reply(state: ThreadState, office: Office, who: str, *, comment: str, at: float,
          body: str, option: int | None, amend: bool, confirmed: bool,
          to: list[Reached], cc: list[Reached]) -> tuple[ThreadState, ReplyKind]:
    """The thread after `who` replies; raises when the reply breaks a rule of the thread."""
    q = state.question
    answerer = may_answer(state, office, who, confirmed=confirmed)
    if (option is not None or amend) and q is None:
        raise InvalidArguments("option/amend: this thread is not a question; reply with body")
    if (option is not None or amend) and not answerer:
        if q is not None and _relays(state, office, who):
            if q.human_only:
                raise Denied(_HUMAN_ONLY, on_forge=_HUMAN_ONLY_ON_FORGE)
            only = f"only those the question asks ({', '.join(state.asked)}) can answer it"
            raise Denied(f"{only}; to relay {person_of(office, who)}'s answer, reply with what "
                         "they said and confirmedWithPerson: true, or reply with body",
                         on_forge=f"{only}; to relay {person_of(office, who)}'s answer, write "
                         "`/confirmed <what they said>` (or `/answer <option>` and a line "
                         "`/confirmed`), or comment in words")
        raise Denied(f"only those the question asks ({', '.join(state.asked)}) can answer it; "
                     "reply with body, or ask them to",
                     on_forge=f"only those the question asks ({', '.join(state.asked)}) can "
                     "answer it; comment in words, or ask them to")
    if amend and state.answer is None:
        raise InvalidArguments("amend: nothing has been answered yet; reply without amend")
    if option is not None and state.answer is not None and not amend:
        raise Conflict("this question is already answered; to change the answer, reply with "
                        "amend: true")
    was = state.answer
    if amend and q is not None and was is not None and was.by == who and body == was.body \
            and (q.options[option].label if option is not None else None) == was.option:
        # (nothing to change: no history entry, nobody told of a change that is none)
        # (said on the forge too, to a second `/answer`: no tool's words in it)
        raise Conflict(f"the answer is already {_said(was)}: nothing changed. To change it, "
                       "answer with another option or other words", code="answer_unchanged")
    members = dict(state.members)
    members.setdefault(who, way_of_writer(who))
    if way_of_writer(who) == "personal":
        members[who] = "personal"  # wrote in the thread themselves
    for r in [*to, *cc]:
        members.setdefault(r.principal, r.way)
    new_people = [r.principal for r in to if r.principal not in (who, state.asker)]
    if q is not None and new_people and who != state.asker \
            and not speaks_for_asked(state, office, who):
        raise Denied(f"only those the question asks ({', '.join(state.asked)}) can pass it "
                     "on; reply without `to`, or ask them to")
    answering = q is not None and answerer and (
        amend or (state.answer is None and (option is not None or not new_people)))
    if answering and q is not None and q.human_only and who.startswith("agent:") \
            and not confirmed:
        raise Denied(_HUMAN_ONLY, on_forge=_HUMAN_ONLY_ON_FORGE)
    since = state.replied_since
    if state.answer is not None and who != state.asker:
        since = _unique([*since, who])  # acted on the answer, or passed it on
    base = replace(state, members=members, asked=_unique([*state.asked, *new_people]),
                   replied_since=since,
                   left={p: n for p, n in state.left.items() if p not in new_people})
    if answering and q is not None:
        relayed = confirmed and who.startswith("agent:")
        answer = Answer(comment=comment, by=who, at=at,
                        option=q.options[option].label if option is not None else None,
                        body=body, confirmed_with_person=relayed,
                        person=person_of(office, who) if relayed else None)
        history = (*state.history, state.answer) if amend and state.answer else state.history
        kind: ReplyKind = "amend" if amend else "answer"
        return replace(base, answer=answer, history=history, waiting_on=(state.asker,),
                       resolved=False if amend else state.resolved, replied_since=()), kind
    if q is None:
        return base, "comment"
    if new_people:
        waiting = [*state.waiting_on, *new_people]
        if state.answer is None:  # (waited on its asker only when all asked had left)
            waiting = [p for p in waiting if p != state.asker]
        if who.startswith("agent:") and person_of(office, who) in new_people:
            waiting = [p for p in waiting if p != who]  # handed to its person to decide
        return replace(base, waiting_on=_unique(waiting)), "pass_on"
    if who == state.asker:  # only the asker follows up (not the asking agent's person)
        back = [state.answer.by] if state.answer else \
            [p for p in state.asked if p not in state.left] or [state.asker]
        return replace(base, waiting_on=_unique(back)), "follow_up"
    if answerer and state.answer is not None:
        # someone asked replies to a follow-up: it is the asker's turn again
        return replace(base, waiting_on=(state.asker,)), "comment"
    return base, "comment"


def withdraw(state: ThreadState, comment: str, *, asked_it: bool) -> ThreadState:
    """The thread after comment `comment` was deleted on the forge. An answer it gave is
    withdrawn: kept in the history as withdrawn, without its words (a decision is not erased
    unsaid), and the question waits again on those asked, open; an earlier answer it replaced
    stays replaced (its answerer changed their mind). A question it asked (`asked_it`: the
    thread's first comment) is closed, its words gone: no one waits on what no one can read."""
    def gone(a: Answer) -> Answer:
        return replace(a, body="", withdrawn=True) if a.comment == comment else a

    history = tuple(gone(a) for a in state.history)
    if state.answer is not None and state.answer.comment == comment:
        return replace(state, answer=None, history=(*history, gone(state.answer)),
                       waiting_on=tuple(p for p in state.asked if p != state.asker),
                       resolved=False, replied_since=())
    if state.question is not None and asked_it:
        return replace(state, question=replace(state.question, body="", context=None),
                       history=history, waiting_on=(), resolved=True)
    return replace(state, history=history)
