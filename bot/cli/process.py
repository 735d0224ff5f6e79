"""What every long-running command shares: its listening socket, bound before anything else
starts (a port in use fails at once, in one line), and stopping on SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket


class StartupError(RuntimeError):
    """Start-up cannot go on; the message says why and what to do."""


def listen(host: str, port: int, *, backlog: int = 512) -> socket.socket:
    """A non-blocking socket listening on host:port, or StartupError naming the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}: stop what uses "
                           f"that port or choose another (PORT / --port)") from None
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def stop_signal() -> asyncio.Event:
    """An event SIGINT or SIGTERM sets from now on. Taken before a command says it is ready,
    so a signal right after that line stops it cleanly (exit 0) instead of killing it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows
            loop.add_signal_handler(sig, stop.set)
    return stop
