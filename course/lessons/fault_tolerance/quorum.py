"""torchft's per-step quorum and live recovery, measured on replicas that leave and come back.

    from course.lessons.fault_tolerance.quorum import fail_and_recover
    record = fail_and_recover(replicas=3, leave_at=2, back_at=4, steps=6)

Each rank is one replica group (of one process) with a ``torchft.Manager`` on gloo; a torchft
Lighthouse, started here on a free loopback port, forms a quorum before every step. Replica
``replicas - 1`` leaves at step ``leave_at``: ``"before quorum"`` (it asks for no quorum; its
heartbeats stop) or ``"mid-step"`` (it is in step ``leave_at``'s quorum, then drops out before
the all-reduce, its sockets closed as a crash would close them). If ``back_at`` is set, it
comes back, with a fresh model, once the others have committed ``back_at`` steps, and heals
from a live peer over torchft's HTTP checkpoint transport. Every replica records, per step,
what it saw: the quorum, ``num_participants``, ``should_commit``, its parameters.

The loop is torchft's own (``Manager.start_quorum``, ``Manager.allreduce``,
``Manager.should_commit``; ``torchft.Optimizer`` makes the same calls): see
https://github.com/pytorch/torchft and its ``manager_integ_test.py``. Everything started here
stops before the call returns: the ranks, their servers, the Lighthouse.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from course.models import toy_model
from course.ranks import run

# torchft's Rust servers log every quorum at INFO; their logger reads RUST_LOG once, when
# torchft's extension is first imported, so this line must come before that import.
os.environ.setdefault("RUST_LOG", "warn")
from torchft import Manager, ProcessGroupGloo
from torchft._torchft import LighthouseServer
from torchft.checkpointing._serialization import _streaming_load
from torchft.checkpointing.http_transport import HTTPTransport

__all__ = [
    "WHEN",
    "batch",
    "fail_and_recover",
    "flat",
    "lighthouse",
    "oracle_step",
    "recovery_report",
    "steps_table",
    "train_replica",
]

WHEN = ("before quorum", "mid-step")
TIMEOUT = timedelta(seconds=5)  # torchft's own waits: all-reduce, should_commit, recovery
HEARTBEAT_MS = 2000  # the Lighthouse drops a replica whose heartbeats stop for this long
JOIN_MS = 30000  # the longest the Lighthouse waits for a heartbeating replica to ask to join
WIDTH, DEPTH = 32, 4  # the model: 4 bias-free 32x32 layers, 4096 parameters, 16 KiB in fp32


@contextlib.contextmanager
def lighthouse(min_replicas: int = 2) -> Iterator[str]:
    """A torchft Lighthouse on a free loopback port (its address), shut down on exit."""
    server = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=min_replicas,
        join_timeout_ms=JOIN_MS,
        heartbeat_timeout_ms=HEARTBEAT_MS,
    )
    try:
        yield "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]
    finally:
        server.shutdown()


def batch(replica: int, step: int, size: int = 8, width: int = WIDTH) -> tuple:
    """Replica ``replica``'s batch ``(x, y)`` at ``step``: fixed by the two, so an oracle can
    recompute it in one process."""
    g = torch.Generator().manual_seed(1000 * replica + step)
    return torch.randn(size, width, generator=g), torch.randn(size, width, generator=g)


def flat(tensors: Any) -> torch.Tensor:
    """Parameters (a module, or a list of tensors) as one flat fp32 vector."""
    if isinstance(tensors, nn.Module):
        tensors = list(tensors.parameters())
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def oracle_step(params: torch.Tensor, survivors: list[int], step: int, lr: float) -> torch.Tensor:
    """One SGD step in one process over the survivors' batches put together: what synchronous
    data parallelism over exactly those replicas computes (Li et al., VLDB 2020, on DDP)."""
    model = toy_model(0, WIDTH, DEPTH)
    torch.nn.utils.vector_to_parameters(params, model.parameters())
    xs, ys = zip(*(batch(r, step) for r in survivors), strict=True)
    nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
    with torch.no_grad():
        return params - lr * flat([p.grad for p in model.parameters()])


class _Replica:
    """One replica group of one process: its model, optimizer and torchft Manager."""

    def __init__(
        self, lighthouse_addr: str, store: Any, optimizer: str, lr: float, seed: int
    ) -> None:
        self.model = toy_model(seed, WIDTH, DEPTH)
        optim = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
        self.opt = optim(self.model.parameters(), lr=lr)
        self.transport = CountingTransport(timeout=TIMEOUT, num_chunks=0)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=TIMEOUT),
            load_state_dict=self.load_state_dict,
            state_dict=self.state_dict,
            min_replica_size=2,
            timeout=TIMEOUT,
            quorum_timeout=timedelta(seconds=20),
            connect_timeout=TIMEOUT,
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lighthouse_addr,
            replica_id=f"replica_{dist.get_rank()}",
            hostname="127.0.0.1",
            checkpoint_transport=self.transport,
            init_sync=False,  # every replica starts from the same seed
        )

    def state_dict(self) -> dict:
        """What a live peer sends a recovering replica: the model's and optimizer's state."""
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Take a peer's state, as torchft calls it when this replica heals."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])

    def step(self, replica: int, drop_out: bool = False, quorum_started: bool = False) -> dict:
        """One torchft step (the calls ``torchft.Optimizer`` makes); what this replica saw."""
        manager, step = self.manager, self.manager.current_step()
        if not quorum_started:
            manager.start_quorum()
        self.opt.zero_grad()
        x, y = batch(replica, step)
        nn.functional.mse_loss(self.model(x), y).backward()
        if drop_out:  # in this step's quorum; gone before its all-reduce, as in a crash
            manager.wait_quorum()
            return {"step": step, "left": True}
        for p in self.model.parameters():
            manager.allreduce(p.grad).wait()
        seen = {
            "step": step,
            "quorum_id": manager._quorum_id,  # noqa: SLF001 - torchft has no public getter
            "participants": manager.num_participants(),
            "participating": manager.is_participating(),
            "healing": manager._healing,  # noqa: SLF001 - nor for this
        }
        seen["committed"] = manager.should_commit()
        seen["step"] = manager.current_step() - seen["committed"]  # a healed replica's is new
        error = manager.errored()
        seen["error"] = str(error.original_exception).split("\n")[0][:120] if error else None
        if seen["committed"]:
            self.opt.step()
        seen["params"] = flat(self.model).clone()
        return seen

    def close(self) -> None:
        """Stop this replica's servers and connections: to its peers it is gone."""
        self.manager.shutdown(wait=True)
        self.manager._pg.abort(errored=False)  # noqa: SLF001 - its sockets close now


class CountingTransport(HTTPTransport):
    """torchft's HTTP checkpoint transport, on loopback, counting what a healing replica
    receives: the bytes of the body, and the tensor bytes of each part of the state."""

    received = 0
    parts: dict[str, int] = {}  # noqa: RUF012 - replaced, never mutated in place

    def address(self) -> str:
        """Loopback, whatever the host name resolves to."""
        return f"http://127.0.0.1:{self._server.socket.getsockname()[1]}/checkpoint/"

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: Any) -> Any:  # noqa: ARG002 - torchft passes it
        """Fetch the peer's whole state, as ``HTTPTransport`` does, and count it."""
        url = f"{metadata}{step}/full"  # http://127.0.0.1:<port>/..., our own address()
        with urllib.request.urlopen(url, timeout=timeout.total_seconds()) as f:  # noqa: S310 - http
            body = f.read()
        state = _streaming_load(io.BytesIO(body), weights_only=False)
        self.received = len(body)
        self.parts = {k: _tensor_bytes(v) for k, v in state["user"]["default"].items()}
        self.parts["torchft"] = _tensor_bytes(state["torchft"])
        return state


def _tensor_bytes(tree: Any) -> int:
    """The bytes of the tensors in a nested state."""
    leaves = tree_leaves(tree)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _lighthouse_sees(address: str, asking: int = 0, heartbeating: int = 0) -> None:
    """Wait until the Lighthouse's status page counts ``asking`` pending quorum requests and
    ``heartbeating`` live replicas: the stage directions that keep every run the same (no
    replica is left out of a quorum because it was a moment late)."""
    pattern = re.compile(r"\[(\d+)/\d+ participants healthy\]\[(\d+) heartbeating\]")
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        status = f"{address}/status"  # the Lighthouse started here, on loopback
        with urllib.request.urlopen(status, timeout=TIMEOUT.total_seconds()) as f:  # noqa: S310 - http
            seen = pattern.search(f.read().decode())
        if seen and int(seen.group(1)) >= asking and int(seen.group(2)) >= heartbeating:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the Lighthouse did not see {asking} asking, {heartbeating} heartbeating")


def _survive(me: _Replica, side: Any, steps: int, back_at: int | None) -> list[dict]:
    """Train until ``steps`` steps are committed; before step ``back_at``, wait for the
    returning replica to ask for a quorum first."""
    seen: list[dict] = []
    while me.manager.current_step() < steps:
        step = me.manager.current_step()
        if step == back_at and not any(s["step"] == step for s in seen):
            side.wait(["ft/back"], timedelta(seconds=30))
        seen.append(me.step(dist.get_rank()))
        if seen[-1]["committed"]:
            side.set(f"ft/committed/{step}", "1")
        if len(seen) > 3 * steps:
            raise RuntimeError(f"no progress: {len(seen)} tries for {steps} steps")
    return seen


def _leave_and_return(me: _Replica, side: Any, plan: dict) -> tuple[_Replica, list[dict], dict]:
    """Train until ``leave_at``, leave (before its quorum, or in the middle of the step); come
    back with a fresh model once the others have committed ``back_at`` steps."""
    rank, seen = dist.get_rank(), []
    while me.manager.current_step() < plan["leave_at"]:
        seen.append(me.step(rank))
    if plan["when"] == "mid-step":
        seen.append(me.step(rank, drop_out=True))
    me.close()
    left = {"left_at": plan["leave_at"], "received_bytes": 0}
    if plan["back_at"] is None:
        return me, seen, left
    side.wait([f"ft/committed/{plan['back_at'] - 1}"], timedelta(seconds=30))
    me = _Replica(plan["address"], plan["store"], plan["optimizer"], plan["lr"], seed=1)
    me.manager.start_quorum()  # asynchronous: it asks the Lighthouse and fetches the state
    _lighthouse_sees(plan["address"], asking=1)  # the others wait for it to ask first
    side.set("ft/back", "1")
    seen.append(me.step(rank, quorum_started=True))
    left["healed_to"] = seen[-1]["step"]  # the step it took part in first, on a peer's state
    left["received_bytes"] = me.transport.received
    left["received_parts"] = me.transport.parts
    while me.manager.current_step() < plan["steps"]:
        seen.append(me.step(rank))
    return me, seen, left


def _final(me: _Replica) -> dict:
    """What a replica ends with: parameters, optimizer state, torchft's step counters."""
    optim = me.opt.state_dict()["state"]
    return {
        "params": flat(me.model).clone(),
        "optim": {(i, k): v for i, s in optim.items() for k, v in s.items()},
        "manager": me.manager.state_dict(),
        "param_bytes": sum(p.numel() * p.element_size() for p in me.model.parameters()),
    }


def train_replica(
    address: str,
    steps: int,
    leave_at: int | None,
    back_at: int | None,
    when: str,
    optimizer: str,
    lr: float,
) -> dict:
    """On every rank: one replica group under torchft; the last rank leaves at ``leave_at``
    (and comes back at ``back_at``). What this replica saw, step by step, and its end state."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    side = dist.distributed_c10d._get_default_store()  # noqa: SLF001 - stage directions
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    me = _Replica(address, store, optimizer, lr, seed=0)
    _lighthouse_sees(address, heartbeating=world_size)  # no replica late for the first quorum
    out: dict = {"replica": rank, "left_at": None, "healed_to": None, "received_bytes": 0}
    out["received_parts"] = {}
    try:
        if leave_at is not None and rank == world_size - 1:
            plan = {"address": address, "store": store, "steps": steps, "when": when}
            plan |= {"leave_at": leave_at, "back_at": back_at, "optimizer": optimizer, "lr": lr}
            me, out["seen"], left = _leave_and_return(me, side, plan)
            out.update(left)
        else:
            out["seen"] = _survive(me, side, steps, back_at)
        out.update(_final(me))
    finally:
        me.close()
    return out


def fail_and_recover(
    replicas: int = 3,
    steps: int = 5,
    leave_at: int | None = 2,
    back_at: int | None = None,
    when: str = "before quorum",
    optimizer: str = "sgd",
    lr: float = 0.1,
    timeout: float = 90.0,
) -> list[dict]:
    """Run ``replicas`` torchft replicas (2 to 4) on gloo ranks under a Lighthouse started
    here; the last leaves at ``leave_at`` ``when`` (see ``WHEN``) and, with ``back_at``,
    comes back. Per replica, in rank order, what it saw (``seen``) and ended with."""
    if not 2 <= replicas <= 4:
        raise ValueError(
            f"replicas must be 2 to 4 (this machine runs each as a process), not {replicas}"
        )
    if when not in WHEN:
        raise ValueError(f"when must be one of {WHEN}, not {when!r}")
    if leave_at is not None and back_at is not None and not leave_at < back_at < steps:
        raise ValueError(f"need leave_at < back_at < steps, got {leave_at}, {back_at}, {steps}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', not {optimizer!r}")
    args = (steps, leave_at, back_at, when, optimizer, lr)
    with lighthouse() as address:
        return run(train_replica, replicas, address, *args, timeout=timeout)


def _members(record: list[dict], step: int, quorum_id: int) -> list[int]:
    """The replicas whose gradients step ``step`` of quorum ``quorum_id`` averaged."""
    return [
        r["replica"]
        for r in record
        for s in r["seen"]
        if (s["step"], s.get("quorum_id"), s.get("participating")) == (step, quorum_id, True)
    ]


def steps_table(record: list[dict], lr: float = 0.1) -> str:
    """Every try of every step, per replica: the quorum, ``num_participants``,
    ``should_commit``, and (SGD) how far the parameters are from one process's SGD step over
    the batches of the replicas in the quorum."""
    rows = ["replica  step  quorum  num_participants  should_commit  |params - one process|"]
    for r in record:
        before = flat(toy_model(0, WIDTH, DEPTH))
        for s in r["seen"]:
            if s.get("left"):
                rows.append(f"{r['replica']:>7}  {s['step']:>4}  (left in the middle of it)")
                continue
            gap = ""
            if s["committed"] and s["participating"]:
                members = _members(record, s["step"], s["quorum_id"])
                oracle = oracle_step(before, members, s["step"], lr)
                gap = f"{(s['params'] - oracle).abs().max().item():.1e}"
            rows.append(
                f"{r['replica']:>7}  {s['step']:>4}  {s['quorum_id']:>6}  "
                f"{s['participants']:>16}  {s['committed']!s:>13}  {gap:>21}"
            )
            before = s["params"]
    return "\n".join(rows)


def recovery_report(record: list[dict]) -> str:
    """What the replica that came back received and lost, and whether it matches a peer."""
    b, p = next(r for r in record if r["healed_to"] is not None), record[0]
    heal = next(s for s in b["seen"] if s["step"] == b["healed_to"])
    return (
        f"replica {b['replica']} left before step {b['left_at']}; back at step {b['healed_to']}\n"
        f"  received from a live peer: {b['received_bytes']:,} bytes "
        f"(its model's parameters: {b['param_bytes']:,} bytes)\n"
        f"  at step {b['healed_to']}: participating {heal['participating']}, "
        f"num_participants {heal['participants']}\n"
        f"  torchft step counter at the end: {b['manager']['step']} (replica {p['replica']}: "
        f"{p['manager']['step']})\n"
        f"  parameters bit for bit those of replica {p['replica']}: "
        f"{torch.equal(b['params'], p['params'])}"
    )
