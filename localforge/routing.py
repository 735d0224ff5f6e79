"""Each dialect's route table, built once a process and shared by every forge of it.

aiohttp compiles a regular expression for each route as it is added, and the GitHub dialect
has some 300 (each path also under /repositories/{id} and /api/v3): building them took 19-25
ms a forge start, and the tests start a forge for nearly every test. No route holds anything
of one forge (a handler finds its forge in `request.app`), and aiohttp only reads a resource
once it is routed to (matching a path, answering its methods), so every forge's application
registers the same resources, in the same order, and shares the read-only maps the routes
were registered with (route -> template). What is one forge's own (the forge, its pending
manifests) each application gets for itself, from its dialect's build_app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

Register = Callable[[web.Application], None]
_built: dict[Register, web.Application] = {}  # each table, in the application it was made in


def add_shared_routes(app: web.Application, register: Register,
                      keys: Sequence[web.AppKey[Any]]) -> None:
    """The routes `register` adds, into `app` (still without routes), with what `register`
    put under `keys` (maps it made of its routes, shared: read them, never change them)."""
    model = _built.get(register)
    if model is None:
        model = web.Application()
        register(model)
        _built[register] = model
    for resource in model.router.resources():
        app.router.register_resource(resource)
    for key in keys:
        app[key] = model[key]
