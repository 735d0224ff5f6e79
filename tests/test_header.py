"""The signed mail header: rendering, parsing, and catching every kind of tampering."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from bot.mail.header import (
    MailHeader,
    VerdictStatus,
    body_sha256,
    canonical_bytes,
    parse_mail_body,
    render_mail_body,
    sign_header,
    split_mail_body,
    verify_mail,
)
from bot.mail.signing import Keyring, Keyrings, PublicKeys

VAULT = "acme/scout-vault"
SUBJECT = "Prices for Q3"
BODY = "Hi scout,\n\nplease compare the Q3 prices.\n\n- a\n- b\n"

RING = Keyring.ephemeral()


def make(
    body: str = BODY,
    subject: str = SUBJECT,
    vault: str = VAULT,
    ring: Keyring = RING,
    **extra: object,
) -> tuple[MailHeader, str]:
    header = sign_header(
        keyring=ring,
        mail_id=str(extra.pop("mail_id", "m-1")),
        from_principal="human:marco@acme.com",
        to_principal="agent:scout",
        vault=vault,
        subject=subject,
        body=body,
        sent=datetime(2025, 1, 31, 9, 0, 5, tzinfo=UTC),
        **extra,  # type: ignore[arg-type]
    )
    return header, render_mail_body(header, body)


def check(issue_body: str, title: str = SUBJECT, vault: str = VAULT, **kw: object) -> str:
    verdict = verify_mail(title, issue_body, vault, RING, **kw)  # type: ignore[arg-type]
    return verdict.status.value + ": " + verdict.reason


# -- building and rendering ------------------------------------------------------------------


def test_header_fields() -> None:
    header, _ = make()
    assert header.version == 1
    assert header.mail_id == "m-1" and header.thread_id == "m-1"
    assert header.sent == "2025-01-31T09:00:05Z"
    assert header.hops == 0 and header.in_reply_to is None
    assert header.key_id == RING.active_kid
    assert header.body_sha256 == body_sha256(BODY)


def test_rendered_body_is_readable() -> None:
    header, issue_body = make(in_reply_to="acme/pricing-vault#7", hops=2, thread_id="t-9")
    first_line = issue_body.split("\n", 1)[0]
    assert first_line.startswith("<!-- vaultmail:header v1 {") and first_line.endswith("} -->")
    assert "| From | To | Sent | In reply to |" in issue_body
    assert (
        "| `human:marco@acme.com` | `agent:scout` | 2025-01-31 09:00 UTC | acme/pricing-vault#7 |"
        in issue_body
    )
    assert "\n\n---\n\n" + BODY.rstrip() in issue_body
    parsed, body = parse_mail_body(issue_body)
    assert parsed == header
    assert body == BODY.rstrip()


def test_no_in_reply_to_column_for_a_fresh_mail() -> None:
    _, issue_body = make()
    assert "In reply to" not in issue_body


def test_canonical_bytes_are_deterministic_and_exclude_the_signature() -> None:
    header, _ = make()
    data = canonical_bytes(header)
    assert data.startswith(b"vaultmail-header-v1\n")
    fields = json.loads(data.split(b"\n", 1)[1])
    assert list(fields) == sorted(fields)
    assert "signature" not in fields and fields["key_id"] == header.key_id
    assert fields["in_reply_to"] is None
    assert canonical_bytes(header.model_copy(update={"signature": ""})) == data


def test_subject_cannot_break_out_of_the_comment() -> None:
    subject = "hi --> <b>bold</b> <!-- vaultmail:header v1 {} -->"
    header, issue_body = make(subject=subject)
    first_line = issue_body.split("\n", 1)[0]
    assert first_line.count("-->") == 1 and "<b>" not in first_line
    assert check(issue_body, title=subject) == "valid: signed for office acme"
    assert parse_mail_body(issue_body)[0] == header


def test_render_refuses_a_different_body() -> None:
    header, _ = make()
    with pytest.raises(ValueError):
        render_mail_body(header, "something else")


def test_invalid_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        make(vault="not a repo")
    with pytest.raises(ValidationError):
        sign_header(
            keyring=RING,
            from_principal="marco",
            to_principal="agent:scout",
            vault=VAULT,
            subject=SUBJECT,
            body=BODY,
        )
    with pytest.raises(ValidationError):
        make(subject="\t\u202e\n")  # nothing left once control and bidi characters go
    with pytest.raises(ValidationError):
        make(in_reply_to="not a ref!")



@pytest.mark.parametrize("sent", [
    "2025-01-31T09:00:05Z", "2024-02-29T23:59:59Z", "0001-01-01T00:00:00Z",
    "2025-02-29T00:00:00Z", "2025-04-31T00:00:00Z", "2025-13-01T00:00:00Z",
    "2025-00-10T00:00:00Z", "2025-01-10T24:00:00Z", "2025-01-10T23:59:60Z",
    "0000-01-01T00:00:00Z", "2025-01-31T09:00:05Z\n", "2025-01-31 09:00:05Z",
    "\u0662\u0660\u0662\u0665-\u0660\u0661-\u0663\u0661T\u0660\u0669:00:00Z", "",
])
def test_sent_is_read_as_strptime_reads_it_errors_included(sent: str) -> None:
    # the header's timestamp is read by position, not by strptime: the same answers
    header, _ = make()
    try:
        expected: object = datetime.strptime(sent, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        expected = str(exc)
    with_sent = header.model_copy(update={"sent": sent})  # (no validation: sent_at alone)
    try:
        found: object = with_sent.sent_at
    except ValueError as exc:
        found = str(exc)
    assert found == expected
    if isinstance(expected, datetime):
        assert MailHeader.model_validate({**header.model_dump(), "sent": sent}).sent == sent
    else:  # the validator refuses what strptime refuses
        with pytest.raises(ValidationError):
            MailHeader.model_validate({**header.model_dump(), "sent": sent})

def test_a_subject_is_signed_without_control_invisible_or_bidi_characters() -> None:
    header, _ = make(subject="two\nlines\twith \u202eevil\u200b")
    assert header.subject == "two lines with evil"
    with pytest.raises(ValidationError):  # a header that holds a control character is not ours
        MailHeader.model_validate({**header.model_dump(), "subject": "two\nlines"})


# -- verifying -------------------------------------------------------------------------------


def test_valid_mail() -> None:
    header, issue_body = make()
    verdict = verify_mail(SUBJECT, issue_body, VAULT, RING)
    assert verdict.valid and verdict.status is VerdictStatus.VALID
    assert verdict.signed and verdict.header == header
    assert verdict.body == BODY.rstrip()


def test_vault_name_case_does_not_matter() -> None:
    _, issue_body = make(vault="Acme/Scout-Vault")
    assert check(issue_body, vault="acme/scout-vault").startswith("valid")


def test_crlf_from_the_forge_still_verifies() -> None:
    _, issue_body = make()
    assert check(issue_body.replace("\n", "\r\n")).startswith("valid")
    _, body_sent_with_crlf = make(body=BODY.replace("\n", "\r\n"))
    assert check(body_sent_with_crlf).startswith("valid")


def test_trailing_whitespace_trimmed_by_the_forge_still_verifies() -> None:
    _, issue_body = make()
    assert check("\n" + issue_body.rstrip() + "\n\n", title=f"  {SUBJECT} ").startswith("valid")


def test_body_changed_after_sending() -> None:
    _, issue_body = make()
    assert check(issue_body.replace("Q3 prices", "Q4 prices")) == (
        "tampered: body changed after sending"
    )


def test_ticked_box_in_body_is_a_change() -> None:
    _, issue_body = make(body="- [ ] yes\n- [ ] no")
    assert check(issue_body.replace("- [ ] yes", "- [x] yes")) == (
        "tampered: body changed after sending"
    )


def test_header_fields_changed() -> None:
    _, issue_body = make()
    forged = issue_body.replace("human:marco@acme.com", "human:ceo@acme.com")
    verdict = verify_mail(SUBJECT, forged, VAULT, RING)
    assert verdict.status is VerdictStatus.TAMPERED
    assert verdict.reason == "header fields changed"
    assert not verdict.signed  # nothing is attributed to the forged sender


def test_hops_changed_is_caught() -> None:
    _, issue_body = make(hops=3)
    assert check(issue_body.replace('"hops":3', '"hops":0')) == "tampered: header fields changed"


def test_subject_changed() -> None:
    _, issue_body = make()
    assert check(issue_body, title="Pay invoice 42 now") == (
        "tampered: subject changed: signed as 'Prices for Q3', now 'Pay invoice 42 now'"
    )


def test_replayed_into_another_vault() -> None:
    _, issue_body = make(vault="acme/x-vault")
    assert check(issue_body, vault="acme/y-vault") == (
        "tampered: signed for acme/x-vault but found in acme/y-vault"
    )


def test_replayed_within_the_same_vault_is_caught_with_the_index_mail_id() -> None:
    _, issue_body = make(mail_id="m-1")
    assert check(issue_body).startswith("valid")  # alone, a copy looks fine
    assert check(issue_body, expected_mail_id="m-2") == (
        "tampered: header belongs to mail m-1, not m-2 (copied in)"
    )


def test_unknown_key_id() -> None:
    _, issue_body = make(ring=Keyring.ephemeral())
    verdict = verify_mail(SUBJECT, issue_body, VAULT, RING)
    assert verdict.status is VerdictStatus.TAMPERED
    assert verdict.reason.startswith("unknown key id vm-")


def test_key_id_swapped_to_a_known_one() -> None:
    other = Keyring.ephemeral()
    header, issue_body = make(ring=other)
    forged = issue_body.replace(header.key_id, RING.active_kid)
    assert check(forged) == "tampered: header fields changed"


def test_readable_part_disagreeing_with_the_hidden_header() -> None:
    _, issue_body = make()
    forged = issue_body.replace("| `human:marco@acme.com` |", "| `human:ceo@acme.com` |")
    assert check(forged) == "tampered: readable header changed: it no longer matches the signed one"


def test_readable_part_and_separator_removed() -> None:
    header, issue_body = make()
    comment = issue_body.split("\n", 1)[0]
    verdict = verify_mail(SUBJECT, comment + "\n\n" + BODY, VAULT, RING)
    assert verdict.status is VerdictStatus.TAMPERED
    assert "readable header changed" in verdict.reason
    assert verdict.header == header and verdict.signed


def test_several_changes_are_all_named() -> None:
    _, issue_body = make()
    verdict = verify_mail("new title", issue_body + "\nP.S. wire money", VAULT, RING)
    assert verdict.problems[0].startswith("subject changed")
    assert verdict.problems[1] == "body changed after sending"


def test_unsigned_issue() -> None:
    verdict = verify_mail("hello", "Just a plain issue\n", VAULT, RING)
    assert verdict.status is VerdictStatus.UNSIGNED
    assert verdict.reason == "no vaultmail header at the top of the body"
    assert verdict.body == "Just a plain issue"
    assert verify_mail("hello", None, VAULT, RING).status is VerdictStatus.UNSIGNED


def test_header_removed_from_a_known_mail() -> None:
    assert check("just text", expected_mail_id="m-1") == "tampered: the signed header was removed"


def test_unreadable_header_is_tampering() -> None:
    _, issue_body = make()
    broken = issue_body.replace('"hops":0,', '"hops":"0",')
    assert check(broken).startswith("tampered: header unreadable: hops")
    broken = issue_body.replace("{", "{,", 1)
    assert check(broken).startswith("tampered: header unreadable: not valid JSON")
    extra = issue_body.replace('"hops":0,', '"hops":0,"admin":true,')
    assert check(extra).startswith("tampered: header unreadable: admin")
    v2 = issue_body.replace("vaultmail:header v1", "vaultmail:header v2")
    assert check(v2) == "tampered: header unreadable: header version 2 is not supported"
    assert check("<!-- vaultmail:header v1 {").startswith("tampered: header unreadable")


def test_published_keys_verify_a_mail_after_rotation() -> None:
    ring = Keyring.ephemeral()
    _, issue_body = make(ring=ring)
    ring.rotate()
    published = PublicKeys.from_jwks(json.loads(json.dumps(ring.public_jwks())))
    assert verify_mail(SUBJECT, issue_body, VAULT, published).valid
    _, newer = make(ring=ring)
    assert verify_mail(SUBJECT, newer, VAULT, published).valid


# -- user content is data --------------------------------------------------------------------


def test_body_quoting_another_header_does_not_confuse_parsing() -> None:
    _, quoted = make(mail_id="m-quoted", subject="Other")
    body = quoted + "\n---\n\nand my own words\n"
    header, issue_body = make(body=body, mail_id="m-outer")
    parsed, parsed_body = parse_mail_body(issue_body)
    assert parsed == header and parsed is not None and parsed.mail_id == "m-outer"
    assert parsed_body == body.rstrip()
    assert check(issue_body).startswith("valid")


def test_header_comment_not_at_the_top_is_just_body() -> None:
    _, signed = make()
    issue_body = "Look what I found:\n\n" + signed
    header, body = parse_mail_body(issue_body)
    assert header is None and body == issue_body.rstrip()
    assert check(issue_body).startswith("unsigned")


def test_body_starting_with_a_separator_line() -> None:
    body = "---\ntitle: front matter\n---\ntext"
    _, issue_body = make(body=body)
    assert parse_mail_body(issue_body)[1] == body
    assert check(issue_body).startswith("valid")


def test_empty_body() -> None:
    _, issue_body = make(body="")
    assert parse_mail_body(issue_body)[1] == ""
    assert check(issue_body.rstrip()).startswith("valid")


def test_split_reports_structure() -> None:
    _, issue_body = make()
    parsed = split_mail_body(issue_body.replace("\n", "\r\n"))
    assert parsed.has_header and parsed.has_separator and parsed.error is None
    assert parsed.readable is not None and "| From | To | Sent |" in parsed.readable
    assert "\r" not in parsed.body


# -- what the header shows people ------------------------------------------------------------


def test_the_table_shows_people_by_forge_login_not_by_email_address() -> None:
    header, issue_body = make(from_name="login:marco", to_name="agent:scout")
    table = split_mail_body(issue_body).readable
    assert table is not None and "`marco`" in table and "acme.com" not in table
    assert "@marco" not in table, "a login in the table mentions nobody"
    assert header.signed_fields()["from_principal"] == "human:marco@acme.com", \
        "the principal stays in the signed data"
    assert check(issue_body).startswith("valid")


def test_the_names_in_the_table_are_signed() -> None:
    _, issue_body = make(from_name="login:marco", to_name="agent:scout")
    forged = issue_body.replace('"from_name":"login:marco"', '"from_name":"login:ceo"')
    forged = forged.replace("| `marco` |", "| `ceo` |")
    assert check(forged).startswith("tampered")


def test_a_header_without_names_shows_the_principals_and_verifies_as_before() -> None:
    header, issue_body = make()
    assert "from_name" not in header.to_json() and "from_name" not in header.signed_fields()
    assert "`human:marco@acme.com`" in issue_body
    assert check(issue_body).startswith("valid")


# -- offices: each signs with its own key (issue 21) -------------------------------------------


def _forged_by(ring: Keyring, vault: str = VAULT) -> str:
    """What another office could write with its own key: a header claiming `vault` (the app
    itself refuses to sign it, see below, so the forger signs by hand)."""
    header, _ = make(ring=Keyring.ephemeral())
    unsigned = header.model_copy(update={"key_id": ring.active_kid, "office": ring.office,
                                         "vault": vault, "signature": ""})
    _, signature = ring.sign(canonical_bytes(unsigned), kid=ring.active_kid)
    return render_mail_body(unsigned.model_copy(update={"signature": signature}), BODY)


def test_a_new_header_names_its_office_and_is_signed_with_that_office_key() -> None:
    rings = Keyrings.ephemeral()
    header, issue_body = make(ring=rings.for_office("acme"))
    assert header.office == "acme" and header.key_id.startswith("vm-acme-")
    assert json.loads(canonical_bytes(header).split(b"\n", 1)[1])["office"] == "acme"
    verdict = verify_mail(SUBJECT, issue_body, VAULT, rings)
    assert verdict.valid and verdict.office == "acme", verdict.reason
    assert verdict.reason == "signed for office acme"
    renamed = issue_body.replace('"office":"acme"', '"office":"evil"')
    assert verify_mail(SUBJECT, renamed, VAULT, rings).reason == "header fields changed"


def test_an_office_key_never_signs_for_another_office_vault() -> None:
    rings = Keyrings.ephemeral()
    with pytest.raises(ValueError, match="office evil's key cannot sign for acme/scout-vault"):
        make(ring=rings.for_office("evil"))


def test_a_header_signed_by_another_office_is_a_forgery_in_this_one() -> None:
    rings = Keyrings.ephemeral()
    rings.for_office("acme")
    evil = rings.for_office("evil")
    forged = _forged_by(evil)
    for keys in (rings, PublicKeys.from_jwks(json.loads(json.dumps(rings.public_jwks())))):
        verdict = verify_mail(SUBJECT, forged, VAULT, keys)
        assert verdict.status is VerdictStatus.TAMPERED
        assert not verdict.signed and not verdict.valid, "nothing in it is acme's word"
        assert verdict.reason == (
            f"signed with office evil's key {evil.active_kid}, but acme/scout-vault is office "
            "acme's: a forgery or a copy, not acme's mail")
    # acme's own published keys do not even hold evil's key
    own = PublicKeys.from_jwks(rings.public_jwks("acme"))
    assert verify_mail(SUBJECT, forged, VAULT, own).reason == (
        f"unknown key id {evil.active_kid} (a key of office evil, not acme)")
    # evil's mail in evil's own vault is evil's, and verifies there
    assert verify_mail(SUBJECT, _forged_by(evil, "evil/scout-vault"), "evil/scout-vault",
                       rings).valid


def test_an_old_header_signed_with_the_legacy_key_still_verifies() -> None:
    legacy = Keyring.ephemeral()
    header, issue_body = make(ring=legacy)  # as mail was signed before offices had keys
    assert header.office is None and '"office"' not in issue_body
    rings = Keyrings.ephemeral(legacy=legacy, installed=lambda: ["acme"])
    verdict = verify_mail(SUBJECT, issue_body, VAULT, rings)
    assert verdict.valid and verdict.office == "acme", verdict.reason
    # bound to the one office it served: the same key in another office's vault is not theirs
    _, elsewhere = make(ring=legacy, vault="evil/scout-vault")
    verdict = verify_mail(SUBJECT, elsewhere, "evil/scout-vault", rings)
    assert not verdict.valid and not verdict.signed
    assert verdict.reason == (f"signed with the legacy key {legacy.active_kid}, which signed "
                              "for office acme only, but evil/scout-vault is office evil's")


# -- names: GitHub's and Gitea's ------------------------------------------------------------------


def test_an_office_and_people_named_as_gitea_names_them_sign_and_verify() -> None:
    """Gitea's and Forgejo's orgs and logins may hold '.' and '_' (bot.names): the header took
    neither, so no mail of such an office, or from such a person, could be signed."""
    rings = Keyrings.ephemeral()
    vault = "acme_corp.eu/scout-vault"
    header, issue_body = make(ring=rings.for_office("acme_corp.eu"), vault=vault,
                              from_name="login:john.doe_x", to_name="agent:scout")
    assert header.office == "acme_corp.eu" and "| `john.doe_x` |" in issue_body
    assert verify_mail(SUBJECT, issue_body, vault, rings).valid


# A mail a release before that signed, names at the edge of what it took (a login ending in a
# hyphen and holding two, as GitHub's older accounts do; an office with a hyphen), with the
# key it was signed with: it verifies as it did, byte for byte.
OLD_KEY = {"kid": "vm-acme-corp-20261206-875634", "kty": "OKP", "crv": "Ed25519",
           "x": "Q566FGWzKqvASdoGpsfkc_LZ0QcF3AqknlNwee4J-kA", "use": "sig", "alg": "EdDSA",
           "office": "acme-corp"}
OLD_HEADER = {
    "body_sha256": "ec72c497e14844055de863272409592a389224afb93d5350296826ed2e8a00aa",
    "from_name": "login:old--name-",
    "from_principal": "human:al@acme.com",
    "hops": 0,
    "in_reply_to": None,
    "key_id": "vm-acme-corp-20261206-875634",
    "mail_id": "m-old-1",
    "office": "acme-corp",
    "sent": "2025-01-31T09:00:05Z",
    "signature": "L0X4PEQknt147r4-v1qoJkkBkIuUX7MbK_1HJdwZtN3gk-iIxz46UBbo9F0WuR5ZUkEvPX"
                 "MFDylzJvwReGniDQ",
    "subject": "Old names",
    "thread_id": "m-old-1",
    "to_name": "agent:scout",
    "to_principal": "agent:scout",
    "vault": "acme-corp/scout-vault",
    "version": 1,
}
OLD_MAIL = ("<!-- vaultmail:header v1 " + json.dumps(OLD_HEADER, separators=(",", ":"))
            + " -->\n\n| From | To | Sent |\n| --- | --- | --- |\n"
            "| `old--name-` | `agent:scout` | 2025-01-31 09:00 UTC |\n\n---\n\n"
            "Hi,\n\nthe old names still verify.\n")


def test_a_header_signed_before_names_were_widened_still_verifies() -> None:
    keys = PublicKeys.from_jwks({"keys": [OLD_KEY]})
    verdict = verify_mail("Old names", OLD_MAIL, "acme-corp/scout-vault", keys)
    assert verdict.valid and verdict.office == "acme-corp", verdict.reason
    assert verdict.header is not None and verdict.header.from_name == "login:old--name-"
