"""The forge's own controls under /_forge/ (never part of the GitHub API): faults, clock,
limits, the request log, deliveries, and waiting for the webhook queue to drain."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .http import FORGE_KEY, ApiError, json_response
from .render import Renderer

if TYPE_CHECKING:
    from ..forge import LocalForge


def _forge(request: web.Request) -> LocalForge:
    forge: LocalForge = request.app[FORGE_KEY]
    return forge


async def _json(request: web.Request) -> dict[str, object]:
    try:
        data = await request.json() if request.can_read_body else {}
    except ValueError as exc:
        raise ApiError(400, "Problems parsing JSON") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "expected a JSON object")
    return data


async def get_faults(request: web.Request) -> web.Response:
    return json_response(_forge(request).faults.as_dict())


async def post_faults(request: web.Request) -> web.Response:
    forge = _forge(request)
    try:
        forge.faults.configure(await _json(request))
    except (TypeError, ValueError) as exc:
        raise ApiError(422, f"invalid fault: {exc}") from exc
    return json_response(forge.faults.as_dict())


async def delete_faults(request: web.Request) -> web.Response:
    _forge(request).faults.clear()
    return web.Response(status=204)


async def get_clock(request: web.Request) -> web.Response:
    clock = _forge(request).clock
    return json_response({"now": clock.now(), "offset": clock.offset})


async def post_clock(request: web.Request) -> web.Response:
    forge = _forge(request)
    body = await _json(request)
    try:
        forge.clock.advance(float(body.get("advance", 0)))  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ApiError(422, "advance must be a number of seconds") from exc
    forge.save()
    return json_response({"now": forge.clock.now(), "offset": forge.clock.offset})


async def get_limits(request: web.Request) -> web.Response:
    return json_response(_forge(request).limits.as_dict())


async def post_limits(request: web.Request) -> web.Response:
    forge = _forge(request)
    try:
        forge.limits.update(await _json(request))
    except KeyError as exc:
        raise ApiError(422, f"unknown limit {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ApiError(422, f"invalid limit: {exc}") from exc
    return json_response(forge.limits.as_dict())


async def get_requests(request: web.Request) -> web.Response:
    records = _forge(request).requests.as_list()
    try:
        since = int(request.query.get("since", "0"))
    except ValueError:
        since = 0
    return json_response(records[since:])


async def delete_requests(request: web.Request) -> web.Response:
    _forge(request).requests.clear()
    return web.Response(status=204)


async def get_deliveries(request: web.Request) -> web.Response:
    forge = _forge(request)
    r = Renderer(forge)
    event = request.query.get("event")
    items = [r.delivery(d) for d in sorted(forge.state.deliveries.values(), key=lambda d: d.id)
             if event is None or d.event == event]
    return json_response(items)


async def webhooks_idle(request: web.Request) -> web.Response:
    await _forge(request).webhooks_idle()
    return json_response({"idle": True})


async def seed(request: web.Request) -> web.Response:
    from .. import seeding_http

    try:
        out = seeding_http.apply(_forge(request), request.match_info["kind"],
                                 await _json(request))
    except KeyError as exc:
        raise ApiError(404 if exc.args == (request.match_info["kind"],) else 422,
                       f"unknown {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ApiError(422, str(exc)) from exc
    return json_response(out, 201)


async def health(request: web.Request) -> web.Response:
    forge = _forge(request)
    return json_response({"ok": True, "dialect": forge.dialect_name, "url": forge.url})


def register(app: web.Application) -> None:
    r = app.router
    r.add_get("/_forge/health", health)
    r.add_get("/_forge/faults", get_faults)
    r.add_post("/_forge/faults", post_faults)
    r.add_delete("/_forge/faults", delete_faults)
    r.add_get("/_forge/clock", get_clock)
    r.add_post("/_forge/clock", post_clock)
    r.add_get("/_forge/limits", get_limits)
    r.add_post("/_forge/limits", post_limits)
    r.add_get("/_forge/requests", get_requests)
    r.add_delete("/_forge/requests", delete_requests)
    r.add_get("/_forge/deliveries", get_deliveries)
    r.add_post("/_forge/webhooks/idle", webhooks_idle)
    r.add_post("/_forge/{kind:users|orgs|teams|repos|permissions|files|apps|installations}",
               seed)
