"""What does ``torch.distributed.checkpoint`` write and read on real gloo ranks, and which
option of each checkpoint quiz item do those measurements support?

Every experiment saves into a fresh directory that it removes. Bytes, files, chunks and values
decide; nothing here is timed.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from quiz import keys, supported

from course.lessons.fault_tolerance import checkpoint as ckpt
from course.ranks import launch

KEYS = keys("fault_tolerance")  # read from the source notebook
KEY_PLAIN_SHARDS = KEYS["fault_tolerance_5"]  # ZeRO-1 pieces as plain tensors under one key
KEY_RESHARD_READS = KEYS["fault_tolerance_6"]  # what rank 1 reads: 4 ranks' checkpoint on 3

ROWS, COLS = 12, 1024  # the weight of the cells and of the explanations: 48 KB of float32
FLAT = 4096  # ITEM_A's exp_avg, scaled down: 4 quarters of 1024 floats


@pytest.fixture(scope="module")
def saved_on_two() -> ckpt.SaveRecord:
    """The measuring cell's save: the weight on 2 ranks, a 1024-float bias on both."""
    return ckpt.save_state(2, ROWS, COLS, bias=1024)


@pytest.fixture(scope="module")
def resharded() -> dict[tuple[int, int, int], ckpt.Reshard]:
    """The weight saved on N ranks and loaded on M, for (rows, N, M): more ranks, fewer, and
    uneven splits that do not line up (10 rows: 4, 4, 2 saved, 3, 3, 3, 1 or 5, 5 loaded)."""
    cases = [(ROWS, 4, 3), (ROWS, 2, 3), (ROWS, 4, 2), (10, 3, 4), (10, 3, 2)]
    return {(rows, n, m): ckpt.reshard(rows, COLS, n, m) for rows, n, m in cases}


# ---- the pure core -------------------------------------------------------------------------------


def test_shard_rows_splits_as_torch_chunk_does() -> None:
    """Are the rows of each rank, for 0 to 20 rows on 1 to 5 ranks, torch.chunk's pieces (the
    last ranks with none where chunk makes fewer), covering every row once?"""
    for rows in range(21):
        for n in range(1, 6):
            spans = ckpt.shard_rows(rows, n)
            sizes = [b - a for a, b in spans]
            chunked = [len(c) for c in torch.arange(rows).chunk(n)] if rows else []
            assert sizes == chunked + [0] * (n - len(chunked)), (rows, n)
            assert sum(sizes) == rows and all(a <= b for a, b in spans)
    assert ckpt.shard_rows(10, 3) == [(0, 4), (4, 8), (8, 10)]


def test_overlapping_and_covered() -> None:
    """Do rows 4-7 touch the 2nd and 3rd of four 3-row chunks, and do byte ranges that overlap
    or repeat count once?"""
    chunks = ckpt.shard_rows(12, 4)
    assert ckpt.overlapping(chunks, 4, 8) == [1, 2]
    assert ckpt.overlapping(chunks, 0, 3) == [0]
    assert ckpt.overlapping([(0, 4), (4, 4)], 3, 9) == [0]  # an empty chunk touches nothing
    assert ckpt.covered([(0, 10), (5, 15), (0, 10), (20, 21)]) == 16
    assert ckpt.covered([]) == 0


# ---- what each rank writes -----------------------------------------------------------------------


@pytest.mark.ranks
def test_each_rank_writes_its_own_rows_and_rank_0_adds_the_metadata(saved_on_two) -> None:
    """On 2 ranks, does each rank write its own rows of the weight to its own file, rank 0
    alone write .metadata, the bias land once, and no file hold more than its items?"""
    rec = saved_on_two
    assert set(rec.files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert rec.coordinators == [0]
    for rank in range(2):
        weight = [w for w in rec.written[rank] if w.fqn == "weight"]
        assert [(w.offsets, w.file) for w in weight] == [((6 * rank, 0), f"__{rank}_0.distcp")]
        assert sum(w.length for w in rec.written[rank]) == rec.files[f"__{rank}_0.distcp"]
    biases = [w for items in rec.written for w in items if w.fqn == "bias"]
    assert len(biases) == 1 and rec.chunks["bias"] == [((0,), (1024,))]
    data = 6 * COLS * 4
    weight_record = rec.written[0][0].length
    assert data < weight_record < data + 2048  # a torch.save record: the bytes and a header
    whole = torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS)
    assert torch.equal(rec.contents["weight"], whole)
    assert torch.equal(rec.contents["bias"], torch.arange(1024, dtype=torch.float32) + 0.5)
    print(rec)


# ---- what each rank reads ------------------------------------------------------------------------


@pytest.mark.ranks
def test_a_checkpoint_loads_on_more_or_fewer_ranks_exactly(resharded) -> None:
    """Saved on N ranks and loaded on M != N (4 -> 3, 2 -> 3, 4 -> 2, and 10 rows 3 -> 4, 3 -> 2,
    whose splits do not line up), does every rank get its rows bit for bit with no other step,
    read .metadata once itself, and open exactly the stored chunks its rows overlap?"""
    for (rows, n, m), result in resharded.items():
        stored = ckpt.shard_rows(rows, n)
        assert [c[0][0] for c in result.save.chunks["weight"]] == [a for a, b in stored if b > a]
        for s in result.shards:
            assert s.exact and s.metadata_reads == 1, (rows, n, m, s.rank)
            assert s.rows == ckpt.shard_rows(rows, m)[s.rank]
            opened = sorted(r.chunk_offsets[0] for r in s.reads)
            assert opened == [stored[i][0] for i in ckpt.overlapping(stored, *s.rows)]


@pytest.mark.ranks
def test_each_read_takes_the_whole_stored_chunk(resharded) -> None:
    """Does every rank read all the data bytes of each stored chunk it opens, even where it
    needs a part of its rows (the plan's ReadItem asks for fewer)?"""
    for (rows, n, m), result in resharded.items():
        for s in result.shards:
            for r in s.reads:
                chunk_rows = dict(result.save.chunks["weight"])[r.chunk_offsets][0]
                assert chunk_rows * COLS * 4 <= r.taken <= r.stored[1] - r.stored[0]
                assert r.needed_lengths[0] <= chunk_rows, (rows, n, m)
    partial = [r for s in resharded[ROWS, 4, 3].shards for r in s.reads if r.needed_lengths[0] < 3]
    assert len(partial) == 4  # 4 -> 3: four of the six reads need 1 or 2 of the 3 rows


# ---- the keys ------------------------------------------------------------------------------------


def _pieces(world_size: int, flat: int) -> list[torch.Tensor]:
    """Each rank's piece of ``exp_avg`` as ``state_on_rank`` makes it."""
    spans = ckpt.shard_rows(flat, world_size)
    return [-torch.arange(a, b, dtype=torch.float32) - 1 for a, b in spans]


@pytest.mark.ranks
def test_item_a_plain_pieces_under_one_key_keep_one_rank_s(no_leftovers) -> None:
    """Four ranks each pass their quarter of a flat exp_avg as a plain tensor under "exp_avg"
    to dcp.save: does no rank raise, and does the checkpoint hold one chunk, exactly one rank's
    quarter, with the other ranks' files empty, not four chunks nor rank 0 gathering them?
    Also with a sharded weight before it (another rank's quarter is kept) and unequal pieces
    (10 floats on 3 ranks: 4, 4, 2)."""
    with tempfile.TemporaryDirectory(prefix="dcp-") as directory:
        raised = not launch(ckpt.save_on_rank, 4, directory, 0, 0, 0, FLAT, timeout=30.0).ok
    alone = ckpt.save_state(4, 0, 0, flat=FLAT)
    after_weight = ckpt.save_state(4, ROWS, COLS, flat=FLAT)
    uneven = ckpt.save_state(3, 0, 0, flat=10)
    kept = {}
    for name, rec in {"alone": alone, "after_weight": after_weight, "uneven": uneven}.items():
        pieces = _pieces(rec.world_size, FLAT if rec is not uneven else 10)
        saved = rec.contents["exp_avg"]
        same = [r for r, p in enumerate(pieces) if p.shape == saved.shape and torch.equal(p, saved)]
        writers = [r for r, items in enumerate(rec.written) for w in items if w.fqn == "exp_avg"]
        kept[name] = (same, writers, rec.chunks["exp_avg"])
        print(name, kept[name], rec.files)
    assert kept["alone"][:2] == ([0], [0])
    assert kept["after_weight"][:2] == ([1], [1])  # not rank 0's: the plans' balance decides
    assert kept["uneven"][:2] == ([0], [0]) and kept["uneven"][2] == [((0,), (4,))]
    assert [alone.files[f"__{r}_0.distcp"] for r in (1, 2, 3)] == [0, 0, 0]
    # the explanation's bytes (torch 2.13's torch.save records and .metadata)
    assert (alone.files["__0_0.distcp"], alone.files[".metadata"]) == (5673, 856)
    assert [after_weight.files[f"__{r}_0.distcp"] for r in range(4)] == [13865, 19538, 13865, 13865]
    one_kept = all(len(s) == 1 and w == s and len(c) == 1 for s, w, c in kept.values())
    options = {
        "a": not raised and len(alone.chunks["exp_avg"]) == 4,
        "b": not raised and one_kept,
        "c": raised,
        "d": not raised and alone.chunks["exp_avg"] == [((0,), (FLAT,))],
    }
    assert supported(options) == KEY_PLAIN_SHARDS


def _load_plain(directory: str, numel: int) -> torch.Tensor:
    """On a rank: ``exp_avg`` loaded into a plain tensor of ``numel`` floats."""
    import torch.distributed.checkpoint as dcp

    state = {"exp_avg": torch.zeros(numel)}
    dcp.load(state, checkpoint_id=directory)
    return state["exp_avg"]


@pytest.mark.ranks
def test_item_a_a_restart_gives_every_rank_the_quarter_kept(run_ranks) -> None:
    """Loaded back on the 4 ranks that saved their quarters as plain tensors, does every rank
    get the one quarter kept, rank 0's, whatever it had saved?"""
    with tempfile.TemporaryDirectory(prefix="dcp-") as directory:
        run_ranks(ckpt.save_on_rank, 4, directory, 0, 0, 0, FLAT)
        loaded = run_ranks(_load_plain, 4, directory, FLAT // 4)
    kept = _pieces(4, FLAT)[0]
    assert all(torch.equal(t, kept) for t in loaded)


@pytest.mark.ranks
def test_item_b_rank_1_reads_the_two_saved_shards_its_rows_overlap(resharded) -> None:
    """A weight saved on 4 ranks, loaded on 3: does rank 1 (rows 4-7 of 12) read the two saved
    shards its rows overlap, whole (1.5 times its shard in data bytes), and not only its rows,
    not all four files, not one shard with the rest from a peer?"""
    result = resharded[ROWS, 4, 3]
    rank1 = result.shards[1]
    shard_data = 4 * COLS * 4
    chunk_data = 3 * COLS * 4
    files = sorted({r.file for r in rank1.reads})
    whole_chunks = all(r.taken >= chunk_data for r in rank1.reads)
    rows_read = sum(3 for r in rank1.reads if r.taken >= chunk_data)
    print(rank1, result.save.files)
    assert rank1.exact and rank1.rows == (4, 8)
    options = {
        "a": rank1.bytes_read <= shard_data * 1.1,  # its own rows' bytes, and headers
        "b": files == [f"__{r}_0.distcp" for r in range(4)],
        "c": files == ["__1_0.distcp", "__2_0.distcp"] and whole_chunks and rows_read == 6,
        "d": len(files) == 1,
    }
    assert supported(options) == KEY_RESHARD_READS
    assert rank1.bytes_read == 2 * rank1.reads[0].taken
    # the explanation's bytes (torch 2.13): two records of 13,865 B, 13,477 B read of each
    assert [(r.stored, r.taken) for r in rank1.reads] == [((0, 13865), 13477)] * 2
    assert [len(s.reads) for s in result.shards] == [2, 2, 2]
    assert 1.5 < rank1.bytes_read / shard_data < 1.7  # 6 rows of data for 4, and two headers
