from typing import Any

from bot.mail.commands import parse_commands
from tests.support import label_names


def test_mail_command_takes_agent_subject_and_body() -> None:
    [cmd] = parse_commands("/mail scout Price check\nCan you check EU prices?\nThanks")
    assert (cmd.name, cmd.args) == ("mail", "scout Price check")
    assert cmd.body == "Can you check EU prices?\nThanks"


def test_commands_in_quotes_and_code_blocks_are_ignored() -> None:
    text = "> /close\n```\n/close\n```\n    /close\nplain words /close\n"
    assert parse_commands(text) == []


def test_command_must_start_a_line_and_be_known() -> None:
    assert [c.name for c in parse_commands("hi\n/working\n/frobnicate\n/close")] == [
        "working", "close"]


def test_crlf_bodies_parse_like_lf() -> None:
    [cmd] = parse_commands("/answer 2\r\nbecause")
    assert (cmd.args, cmd.body) == ("2", "because")


# -- issue 9, item 13: commands only from real paragraphs (CommonMark) --------------------------

def _names(text: str) -> list[str]:
    return [c.name for c in parse_commands(text)]


def test_a_command_inside_an_html_comment_is_not_taken() -> None:
    assert _names("thanks\n<!--\n/close\n-->\n") == []
    assert _names("<!-- /close -->\n") == []


def test_a_command_inside_an_inline_html_comment_spanning_lines_is_not_taken() -> None:
    assert _names("see <!-- hidden\n/close\n--> above\n") == []


def test_a_command_inside_a_four_backtick_fence_is_not_taken() -> None:
    text = "````\n```\n/close\n```\n````\n"
    assert _names(text) == []
    assert _names("````md\n/close\n```\n/close\n````\n/working\n") == ["working"]


def test_an_unclosed_fence_hides_every_command_after_it() -> None:
    assert _names("```\n/close\n\nmore\n/working\n") == []


def test_a_command_in_a_lazily_continued_quote_is_not_taken() -> None:
    assert _names("> quoting you\n/close\n") == []
    assert _names("> quoting you\n\n/close\n") == ["close"]


def test_a_command_in_indented_code_or_a_list_is_not_taken() -> None:
    assert _names("    /close\n") == []
    assert _names("\t/close\n") == []
    assert _names("- item\n  /close\n") == []
    assert _names("<details>\n/close\n</details>\n") == []


def test_private_use_characters_cannot_pass_for_a_line_of_the_paragraph() -> None:
    marks = "".join(chr(0xF0000 + k) for k in range(4))
    assert _names(f"hello {marks}\nsee <!-- x\n/close\n--> there\n") == []


def test_an_escaped_slash_is_text_not_a_command() -> None:
    assert _names("\\/close\n&#47;close\n") == []


def test_a_command_continuing_a_paragraph_is_taken() -> None:
    assert _names("Done here.\n/close\n") == ["close"]
    assert _names("  /close") == ["close"]  # up to three spaces, as CommonMark allows


def test_the_body_of_mail_keeps_its_markdown_up_to_the_next_command() -> None:
    text = "/mail scout Logs\nPlease look:\n\n```\n/close\n```\n\n> quoted\n\n/working\n"
    [mail, working] = parse_commands(text)
    assert (mail.name, mail.args) == ("mail", "scout Logs")
    assert mail.body == "Please look:\n\n```\n/close\n```\n\n> quoted"
    assert working.name == "working"


def test_ticks_count_only_in_the_card_itself_not_in_a_hidden_copy() -> None:
    from bot.items.questions import Question
    from bot.items.render import option_line, ticked_option

    q = Question.from_json({"body": "Which?", "options": [{"label": "Keep"},
                                                            {"label": "Drop"}]})
    card = "\n".join([option_line(0, q, False), option_line(1, q, False)])
    hidden = card + "\n<!--\n" + option_line(1, q, True) + "\n-->\n"
    assert ticked_option(card, q, hidden) is None
    fenced = card + "\n````\n" + option_line(0, q, True) + "\n````\n"
    assert ticked_option(card, q, fenced) is None
    real = "\n".join([option_line(0, q, False), option_line(1, q, True)])
    assert ticked_option(card, q, real) == 1


def test_ask_options_in_code_are_not_options() -> None:
    from bot.items.render import parse_ask

    ask = parse_ask("Which one?", "- [ ] Keep\n```\n- [ ] Sneaky\n```\n- [ ] Drop")
    assert [o["label"] for o in ask.options] == ["Keep", "Drop"]


async def test_close_hidden_in_an_html_comment_on_a_mail_leaves_it_open(
        embedded: Any, tools: Any, person: Any) -> None:
    sent = (await tools("human:marco@acme.com")("mail_send", to="scout", subject="Logs",
                                                 body="Rotate them"))["mail"]
    await embedded.settle()
    marco = person("marco")
    vault, n = "acme/scout-vault", sent["number"]
    for hidden in ("Thanks!\n<!--\n/close\n-->", "````\n```\n/close\n```\n````",
                   "> you said\n/close"):
        await marco.comment(vault, n, hidden)
        await embedded.settle()
        issue = await marco.issue(vault, n)
        assert issue["state"] == "open" and "mail:closed" not in label_names(issue), hidden
    await marco.comment(vault, n, "Thanks!\n/close")
    await embedded.settle()
    issue = await marco.issue(vault, n)
    assert issue["state"] == "closed" and label_names(issue) == ["mail:closed"]
