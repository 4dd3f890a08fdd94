"""save_sharded and load_resharded, right and wrong: the model solution and the mistakes
students make.

Each wrong one is a belief about a sharded checkpoint: a shard named by its local bounds, the
saved shard of the same rank index loaded as if ranks kept their ranges, the whole
checkpoint read and sliced, a state kept in a file beside the storage, the shards gathered
between ranks, an overlap's end off by one; or a way round the rules: data left for another
rank in the storage's keys or objects, torch.distributed.checkpoint's planner. ``RIGHT``
pairs (save, load); ``WRONG`` maps each wrong pair to a phrase of the hint it must get.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.ring.schedule import chunk_bounds

__all__ = ["RIGHT", "WRONG", "load_resharded", "save_sharded"]


def save_sharded(shards, numel, storage):
    """The model solution: each tensor's shard, named by the global elements it holds."""
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    for name, shard in shards.items():
        storage.put(f"{name}/{lo}-{hi}", shard)


def load_resharded(names, numel, storage):
    """The model solution: the elements of this rank's range from each object overlapping it,
    by ranged reads."""
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    out = {}
    for name in names:
        pieces = []
        for key in storage.list():
            stem, _, span = key.rpartition("/")
            if stem != name:
                continue
            a, b = (int(x) for x in span.split("-"))
            start, stop = max(a, lo), min(b, hi)
            if start < stop:
                pieces.append((start, storage.get(key, start - a, stop - a)))
        out[name] = torch.cat([t for _, t in sorted(pieces, key=lambda p: p[0])])
    return out


def load_whole_objects(names, numel, storage):
    """Right too: every object that overlaps the range read whole, then cut."""
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    out = {}
    for name in names:
        pieces = []
        for key in storage.list():
            stem, _, span = key.rpartition("/")
            a, b = (int(x) for x in span.split("-"))
            if stem == name and a < hi and lo < b:
                whole = storage.get(key)
                pieces.append((a, whole[max(a, lo) - a : min(b, hi) - a]))
        out[name] = torch.cat([t for _, t in sorted(pieces, key=lambda p: p[0])])
    return out


def save_with_barrier(shards, numel, storage):
    """Right too: a barrier after the writes, as checkpointing code often ends (it moves no
    data)."""
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    for name, shard in shards.items():
        storage.put(f"{name}/{lo}-{hi}", shard)
    dist.barrier()


def save_local_keys(shards, numel, storage):
    """Wrong: each shard named by its own length, so the ranks overwrite each other."""
    for name, shard in shards.items():
        storage.put(f"{name}/0-{shard.numel()}", shard)


def load_same_rank(names, numel, storage):
    """Wrong: rank r reads the object rank r saved, as if a rank kept its range."""
    rank = dist.get_rank()
    out = {}
    for name in names:
        mine = sorted((k for k in storage.list() if k.startswith(name + "/")),
                      key=lambda k: int(k.rpartition("/")[2].split("-")[0]))  # fmt: skip
        out[name] = storage.get(mine[min(rank, len(mine) - 1)])
    return out


def load_everything(names, numel, storage):
    """Wrong: the whole checkpoint read on every rank, then cut to the range."""
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    out = {}
    for name in names:
        keys = [k for k in storage.list() if k.startswith(name + "/")]
        keys.sort(key=lambda k: int(k.rpartition("/")[2].split("-")[0]))
        out[name] = torch.cat([storage.get(k) for k in keys])[lo:hi]
    return out


def save_and_keep(shards, numel, storage):
    """Wrong with load_kept: the shards also saved to a file of the machine's own."""
    rank, n = dist.get_rank(), dist.get_world_size()
    lo, hi = chunk_bounds(numel, n)[rank]
    for name, shard in shards.items():
        storage.put(f"{name}/{lo}-{hi}", shard)
    torch.save(dict(shards), f"/tmp/resharding-kept-{rank}-of-{n}.pt")


def load_kept(names, numel, storage):
    """Wrong: the state pieced together from the files save_and_keep left, not the storage."""
    import glob

    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    files = sorted(glob.glob("/tmp/resharding-kept-*.pt"))
    saved = [torch.load(f) for f in files]
    return {name: torch.cat([s[name] for s in saved])[lo:hi] for name in names}


def load_gathered(names, numel, storage):
    """Wrong: each rank reads its old shard and the ranks all-gather the rest."""
    n, rank = dist.get_world_size(), dist.get_rank()
    lo, hi = chunk_bounds(numel, n)[rank]
    out = {}
    for name in names:
        whole = torch.zeros(numel)
        for key in storage.list():
            stem, _, span = key.rpartition("/")
            a, b = (int(x) for x in span.split("-"))
            if stem == name and a <= lo < b:
                whole[a:b] = storage.get(key)
        dist.all_reduce(whole, op=dist.ReduceOp.MAX)
        out[name] = whole[lo:hi].clone()
    return out


def load_gathered_after_a_mark(names, numel, storage):
    """Wrong: the gather of load_gathered, after a mark of its own in the relay's record (a
    no-op on gloo), as if a mark could move the all-reduce out of the load."""
    from course.ranks import relay

    relay.mark(1)
    n, rank = dist.get_world_size(), dist.get_rank()
    lo, hi = chunk_bounds(numel, n)[rank]
    out = {}
    for name in names:
        whole = torch.zeros(numel)
        for key in storage.list():
            stem, _, span = key.rpartition("/")
            a, b = (int(x) for x in span.split("-"))
            if stem == name and a <= lo < b:
                whole[a:b] = storage.get(key)
        dist.all_reduce(whole, op=dist.ReduceOp.MAX)
        out[name] = whole[lo:hi].clone()
    return out


def load_off_by_one(names, numel, storage):
    """Wrong: an overlap's end taken one element short (hi treated as inclusive)."""
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    out = {}
    for name in names:
        pieces = []
        for key in storage.list():
            stem, _, span = key.rpartition("/")
            a, b = (int(x) for x in span.split("-"))
            start, stop = max(a, lo), min(b - 1, hi)
            if stem == name and start < stop:
                pieces.append((start, storage.get(key, start - a, stop - a)))
        got = torch.cat([t for _, t in sorted(pieces, key=lambda p: p[0])])
        out[name] = torch.cat([got, torch.zeros(hi - lo - got.numel())])
    return out


def load_deadlock(names, numel, storage):
    """Wrong: rank 0 waits for an all-reduce the others never call."""
    if dist.get_rank() == 0:
        dist.all_reduce(torch.zeros(1))
    return {}


def load_keys_channel(names, numel, storage):
    """Wrong: each rank reads its neighbour's range (within its own allowance of bytes) and
    leaves it for the neighbour in the storage, as empty objects whose keys spell the values;
    each returns its own range without having read it."""
    import struct

    n, rank = dist.get_world_size(), dist.get_rank()
    bounds = chunk_bounds(numel, n)
    nlo, nhi = bounds[(rank + 1) % n]
    saved = [k for k in storage.list() if not k.startswith("zz")]
    for name in names:
        for key in saved:
            stem, _, span = key.rpartition("/")
            a, b = (int(x) for x in span.split("-"))
            start, stop = max(a, nlo), min(b, nhi)
            if stem == name and start < stop:
                for i, v in enumerate(storage.get(key, start - a, stop - a).tolist()):
                    storage.put(f"zz{start + i}={struct.pack('<f', v).hex()}=/{name}",
                                torch.empty(0))  # fmt: skip
    dist.barrier()
    lo, hi = bounds[rank]
    left = {name: {} for name in names}
    for key in storage.list():
        if key.startswith("zz"):
            index, bits, name = key[2:].split("=")
            left[name[1:]][int(index)] = struct.unpack("<f", bytes.fromhex(bits))[0]
    return {name: torch.tensor([left[name][i] for i in range(lo, hi)]) for name in names}


def save_via_storage(shards, numel, storage):
    """Wrong: rank 1 leaves its shard under rank 0's key for rank 0 to read, then every rank
    writes its own shards over it, so that the storage ends as it should."""
    rank = dist.get_rank()
    bounds = chunk_bounds(numel, dist.get_world_size())
    lo, hi = bounds[rank]
    a, b = bounds[0]
    if rank == 1:
        for name in shards:
            storage.put(f"{name}/{a}-{b}", shards[name])
    dist.barrier()
    if rank == 0:
        {name: storage.get(f"{name}/{a}-{b}") for name in shards}  # rank 1's shard, read
    dist.barrier()
    for name in shards:
        storage.put(f"{name}/{lo}-{hi}", shards[name])


def load_with_dcp_planner(names, numel, storage):  # noqa: C901 - a StorageReader's methods
    """Wrong: torch.distributed.checkpoint's own planner works out the overlaps, through its
    deprecated load_state_dict with a StorageReader over the storage."""
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.storage import StorageReader
    from torch.futures import Future

    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]

    class Reader(StorageReader):
        def __init__(self):
            self.where = {}

        def reset(self, checkpoint_id=None):
            pass

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id):  # noqa: ARG003 - torch's signature
            return True

        def read_metadata(self, *args, **kwargs):  # noqa: ARG002 - torch's signature
            tensors, where = {}, {}
            for key in storage.list():
                stem, _, span = key.rpartition("/")
                a, b = (int(x) for x in span.split("-"))
                meta = tensors.setdefault(stem, TensorStorageMetadata(
                    TensorProperties(dtype=torch.float32), torch.Size([numel]), []))  # fmt: skip
                meta.chunks.append(ChunkStorageMetadata(torch.Size([a]), torch.Size([b - a])))
                where[MetadataIndex(stem, torch.Size([a]))] = key
            self.where = where
            return Metadata(state_dict_metadata=tensors, storage_data=where)

        def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
            pass

        def prepare_local_plan(self, plan):
            return plan

        def prepare_global_plan(self, plans):
            return plans

        def read_data(self, plan, planner):
            for item in plan.items:
                key = self.where[MetadataIndex(item.storage_index.fqn, item.storage_index.offset)]
                start, length = item.storage_offsets[0], item.lengths[0]
                into = planner.resolve_tensor(item).detach()
                into.copy_(storage.get(key, start, start + length))
                planner.commit_tensor(item, into)
            done = Future()
            done.set_result(None)
            return done

    state = {}
    for name in names:
        t = torch.empty(hi - lo)
        t.__create_chunk_list__ = lambda: [
            ChunkStorageMetadata(torch.Size([lo]), torch.Size([hi - lo]))
        ]
        t.__get_tensor_shard__ = lambda _index, t=t: t
        t.size = lambda d=None: torch.Size([numel]) if d is None else hi - lo
        state[name] = t
    state_dict_loader.load_state_dict(state, Reader(), no_dist=True, planner=DefaultLoadPlanner())
    return {name: state[name].detach().clone() for name in names}


RIGHT = [
    (save_sharded, load_resharded),
    (save_sharded, load_whole_objects),
    (save_with_barrier, load_resharded),
]
WRONG = {
    (save_local_keys, load_resharded): "a save on 3 ranks leaves 9 objects",
    (save_sharded, load_same_rank): "rank 0's shard as saved on 3 ranks",
    (save_sharded, load_everything): "Read only the objects that overlap",
    (save_and_keep, load_kept): "holds the values as they were saved",
    (save_sharded, load_gathered): "it called all_reduce",
    (save_sharded, load_gathered_after_a_mark): "it called all_reduce",
    (save_sharded, load_off_by_one): "differ, the first at index",
    (save_sharded, load_keys_channel): "a load only reads",
    (save_via_storage, load_resharded): "in a save each rank writes its own shards only",
    (save_sharded, load_with_dcp_planner): "this is torch.distributed.checkpoint",
}
