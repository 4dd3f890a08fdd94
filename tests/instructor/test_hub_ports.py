"""The ports a hub (or a test's lab) is given: free now, and out of the kernel's way."""

from __future__ import annotations

import socket

from course.instructor import hub


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    """A port chosen now is bound seconds later: one from the ephemeral range could be handed
    meanwhile to any process that asks for a port (a rank's store took a hub's service port
    so, and the hub failed to start). Are they below that range, distinct, and free?"""
    ports = hub.free_ports(4)
    assert len(set(ports)) == 4
    low = hub._ephemeral_low()  # noqa: SLF001 - the module's own reading of the kernel's range
    assert all(1024 <= port < low for port in ports), (ports, low)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_taken_is_never_chosen(monkeypatch) -> None:
    """With the first candidates taken (one listening, one bound only), are they skipped?"""
    taken, free = hub.free_ports(2), hub.free_ports(6)
    free = tuple(port for port in free if port not in taken)[:2]
    monkeypatch.setattr(hub.random, "sample", lambda *_: [*taken, *free])
    with socket.socket() as listening, socket.socket() as bound:
        listening.bind(("127.0.0.1", taken[0]))
        listening.listen()
        bound.bind(("127.0.0.1", taken[1]))
        assert hub.free_ports(2) == free
