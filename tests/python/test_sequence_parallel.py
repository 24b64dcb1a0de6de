"""Sequence parallelism (streamplan.apply(..., process_group=pg, sequence_parallel="ulysses" or
"ring")) on ComfyUI's WanModel, Flux and MiniMaxH3Model with tiny random weights, fp32, over gloo
process groups of 2 and 4 CPU processes: every rank holds the same module and calls it with the
same inputs, and gets the whole output, within rel L2 1e-5 of the module's own forward in one
process (same shape and dtype); the call ran planned (no fallback) and the plan's explanation
names the mode and the rank count. Ulysses runs both its default plan and slabs of a few rows
(each rank running as many slab exchanges as the rank with the most rows). Heads the ranks do not divide (Wan and H3: 3 heads on 2 and 4
ranks; Flux: 6 heads, 2, 2, 1, 1 on 4) and rows they do not divide (Wan: 45 video rows; Flux: 35
image and 4 text rows; H3: 63 video, 10 audio and 9 text rows).

Needs the ComfyUI trees of test_comfy_models.py and test_comfy_minimax.py (tests/reference/
comfy_tree.py); without them the family's tests are skipped with the reason.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import pytest
import streamplan
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import rel_l2
from test_comfy_minimax import MIXED_TAGS, build
from test_comfy_minimax import call_args as h3_call
from test_comfy_minimax import run as run_h3
from test_comfy_models import attached, flux_call, make_flux, make_wan, wan_call
from test_comfy_models import run as run_comfy

import comfy_tree  # noqa: E402  (tests/reference, on the path through conftest)
import minimax_h3 as h3  # noqa: E402

TOL = 1e-5

# family -> (where its `comfy` is imported from, the function importing its modules, Handle.family)
FAMILIES = {
    "wan": (comfy_tree.FULL_SITE, comfy_tree.FULL_TREE, comfy_tree.wan_flux_modules, "wan2.1"),
    "flux": (comfy_tree.FULL_SITE, comfy_tree.FULL_TREE, comfy_tree.wan_flux_modules, "flux1"),
    "minimax": (comfy_tree.EXTRA_SITE, comfy_tree.COMFY_TREE, comfy_tree.minimax_h3_modules, "minimax-h3"),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> Any:
    """The family's name, its ComfyUI tree importable (else pytest.skip naming what is missing)."""
    site, tree, modules, _ = FAMILIES[request.param]
    with comfy_tree.isolated(site, tree):
        modules()
        yield request.param


def _resized(comfy: Any, **sizes: Any) -> tuple[Any, ...]:
    """`comfy` as test_comfy_models' fixture gives it, with WanModel and Flux built with `sizes`
    over what make_wan and make_flux pass: their modules with other head counts."""
    wan, flux, ops = comfy

    def resized(cls: Any) -> Callable[..., torch.nn.Module]:
        return lambda **kw: cls(**{**kw, **sizes})

    return (types.SimpleNamespace(WanModel=resized(wan.WanModel)),
            types.SimpleNamespace(Flux=resized(flux.Flux), FluxParams=flux.FluxParams), ops)


def _case(family: str, comfy: Any) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], list[torch.Tensor]]]:
    """The family's tiny module and a call of it (its outputs as a list), on inputs of rows the
    ranks do not divide. "minimax-apart": on 2 ranks, one holds 34 text rows only, the other the
    last 6 text rows, 10 audio and 3 x 2 x 3 = 18 video rows: the ranks' chunks differ, and one
    holds none of the output rows."""
    if family == "minimax-apart":
        m = build(comfy, h3.TINY)
        (x, t, context), kwargs = h3_call(m, h3.TINY)
        audio = torch.cat([x[1], x[1].flip(-1)], -1)  # 10 audio rows
        text = torch.cat([context] * 5, 1)[:, :40] * torch.linspace(0.5, 1.5, 40)[None, :, None]
        args = ([x[0][:, :, :3, :4, :6].contiguous(), audio], t, text)
        return m, lambda m: run_h3(m, args, kwargs)
    if family == "wan":  # 3 heads of 32; 2 clips of 3 x 3 x 5 = 45 rows, 7 text rows
        m = make_wan(_resized(comfy, dim=96, num_heads=3))
        (x, t, context), kwargs = wan_call()
        call = ((x[..., :6, :10].contiguous(), t, context), kwargs)
        return m, lambda m: [run_comfy(m, call)]
    if family == "flux":  # 6 heads of 16; 2 images of 7 x 5 = 35 rows after 4 text rows
        m = make_flux(_resized(comfy, hidden_size=96, num_heads=6))
        (x, t, context), kwargs = flux_call()
        call = ((x[..., :14, :10].contiguous(), t, context[:, :4].contiguous()), kwargs)
        return m, lambda m: [run_comfy(m, call)]
    m = build(comfy, h3.TINY)  # 3 heads of 32; 9 text, 10 audio and 7 x 3 x 3 = 63 video rows
    (x, t, context), kwargs = h3_call(m, h3.TINY, tags=MIXED_TAGS)
    args = ([x[0][..., :6].contiguous(), x[1]], t, context)
    return m, lambda m: run_h3(m, args, kwargs)


def _rank(rank: int, world: int, store: str, family: str, mode: str, chunk: int | None, cfg: bool = False,
          shard: bool = False, consumer: str = "sdpa", link_rate: float | None = None) -> None:
    torch.set_num_threads(1)  # up to 4 ranks on a CI runner's few cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        site, tree, modules, name = FAMILIES[family.split("-")[0]]
        torch.manual_seed(0)
        with comfy_tree.isolated(site, tree):
            m, call = _case(family, modules())
            want = call(m)  # the module's own forward, the whole sequence in this process
            weights = sum(t.numel() * t.element_size() for t in m.state_dict().values())
            held = []  # what the handle holds after the call, before remove() gives it back

            def call_and_hold(m: torch.nn.Module) -> list[torch.Tensor]:
                out = call(m)
                held.append(streamplan.handle_of(m).sharded_bytes)
                return out

            handle, got = attached(m, call_and_hold, process_group=dist.group.WORLD, sequence_parallel=mode,
                                   token_chunk=chunk, cfg_parallel=cfg, shard_weights=shard, consumer=consumer,
                                   link_rate=link_rate)
        where = (f"{family} {mode} (consumer {consumer}, token chunk {chunk}{', cfg parallel' if cfg else ''}"
                 f"{', weights sharded' if shard else ''}), rank {rank} of {world}")
        assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1, f"{where}: {handle.fallbacks}"
        assert handle.family == name, f"{where}: recognized as {handle.family}"
        assert len(got) == len(want), f"{where}: {len(got)} outputs, the original gives {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert (g.shape, g.dtype) == (w.shape, w.dtype), f"{where}, output {i}: {g.shape} {g.dtype}, not {w.shape}"
            err = rel_l2(g, w)
            assert err <= TOL, f"{where}, output {i} {list(w.shape)}: rel L2 {err:.3e} > {TOL:.0e}"
        text = handle.explain()
        if cfg:  # this rank ran one of the two batch elements; its half split its rows
            runs = sum(p["calls"] for p in handle.plans)
            assert runs == 1, f"{where}: {runs} batch elements ran on this rank, not 1"
            assert "cfg parallel: two batch elements of one geometry" in text, f"{where}: explain() says\n{text}"
            world //= 2
        if world > 1:
            assert f"sequence parallel: {mode} over {world} ranks" in text, f"{where}: explain() says\n{text}"
        if link_rate:  # the plans price the exchanges at the rate given, not at a measured one
            assert f" at {link_rate / 1e9:g} GB/s" in text, f"{where}: explain() says\n{text}"
        shares, slots = held[0]
        if shard:  # this rank's shares: 1/world of the weights (each tensor at a 512-byte offset)
            tensors = len(m.state_dict())
            most = (weights + 512 * tensors) / world + 512 * tensors
            assert "weights sharded, each block gathered as it begins" in text, f"{where}: explain() says\n{text}"
            assert 0 < shares <= most and slots > 0, f"{where}: shares {shares} bytes (at most {most:.0f}), slots {slots}"
        else:
            assert (shares, slots) == (0, 0), f"{where}: shares {shares} and slots {slots} without shard_weights"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode,chunk", [
    ("ulysses", None),  # the default plan: each exchange whole (one slab)
    ("ulysses", 8),     # slabs of 8 K/V rows and of 2 or 4 Q rows per rank: remainders, padding slabs
    ("ring", None),
])
def test_sequence_parallel_matches_the_forward_in_one_process(tmp_path, family: str, mode: str, chunk: int | None,
                                                              world: int) -> None:
    mp.spawn(_rank, args=(world, str(tmp_path / "store"), family, mode, chunk), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 4])
def test_cfg_parallel_runs_one_batch_element_per_half(tmp_path, family: str, world: int) -> None:
    """Wan and Flux calls hold two batch elements: each half of the ranks runs one (on 4 ranks,
    its rows split over the half's 2), and every rank gets both outputs. The MiniMax H3 call
    holds one: each half runs it."""
    mp.spawn(_rank, args=(world, str(tmp_path / "store"), family, "ulysses", None, True), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_weights_match_the_forward_in_one_process(tmp_path, family: str, world: int) -> None:
    """Each rank keeps 1/N of every block's weights and gathers each block from the others as it
    begins: the same output, and less held than the whole weights."""
    mp.spawn(_rank, args=(world, str(tmp_path / "store"), family, "ulysses", None, False, True), nprocs=world,
             join=True)


def test_head_major_consumer_takes_its_heads_from_the_exchanges(tmp_path, family: str) -> None:
    """The math consumer reads K and V head-major: the exchanges place each slab's rows there."""
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), family, "ulysses", 8, False, False, "math"), nprocs=2, join=True)


def test_a_given_link_rate_prices_the_exchanges(tmp_path, family: str) -> None:
    """link_rate replaces the all-to-all measured when attached: the plans say the rate given."""
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), family, "ulysses", 8, False, False, "sdpa", 3e9), nprocs=2,
             join=True)


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_ranks_holding_different_modalities_trade_the_same_slabs(tmp_path, mode: str) -> None:
    """Each rank chooses its chunks for its own rows; the ranks agree on the slabs their exchanges
    trade (each the smallest any chose), and a rank without output rows still takes its part in
    gathering the output."""
    site, tree, modules, _ = FAMILIES["minimax"]
    with comfy_tree.isolated(site, tree):
        modules()  # pytest.skip naming what is missing
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), "minimax-apart", mode, None), nprocs=2, join=True)


WINDOW = 4  # rows each side that a query row of the window consumer sees in self-attention


def _window(calls: list[tuple[int, int, int, int, int]]) -> Callable[..., torch.Tensor]:
    """A consumer whose output depends on where its rows are: in self-attention (as many keys as
    the sublayer's query rows) query row q_start + i sees the keys within WINDOW rows of it."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, q_total: int,
               layer: int) -> torch.Tensor:
        rows, keys = q.shape[2], k.shape[2]
        calls.append((layer, q_start, rows, q_total, keys))
        scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        if keys == q_total:
            at = torch.arange(q_start, q_start + rows)[:, None] - torch.arange(keys)[None, :]
            scores = scores.masked_fill(at.abs() > WINDOW, float("-inf"))
        return scores.softmax(-1) @ v

    return attend


def _rank_placed(rank: int, world: int, store: str, family: str, chunk: int | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    calls: list[tuple[int, int, int, int, int]] = []
    streamplan.register_consumer("py-window", _window(calls), caps={
        "accepts_bounded_q": True, "requires_global_k": True, "requires_global_v": True, "slab_output": True,
        "dtypes": ["fp32"]})
    try:
        site, tree, modules, _ = FAMILIES[family]
        torch.manual_seed(0)
        with comfy_tree.isolated(site, tree):
            m, call = _case(family, modules())
            exact = call(m)
            _, one = attached(m, call, consumer="py-window", token_chunk=chunk)
            calls.clear()
            handle, got = attached(m, call, process_group=dist.group.WORLD, sequence_parallel="ulysses",
                                   token_chunk=chunk, consumer="py-window")
        where = f"{family} ulysses, token chunk {chunk}, rank {rank} of {world}"
        assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1, f"{where}: {handle.fallbacks}"
        for i, (g, w, e) in enumerate(zip(got, one, exact)):
            assert rel_l2(w, e) > 1e-3, f"{where}, output {i}: the window changes nothing to test"
            err = rel_l2(g, w)
            assert err <= TOL, f"{where}, output {i}: rel L2 {err:.3e} against one process > {TOL:.0e}"
        # Each self-attention this rank attends (it holds heads) covers every query row once per
        # batch element.
        covered: dict[tuple[int, int], torch.Tensor] = {}
        for layer, start, rows, total, keys in calls:
            if keys == total:
                covered.setdefault((layer, total), torch.zeros(total, dtype=torch.long))[start:start + rows] += 1
        for (layer, total), count in covered.items():
            assert count.min() == count.max() >= 1, f"{where}, block {layer}: rows attended {count.tolist()} times"
    finally:
        streamplan.unregister_consumer("py-window")
        dist.destroy_process_group()


@pytest.mark.parametrize("world,chunk", [(2, None), (3, 8), (4, 8)])
def test_a_consumer_given_its_rows_places_sees_them_under_ulysses(tmp_path, family: str, world: int,
                                                                  chunk: int | None) -> None:
    """A ulysses Q slab holds rows of every rank. A consumer told where its rows are (a Python
    consumer's q_start) is called once per rank's rows, each at its place, so that a
    position-dependent consumer (a local window) gives what it gives in one process; each
    self-attention's calls on a rank cover every query row once."""
    mp.spawn(_rank_placed, args=(world, str(tmp_path / "store"), family, chunk), nprocs=world, join=True)


def _rank_mismatched(rank: int, world: int, store: str, what: str) -> None:
    """Rank 1 calls with another shape or other values than rank 0: every rank raises, naming it,
    instead of exchanging rows that do not belong together."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        site, tree, modules, _ = FAMILIES["wan"]
        with comfy_tree.isolated(site, tree):
            m = make_wan(_resized(modules(), dim=96, num_heads=3))
            (x, t, context), kwargs = wan_call()
            if rank == 1:
                x = x[..., :6, :8] if what == "shapes" else x + 1.0
            x = x[..., :6, :10] if rank == 0 or what == "values" else x
            streamplan.apply(m, process_group=dist.group.WORLD)
            message = "inputs of different shapes" if what == "shapes" else "different input values"
            with pytest.raises(ValueError, match=f"the ranks of the process group called the module with {message}"):
                run_comfy(m, ((x.contiguous(), t, context), kwargs))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("what", ["shapes", "values"])
def test_ranks_called_with_different_inputs_all_raise(tmp_path, what: str) -> None:
    site, tree, modules, _ = FAMILIES["wan"]
    with comfy_tree.isolated(site, tree):
        modules()  # pytest.skip naming what is missing
    mp.spawn(_rank_mismatched, args=(2, str(tmp_path / "store"), what), nprocs=2, join=True)


def _rank_arranged(rank: int, world: int, store: str, split: bool | None) -> None:
    """Wan with 8 blocks under a device memory below every block resident on each rank: the
    planner arranges the weights (`split`: None chooses, True shards, False replicates and
    streams from host memory) and the output is the one-process forward's."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        site, tree, modules, _ = FAMILIES["wan"]
        torch.manual_seed(0)
        with comfy_tree.isolated(site, tree):
            m = make_wan(_resized(modules(), dim=96, num_heads=3, num_layers=8))
            (x, t, context), kwargs = wan_call()
            call = ((x[..., :6, :10].contiguous(), t, context), kwargs)
            want = run_comfy(m, call)
            seen: list[dict[str, Any]] = []

            def call_and_look(m: torch.nn.Module) -> torch.Tensor:
                out = run_comfy(m, call)
                h = streamplan.handle_of(m)
                seen.append({**h.residency, "explain_all": h.explain(), "sharded_now": h.sharded_bytes})
                return out

            group = dist.group.WORLD
            attached(m, call_and_look, device_memory="1TiB", process_group=group)  # every block on each rank
            roomy = seen.pop()
            assert roomy["kept_blocks"] == 8 and not roomy["sharded"], roomy["explain"]
            # Room for the activations and 85% of the blocks' weights.
            memory = (roomy["fixed_bytes"] + roomy["activation_bytes"] + roomy["slack_bytes"] +
                      int(0.85 * roomy["kept_bytes"]))
            handle, got = attached(m, call_and_look, device_memory=memory, process_group=group, shard_weights=split)
        r = seen.pop()
        where = f"wan, 8 blocks, shard_weights={split}, device memory {memory} bytes, rank {rank} of {world}"
        assert handle.fallbacks == [] and handle.planned_calls == handle.calls == 1, f"{where}: {handle.fallbacks}"
        err = rel_l2(got, want)
        if rank == 0:
            print(f"{where}: rel L2 {err:.3e}\n{r['explain']}")
        assert err <= TOL, f"{where}: rel L2 {err:.3e} > {TOL:.0e}"
        assert r["planned_device_bytes"] <= memory, f"{where}: planned {r['planned_device_bytes']} bytes\n{r['explain']}"
        if split is None:  # every block on each rank was weighed and did not fit
            assert "replicated, every block on each rank: needs" in r["why"], f"{where}: {r['why']}"
            assert r["streamed_blocks"], f"{where}: nothing streamed or sharded\n{r['explain']}"
        elif split:  # sharded, the blocks that fit kept whole
            assert r["sharded"] and r["kept_blocks"] >= 1, f"{where}:\n{r['explain']}"
            assert r["sharded_now"][0] == r["shard_bytes"], f"{where}: holds {r['sharded_now']}, planned {r}"
            assert "weights sharded, each block gathered as it begins" in r["explain_all"], r["explain_all"]
        else:  # replicated: the blocks that do not fit stream from host memory
            assert not r["sharded"] and r["streamed_blocks"], f"{where}:\n{r['explain']}"
            assert "sharded over the ranks: excluded by the request" in r["why"], f"{where}: {r['why']}"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("split", [None, True, False], ids=["chosen", "sharded", "replicated"])
def test_device_memory_arranges_the_weights_of_each_rank(tmp_path, split: bool | None) -> None:
    site, tree, modules, _ = FAMILIES["wan"]
    with comfy_tree.isolated(site, tree):
        modules()  # pytest.skip naming what is missing
    mp.spawn(_rank_arranged, args=(2, str(tmp_path / "store"), split), nprocs=2, join=True)


@pytest.mark.parametrize("options,message", [
    ({"sequence_parallel": "bogus"}, "sequence_parallel: expected 'ulysses' or 'ring', got 'bogus'"),
    ({"cfg_parallel": True}, "cfg_parallel: needs a process_group"),
    ({"shard_weights": True}, "shard_weights: shares the blocks' weights over the ranks of a process_group"),
    ({"link_rate": 1e9}, "link_rate: prices the exchanges between the ranks of a process_group of 2 or more ranks; "
                         "got none"),
    ({"link_rate": -1.0}, r"link_rate: expected bytes per second \(a finite number > 0\), got -1.0"),
    ({"link_rate": float("inf")}, r"link_rate: expected bytes per second \(a finite number > 0\), got inf"),
])
def test_sequence_options_without_their_group_are_refused_by_name(family: str, options: dict[str, Any],
                                                                   message: str) -> None:
    m, _call = _case(family, FAMILIES[family][2]())  # the fixture's tree is the importable one
    forward = m.forward
    with pytest.raises(ValueError, match=message):
        streamplan.apply(m, **options)
    assert m.forward == forward and streamplan.handle_of(m) is None, "a refused apply() left the module changed"
