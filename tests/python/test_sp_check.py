"""scripts/sp_check.py, the several-GPU check, on the CPU over gloo: ComfyUI's tiny Wan (CFG) on
one rank and on two with each arrangement of the weights, and tiny MiniMax H3 under a device
memory that leaves the arrangement to the planner. Each row after the first is a split's output
against the one-rank run's, with the split and the weights its plan names. Needs ComfyUI's tree
(tests/reference/comfy_tree.py); without it the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import comfy_tree  # noqa: E402  (tests/reference, on the path through conftest)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sp_check.py"
# The script runs in bf16: a split's output against one rank's differs by the rounding of
# partial attention results merged in another order (the ring: 2e-3); a misplaced row gives ~1.
BF16 = 1e-2


def _sp_check(tmp_path: Path, *args: str) -> list[dict]:
    if not (comfy_tree.FULL_TREE / "comfy" / "ldm" / "wan" / "model.py").is_file():
        pytest.skip(f"no ComfyUI tree at {comfy_tree.FULL_TREE}: sp_check not run")
    out = tmp_path / "rows.json"
    env = {**os.environ, "COMFYUI_PATH": str(comfy_tree.FULL_TREE), "COMFY_SITE": str(comfy_tree.FULL_SITE)}
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--layers", "1", "--reps", "1",
                        "--out", str(out), *args], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert json.loads(p.stdout) == [{k: v for k, v in r.items() if k != "per_rank"} for r in rows]
    return rows


def _explains(row: dict) -> list[str]:
    return [r["explain"] for r in row["per_rank"]]


def test_wan_on_one_and_two_ranks_with_both_arrangements(tmp_path: Path) -> None:
    rows = _sp_check(tmp_path, "--frames", "5", "--height", "32", "--width", "48", "--ranks", "1,2",
                     "--weights", "replicated,sharded")
    assert [(r["ranks"], r["weights"]) for r in rows] == [(1, "replicated"), (2, "replicated"), (2, "sharded")]
    for r in rows:
        assert len(r["per_rank"]) == r["ranks"] and r["model"].startswith("wan2.1 tiny, 1 layers, 5x32x48")
        assert all(p["fallbacks"] == [] and p["estimated_ms"] > 0 for p in r["per_rank"]), r["per_rank"]
        assert r["rel_l2_vs_first"] < BF16, r
    assert "sequence parallel" not in _explains(rows[0])[0]
    for rank, text in enumerate(_explains(rows[1])):
        assert f"ulysses over 2 ranks, rank {rank}:" in text and "weights replicated" in text, text
    for text in _explains(rows[2]):
        assert "weights sharded" in text, text
    assert rows[2]["per_rank"][0]["sharded_bytes"][0] > 0


def test_minimax_under_a_device_memory_leaves_the_weights_to_the_planner(tmp_path: Path) -> None:
    rows = _sp_check(tmp_path, "--model", "minimax", "--frames", "3", "--height", "64", "--width", "64",
                     "--ranks", "1,2", "--mode", "ring", "--device-memory", "1GiB")
    assert [(r["ranks"], r["weights"], r["mode"]) for r in rows] == [(1, "planned", "ring"), (2, "planned", "ring")]
    assert rows[1]["rel_l2_vs_first"] < BF16, rows[1]
    for rank, text in enumerate(_explains(rows[1])):
        assert f"ring over 2 ranks, rank {rank}:" in text, text


def test_solo_runs_the_first_rank_of_each_count_alone(tmp_path: Path) -> None:
    """--solo: one process per rank count, rank 0 of a group whose other ranks are absent, its
    exchanges receiving copies of what it sends; its plans price the link at 200 GB/s, and its
    output is not compared (it holds rows nobody sent)."""
    rows = _sp_check(tmp_path, "--frames", "5", "--height", "32", "--width", "48", "--ranks", "1,2,4", "--solo")
    assert [(r["ranks"], r["solo"], len(r["per_rank"])) for r in rows] == [(1, True, 1), (2, True, 1), (4, True, 1)]
    assert rows[0]["rel_l2_vs_first"] == 0.0 and rows[1]["rel_l2_vs_first"] is None is rows[2]["rel_l2_vs_first"]
    for r in rows[1:]:
        text = r["per_rank"][0]["explain"]
        assert f"ulysses over {r['ranks']} ranks, rank 0:" in text and " at 200 GB/s" in text, text
        assert r["per_rank"][0]["fallbacks"] == [] and r["estimated_ms"] > 0, r["per_rank"]


def test_split_budget_binds_the_split_alone(tmp_path: Path) -> None:
    """--split-budget: one rank plans under the default policy, each rank of a split under the
    budget given (a row says which)."""
    rows = _sp_check(tmp_path, "--frames", "5", "--height", "32", "--width", "48", "--ranks", "1,2", "--solo",
                     "--split-budget", "1GiB")
    assert [r["budget"] for r in rows] == [None, "1GiB"], rows
    assert "budget none" in rows[0]["per_rank"][0]["explain"], rows[0]["per_rank"][0]["explain"]
    assert "budget 1GiB" in rows[1]["per_rank"][0]["explain"], rows[1]["per_rank"][0]["explain"]


@pytest.mark.parametrize("args,message", [
    (["--weights", "replicated,sharded"], "--solo: runs one rank without the others' data, so not with --weights sharded"),
    (["--vs-comfy", "--cfg-parallel"], "not with --cfg-parallel, --vs-comfy"),
    (["--link-rate", "0"], "--link-rate: GB/s, > 0, got 0.0"),
])
def test_solo_refuses_what_needs_the_other_ranks(args: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--solo", *args], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and message in p.stderr, p.stderr[-2000:]


def test_kernels_refuses_the_cpu() -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--kernels"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "--kernels: measures CUDA kernels, so needs --device cuda" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("name,kind", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "attention"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>", "copy"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2>>",
     "copy"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "other"),
])
def test_kernel_kinds(name: str, kind: str) -> None:
    """--kernels sorts the profiler's kernels by name; NCCL's and attention's first (cuDNN's SDPA
    kernel names its wgmma too)."""
    sys.path.insert(0, str(SCRIPT.parent))
    import sp_check

    assert sp_check.kernel_kind(name) == kind
