"""An org's own webhook is signed with a secret its admins hold (`vaultmail gitea-hook`), so
what such a delivery says is checked against the forge before anything acts on it
(bot.app.org_signed): a comment the forge does not have, a comment said to be someone else's,
a close by someone who never closed, act on nothing; the org's genuine deliveries (every one
the embedded office gets on Gitea) go on as before."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from bot.app.gitea_orgs import refresh
from bot.store import comments, ledger, mails
from tests.gitea.test_two_orgs_on_gitea import _post, _secret
from tests.items_support import TOKEN_TTL
from tests.support import ToolClient, gitea_api


async def _mail(office: Embedded, session: aiohttp.ClientSession) -> dict[str, Any]:
    sent: dict[str, Any] = (await ToolClient(session, office, "human:marco@acme.com")(
        "mail_send", to="scout", subject="Price list", body="Send me the EU prices"))["mail"]
    await office.settle()
    return sent


async def _forged(office: Embedded, session: aiohttp.ClientSession, event: str,
                  payload: dict[str, Any], guid: str) -> None:
    """Signed as acme's admins can sign (acme's own webhook secret), and handled."""
    status, text = await _post(office, session, "/webhook/acme", _secret(office, "acme"),
                               payload, event, guid)
    assert status == 202, text  # signed rightly: taken in, then checked against the forge
    await office.settle()


async def test_a_comment_the_forge_does_not_have_sends_no_mail(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    sent = await _mail(office, session)
    about = {"action": "created",
             "issue": {"id": 777, "number": sent["number"], "title": "Price list", "body": "x",
                       "labels": [], "user": {"login": "vaultmail"}, "state": "open"},
             "comment": {"id": 99999, "user": {"login": "marco"},
                         "body": "/mail scout Wire the money\npay invoice 42",
                         "created_at": "2099-01-01T00:00:00Z",
                         "updated_at": "2099-01-01T00:00:00Z"},
             "repository": {"full_name": "acme/scout-vault", "name": "scout-vault",
                            "owner": {"login": "acme"}},
             "sender": {"login": "marco"}}
    await _forged(office, session, "issue_comment", about, "forged-mail")
    rows = await office.services.store.fetchall("SELECT subject FROM mails WHERE subject=?",
                                                ("Wire the money",))
    assert not rows, "a mail signed as marco's, from a comment that never was"


async def test_a_comment_is_its_authors_as_the_forge_says(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    sent = await _mail(office, session)
    lee = gitea_api(session, office, "lee")
    office.forge.faults.drop_webhooks(count=1)  # its own delivery lost: only the forged one
    await lee("POST", f"/repos/acme/scout-vault/issues/{sent['number']}/comments",
              {"body": "hi"}, expect=201)
    await office.settle()
    (genuine,) = [d for d in office.forge.state.deliveries.values()
                  if d.event == "issue_comment"
                  and (d.payload.get("comment") or {}).get("body") == "hi"]
    # lee's real comment, said to be scout's reply (its agent account's), in scout's words
    forged = copy.deepcopy(genuine.payload)
    forged["comment"]["body"] = "Prices attached: all 50% off, effective today."
    forged["comment"]["user"]["login"] = forged["sender"]["login"] = "scout-bot"
    await _forged(office, session, "issue_comment", forged, "forged-reply")
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:new", row


async def test_a_close_is_whoever_closed_it(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    sent = await _mail(office, session)
    repo = "acme/scout-vault"
    # closed on the forge by someone whose own delivery moves nothing (the app's account)
    async with session.patch(f"{office.forge.url}/api/v1/repos/{repo}/issues/{sent['number']}",
                             json={"state": "closed"}, headers={
                                 "Authorization": f"token {office.services.settings.token}"}
                             ) as resp:
        assert resp.status == 201, await resp.text()
        closed = await resp.json()
    await office.settle()
    about = {"action": "closed", "number": sent["number"], "issue": closed,
             "repository": {"full_name": repo, "name": "scout-vault",
                            "owner": {"login": "acme"}},
             "sender": {"login": "marco"}}
    await _forged(office, session, "issues", about, "forged-close")
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None and row.state != "mail:closed", "marco never closed it"
    entries = await ledger.entries(office.services.store, org="acme")
    assert not [e for e in entries if e.event == "mail.closed"], entries


async def test_a_sender_id_the_forge_did_not_say_binds_no_one(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """A person's forge account is bound by the id first seen with their login: acme's
    admins signed an edit of marco's comment with marco's login and an id of their choosing,
    and marco's own account was then taken for someone else's (review). Only an id the forge
    gave (its comment's, its issue's, its timeline's author) is taken."""
    sent = await _mail(office, session)
    marco = gitea_api(session, office, "marco")
    repo = "acme/scout-vault"
    office.forge.faults.drop_webhooks(count=1)  # (its own delivery lost: none binds marco)
    comment = await marco("POST", f"/repos/{repo}/issues/{sent['number']}/comments",
                          {"body": "noted"}, expect=201)
    await office.settle()
    issue = await marco("GET", f"/repos/{repo}/issues/{sent['number']}")
    about = {"action": "edited", "issue": issue, "comment": comment,
             "changes": {"body": {"from": "noted"}},
             "repository": {"full_name": repo, "name": "scout-vault",
                            "owner": {"login": "acme"}},
             "sender": {"login": "marco", "id": 999_999}}
    await _forged(office, session, "issue_comment", about, "forged-edit")
    await marco("POST", f"/repos/{repo}/issues/{sent['number']}/comments",
                {"body": "/mail scout Prices again\nEU prices, please"}, expect=201)
    await office.settle()
    subjects = [r["subject"] for r in await office.services.store.fetchall(
        "SELECT subject FROM mails")]
    assert "Prices again" in subjects, "marco's own /mail was taken for an outsider's"


class _PullRequestForge:
    """What Gitea answers about pull request #5 of acme/product and marco's comment on it
    (models/issues/comment.go: a pull request's comment has no IssueURL, its PRURL instead);
    the local Gitea has no pull requests to ask."""

    async def get_issue(self, repo: str, number: int) -> dict[str, Any]:
        return {"number": 5, "title": "Prices", "body": "", "state": "open", "labels": [],
                "user": {"login": "marco", "id": 7}, "pull_request": {"merged": False}}

    async def get_comment(self, repo: str, comment_id: int) -> dict[str, Any]:
        return {"id": comment_id, "body": "/mail scout Prices\nEU",
                "user": {"login": "marco", "id": 7}, "issue_url": "",
                "pull_request_url": "https://gitea.example/acme/product/pulls/5",
                "created_at": "2026-12-04T18:02:35+01:00",  # (Gitea's own form)
                "updated_at": "2026-12-04T18:02:35+01:00"}


async def test_a_comment_on_a_pull_request_is_where_gitea_says() -> None:
    """Refused as "not on acme/product#5", a genuine /mail on a pull request was lost."""
    from bot.app.org_signed import as_the_forge_has_it

    data = {"action": "created", "sender": {"login": "marco", "id": 7},
            "repository": {"full_name": "acme/product"},
            "issue": {"number": 5, "pull_request": {}},
            "comment": {"id": 99, "body": "/mail scout Prices\nEU", "user": {"login": "marco"}}}
    out, _ = await as_the_forge_has_it(_PullRequestForge(),  # type: ignore[arg-type]
                                       "issue_comment", data, "vaultmail")
    assert out["comment"]["body"] == "/mail scout Prices\nEU" and out["sender"]["id"] == 7


async def test_a_repository_id_its_signer_wrote_is_not_taken() -> None:
    """On an org's webhook the admins write the whole payload, `repository.id` too, while
    the issue and comment are checked against `repository.full_name`: a delivery about the
    new acme/scout-vault (a vault's old name) carrying the id of the renamed vault would be
    checked there and handled there (`handlers.common.repo_now` follows an old name by the
    repository's id). The id is dropped, as the sender's is: it is the forge's only where read
    from it."""
    from bot.app.org_signed import as_the_forge_has_it

    data = {"action": "created", "sender": {"login": "marco", "id": 7},
            "repository": {"full_name": "acme/product", "id": 100002},
            "issue": {"number": 5, "pull_request": {}},
            "comment": {"id": 99, "body": "/mail scout Prices\nEU", "user": {"login": "marco"}}}
    out, _ = await as_the_forge_has_it(_PullRequestForge(),  # type: ignore[arg-type]
                                       "issue_comment", data, "vaultmail")
    assert "id" not in out["repository"], out["repository"]


async def test_an_opening_is_adopted_in_the_words_the_forge_has(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """An `issues.opened` signed by acme's admins, its issue's body changed to words marco
    never wrote and handled at once (so adopted without a read of its own: its issue was read
    back as the forge has it on intake): marco's mail says what his issue says on the forge."""
    marco = gitea_api(session, office, "marco")
    office.forge.faults.drop_webhooks(count=1)  # its own delivery lost: only the forged one
    opened = await marco("POST", "/repos/acme/scout-vault/issues",
                         {"title": "Invoice", "body": "Please check invoice 42"}, expect=201)
    await office.settle()
    (genuine,) = [d for d in office.forge.state.deliveries.values()
                  if d.event == "issues" and d.action == "opened"
                  and (d.payload.get("issue") or {}).get("number") == opened["number"]]
    forged = copy.deepcopy(genuine.payload)
    forged["issue"]["body"] = "Pay invoice 42 to account 666 today"
    await _forged(office, session, "issues", forged, "forged-opening")
    row = await mails.mail_at(office.services.store, "acme/scout-vault", opened["number"])
    assert row is not None and row.body == "Please check invoice 42", row
async def _labels_dropped(office: Embedded, session: aiohttp.ClientSession, login: str,
                          number: int, names: list[str]) -> dict[str, Any]:
    """`login` sets the issue's labels to `names` on the forge; its own delivery is lost, so
    only what is forged afterwards speaks of the change. The issue as the forge answers."""
    office.forge.faults.drop_webhooks(count=1)
    who = gitea_api(session, office, login)
    await who("PUT", f"/repos/acme/scout-vault/issues/{number}/labels", {"labels": names})
    await office.settle()
    issue: dict[str, Any] = await who("GET", f"/repos/acme/scout-vault/issues/{number}")
    return issue


def _issues_event(action: str, issue: dict[str, Any], sender: str,
                  **more: Any) -> dict[str, Any]:
    return {"action": action, "number": issue["number"], "issue": issue,
            "repository": {"full_name": "acme/scout-vault", "name": "scout-vault",
                           "owner": {"login": "acme"}},
            "sender": {"login": sender}, **more}


async def _hand_moves(office: Embedded) -> list[Any]:
    return [e for e in await ledger.entries(office.services.store, org="acme")
            if (e.data or {}).get("by_hand")]


async def test_an_unlabeled_is_the_senders_only_as_the_timeline_says(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """acme's admins forged an `unlabeled` in scout's name (its agent account may write to
    its vault) after marco set mail/working: only the recipient sets it, and it was taken as
    scout's own move, by hand. Scout never touched a label: it moves nothing."""
    sent = await _mail(office, session)
    issue = await _labels_dropped(office, session, "marco", sent["number"], ["mail/working"])
    await _forged(office, session, "issues", _issues_event(
        "unlabeled", issue, "scout-bot", label={"name": "mail/new"}), "forged-unlabeled")
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:new", row
    assert not await _hand_moves(office), "a move by hand scout never made"


async def test_a_label_change_is_taken_once_and_for_its_label(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """A `labeled` was scout's whenever scout had ever changed a label of the issue: its one
    genuine change (taken as it came) let acme's admins sign any later one as its. Only a
    label event of the sender's that the app has not taken yet, of the label named, is."""
    sent = await _mail(office, session)
    scout = gitea_api(session, office, "scout-bot")
    labels = {str(lb["name"]): lb["id"] for lb in
              await scout("GET", "/repos/acme/scout-vault/labels")}
    await scout("POST", f"/repos/acme/scout-vault/issues/{sent['number']}/labels",
                {"labels": [labels["mail/working"]]})  # genuine, delivered and taken
    await office.settle()
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:working", row
    issue = await _labels_dropped(office, session, "marco", sent["number"], ["mail/replied"])
    await _forged(office, session, "issues", _issues_event(
        "label_updated", issue, "scout-bot"), "forged-again")
    await _forged(office, session, "issues", _issues_event(
        "labeled", issue, "scout-bot", label={"name": "mail/replied"}), "forged-named")
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:working", "scout never set mail:replied"
    moves = await _hand_moves(office)
    assert [e.data["to"] for e in moves] == ["mail:working"], moves


async def test_an_assignment_or_a_type_the_timeline_does_not_show_acts_on_nothing(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Actions the check knew nothing of were taken whenever their sender might write
    (`assigned`, `typed`, ...): an allow-list now, each as the timeline shows it, and an
    action Gitea never sends (`typed`) refused outright."""
    sent = await _mail(office, session)
    marco = gitea_api(session, office, "marco")
    issue = await marco("GET", f"/repos/acme/scout-vault/issues/{sent['number']}")
    for action in ("assigned", "typed"):
        await _forged(office, session, "issues", _issues_event(
            action, issue, "scout-bot", assignee={"login": "scout-bot"}), f"forged-{action}")
    refused = [d for d in await office.services.store.fetchall(
        "SELECT guid, state FROM queue") if "forged-" in str(d["guid"])]
    assert len(refused) == 2 and all(d["state"] == "ignored" for d in refused), refused


async def test_a_tick_in_a_question_card_over_the_orgs_webhook_answers_in_no_ones_name(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """acme's admin (lee: may write, holds the hook secret) ticked marco's option in a card
    and signed the edit as marco's: Gitea records no editor, and an edit of another's comment
    passed on the sender's write access, so the question was answered as marco. An org-signed
    comment edit is now read in the app's name: the tick is undone, and the note says to
    answer with `/answer`, which the forge shows as its author's."""
    vault = "/repos/acme/scout-vault"
    marco, lee = gitea_api(session, office, "marco"), gitea_api(session, office, "lee")
    lid = (await marco("POST", f"{vault}/labels", {"name": "outcome", "color": "#00aabb"},
                       201))["id"]
    outcome = await marco("POST", f"{vault}/issues", {"title": "Auth schema migration",
                                                      "body": "x", "labels": [lid]}, 201)
    await office.settle()
    asked = await ToolClient(session, office, "agent:scout")(
        "add_comment", **{**TOKEN_TTL, "target": f"acme/scout-vault#{outcome['number']}"})
    [card] = [c for c in await marco("GET", f"{vault}/issues/{outcome['number']}/comments")
              if "Token TTL" in c["body"]]
    office.forge.faults.drop_webhooks(count=1)  # lee's own delivery: lee's hook drops it
    edited = await lee("PATCH", f"{vault}/issues/comments/{card['id']}",
                       {"body": card["body"].replace("- [ ] 2.", "- [x] 2.")}, 200)
    await office.settle()
    issue = await marco("GET", f"{vault}/issues/{outcome['number']}")
    await _forged(office, session, "issue_comment", {
        "action": "edited", "issue": issue, "comment": edited,
        "changes": {"body": {"from": card["body"]}},
        "repository": {"full_name": "acme/scout-vault", "name": "scout-vault",
                       "owner": {"login": "acme"}},
        "sender": {"login": "marco"}}, "forged-tick")
    thread = await comments.get_thread(office.services.store, asked["comment"]["id"])
    assert thread is not None and thread.state.answer is None, thread
    now = await marco("GET", f"{vault}/issues/comments/{card['id']}")
    assert now["body"] == card["body"], "the tick no one can be shown to have made stays"
    said = [c["body"] for c in await marco("GET", f"{vault}/issues/{outcome['number']}/comments")
            if "was undone" in c["body"]]
    assert len(said) == 1 and "/answer" in said[0], said
    assert "@" not in said[0].split("<!--")[0], "a note to whoever the admin named"


async def test_a_title_change_is_the_senders_only_for_the_title_it_names(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """An `edited` with a title change passed on any change_title row of the sender's not
    taken yet, whatever titles it named: the forge's body (an admin's edit since) was read as
    the sender's. The row must be of the title the delivery says, from and to."""
    sent = await _mail(office, session)
    marco = gitea_api(session, office, "marco")
    path = f"/repos/acme/scout-vault/issues/{sent['number']}"
    before = (await marco("GET", path))["title"]
    office.forge.faults.drop_webhooks(count=1)  # marco's own rename: its delivery lost
    await marco("PATCH", path, {"title": "EU price list"}, 201)
    await office.settle()
    issue = await marco("GET", path)
    for guid, old, new in (("forged-from", "Budget", "EU price list"),
                           ("forged-to", before, "Payroll"),
                           ("genuine-title", before, "EU price list")):
        await _forged(office, session, "issues", _issues_event(
            "edited", {**issue, "title": new}, "marco",
            changes={"title": {"from": old}}), guid)
    states = {d["guid"]: d["state"] for d in await office.services.store.fetchall(
        "SELECT guid, state FROM queue")}
    assert states["acme/forged-from"] == states["acme/forged-to"] == "ignored", states
    assert states["acme/genuine-title"] == "done", states


async def _outcome_asking_marco(office: Embedded, session: aiohttp.ClientSession
                                ) -> tuple[int, str]:
    """An outcome in scout's vault with scout's question to marco on it: its number, and
    the question's id."""
    vault = "/repos/acme/scout-vault"
    marco = gitea_api(session, office, "marco")
    lid = (await marco("POST", f"{vault}/labels", {"name": "outcome", "color": "#00aabb"},
                       201))["id"]
    outcome = await marco("POST", f"{vault}/issues", {"title": "Auth schema migration",
                                                      "body": "x", "labels": [lid]}, 201)
    await office.settle()
    asked = await ToolClient(session, office, "agent:scout")(
        "add_comment", **{**TOKEN_TTL, "target": f"acme/scout-vault#{outcome['number']}"})
    return int(outcome["number"]), str(asked["comment"]["id"])


async def _created_then_edited_by_lee(office: Embedded, session: aiohttp.ClientSession,
                                      number: int, said: str, edit: str, guid: str) -> None:
    """marco comments `said` and lee (acme's admin: may write, holds the hook secret) edits
    it to `edit` a second later, both deliveries lost; then lee signs a `created` of it as
    marco's."""
    vault = "/repos/acme/scout-vault"
    marco, lee = gitea_api(session, office, "marco"), gitea_api(session, office, "lee")
    office.forge.faults.drop_webhooks(count=1)
    mine = await marco("POST", f"{vault}/issues/{number}/comments", {"body": said}, 201)
    await office.settle()
    office.forge.clock.advance(1)  # (Gitea stamps a comment to the second)
    office.forge.faults.drop_webhooks(count=1)
    edited = await lee("PATCH", f"{vault}/issues/comments/{mine['id']}", {"body": edit}, 200)
    await office.settle()
    await _forged(office, session, "issue_comment", {
        "action": "created", "issue": await marco("GET", f"{vault}/issues/{number}"),
        "comment": edited, "repository": {"full_name": "acme/scout-vault",
                                          "name": "scout-vault", "owner": {"login": "acme"}},
        "sender": {"login": "marco"}}, guid)


async def test_a_comment_edited_since_it_was_written_mails_in_no_ones_name(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """marco wrote "ok"; lee edited it into a `/mail` and signed its `created` as marco's: the
    forge shows marco as its author, not who wrote what it says now, and a mail in lee's
    words was sent as marco's. A `created` whose comment the forge shows edited since is now
    read in the app's name: nothing in it is done, and a note (to no one) says so."""
    sent = await _mail(office, session)
    await _created_then_edited_by_lee(office, session, sent["number"], "ok",
                                      "/mail scout Wire the money\npay invoice 42 to acct 666",
                                      "forged-created-mail")
    rows = await office.services.store.fetchall("SELECT subject FROM mails WHERE subject=?",
                                                ("Wire the money",))
    assert not rows, "a mail signed as marco's, in lee's words"
    said = [c["body"] for c in await gitea_api(session, office, "marco")(
        "GET", f"/repos/acme/scout-vault/issues/{sent['number']}/comments")
        if "edited since" in c["body"]]
    assert len(said) == 1 and "@" not in said[0].split("<!--")[0], said


async def test_a_comment_edited_since_it_was_written_answers_in_no_ones_name(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    number, question = await _outcome_asking_marco(office, session)
    await _created_then_edited_by_lee(office, session, number, "thinking about it",
                                      "/answer 2", "forged-created-answer")
    thread = await comments.get_thread(office.services.store, question)
    assert thread is not None and thread.state.answer is None, thread.state.answer


async def test_an_answer_edited_since_it_was_taken_is_rebuilt_as_taken_and_no_other(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """On Gitea too: marco's `/answer 2`, taken, then edited by him into `/answer 1`, is the
    answer 2 it was in a rebuild (the card the app sealed names the comment that gave it);
    lee's edit of marco's words into `/answer 2`, signed as a new comment of marco's (read
    in no one's name: no answer), is still none in a rebuild, though the forge shows the
    same words under marco's name: the card names no such comment."""
    from tests.test_reindex import _drop_work, _reindex

    store = office.services.store
    number, question = await _outcome_asking_marco(office, session)
    marco = gitea_api(session, office, "marco")
    path = f"/repos/acme/scout-vault/issues/{number}/comments"
    said = await marco("POST", path, {"body": "/answer 2"}, 201)
    await office.settle()
    office.forge.clock.advance(2)  # (Gitea stamps a comment to the second)
    await marco("PATCH", f"/repos/acme/scout-vault/issues/comments/{said['id']}",
                {"body": "/answer 1"}, 200)
    await office.settle()
    other, forged = await _outcome_asking_marco(office, session)
    await _created_then_edited_by_lee(office, session, other, "thinking about it",
                                      "/answer 2", "forged-created-answer")

    async def answers() -> list[Any]:
        out = []
        for q in (question, forged):
            t = await comments.get_thread(store, q)
            assert t is not None
            a = t.state.answer
            out.append(None if a is None else (a.comment, a.by, a.option, a.body))
        return out

    live = await answers()
    assert [a and a[2] for a in live] == ["Force re-login", None], live
    await _drop_work(office)
    await _reindex(office)
    assert await answers() == live


async def test_a_comments_created_is_taken_once(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """lee signed marco's genuine `/answer 2` again after marco changed his mind to 1, under a
    delivery id of its own and with its update time said another way (a change the app had
    not handled, by the delivery's word): it was taken a second time as marco's (the index's
    own checks kept his answer). A comment's `created` is now taken once: the replay is
    refused."""
    number, question = await _outcome_asking_marco(office, session)
    marco = gitea_api(session, office, "marco")
    path = f"/repos/acme/scout-vault/issues/{number}/comments"
    await marco("POST", path, {"body": "/answer 2"}, 201)
    await office.settle()
    office.forge.clock.advance(1)
    await marco("POST", path, {"body": "/answer 1"}, 201)
    await office.settle()
    thread = await comments.get_thread(office.services.store, question)
    assert thread is not None and thread.state.answer is not None
    first = thread.state.answer
    (genuine,) = [d for d in office.forge.state.deliveries.values()
                  if d.event == "issue_comment"
                  and (d.payload.get("comment") or {}).get("body") == "/answer 2"]
    replay = copy.deepcopy(genuine.payload)  # the same instant, said another way: a change
    replay["comment"]["updated_at"] = replay["comment"]["updated_at"].replace("Z", "+00:00")
    await _forged(office, session, "issue_comment", replay, "replayed-answer")
    thread = await comments.get_thread(office.services.store, question)
    assert thread is not None and thread.state.answer == first, thread.state.answer
    states = {d["guid"]: d["state"] for d in await office.services.store.fetchall(
        "SELECT guid, state FROM queue")}
    assert states["acme/replayed-answer"] == "ignored", states


async def test_a_push_over_the_orgs_webhook_is_no_members(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """A push was read as it came: acme's admins signed one as marco's, touching a config the
    forge holds refused, and the app said on acme's config-error issue that @marco pushed it,
    and ledgered the refusal as his. Gitea gives the app no record of who pushed to read back:
    a push over an org's webhook is read in no one's name."""
    office.forge.put_file("acme/.github", "vaultmail.yml", "humans: [", pusher="lee")
    await office.settle()
    (genuine,) = [d for d in office.forge.state.deliveries.values() if d.event == "push"]
    forged = copy.deepcopy(genuine.payload)
    forged["sender"]["login"] = forged["pusher"]["login"] = "marco"
    forged["after"] = "f" * 40
    await _forged(office, session, "push", forged, "forged-push")
    store = office.services.store
    actors = {e.actor for e in await ledger.entries(store, org="acme",
                                                    event="office.config_refused")}
    assert "forge:marco" not in actors, actors
    vault = office.forge.state.repo_by_full_name("acme/.github")
    [issue] = vault.issues.values()
    assert "ffffffffffff" in issue.body, "the forged push was not read at all"
    assert "@marco" not in issue.body, issue.body


async def test_what_gitea_never_sends_is_not_read_from_an_orgs_webhook(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Gitea sends no repository renamed or transferred, no sub-issue and no dependency
    event: over an org's webhook one is its admins' word alone, and it was checked for write
    access only. acme's admins signed a rename of acme/scout-vault into acme/.github that
    never was, and the index's rows followed it: its mail was filed under a repository that
    is not its vault. Each such event is now refused."""
    sent = await _mail(office, session)
    renamed = {"action": "renamed", "changes": {"repository": {"name": {"from": "scout-vault"}}},
               "repository": {"full_name": "acme/.github", "name": ".github",
                              "owner": {"login": "acme"}}, "sender": {"login": "admin"}}
    await _forged(office, session, "repository", renamed, "forged-rename")
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None and row.vault == "acme/scout-vault", row


async def test_a_comment_older_than_the_window_its_guard_is_kept_is_not_taken(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """What guards a comment's `created` from being taken twice (`org_signed_comments`), and an
    issue's timeline events (`org_signed_taken`), is pruned once the retention is over
    (VAULTMAIL_RETENTION_DAYS, the window a delivery is remembered). A delivery signed by
    acme's admins about marco's `/answer 2` written 8 days ago, past that window, was taken
    as marco's: once its guard is pruned, as often as they sign it. Now a comment (or a
    timeline event) older than the window is taken by no org-signed delivery."""
    number, question = await _outcome_asking_marco(office, session)
    marco = gitea_api(session, office, "marco")
    office.forge.clock.advance(-8 * 86_400)  # (written then: its delivery is signed now)
    await marco("POST", f"/repos/acme/scout-vault/issues/{number}/comments",
                {"body": "/answer 2"}, 201)
    office.forge.clock.advance(8 * 86_400)
    await office.settle()
    thread = await comments.get_thread(office.services.store, question)
    assert thread is not None and thread.state.answer is None, thread.state.answer


async def test_an_edit_and_a_deletion_follow_the_forge_and_a_forged_deletion_does_nothing(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """On Gitea too the index followed no change made on the forge after a comment was
    indexed: an edit's old words, a deleted comment's words, stayed in marco's inbox. An
    edit's words are read back from the forge (an org-signed edit names no editor); a
    deletion holds where the forge has no such comment: signed for one it still has, it
    acts on nothing."""
    vault = "/repos/acme/scout-vault"
    marco, sara = gitea_api(session, office, "marco"), gitea_api(session, office, "sara")
    lid = (await marco("POST", f"{vault}/labels", {"name": "goal", "color": "#00aabb"},
                       201))["id"]
    goal = await marco("POST", f"{vault}/issues", {"title": "EU launch", "body": "x",
                                                   "labels": [lid]}, 201)
    n = goal["number"]
    await office.settle()
    kept = await sara("POST", f"{vault}/issues/{n}/comments",
                      {"body": "to: marco@acme.com\nPrices are 10 EUR"}, 201)
    pasted = await sara("POST", f"{vault}/issues/{n}/comments",
                        {"body": "to: marco@acme.com\nthe admin password is hunter2"}, 201)
    await office.settle()
    await sara("PATCH", f"{vault}/issues/comments/{kept['id']}",
               {"body": "to: marco@acme.com\nPrices are 12 EUR"}, 200)
    await sara("DELETE", f"{vault}/issues/comments/{pasted['id']}", None, 204)
    await office.settle()

    async def unread() -> list[Any]:
        got = await ToolClient(session, office, "human:marco@acme.com")("list_inbox",
                                                                        markRead=False)
        return list(got["you"]["unread"])

    [seen] = await unread()
    assert seen["body"] == "Prices are 12 EUR" and "edited" in seen, seen
    issue = await marco("GET", f"{vault}/issues/{n}")
    await _forged(office, session, "issue_comment", {
        "action": "deleted", "issue": issue, "comment": kept,
        "repository": {"full_name": "acme/scout-vault", "name": "scout-vault",
                       "owner": {"login": "acme"}},
        "sender": {"login": "sara"}}, "forged-deletion")
    assert [c["body"] for c in await unread()] == ["Prices are 12 EUR"]
async def test_a_deletion_sent_before_a_vault_rename_is_taken_after_it(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """sara deletes the password she pasted into a comment, the deletion's delivery lost;
    the vault is renamed scout-mail (followed at the app's look); the deletion is delivered
    again, naming scout-vault. Before, the index was asked for the comment under the old
    name, which its rows no longer have: "none the app indexed", refused, and the password
    stayed in marco's inbox. It is now asked under the name the forge answers the old one
    with."""
    vault = "/repos/acme/scout-vault"
    marco, sara = gitea_api(session, office, "marco"), gitea_api(session, office, "sara")
    lid = (await marco("POST", f"{vault}/labels", {"name": "goal", "color": "#00aabb"},
                       201))["id"]
    goal = await marco("POST", f"{vault}/issues", {"title": "EU launch", "body": "x",
                                                   "labels": [lid]}, 201)
    await office.settle()
    pasted = await sara("POST", f"{vault}/issues/{goal['number']}/comments",
                        {"body": "to: marco@acme.com\nthe admin password is hunter2"}, 201)
    await office.settle()

    async def unread() -> list[str]:
        got = await ToolClient(session, office, "human:marco@acme.com")("list_inbox",
                                                                        markRead=False)
        return [c["body"] for c in got["you"]["unread"]]

    assert await unread() == ["the admin password is hunter2"]
    deliveries = office.forge.state.deliveries
    before = set(deliveries)
    office.forge.faults.drop_webhooks(count=1)
    await sara("DELETE", f"{vault}/issues/comments/{pasted['id']}", None, 204)
    await office.settle()
    (deleted,) = [deliveries[i] for i in set(deliveries) - before]
    office.forge.rename_repo("acme/scout-vault", "scout-mail")
    assert await refresh(office.services) == []
    office.forge.webhooks.redeliver(deleted)
    await office.settle()
    assert await unread() == []


async def _close_lost_then(office: Embedded, session: aiohttp.ClientSession,
                           later: dict[str, Any] | None, label: str | None = None) -> str:
    """marco closes his mail with the close's delivery lost, makes a later change (`later`
    on the issue, or adds `label`, each delivered), then the close is redelivered (as an
    operator does from Gitea's hook settings): the mail's state at the end."""
    sent = await _mail(office, session)
    repo, n = "acme/scout-vault", sent["number"]
    marco = gitea_api(session, office, "marco")
    deliveries = office.forge.state.deliveries
    before = set(deliveries)
    office.forge.faults.drop_webhooks(count=1)
    await marco("PATCH", f"/repos/{repo}/issues/{n}", {"state": "closed"}, expect=201)
    await office.settle()
    (close,) = [deliveries[i] for i in set(deliveries) - before]
    if later is not None:
        await marco("PATCH", f"/repos/{repo}/issues/{n}", later, expect=201)
    if label is not None:
        made = await marco("POST", f"/repos/{repo}/labels", {"name": label, "color": "ff0000"},
                           expect=201)
        await marco("POST", f"/repos/{repo}/issues/{n}/labels", {"labels": [made["id"]]})
    await office.settle()
    office.forge.webhooks.redeliver(close)
    await office.settle()
    issue = await marco("GET", f"/repos/{repo}/issues/{n}")
    row = await mails.get_mail(office.services.store, sent["mail_id"])
    assert row is not None
    return f"{issue['state']} {row.state}"


async def test_a_close_delivered_after_a_later_assignment_still_closes_the_mail(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Only a timeline row newer than the newest taken on the issue counted: marco's later
    assignment, taken first, made his close's own row too old to be taken, and the lost
    close, redelivered, was refused for good. Each row is now taken once, in any order."""
    assert await _close_lost_then(office, session, {"assignees": ["marco"]}) == \
        "closed mail:closed"


async def test_a_close_delivered_after_a_later_label_change_still_closes_the_mail(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The same with a label added later (whose review reopened the closed issue, too)."""
    assert await _close_lost_then(office, session, None, label="urgent") == "closed mail:closed"


async def test_a_redelivered_close_already_taken_is_refused(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Taken once still holds, row by row: marco closed, reopened and closed again, each
    delivered and taken; a close under other delivery ids finds no close of his untaken."""
    sent = await _mail(office, session)
    repo, n = "acme/scout-vault", sent["number"]
    marco = gitea_api(session, office, "marco")
    for state in ("closed", "open", "closed"):
        await marco("PATCH", f"/repos/{repo}/issues/{n}", {"state": state}, expect=201)
        await office.settle()
    issue = await marco("GET", f"/repos/{repo}/issues/{n}")
    for copy_ in ("replayed-close-1", "replayed-close-2"):
        await _forged(office, session, "issues", _issues_event("closed", issue, "marco"), copy_)
    states = {str(d["guid"]): d["state"] for d in await office.services.store.fetchall(
        "SELECT guid, state FROM queue") if "replayed-close" in str(d["guid"])}
    assert set(states.values()) == {"ignored"}, states


async def test_a_deletion_or_edit_signed_for_a_comment_not_written_yet_silences_nothing(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """Acted out (review r4): Gitea's comment ids are sequential, instance-wide, so acme's
    admin signed `deleted` for the next ids; the forge had no such comment (not yet), so the
    deletion held and left a tombstone, and sara's "the launch is off" that came next under
    that id was dropped unread. A deletion of a comment the index never held now takes
    nothing, on its issue or another; an `edited` for one is refused as before."""
    vault = "/repos/acme/scout-vault"
    marco, sara = gitea_api(session, office, "marco"), gitea_api(session, office, "sara")
    lid = (await marco("POST", f"{vault}/labels", {"name": "goal", "color": "#00aabb"},
                       201))["id"]
    a, b = [await marco("POST", f"{vault}/issues", {"title": title, "body": "x",
                                                     "labels": [lid]}, 201)
            for title in ("EU launch", "US launch")]
    await office.settle()
    await sara("POST", f"{vault}/issues/{a['number']}/comments",
               {"body": "to: marco@acme.com\nfirst"}, 201)
    await office.settle()
    ids = [int(c["id"]) for issue in (a, b)
           for c in await marco("GET", f"{vault}/issues/{issue['number']}/comments")]
    newest = max(ids)
    repository = {"full_name": "acme/scout-vault", "name": "scout-vault",
                  "owner": {"login": "acme"}}
    on_a = await marco("GET", f"{vault}/issues/{a['number']}")
    # the next three ids: two deleted on a (the first comment to come is on a, the second on
    # b), the third edited
    for k, action in ((1, "deleted"), (2, "deleted"), (3, "edited")):
        await _forged(office, session, "issue_comment", {
            "action": action, "issue": on_a, "changes": {"body": {"from": ""}},
            "comment": {"id": newest + k, "user": {"login": "sara"}, "body": "x"},
            "repository": repository, "sender": {"login": "eve"}}, f"pre-{action}-{k}")
    said = ["the launch is off, do not ship", "the US launch is off too", "and so is Asia"]
    posted = [await sara("POST", f"{vault}/issues/{issue['number']}/comments",
                         {"body": f"to: marco@acme.com\n@marco {text}"}, 201)
              for issue, text in zip((a, b, a), said, strict=True)]
    assert [c["id"] for c in posted] == [newest + 1, newest + 2, newest + 3]
    await office.settle()
    got = await ToolClient(session, office, "human:marco@acme.com")("list_inbox",
                                                                    markRead=False)
    assert sorted(c["body"] for c in got["you"]["unread"]) == sorted(
        ["first", *(f"@marco {text}" for text in said)]), got["you"]["unread"]


async def test_a_delivery_signed_as_marcos_spends_none_of_marcos_write_budget(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """The worker charged a delivery's forge writes to the sender its payload names before
    the org-signed check said who that is: acme's admins signed a push as marco's (read in no
    one's name), its config-error issue was made on marco's share of the write budget, and
    marco's own push fixing the config (through the operator's system webhook: his, as it
    came) could not close that issue, put off for the hour. An org-signed delivery's writes
    are now the sender's only as the forge vouches for them (a handler's scene), else no
    one's; one signed by the operator's secret (GitHub's path) is still its sender's."""
    pacer = office.services.forge_for(None, "acme").pacer  # type: ignore[attr-defined]
    pacer.principal_share = 0.001  # each principal: one creation an hour
    config = office.forge.state.repo_by_full_name("acme/.github").files["vaultmail.yml"]
    deliveries = office.forge.state.deliveries
    try:
        before = set(deliveries)
        office.forge.faults.drop_webhooks(count=1)
        office.forge.put_file("acme/.github", "vaultmail.yml", "humans: [", pusher="lee")
        await office.settle()
        (lees,) = [deliveries[i].payload for i in set(deliveries) - before]
        forged = copy.deepcopy(lees)
        forged["sender"]["login"] = forged["pusher"]["login"] = "marco"
        await _forged(office, session, "push", forged, "forged-push")
        [issue] = office.forge.state.repo_by_full_name("acme/.github").issues.values()
        assert issue.state == "open", "the forged push read the refused config"

        before = set(deliveries)
        office.forge.faults.drop_webhooks(count=1)
        office.forge.put_file("acme/.github", "vaultmail.yml", config, pusher="marco")
        await office.settle()
        (fix,) = [deliveries[i].payload for i in set(deliveries) - before]
        status, text = await _post(office, session, "/webhook",
                                   office.services.settings.webhook_secret, fix, "push",
                                   "marcos-fix")
        assert status == 202, text
        await office.settle()  # (put off for the hour, it never settles)
    finally:
        pacer.principal_share = 0.75
    assert issue.state == "closed", "marco's fix could not close the config-error issue"


async def test_a_comment_its_author_edited_before_it_was_handled_is_indexed_as_the_forge_shows(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """sara commented on marco's plan and edited it a second later, before the app handled
    its `created`: the forge shows the comment edited since it was written, so org_signed
    reads it in no one's name, and the items handler left it there: it was never indexed,
    and marco (the plan's author) never heard of it. It is now indexed as the forge shows
    it, sara's, in its words now, marked edited; the edit's `cc:` addresses no one."""
    vault = "/repos/acme/scout-vault"
    marco, sara = gitea_api(session, office, "marco"), gitea_api(session, office, "sara")
    lid = (await marco("POST", f"{vault}/labels", {"name": "plan", "color": "#00aabb"},
                       201))["id"]
    plan = await marco("POST", f"{vault}/issues", {"title": "EU launch plan", "body": "x",
                                                   "labels": [lid]}, 201)
    n = plan["number"]
    await office.settle()
    deliveries = office.forge.state.deliveries
    before = set(deliveries)
    office.forge.faults.drop_webhooks(count=1)  # its `created`, handled after the edit
    mine = await sara("POST", f"{vault}/issues/{n}/comments", {"body": "Prices are 10 EUR"}, 201)
    await office.settle()
    (created,) = [deliveries[i] for i in set(deliveries) - before]
    office.forge.clock.advance(1)  # (Gitea stamps a comment to the second)
    await sara("PATCH", f"{vault}/issues/comments/{mine['id']}",
               {"body": "cc: lee@acme.com\nPrices are 12 EUR"}, 200)
    await office.settle()
    office.forge.webhooks.redeliver(created)
    await office.settle()

    async def unread(who: str) -> list[Any]:
        got = await ToolClient(session, office, who)("list_inbox", markRead=False)
        return list(got["you"]["unread"])

    [seen] = await unread("human:marco@acme.com")
    assert seen["body"] == "Prices are 12 EUR" and "edited" in seen, seen
    assert seen["author"] == "human:sara@acme.com", seen
    assert await unread("human:lee@acme.com") == [], "addressed by words no one can be shown " \
        "to have written"
    row = await comments.comment_by_forge_id(office.services.store, int(mine["id"]),
                                             f"acme/scout-vault#{n}")
    assert row is not None and row.data["addressed"] == [] and row.data["kind"] == "comment"


async def test_an_outsiders_comments_edited_before_they_were_handled_get_a_note_only_if_they_asked(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """troll, outside the office, commented on their own issue in a public repository and
    edited each comment a second later, before the app handled its `created`: each was read
    in no one's name, and each got a note "nothing it asks was done", though it asked
    nothing, past the quiet a stranger's refusals keep. A note is now said only of words
    that ask something (a command, someone addressed), and to someone outside the office as
    a refusal is: once a while, the rest ledgered."""
    forge = office.forge
    forge.add_repo("acme", "website", private=False)
    office.forge_tokens["troll"] = forge.add_user("troll")
    troll = gitea_api(session, office, "troll")
    n = (await troll("POST", "/repos/acme/website/issues", {"title": "hi", "body": "x"},
                     201))["number"]
    await office.settle()
    path = f"/repos/acme/website/issues/{n}/comments"

    async def edited_before_handled(body: str, now: str) -> None:
        deliveries = forge.state.deliveries
        before = set(deliveries)
        forge.faults.drop_webhooks(count=1)  # its `created`, handled after the edit
        mine = await troll("POST", path, {"body": body}, 201)
        await office.settle()
        (created,) = [deliveries[i] for i in set(deliveries) - before]
        forge.clock.advance(1)  # (Gitea stamps a comment to the second)
        await troll("PATCH", f"/repos/acme/website/issues/comments/{mine['id']}",
                    {"body": now}, 200)
        await office.settle()
        forge.webhooks.redeliver(created)
        await office.settle()

    async def notes() -> list[str]:
        return [c["body"] for c in await troll("GET", path) if c["user"]["login"] != "troll"]

    for i in range(3):
        await edited_before_handled(f"spam {i}", f"spam {i}!")
    assert await notes() == [], "words that asked nothing"
    for i in range(2):
        await edited_before_handled(f"spam {i}", f"/close\nspam {i}")
    said = await notes()
    assert len(said) == 1 and "edited since" in said[0], said
    quiet = [e for e in await ledger.entries(office.services.store, event="run.denied")
             if e.actor == "forge:troll"]
    assert [e.data.get("quiet") for e in quiet] == [True], quiet


async def test_a_sealed_card_copied_onto_another_item_moves_nothing_in_a_rebuild(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    """On Gitea too (its issues' `id` is what the seal binds): marco edits scout's app comment
    on another outcome into an exact copy of scout's sealed card to him; after a reindex the
    question is on its own outcome still, and the report names the copy."""
    from tests.test_reindex import _drop_work, _reindex

    vault = "/repos/acme/scout-vault"
    marco = gitea_api(session, office, "marco")
    number, question = await _outcome_asking_marco(office, session)
    lid = next(label["id"] for label in await marco("GET", f"{vault}/labels", None, 200)
               if label["name"] == "outcome")
    other = await marco("POST", f"{vault}/issues", {"title": "Logs", "body": "x",
                                                    "labels": [lid]}, 201)
    await office.settle()
    await ToolClient(session, office, "agent:scout")(
        "add_comment", target=f"acme/scout-vault#{other['number']}", targetType="outcome",
        body="Checking the logs")
    await office.settle()
    card = next(c for c in await marco("GET", f"{vault}/issues/{number}/comments", None, 200)
                if "kind=question" in c["body"])
    mine = next(c for c in await marco("GET", f"{vault}/issues/{other['number']}/comments",
                                       None, 200) if "Checking the logs" in c["body"])
    office.forge.clock.advance(1)
    await marco("PATCH", f"{vault}/issues/comments/{mine['id']}", {"body": card["body"]}, 200)
    await office.settle()
    await _drop_work(office)
    report = await _reindex(office)
    t = await comments.get_thread(office.services.store, question)
    assert t is not None and t.item == f"acme/scout-vault#{number}", t
    assert report.work is not None and \
        f"acme/scout-vault#{other['number']} comment {mine['id']}" in report.work.skipped, \
        report.work
