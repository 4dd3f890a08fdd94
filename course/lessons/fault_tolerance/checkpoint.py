"""What ``torch.distributed.checkpoint`` (DCP) writes and reads, measured on gloo ranks.

DCP (PyTorch docs, "Distributed Checkpoint - torch.distributed.checkpoint") saves one state
dict from N ranks at once: each rank makes a local plan of what it holds, the coordinator
(rank 0 by default) gathers the plans into a global one, the ranks write their items, and
the coordinator stores ``.metadata``, which says for each key its chunks and the file,
offset and length of each. Loading on M ranks, each rank states what it wants (its own
shard) and its storage reader fetches it from the files. :class:`RecordingWriter` and
:class:`RecordingReader` are torch's ``FileSystemWriter`` and ``FileSystemReader`` that also
keep what each rank wrote and the byte ranges of the files it read.

The rank functions are plain torch.distributed programs: ``torchrun --nproc-per-node 4`` on
a script calling ``save_on_rank(directory, 12, 1024)`` saves what ``save_state(4)`` does.
The state they save: ``weight``, ``arange(rows * cols)`` as a ``DTensor`` with ``Shard(0)``
over a CPU device mesh; ``bias``, a plain tensor the same on every rank (as DDP keeps one);
``exp_avg``, each rank's piece of a flat tensor kept as a plain tensor (ZeRO-1 by hand).
"""

from __future__ import annotations

import io
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from course.ranks import run

__all__ = [
    "Loaded",
    "Read",
    "RecordingReader",
    "RecordingWriter",
    "Reshard",
    "SaveRecord",
    "Written",
    "covered",
    "format_reshard",
    "format_save",
    "load_on_rank",
    "overlapping",
    "reshard",
    "save_on_rank",
    "save_state",
    "shard_rows",
    "sharded",
    "state_on_rank",
]

Span = tuple[int, int]  # [start, stop)


def shard_rows(rows: int, world_size: int) -> list[Span]:
    """Each rank's rows under ``Shard(0)``: ``torch.chunk``'s split, ceil(rows / N) a rank.

    DTensor shards as ``torch.chunk`` does (PyTorch docs, torch.distributed.tensor): 10 rows
    on 3 ranks are 4, 4 and 2, and the last ranks may hold none.
    """
    size = -(-rows // world_size) if rows else 0
    return [(min(r * size, rows), min((r + 1) * size, rows)) for r in range(world_size)]


def overlapping(chunks: list[Span], start: int, stop: int) -> list[int]:
    """The indices of the stored chunks that share a row with rows ``[start, stop)``."""
    return [i for i, (a, b) in enumerate(chunks) if a < stop and start < b and a < b]


def covered(spans: list[Span]) -> int:
    """How many distinct bytes a list of ``[start, stop)`` byte ranges covers."""
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


@dataclass(frozen=True)
class Written:
    """One item a rank wrote: its key, where it starts in the whole tensor, file and bytes."""

    fqn: str
    offsets: tuple[int, ...]
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class Read:
    """One stored chunk a rank opened: which item, which part it needed, the bytes it read."""

    fqn: str
    chunk_offsets: tuple[int, ...]
    needed_offsets: tuple[int, ...]
    needed_lengths: tuple[int, ...]
    file: str
    stored: Span  # the chunk's byte range in its file, as .metadata gives it
    taken: int  # distinct bytes of the file the reader consumed for it


@dataclass(frozen=True)
class Loaded:
    """What one rank loaded: its rows, what it read, whether the values came back exactly."""

    rank: int
    rows: Span
    shard_bytes: int
    reads: list[Read]
    metadata_reads: int
    exact: bool

    @property
    def bytes_read(self) -> int:
        """Distinct bytes read from the chunk files (``.metadata`` not counted)."""
        return sum(r.taken for r in self.reads)


@dataclass
class SaveRecord:
    """A ``dcp.save`` on N ranks: the files, who wrote what, and what the checkpoint holds."""

    world_size: int
    files: dict[str, int]  # name -> bytes on disk
    written: list[list[Written]]  # per rank, in rank order
    coordinators: list[int]  # the ranks that wrote .metadata
    chunks: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]]  # fqn -> (offsets, sizes)
    contents: dict[str, torch.Tensor] = field(default_factory=dict)  # read back, one process

    def __str__(self) -> str:
        return format_save(self)


@dataclass
class Reshard:
    """A checkpoint saved on N ranks and loaded on M: the save, then each loading rank."""

    save: SaveRecord
    shards: list[Loaded]

    def __str__(self) -> str:
        return format_reshard(self)


class RecordingWriter(FileSystemWriter):
    """torch's ``FileSystemWriter`` that keeps what this rank wrote and whether it wrote the
    ``.metadata`` (only the coordinator's writer is asked to ``finish``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.written: list[Written] = []
        self.wrote_metadata = False

    def write_data(self, plan: Any, planner: Any) -> Any:
        """Write this rank's items as torch does, and keep each item's file and byte range."""
        future = super().write_data(plan, planner)
        self.written = [
            Written(
                r.index.fqn,
                tuple(r.index.offset or ()),
                r.storage_data.relative_path,
                r.storage_data.offset,
                r.storage_data.length,
            )
            for r in future.wait()
        ]
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        """Write ``.metadata`` as torch does, and note that this rank did."""
        self.wrote_metadata = True
        super().finish(metadata, results)


class _CountingView(io.RawIOBase):
    """A stored chunk's byte range of an open file that notes each range read from it."""

    def __init__(self, base: Any, start: int, length: int) -> None:
        super().__init__()
        self.base, self.start, self.length = base, start, length
        self.spans: list[Span] = []
        base.seek(start)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Seek inside the chunk (offsets count from its first byte)."""
        if whence == os.SEEK_SET:
            offset += self.start
        elif whence == os.SEEK_END:
            offset, whence = self.start + self.length + offset, os.SEEK_SET
        return self.base.seek(offset, whence) - self.start

    def tell(self) -> int:
        """Where the next read starts, from the chunk's first byte."""
        return self.base.tell() - self.start

    def readable(self) -> bool:
        """It can be read."""
        return True

    seekable = readable  # torch.load seeks in it

    def readinto(self, buffer: Any) -> int:
        """Read up to the chunk's end, noting the file's byte range read."""
        left = self.length - self.tell()
        if left <= 0:
            return 0
        view = memoryview(buffer)[:left]
        at = self.base.tell()
        count = self.base.readinto(view)
        self.spans.append((at, at + count))
        return count


class RecordingReader(FileSystemReader):
    """torch's ``FileSystemReader`` that keeps every stored chunk this rank opened, the part
    of it the load plan needed, and the bytes of the file actually read for it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads: list[Read] = []
        self.metadata_reads = 0
        self._views: dict[int, _CountingView] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """Read ``.metadata`` as torch does, counting the reads."""
        self.metadata_reads += 1
        return super().read_metadata(*args, **kwargs)

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        self._views[id(sinfo)] = _CountingView(file, sinfo.offset, sinfo.length)
        return self._views[id(sinfo)]

    def read_data(self, plan: Any, planner: Any) -> Any:
        """Read as torch does, recording each stored chunk opened and the bytes read."""
        future = super().read_data(plan, planner)
        for item in plan.items:
            sinfo = self.storage_data[item.storage_index]
            self.reads.append(
                Read(
                    item.storage_index.fqn,
                    tuple(item.storage_index.offset),
                    tuple(item.storage_offsets),
                    tuple(item.lengths),
                    sinfo.relative_path,
                    (sinfo.offset, sinfo.offset + sinfo.length),
                    covered(self._views.pop(id(sinfo)).spans),
                )
            )
        return future


def sharded(tensor: torch.Tensor) -> DTensor:
    """``tensor`` split by rows over all ranks: a DTensor, ``Shard(0)``, on a CPU device mesh."""
    return distribute_tensor(tensor, init_device_mesh("cpu", (dist.get_world_size(),)), [Shard(0)])


def state_on_rank(rows: int, cols: int, bias: int = 0, flat: int = 0) -> dict[str, Any]:
    """This rank's state dict: ``weight`` sharded by rows (DTensor, ``Shard(0)``), ``bias`` the
    same on every rank, ``exp_avg`` this rank's piece of a flat tensor as a plain tensor."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state: dict[str, Any] = {}
    if rows:
        state["weight"] = sharded(torch.arange(rows * cols, dtype=torch.float32).view(rows, cols))
    if bias:
        state["bias"] = torch.arange(bias, dtype=torch.float32) + 0.5
    if flat:
        start, stop = shard_rows(flat, world_size)[rank]
        state["exp_avg"] = -torch.arange(start, stop, dtype=torch.float32) - 1
    return state


def save_on_rank(
    directory: str, rows: int, cols: int, bias: int = 0, flat: int = 0
) -> tuple[list[Written], bool]:
    """``dcp.save`` this rank's state; return what it wrote and whether it wrote ``.metadata``."""
    writer = RecordingWriter(directory)
    dcp.save(state_on_rank(rows, cols, bias, flat), storage_writer=writer)
    return writer.written, writer.wrote_metadata


def load_on_rank(directory: str, rows: int, cols: int) -> Loaded:
    """``dcp.load`` this rank's ``Shard(0)`` rows of ``weight`` from a checkpoint saved on any
    number of ranks; return what it read and whether the values are exactly the saved ones."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = {"weight": sharded(torch.zeros(rows, cols))}
    reader = RecordingReader(directory)
    dcp.load(state, storage_reader=reader)
    local = state["weight"].to_local()
    start, stop = shard_rows(rows, world_size)[rank]
    whole = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    exact, nbytes = torch.equal(local, whole[start:stop]), local.numel() * local.element_size()
    return Loaded(rank, (start, stop), nbytes, reader.reads, reader.metadata_reads, exact)


def _contents(directory: str, chunks: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint read back whole in this one process (no ranks)."""
    reader = FileSystemReader(directory)
    sizes = reader.read_metadata().state_dict_metadata
    state = {fqn: torch.zeros(tuple(sizes[fqn].size)) for fqn in chunks}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state


def _record(directory: str, world_size: int, per_rank: list[Any]) -> SaveRecord:
    """The files of a saved checkpoint, its ``.metadata``'s chunks and its tensors."""
    files = {n: os.path.getsize(os.path.join(directory, n)) for n in sorted(os.listdir(directory))}
    meta = FileSystemReader(directory).read_metadata().state_dict_metadata
    chunks = {
        fqn: [(tuple(c.offsets), tuple(c.sizes)) for c in m.chunks]
        for fqn, m in meta.items()
        if hasattr(m, "chunks")
    }
    written = [items for items, _ in per_rank]
    coordinators = [r for r, (_, coordinator) in enumerate(per_rank) if coordinator]
    return SaveRecord(
        world_size, files, written, coordinators, chunks, _contents(directory, chunks)
    )


def save_state(
    world_size: int, rows: int = 12, cols: int = 1024, bias: int = 0, flat: int = 0
) -> SaveRecord:
    """``dcp.save`` on ``world_size`` gloo ranks into a fresh directory (removed after), and
    what it wrote: files, bytes, the items of each rank, ``.metadata``, the values."""
    with tempfile.TemporaryDirectory(prefix="dcp-") as directory:
        per_rank = run(save_on_rank, world_size, directory, rows, cols, bias, flat)
        return _record(directory, world_size, per_rank)


def reshard(rows: int = 12, cols: int = 1024, saved_on: int = 2, loaded_on: int = 3) -> Reshard:
    """Save ``weight`` (rows x cols, ``Shard(0)``) on ``saved_on`` ranks, load it on
    ``loaded_on``, each rank asking for its own rows: what each wrote, read and got."""
    with tempfile.TemporaryDirectory(prefix="dcp-") as directory:
        per_rank = run(save_on_rank, saved_on, directory, rows, cols)
        saved = _record(directory, saved_on, per_rank)
        shards = run(load_on_rank, loaded_on, directory, rows, cols)
    return Reshard(saved, shards)


def _item(w: Written, record: SaveRecord) -> str:
    """One written item: its key and, for a chunk of rows, which rows."""
    for offsets, sizes in record.chunks.get(w.fqn, []):
        if offsets == w.offsets and len(sizes) == 2:
            return f"{w.fqn} rows {offsets[0]}-{offsets[0] + sizes[0] - 1}"
    return w.fqn


def format_save(record: SaveRecord) -> str:
    """A saved checkpoint as a table: each file, its bytes, the rank that wrote it, what it
    holds, then the chunks that ``.metadata`` lists for each key."""
    lines = [f"dcp.save on {record.world_size} ranks", f"{'file':<14}{'bytes':>9}  written by"]
    for name, size in record.files.items():
        if name == ".metadata":
            who, what = ", ".join(f"rank {r}" for r in record.coordinators), "the plan"
        else:
            rank = int(name[2:].split("_")[0])
            who = f"rank {rank}"
            what = ", ".join(_item(w, record) for w in record.written[rank]) or "nothing"
        lines.append(f"{name:<14}{size:>9,}  {who:<8} {what}")
    lines.append(".metadata lists (offsets, sizes) of each chunk:")
    lines += [f"  {fqn}: {chunks}" for fqn, chunks in record.chunks.items()]
    return "\n".join(lines)


def format_reshard(result: Reshard) -> str:
    """A resharded load as text: per loading rank, its rows, the stored chunks it opened, the
    bytes it read from each, against its shard's bytes; and whether its values are exact."""
    chunks = dict(result.save.chunks["weight"])
    lines = [format_save(result.save), f"dcp.load on {len(result.shards)} ranks"]
    for s in result.shards:
        lines.append(
            f"rank {s.rank}: asks for rows {s.rows[0]}-{s.rows[1] - 1} ({s.shard_bytes:,} B), "
            f"reads {s.bytes_read:,} B from the files; values exact: {s.exact}"
        )
        for r in s.reads:
            first = r.chunk_offsets[0]
            needed = first + r.needed_offsets[0]
            lines.append(
                f"    {r.file} rows {first}-{first + chunks[r.chunk_offsets][0] - 1} "
                f"(bytes {r.stored[0]:,}-{r.stored[1]:,}): needs rows "
                f"{needed}-{needed + r.needed_lengths[0] - 1}, reads {r.taken:,} B"
            )
    return "\n".join(lines)
