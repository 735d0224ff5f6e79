"""Issue 28: an issue's later deliveries handled while its `issues.opened` was missing.

The forge dropped the `issues.opened` of an issue a person opened; the person then closed it,
or commented `/close` on it, and that delivery arrived and was handled before the reconciler
asked for the opened one again. It found no mail and was dropped; the issue was then adopted
as `mail:new` and stayed so: the close was lost (the fault harness's `--close-unseen`).

Now adoption takes the issue's state as the forge has it (a closed issue is a closed mail,
ledgered once), and a delivery about a vault's issue that finds no mail yet is held in the
queue (`parked`) until the issue is adopted, then handled in its order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bot.app.embedded import Embedded
from bot.mail.header import verify_issue
from bot.store import mails, prune
from tests.support import Actor, label_names

SCOUT_VAULT = "acme/scout-vault"


async def _opened_dropped(embedded: Embedded, marco: Actor, title: str) -> int:
    """marco opens an issue whose `issues.opened` delivery the forge drops."""
    embedded.forge.faults.drop_webhooks(count=1)
    issue = await marco.open_issue(SCOUT_VAULT, title, f"{title}: its opened is dropped")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == []
    assert embedded.forge.faults.drop.count == 0, "the opened delivery was dropped"
    return int(issue["number"])


async def _closed_once(embedded: Embedded, marco: Actor, number: int) -> None:
    found = await marco.issue(SCOUT_VAULT, number)
    assert found["state"] == "closed" and label_names(found) == ["mail:closed"], found
    record = await mails.mail_at(embedded.services.store, SCOUT_VAULT, number)
    assert record is not None and record.state == "mail:closed"
    ref = f"{SCOUT_VAULT}#{number}"
    for event in ("mail.sent", "mail.closed"):
        entries = [e for e in await embedded.ledger_events(event) if e.subject == ref
                   and not e.data.get("reopened")]
        assert len(entries) == 1, (event, [e.as_json() for e in entries])
    assert not [e for e in await embedded.ledger_events("mail.sent") if e.data.get("reopened")]


async def test_an_issue_closed_before_its_missed_opened_is_adopted_closed(
        embedded: Embedded, person: Any) -> None:
    marco: Actor = person("marco")
    number = await _opened_dropped(embedded, marco, "Closed unseen")
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"state": "closed"},
                     expect=200)
    await embedded.settle()  # the close arrived first: no mail yet
    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    await _closed_once(embedded, marco, number)
    await embedded.reconciler.run_once()
    await embedded.settle()
    await _closed_once(embedded, marco, number)  # nothing moved again


async def test_a_close_command_before_its_missed_opened_is_applied_after_adoption(
        embedded: Embedded, person: Any) -> None:
    """A `/close` comment leaves the issue open: adoption alone (the issue's state) cannot
    know of it, so the comment waits in the queue for the mail."""
    marco: Actor = person("marco")
    number = await _opened_dropped(embedded, marco, "Commanded unseen")
    await marco.comment(SCOUT_VAULT, number, "Not needed after all\n/close")
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, number)
    assert found["state"] == "open" and label_names(found) == []
    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    await _closed_once(embedded, marco, number)


async def test_a_comment_on_an_issue_that_never_becomes_mail_waits_harmlessly(
        embedded: Embedded, person: Any) -> None:
    """An issue whose opened never comes (opened before the app was installed, or lost past
    the forge's redelivery window): its later deliveries are held, not handled, and pruned
    with the finished ones."""
    marco: Actor = person("marco")
    number = await _opened_dropped(embedded, marco, "Never adopted")
    await marco.comment(SCOUT_VAULT, number, "/close")
    await embedded.settle()
    store = embedded.services.store
    row = await store.fetchone("SELECT state FROM queue WHERE event='issue_comment'"
                               " AND lower(issue_key)=?", (f"{SCOUT_VAULT}#{number}",))
    assert row is not None and row["state"] == "parked"
    assert await store.pending_count() == 0
    found = await marco.issue(SCOUT_VAULT, number)
    assert found["state"] == "open" and label_names(found) == []
    assert await mails.mail_at(store, SCOUT_VAULT, number) is None
    await prune.prune(store, now=10 ** 12, keep=0)
    assert await store.fetchone("SELECT 1 FROM queue WHERE state='parked'") is None


GET_ISSUE = "GET /repos/{owner}/{repo}/issues/{issue_number}"
PATCH_ISSUE = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"


async def test_an_opening_handled_at_once_is_adopted_as_delivered(
        embedded: Embedded, person: Any) -> None:
    """An `issues.opened` handled as soon as it came, its issue unchanged since it was made
    and nothing else about it arrived, describes the issue as it is: adoption writes it (one
    PATCH) without reading it first."""
    marco: Actor = person("marco")
    requests = embedded.forge.requests
    reads, writes = requests.count(GET_ISSUE, "installation"), requests.count(PATCH_ISSUE)
    issue = await marco.open_issue(SCOUT_VAULT, "Fresh", "handled as it came")
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, issue["number"])
    assert label_names(found) == ["mail:new"] and "vaultmail:header" in found["body"]
    assert requests.count(GET_ISSUE, "installation") == reads
    assert requests.count(PATCH_ISSUE) == writes + 1


async def test_an_opening_handled_late_takes_the_issue_as_it_is_now(
        embedded: Embedded, person: Any) -> None:
    """An opening redelivered a minute after the issue was made, its issue relabelled since
    (that delivery lost too, so nothing else about it waits): adoption reads the issue first
    and keeps the label the delivery did not show."""
    marco: Actor = person("marco")
    forge = embedded.forge
    forge.clock.offset -= 60.0  # the issue is made a minute before the app hears of it
    forge.faults.drop_webhooks(count=2)
    issue = await marco.open_issue(SCOUT_VAULT, "Late", "its opening comes a minute late")
    number = int(issue["number"])
    await marco.call("POST", f"/repos/{SCOUT_VAULT}/issues/{number}/labels",
                     {"labels": ["urgent"]}, expect=200)
    await embedded.settle()
    assert forge.faults.drop.count == 0, "both deliveries were dropped"
    opened = next(d for d in forge.state.deliveries.values()
                  if d.action == "opened" and d.payload["issue"]["number"] == number)
    assert forge.webhooks.redeliver(opened) is not None
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, number)
    assert sorted(label_names(found)) == ["mail:new", "urgent"], found["labels"]


# -- a change made just before the adoption's write --------------------------------------------
# The person (or a script: "create an issue, then PATCH its body to add its own URL") changes
# the issue in the moment between the app's reading it (or the opening's delivery describing
# it) and the adoption's PATCH, which then writes the issue as it was: the change is undone on
# the forge. Its own delivery comes after, showing the issue as the change left it, before the
# adoption's write (no header, no mail:* label): the app makes a label change again; an edit of
# the title or body is flagged, never signed (nothing in its delivery proves when it was made).


def _dropped(embedded: Embedded, number: int, *, besides: list[Any] = ()) -> list[Any]:
    """The forge's deliveries about issue `number` that it dropped (other than `besides`), in
    the order it sent them."""
    return sorted((d for d in embedded.forge.state.deliveries.values()
                   if d.payload.get("issue", {}).get("number") == number
                   and "dropped" in d.status and d not in besides), key=lambda d: d.id)


async def _raced(embedded: Embedded, marco: Actor, change: Callable[[int], Awaitable[Any]],
                 *, labels: list[str] | None = None, late: bool = False) -> int:
    """The race acted out: marco opens an issue (with `labels`) and changes it (`change`),
    every delivery dropped; the opening's come (redelivered at once, the forge's clock
    fresh: adopted as they describe the issue, from before the change), then, once they are
    handled, the change's. `late`: the issue was made a minute before the opening comes (the
    adoption reads the issue first, and so sees the change)."""
    forge = embedded.forge
    if late:
        forge.clock.offset -= 60.0
    await marco.call("POST", f"/repos/{SCOUT_VAULT}/labels", {"name": "urgent"}, expect=201)
    await embedded.settle()  # (its own delivery, `label.created`, is not the one dropped)
    forge.faults.drop_webhooks(count=1 + len(labels or []))
    issue = await marco.open_issue(SCOUT_VAULT, "Raced", "as opened",
                                   **({"labels": labels} if labels else {}))
    number = int(issue["number"])
    await embedded.settle()
    opening = _dropped(embedded, number)
    forge.faults.drop_webhooks(count=1)
    await change(number)
    await embedded.settle()
    assert forge.faults.drop.count == 0, "every delivery was dropped"
    assert "vaultmail:header" not in str((await marco.issue(SCOUT_VAULT, number))["body"])
    changed = _dropped(embedded, number, besides=opening)
    assert len(opening) == 1 + len(labels or []) and len(changed) == 1
    for delivery in opening:  # each alone: nothing else about the issue waits
        assert forge.webhooks.redeliver(delivery) is not None
        await embedded.settle()
    assert "vaultmail:header" in (await marco.issue(SCOUT_VAULT, number))["body"]
    assert forge.webhooks.redeliver(changed[0]) is not None
    await embedded.settle()
    return number


async def _valid_once(embedded: Embedded, marco: Actor, number: int) -> tuple[Any, Any]:
    """The mail at `number` is as signed, on the forge and in the index, never flagged, sent
    once; (its issue, its index row)."""
    found = await marco.issue(SCOUT_VAULT, number)
    record = await mails.mail_at(embedded.services.store, SCOUT_VAULT, number)
    assert record is not None and not record.tampered
    verdict = verify_issue(found, SCOUT_VAULT, embedded.services.keyring,
                           app_login=embedded.services.bot_login,
                           expected_mail_id=record.mail_id)
    assert verdict.valid, verdict.reason
    assert not await embedded.ledger_events("mail.tampered")
    ref = f"{SCOUT_VAULT}#{number}"
    assert len([e for e in await embedded.ledger_events("mail.sent") if e.subject == ref]) == 1
    assert not [c for c in await marco.comments(SCOUT_VAULT, number)
                if "changed after it was sent" in c["body"]]
    return found, record


async def _signed_as_adopted(embedded: Embedded, marco: Actor, number: int,
                             body: str) -> Any:
    """The mail at `number` holds `body` as adopted, in the index and under the header the
    index signed on the forge; its index row."""
    found = await marco.issue(SCOUT_VAULT, number)
    record = await mails.mail_at(embedded.services.store, SCOUT_VAULT, number)
    assert record is not None and record.body == body, record
    assert f'"body_sha256":"{record.body_sha256}"' in found["body"], found["body"]
    assert found["body"].rstrip().endswith(body), found["body"]
    return record


async def _kept(embedded: Embedded, marco: Actor, number: int) -> list[str]:
    """The app's comments on `number` that keep an edit the adoption's write wrote over."""
    return [c["body"] for c in await marco.comments(SCOUT_VAULT, number)
            if c["user"]["login"] == embedded.services.bot_login
            and "the signing wrote over the edit" in c["body"]]


async def test_an_edit_made_just_before_the_adoptions_write_is_flagged_not_signed(
        embedded: Embedded, person: Any) -> None:
    """marco's script opens an issue and at once PATCHes its title and body; the adoption
    wrote the issue as opened over them. The edit's delivery cannot show that it was marco's
    newest (deliveries come in any order): nothing is signed that the adoption did not read
    (an edit adopted again let a sender rewrite a sent mail, or sign a collaborator's words,
    below), and the mail is flagged. Nor is the edit lost: the forge dates it no later than
    the adoption's write, so what it said is quoted as marco's in a comment, unsigned."""
    marco: Actor = person("marco")

    async def edit(number: int) -> None:
        await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}",
                         {"title": "Raced, retitled", "body": f"see #{number}"}, expect=200)

    number = await _raced(embedded, marco, edit)
    record = await _signed_as_adopted(embedded, marco, number, "as opened")
    assert record.subject == "Raced" and record.tampered
    [kept] = await _kept(embedded, marco, number)
    assert "human:marco@acme.com edited this issue (title and body)" in kept, kept
    assert "Title: “Raced, retitled”" in kept and f"\n> see #{number}\n" in kept, kept


async def test_an_edit_the_fresh_adoption_wrote_over_is_kept_in_view_unsigned(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco opens "Pay invoice 42: 100 EUR" and at once adds a correction. The opening is
    handled within seconds (adopted as its delivery describes the issue, no read-back) while
    the edit's delivery is lost: the adoption signs and writes the opening's words over the
    correction. When the reconciler brings the edit's delivery, the correction is back in view
    on the forge, quoted as marco's and unsigned, and scout's inbox and mail_get say the mail
    holds an edit its signature does not cover; nothing is signed that marco did not send."""
    marco: Actor = person("marco")
    forge = embedded.forge
    forge.faults.drop_webhooks(count=2)  # the opening's and the edit's
    issue = await marco.open_issue(SCOUT_VAULT, "Pay invoice", "Pay invoice 42: 100 EUR")
    number = int(issue["number"])
    correction = "Pay invoice 42: 100 EUR. CORRECTION: do NOT pay @sara, it is a fraud"
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"body": correction},
                     expect=200)
    await embedded.settle()
    opened, _ = _dropped(embedded, number)
    assert forge.webhooks.redeliver(opened) is not None  # at once: adopted as delivered
    await embedded.settle()
    assert "fraud" not in (await marco.issue(SCOUT_VAULT, number))["body"]  # written over
    assert await embedded.reconciler.run_once() == 1  # the edit's delivery, come again
    await embedded.settle()
    record = await _signed_as_adopted(embedded, marco, number, "Pay invoice 42: 100 EUR")
    assert record.tampered
    found = await marco.issue(SCOUT_VAULT, number)
    assert verify_issue(found, SCOUT_VAULT, embedded.services.keyring,
                        app_login=embedded.services.bot_login,
                        expected_mail_id=record.mail_id).valid
    kept = [c for c in await marco.comments(SCOUT_VAULT, number) if "CORRECTION" in c["body"]]
    assert len(kept) == 1, kept
    note = kept[0]["body"]
    assert kept[0]["user"]["login"] == embedded.services.bot_login
    assert "> Pay invoice 42: 100 EUR. CORRECTION: do NOT pay @\u2060sara" in note, note
    assert "human:marco" in note and "not signed" in note and "send" in note
    scout = tools("agent:scout")
    inbox = (await scout("mail_list"))["inbox"]["mail"]
    [waiting] = [m for m in inbox if m["ref"] == record.ref]
    assert waiting["tampered"] is True
    got = await scout("mail_get", mail=record.ref)
    assert got["mail"]["tampered"] is True and got["verified"] is True
    assert any("CORRECTION" in c["body"] for c in got["comments"])
    await embedded.reconciler.run_once()
    await embedded.settle()
    again = [c for c in await marco.comments(SCOUT_VAULT, number) if "CORRECTION" in c["body"]]
    assert len(again) == 1, "kept once"


async def test_a_sender_cannot_rewrite_a_sent_mail_by_losing_a_delivery(
        embedded: Embedded, person: Any) -> None:
    """Long after adoption marco takes the header off (that delivery lost), writes other
    words, and puts the signed body back: the second edit's delivery shows a body before it
    without a header, as an edit from before the adoption would. It is not signed."""
    marco: Actor = person("marco")
    forge = embedded.forge
    issue = await marco.open_issue(SCOUT_VAULT, "Order", "pay 100 EUR to acct 1")
    number = int(issue["number"])
    await embedded.settle()
    signed = (await marco.issue(SCOUT_VAULT, number))["body"]
    assert "vaultmail:header" in signed
    forge.clock.advance(2)  # the forge dates the edits after the adoption's write
    forge.faults.drop_webhooks(count=2)
    for words in ("x", "pay 9999 EUR to acct 666"):
        await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"body": words},
                         expect=200)
    await embedded.settle()
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"body": signed},
                     expect=200)
    await embedded.settle()
    _, rewrite = _dropped(embedded, number)
    assert forge.webhooks.redeliver(rewrite) is not None
    await embedded.settle()
    record = await _signed_as_adopted(embedded, marco, number, "pay 100 EUR to acct 1")
    assert record.tampered
    assert not await _kept(embedded, marco, number), "no edit the adoption wrote over"


async def test_a_title_edit_signs_no_collaborators_words(
        embedded: Embedded, person: Any) -> None:
    """sara replaces marco's adopted words, marco fixes the title, sara puts the signed body
    back; sara's deliveries are lost. marco's title-only edit shows sara's words as the body:
    they are not signed as marco's mail."""
    marco: Actor = person("marco")
    sara: Actor = person("sara")
    forge = embedded.forge
    issue = await marco.open_issue(SCOUT_VAULT, "Order", "pay 100 EUR to acct 1")
    number = int(issue["number"])
    await embedded.settle()
    signed = (await marco.issue(SCOUT_VAULT, number))["body"]
    forge.clock.advance(2)  # the forge dates the edits after the adoption's write
    forge.faults.drop_webhooks(count=3)
    await sara.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}",
                    {"body": "sara: pay 9999 EUR to acct 666"}, expect=200)
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"title": "Order!"},
                     expect=200)
    await sara.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"body": signed},
                    expect=200)
    await embedded.settle()
    _, retitle, _ = _dropped(embedded, number)
    assert retitle.payload["sender"]["login"] == "marco"
    assert forge.webhooks.redeliver(retitle) is not None
    await embedded.settle()
    record = await _signed_as_adopted(embedded, marco, number, "pay 100 EUR to acct 1")
    assert record.subject == "Order" and record.tampered
    assert not await _kept(embedded, marco, number), "no edit the adoption wrote over"


async def test_edits_before_adoption_delivered_out_of_order_roll_nothing_back(
        embedded: Embedded, person: Any) -> None:
    """marco edits his new issue to B, then C, before the adoption's write; C's delivery
    comes before B's. Neither is signed (B's, taken last, signed words marco had replaced);
    each is kept in view, unsigned, dated by the forge."""
    marco: Actor = person("marco")
    forge = embedded.forge
    forge.faults.drop_webhooks(count=1)
    issue = await marco.open_issue(SCOUT_VAULT, "Raced", "as opened")
    number = int(issue["number"])
    await embedded.settle()
    opening = _dropped(embedded, number)
    forge.faults.drop_webhooks(count=2)
    for words in ("words B", "words C"):
        await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"body": words},
                         expect=200)
    await embedded.settle()
    b, c = _dropped(embedded, number, besides=opening)
    for delivery in (opening[0], c, b):
        assert forge.webhooks.redeliver(delivery) is not None
        await embedded.settle()
    record = await _signed_as_adopted(embedded, marco, number, "as opened")
    assert record.tampered
    kept = await _kept(embedded, marco, number)
    assert ["> words C" in k for k in kept] == [True, False], kept
    assert "> words B" in kept[1], kept


async def test_an_edit_the_adoption_saw_is_not_taken_for_tampering(
        embedded: Embedded, person: Any) -> None:
    """The opening came late, so the adoption read the issue, edit and all: the edit's
    delivery, showing a body without a header before it, is neither tampering nor anything to
    adopt again."""
    marco: Actor = person("marco")

    async def edit(number: int) -> None:
        await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}",
                         {"body": "the words it was adopted with"}, expect=200)

    number = await _raced(embedded, marco, edit, late=True)
    found, record = await _valid_once(embedded, marco, number)
    assert record.body == "the words it was adopted with"


async def test_an_edit_before_adoption_by_someone_else_is_not_signed_as_the_senders(
        embedded: Embedded, person: Any) -> None:
    """An editor changed marco's issue before the adoption's write: the words are not marco's,
    so they are not signed as his mail; the mail stays as adopted and the edit is flagged, and
    kept in view as sara's, unsigned."""
    marco: Actor = person("marco")
    sara: Actor = person("sara")

    async def edit(number: int) -> None:
        await sara.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}",
                        {"body": "sara's words"}, expect=200)

    number = await _raced(embedded, marco, edit)
    record = await mails.mail_at(embedded.services.store, SCOUT_VAULT, number)
    assert record is not None and record.body == "as opened" and record.tampered
    assert "sara's words" not in (await marco.issue(SCOUT_VAULT, number))["body"]
    [kept] = await _kept(embedded, marco, number)
    assert "human:sara@acme.com edited this issue (body)" in kept, kept
    assert "\n> sara's words\n" in kept, kept


async def test_a_label_added_just_before_the_adoptions_write_is_added_again(
        embedded: Embedded, person: Any) -> None:
    marco: Actor = person("marco")

    async def label(number: int) -> None:
        await marco.call("POST", f"/repos/{SCOUT_VAULT}/issues/{number}/labels",
                         {"labels": ["urgent"]}, expect=200)

    number = await _raced(embedded, marco, label)
    found, record = await _valid_once(embedded, marco, number)
    assert sorted(label_names(found)) == ["mail:new", "urgent"], found["labels"]
    assert record.state == "mail:new" and record.other_labels == ("urgent",)


async def test_a_label_removed_just_before_the_adoptions_write_is_removed_again(
        embedded: Embedded, person: Any) -> None:
    marco: Actor = person("marco")

    async def unlabel(number: int) -> None:
        await marco.call("DELETE", f"/repos/{SCOUT_VAULT}/issues/{number}/labels/urgent",
                         expect=200)

    number = await _raced(embedded, marco, unlabel, labels=["urgent"])
    found, record = await _valid_once(embedded, marco, number)
    assert label_names(found) == ["mail:new"], found["labels"]
    assert record.state == "mail:new" and record.other_labels == ()


async def test_a_label_change_from_before_adoption_does_not_undo_a_later_one(
        embedded: Embedded, person: Any) -> None:
    """The opening's `labeled` (the issue as made: no header, no mail:* label) comes after
    marco took the label off the adopted mail: the adoption's write did not undo it, marco
    did, later, so it is not made again."""
    marco: Actor = person("marco")
    forge = embedded.forge
    await marco.call("POST", f"/repos/{SCOUT_VAULT}/labels", {"name": "urgent"}, expect=201)
    await embedded.settle()
    forge.faults.drop_webhooks(count=2)
    issue = await marco.open_issue(SCOUT_VAULT, "Labelled", "made with a label",
                                   labels=["urgent"])
    number = int(issue["number"])
    await embedded.settle()
    opened, labeled = _dropped(embedded, number)
    assert forge.webhooks.redeliver(opened) is not None
    await embedded.settle()
    await marco.call("DELETE", f"/repos/{SCOUT_VAULT}/issues/{number}/labels/urgent",
                     expect=200)
    await embedded.settle()
    assert forge.webhooks.redeliver(labeled) is not None
    await embedded.settle()
    found, _ = await _valid_once(embedded, marco, number)
    assert label_names(found) == ["mail:new"], found["labels"]
