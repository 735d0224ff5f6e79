"""Questions (seed: "Questions"): validated once, so every face (tools, forge) refuses alike."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from bot.digits import whole
from bot.errors import InvalidArguments
from bot.unseen import clean_subject

MAX_OPTIONS = 4
MAX_LABEL = 60
MAX_LABEL_WORDS = 5
MAX_HEADER = 40
MAX_CONTEXT = 4_000
MAX_DESCRIPTION = 500
MAX_THEN = 4_000
# People can always answer in words, so an option that means "something else" is refused.
_OTHER = re.compile(r"^\s*(other|something else|none of (the|these) above|anything else)\b",
                    re.IGNORECASE)


@dataclass(frozen=True)
class Option:
    label: str
    description: str = ""
    then: str = ""
    recommended: bool = False

    def public(self) -> dict[str, Any]:
        """The option as anyone sees it: `then` is the asker's own note and stays out."""
        return {"label": self.label, "description": self.description,
                "recommended": self.recommended}


@dataclass(frozen=True)
class Question:
    body: str
    needs_reply: bool = True
    options: tuple[Option, ...] = field(default_factory=tuple)
    header: str | None = None
    human_only: bool = False
    context: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["options"] = [asdict(o) for o in self.options]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Question:
        opts = tuple(Option(**o) for o in data.get("options", []))
        return cls(**{**data, "options": opts})

    def view(self, *, with_then: bool) -> dict[str, Any]:
        options = [{**o.public(), **({"then": o.then} if with_then else {})}
                   for o in self.options]
        return {"header": self.header, "body": self.body, "needsReply": True,
                "humanOnly": self.human_only, "context": self.context, "options": options}

    def option_index(self, choice: str | int) -> int:
        """An option by its number (1-based) or its label, case-insensitively."""
        if not self.options:
            raise InvalidArguments("option: this question has no options; answer with body")
        text = str(choice).strip()
        number = whole(text)
        if number is not None and 1 <= number <= len(self.options):
            return number - 1
        for i, o in enumerate(self.options):
            if o.label.lower() == text.lower():
                return i
        labels = "; ".join(f"{i + 1}. {o.label}" for i, o in enumerate(self.options))
        raise InvalidArguments(f"option: {text!r} is not one of this question's options ({labels})")


def _option(i: int, raw: dict[str, Any]) -> Option:
    where = f"options[{i}]"
    label = clean_subject(str(raw.get("label") or ""))  # one line: a box of its own, no more
    words = label.split()
    if not 1 <= len(words) <= MAX_LABEL_WORDS or len(label) > MAX_LABEL:
        raise InvalidArguments(f"{where}.label: {label!r} must be 1 to {MAX_LABEL_WORDS} words "
                               f"and at most {MAX_LABEL} characters: it is the button people tap")
    if _OTHER.match(label):
        raise InvalidArguments(f"{where}.label: drop the {label!r} option; people can always "
                               "reply in words")
    description = clean_subject(str(raw.get("description") or ""))  # on the box's line
    then = str(raw.get("then") or "").strip()
    if len(description) > MAX_DESCRIPTION:
        raise InvalidArguments(f"{where}.description: at most {MAX_DESCRIPTION} characters; "
                               "say the trade-off in a sentence")
    if len(then) > MAX_THEN:
        raise InvalidArguments(f"{where}.then: at most {MAX_THEN} characters")
    return Option(label, description, then, bool(raw.get("recommended")))


def validate_question(body: str, *, needs_reply: bool, options: list[dict[str, Any]] | None,
                      header: str | None, human_only: bool,
                      context: str | None) -> Question | None:
    """The question a comment asks, or None for a plain comment; refuses what breaks a rule."""
    options = options or []
    if not needs_reply and not options:
        stray = [name for name, v in (("header", header), ("humanOnly", human_only),
                                      ("context", context)) if v]
        if stray:
            raise InvalidArguments(f"{', '.join(stray)}: only a question takes these; add "
                                   "needsReply: true or options")
        return None
    if len(options) > MAX_OPTIONS:
        raise InvalidArguments(f"options: {len(options)} given, at most {MAX_OPTIONS}; "
                               "people can always reply in words")
    parsed = tuple(_option(i, o) for i, o in enumerate(options))
    labels = [o.label.lower() for o in parsed]
    if len(set(labels)) != len(labels):
        raise InvalidArguments("options: two options have the same label")
    if sum(o.recommended for o in parsed) > 1:
        raise InvalidArguments("options: at most one option may be recommended")
    header = clean_subject(header) if header is not None else None  # the card's one-line title
    if header is not None and len(header) > MAX_HEADER:
        raise InvalidArguments(f"header: {len(header)} characters, at most {MAX_HEADER}: "
                               'a few words, like "Token TTL"')
    if context is not None and len(context) > MAX_CONTEXT:
        raise InvalidArguments(f"context: {len(context)} characters, at most {MAX_CONTEXT}")
    if not body.strip():
        raise InvalidArguments("body: a question needs its question in body",
                               on_forge="a question needs its question: write it after `/ask`")
    return Question(body=body.strip(), options=parsed,
                    header=header.strip() if header and header.strip() else None,
                    human_only=human_only, context=context.strip() if context else None)


def naming(words: str, questions: list[tuple[str, Question]]) -> list[tuple[str, str]]:
    """Which of `questions` ((comment id, question) pairs) `/answer <question> <answer>` names
    at the start of `words`: by its comment id, or by its header, quoted or not, in any case,
    followed by a space, a colon or nothing; the longest header that fits ("Colour scheme"
    over "Colour"). Returns (id, the words after the name) for each (several only when two
    share a header); none when the words name no question."""
    text = words.strip()
    first = text.split(maxsplit=1)
    for qid, _ in questions:
        if first and first[0].strip("`") == qid:
            return [(qid, first[1].strip() if len(first) > 1 else "")]
    found: list[tuple[int, str, str]] = []
    for qid, q in questions:
        for name in (f'"{q.header}"', q.header) if q.header else ():
            rest = text[len(name):]
            if text[:len(name)].casefold() == name.casefold() and rest[:1] in ("", " ", "\t", ":"):
                found.append((len(q.header or ""), qid, rest.lstrip(" \t:").strip()))
                break
    longest = max((n for n, _, _ in found), default=0)
    return [(qid, rest) for n, qid, rest in found if n == longest]
