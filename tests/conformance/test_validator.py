"""The checks have teeth: a conforming response or payload from the forge, broken in one place,
is refused with a message naming the field. (A validator that accepts everything would let
the whole suite pass.)"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from . import validator
from .conftest import SECRET, VAULT, World


async def _issue_response(w: World) -> tuple[str, int, dict[str, str], dict[str, Any]]:
    issue = await w.new_issue(labels=["mail:new"])
    url = f"{w.url}/repos/{VAULT}/issues/{issue['number']}"
    r = await w.call("GET", url, expect=200)
    return url, r.status, dict(r.headers), r.json


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda b, h: b.pop("number"), "field number: 'number' is a required property"),
    (lambda b, h: b.update(state=7), "field state: 7 is not of type 'string'"),
    (lambda b, h: b.update(state_reason="bored"), "field state_reason: 'bored' is not one of"),
    (lambda b, h: b.update(created_at="yesterday"), "field created_at: 'yesterday' is not a"),
    (lambda b, h: b.update(html_url="/acme/x/issues/1"), "field html_url: '/acme/x/issues/1'"),
    (lambda b, h: b["labels"][0].update(name=5), "field labels/0/name: 5 is not of type"),
    (lambda b, h: b["user"].update(id="1"), "field user/id"),
    (lambda b, h: b.update(closed_by="admin"), "field closed_by"),
    (lambda b, h: h.pop("X-RateLimit-Remaining"), "header x-ratelimit-remaining is missing"),
    (lambda b, h: h.update({"Content-Type": "text/html"}), "content-type 'text/html'"),
])
async def test_rest_mutations_are_refused(world: World, mutate: Any, expected: str) -> None:
    url, status, headers, body = await _issue_response(world)
    assert not validator.check_response("GET", url, status, headers, body)[1]
    mutate(body, headers)
    problems = validator.check_response("GET", url, status, headers, body)[1]
    assert any(expected in p for p in problems), problems


async def test_undocumented_status_is_refused(world: World) -> None:
    url, _, headers, body = await _issue_response(world)
    problems = validator.check_response("GET", url, 418, headers, body)[1]
    assert problems and "status 418 is not documented" in problems[0]
    problems = validator.check_response("DELETE", f"{world.url}/repos/{VAULT}", 204, headers,
                                        None)[1]
    assert problems and "no such operation" in problems[0]


async def test_location_is_required_on_creation(world: World) -> None:
    r = await world.call("POST", f"/repos/{VAULT}/labels",
                         json_body={"name": "goal", "color": "0e8a16"}, expect=201)
    headers = {k: v for k, v in r.headers.items() if k.lower() != "location"}
    problems = validator.check_response("POST", r.url, 201, headers, r.raw)[1]
    assert any("Location is missing" in p for p in problems), problems


async def test_webhook_mutations_are_refused(world: World) -> None:
    await world.forge.webhooks_idle()
    (d,) = [x for x in world.receiver.take() if x.event == "installation"]
    ok = validator.check_webhook(d.event, d.action, d.payload, headers=d.headers,
                                 raw_body=d.raw, secret=SECRET)
    assert not ok, "unexpected problems with installation.created"

    payload = copy.deepcopy(d.payload)
    payload["installation"].pop("app_id")
    problems = validator.check_webhook(d.event, d.action, payload)
    assert any("installation/app_id" in p for p in problems), problems

    payload = copy.deepcopy(d.payload)
    payload["installation"]["created_at"] = "1557933591"  # a string, but not a date-time
    problems = validator.check_webhook(d.event, d.action, payload)
    assert any("installation/created_at" in p for p in problems), problems

    tampered = d.raw.replace(b'"created"', b'"deleted"')
    problems = validator.check_webhook(d.event, d.action, json.loads(tampered),
                                       headers=d.headers, raw_body=tampered, secret=SECRET)
    assert any("X-Hub-Signature-256 does not verify" in p for p in problems), problems

    for name in ("User-Agent", "X-GitHub-Hook-ID", "X-GitHub-Event",
                 "X-GitHub-Hook-Installation-Target-ID",
                 "X-GitHub-Hook-Installation-Target-Type", "X-GitHub-Delivery",
                 "X-Hub-Signature-256"):
        headers = {k: v for k, v in d.headers.items() if k.lower() != name.lower()}
        problems = validator.check_webhook(d.event, d.action, d.payload, headers=headers)
        assert any(f"required header {name.lower()}" in p.lower() for p in problems), \
            (name, problems)

    payload = copy.deepcopy(d.payload)
    payload["installation"]["invented"] = 1
    payload["sender"].pop("login")
    problems = validator.compare_keys_with_examples(d.event, d.action, payload)
    assert any("['invented']" in p for p in problems), problems
    assert any("sender lacks ['login']" in p for p in problems), problems


def test_a_drift_covers_one_field_and_one_kind_of_error() -> None:
    """installation-epoch-timestamps accepts an epoch integer at installation.created_at in
    an installation event, and nothing else."""
    example = next(e for ev in validator.examples() if ev["name"] == "installation"
                   for e in ev["examples"] if e.get("action") == "created")
    allow = validator.KNOWN_DRIFTS + validator.STALE_EXAMPLE_FIELDS
    assert not validator.check_webhook("installation", "created", example, drifts=allow)
    bad = copy.deepcopy(example)
    bad["installation"]["created_at"] = True
    assert validator.check_webhook("installation", "created", bad, drifts=allow)
    bad = copy.deepcopy(example)
    bad["installation"]["id"] = "1"
    assert validator.check_webhook("installation", "created", bad, drifts=allow)
    bad = copy.deepcopy(example)
    bad["sender"]["created_at"] = 1557933591
    assert not validator.check_webhook("installation", "created", bad, drifts=allow), \
        "sender.created_at is not in the sender schema, so any value passes (no drift used)"
    ex = next(e for ev in validator.examples() if ev["name"] == "issues"
              for e in ev["examples"] if e.get("action") == "opened")
    bad = copy.deepcopy(ex)
    bad["issue"]["created_at"] = 1557933591
    assert validator.check_webhook("issues", "opened", bad, drifts=allow), \
        "the epoch drift is for installation events only"
