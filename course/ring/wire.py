"""What each rank put on the wire, read from the kernel's own TCP counters.

    with WireMeter() as wire:          # on every rank of the default group (%%ranks 8)
        dist.all_reduce(tensor)        # gloo's own all-reduce, or anything else
    wire.sent                          # {peer rank: bytes this rank sent it}

gloo's ranks talk over TCP, one connection per pair of ranks, even on one machine (through the
loopback interface), so what a collective sends is what the kernel counts on those
connections. Linux keeps the counters per socket (``getsockopt(TCP_INFO)``: RFC 4898's
``HCDataOctetsOut`` as ``tcpi_bytes_sent``, plus what waits in the send queue,
``tcpi_notsent_bytes``); the meter reads them for every TCP socket of this process before and
after the block, and names each connection's peer by matching ports with the other ranks'
(one exchange after the block, so the exchange's own bytes are not counted). Nothing in the
measured code is patched or wrapped: gloo's C++ collectives are measured as they run, header
bytes included (a few hundred per message).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Self

import torch.distributed as dist

__all__ = ["WireMeter", "connections"]

# Offsets in Linux's struct tcp_info (include/uapi/linux/tcp.h).
_NOTSENT, _BYTES_SENT, _BYTES_RETRANS = 144, 200, 208
_TCP_INFO_SIZE = 256


@dataclass(frozen=True)
class _Counters:
    sent: int
    received: int


def connections() -> dict[tuple[int, int], _Counters]:
    """This process's TCP connections, ``(local port, remote port)`` -> bytes sent/received."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:  # closed meanwhile, or not a socket we may look at
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.type != socket.SOCK_STREAM:
                continue
            try:
                ports = sock.getsockname()[1], sock.getpeername()[1]
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
            except OSError:  # listening or not yet connected
                continue
            found[ports] = _read(info)
    return found


def _read(info: bytes) -> _Counters:
    if len(info) < _BYTES_RETRANS + 8:
        raise RuntimeError(
            "this kernel's TCP_INFO has no byte counters (Linux 4.19 or newer has them): "
            "the wire cannot be measured here"
        )
    (notsent,) = struct.unpack_from("I", info, _NOTSENT)
    (received,) = struct.unpack_from("Q", info, 128)
    sent, retrans = struct.unpack_from("QQ", info, _BYTES_SENT)
    return _Counters(sent=sent - retrans + notsent, received=received)


@dataclass
class WireMeter:
    """Context manager, on every rank: the bytes this rank sent to and received from each peer."""

    sent: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)

    def __enter__(self) -> Self:
        self._before = connections()
        return self

    def __exit__(self, *exc: object) -> None:
        after = connections()
        if exc[0] is not None:
            return
        ports: list[list[int]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(ports, [local for local, _ in after])
        owner = {port: rank for rank, owned in enumerate(ports) for port in owned}
        me = dist.get_rank()
        for key, now in after.items():
            peer = owner.get(key[1])
            if peer is None or peer == me:
                continue
            then = self._before.get(key, _Counters(0, 0))
            self.sent[peer] = self.sent.get(peer, 0) + now.sent - then.sent
            self.received[peer] = self.received.get(peer, 0) + now.received - then.received
        self.sent = dict(sorted(self.sent.items()))
        self.received = dict(sorted(self.received.items()))

    @property
    def total_sent(self) -> int:
        """Bytes this rank sent, to every peer."""
        return sum(self.sent.values())
