"""`tests.support.free_port`: the port a test gives a server it starts later is handed to no one
else before the server binds it (issue: a port bound at 0, let go and given to a subprocess was
taken meanwhile by another xdist worker's bind(0) or an outgoing connection)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import free_port, port_share


def test_a_port_is_outside_the_kernels_range_in_this_workers_share_and_given_once() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    share = port_share(os.environ.get("PYTEST_XDIST_WORKER", ""),
                       int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high], "where bind(0) takes its ports"
    assert all(p in share for p in ports)


def test_the_workers_shares_are_apart_and_together_the_whole() -> None:
    whole = port_share()
    shares = [set(port_share(f"gw{n}", 3)) for n in range(3)]
    assert not (shares[0] & shares[1] or shares[1] & shares[2] or shares[0] & shares[2])
    assert set().union(*shares) == set(whole) and len(whole) > 1000
