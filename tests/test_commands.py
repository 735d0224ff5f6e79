from bot.mail.commands import parse_commands


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
