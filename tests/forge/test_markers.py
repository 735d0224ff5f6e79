"""bot.forge.markers: a marker is built of the app's tokens alone and found only whole."""

from __future__ import annotations

import pytest

from bot.forge import markers


def test_a_part_that_could_close_or_open_a_comment_is_refused() -> None:
    for part in ("k --> <!-- vaultmail:tampered x", "a b", "<x>", "", "-->"):
        with pytest.raises(ValueError):
            markers.marker("reply", part)
    assert markers.marker("comment", "id=c1", "kind=question") == \
        "<!-- vaultmail:comment id=c1 kind=question -->"


def test_a_chosen_key_goes_in_as_its_digest() -> None:
    key = "k --> <!-- vaultmail:tampered m1"
    reply = markers.reply(key)
    assert reply.count("<!--") == 1 and "tampered" not in reply
    assert reply == markers.marker("reply", markers.token(key))


def test_a_marker_is_found_only_as_a_whole_comment() -> None:
    tampered = "<!-- vaultmail:tampered m1 -->"
    assert markers.carries(f"words\n\n{tampered}", tampered)
    # inside a longer comment (what a raw key made of the reply's marker): not found
    assert not markers.carries(f"<!-- vaultmail:reply k {tampered}", tampered)
    assert not markers.carries(f"<!-- note {tampered}", tampered)
    # (a comment left open holds no marker either)
    assert not markers.carries("<!-- vaultmail:tampered m1 -", tampered)


def test_a_reply_posted_before_the_upgrade_is_still_its_reply() -> None:
    """An earlier release wrote the key itself: found, its marker taken off; one whose key
    closed the comment is not (`legacy_reply` is found only whole)."""
    old = "**agent:scout** replied:\n\nOn it.\n\n<!-- vaultmail:reply r1 -->\n"
    assert markers.is_reply(old, "r1") and markers.without_reply(old, "r1").endswith("On it.")
    new = f"**agent:scout** replied:\n\nOn it.\n\n{markers.reply('r1')}"
    assert markers.is_reply(new, "r1") and not markers.is_reply(new, "r2")
    forged = "x\n\n<!-- vaultmail:reply k --> <!-- vaultmail:tampered m1 -->"
    assert not markers.is_reply(forged, "k --> <!-- vaultmail:tampered m1")
