"""Sequence-parallel exchanges (streamplan._C.rows_to_heads / heads_to_rows, ring and Ulysses attention) over
gloo process groups of 2 and 4 CPU processes: the Ulysses all-to-all against slicing the whole
tensor, and its inverse back to each rank's rows, bit for bit; ring and Ulysses attention against
attention over the whole sequence in one process; uneven row and head counts, a rank with no rows."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from streamplan import _C


def _rank(rank: int, world: int, store: str, rows_total: int, heads: int, dtype: torch.dtype) -> None:
    import streamplan._C as C

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        full = torch.randn(rows_total, heads, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
        rows, hs = C.shares(rows_total, world), C.shares(heads, world)
        r0, h0 = sum(rows[:rank]), sum(hs[:rank])
        mine = full[r0:r0 + rows[rank]]
        got = C.rows_to_heads(dist.group.WORLD, mine, rows, hs)
        assert torch.equal(got, full[:, h0:h0 + hs[rank]]), f"rank {rank}: rows_to_heads differs from the slice"
        back = C.heads_to_rows(dist.group.WORLD, got, rows, hs)
        assert torch.equal(back, mine), f"rank {rank}: heads_to_rows does not give back the rank's rows"
        with pytest.raises(ValueError, match="head counts for a process group of"):
            C.rows_to_heads(dist.group.WORLD, mine, rows, hs[:-1])
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,rows_total,heads,dtype", [
    (2, 37, 40, torch.float32),   # Wan's 40 heads, an odd row count
    (4, 37, 6, torch.bfloat16),   # heads 2, 2, 1, 1
    (4, 3, 24, torch.float32),    # rows 1, 1, 1, 0
])
def test_ulysses_exchange_matches_slicing_and_inverts(tmp_path, world, rows_total, heads, dtype):
    mp.spawn(_rank, args=(world, str(tmp_path / "store"), rows_total, heads, dtype), nprocs=world, join=True)


def _ring_rank(rank: int, world: int, store: str, rows_total: int, heads: int, groups: int, dtype: torch.dtype) -> None:
    import torch.nn.functional as F

    import streamplan._C as C

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(rows_total, h, 16, generator=g).to(dtype) for h in (heads, groups, groups))
        rows = C.shares(rows_total, world)
        r0 = sum(rows[:rank])
        mine = slice(r0, r0 + rows[rank])
        rep = heads // groups
        want = F.scaled_dot_product_attention(*(t.double().transpose(0, 1) for t in (
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))), scale=0.3).transpose(0, 1)[mine]
        def ring_through(consumer):  # K/V blocks attended by a built-in consumer, 5 query rows at a time
            def ring(group, q, k, v, rows, scale):
                return C.ring_attention(group, q, k, v, rows, scale, q_chunk=5, consumer=consumer)
            ring.__name__ = f"ring_attention through {consumer}"
            return ring

        for attend in (C.ring_attention, C.ulysses_attention, ring_through("sdpa"), ring_through("math")):
            got = attend(dist.group.WORLD, q[mine], k[mine], v[mine], rows, 0.3)
            assert got.dtype == dtype and got.shape == want.shape, (attend.__name__, got.shape, want.shape)
            err = ((got.double() - want).norm() / want.norm()).item() if want.numel() else 0.0
            assert err <= (1e-6 if dtype == torch.float32 else 2e-2), f"rank {rank} {attend.__name__}: rel L2 {err:.2e}"
            with pytest.raises(ValueError, match="with H a multiple of G"):
                attend(dist.group.WORLD, q[mine, :1], k[mine], v[mine], rows, 0.3)
        with pytest.raises(ValueError, match="consumer 'int8' returns no log-sum-exp"):
            C.ring_attention(dist.group.WORLD, q[mine], k[mine], v[mine], rows, 0.3, consumer="int8")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,rows_total,heads,groups,dtype", [
    (2, 37, 6, 3, torch.float32),   # grouped K/V, an odd row count
    (4, 41, 5, 5, torch.float32),   # 5 heads: no even split of heads over 4 ranks (Ulysses: 2, 1, 1, 1)
    (4, 3, 4, 2, torch.bfloat16),   # rows 1, 1, 1, 0: a rank with no rows; Ulysses: 2 ranks without heads
])
def test_ring_and_ulysses_attention_equal_attention_over_the_whole_sequence(tmp_path, world, rows_total, heads, groups,
                                                                           dtype):
    mp.spawn(_ring_rank, args=(world, str(tmp_path / "store"), rows_total, heads, groups, dtype), nprocs=world,
             join=True)


def test_shares_spread_the_remainder_over_the_first_ranks():
    assert _C.shares(10, 4) == [3, 3, 2, 2]
    assert _C.shares(3, 4) == [1, 1, 1, 0]
    with pytest.raises(ValueError, match="shares: 5 items over 0 ranks"):
        _C.shares(5, 0)
