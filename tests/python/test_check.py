"""`python -m streamplan.check` (what an installation found, and its self-test) and the start-up
of scripts/comfy_check.py (what it needs, said in one line, exit status 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import streamplan
from streamplan import _C

ROOT = Path(__file__).resolve().parents[2]
SHARED_TREES = sorted((ROOT.parent / "shared").glob("comfyui-*/comfy/model_management.py"))


def _run(*args: str, env: dict[str, str] | None = None, python: tuple[str, ...] = (sys.executable,)) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("COMFYUI_PATH", "COMFY_SITE")}
    p = subprocess.run([*python, *args], capture_output=True, text=True, timeout=600, cwd="/", env={**clean, **(env or {})})
    return p.returncode, p.stdout, p.stderr


def _check(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    rc, out, err = _run("-m", "streamplan.check", *args, env=env)
    return rc, out.splitlines(), err


def _assert_found(lines: list[str]) -> None:
    """The lines every check prints first: package, torch, CUDA, kernels, consumers."""
    assert lines[0] == (f"streamplan: {streamplan.__version__} at {os.path.dirname(streamplan.__file__)} "
                        f"({_C.build_kind} build" + (f", nvcc {_C.nvcc_version})" if _C.build_kind == "CUDA" else ")"))
    assert lines[1].startswith(f"torch: {torch.__version__} at ") and lines[1].endswith(
        f"(streamplan was built against torch {_C.torch_version}: matches)"), lines[1]
    assert f"CUDA {torch.version.cuda or 'none'} " in lines[1]
    if torch.cuda.is_available():
        assert lines[2].startswith(f"CUDA available: yes, {torch.cuda.device_count()} device(s): cuda:0 "), lines[2]
    else:
        assert lines[2].startswith("CUDA available: no ("), lines[2]
    if _C.build_kind == "CUDA":
        assert lines[3].startswith(f"kernels: {_C.cuda_archs} (fused 8-bit GEMM for sm_90a: "), lines[3]
    else:
        assert lines[3].startswith("kernels: none (a CPU build"), lines[3]
    assert lines[4] == "consumers: " + ", ".join(streamplan.consumers())


SELF_TEST = r"self-test cpu: {what}, 2 blocks, 72 tokens in slabs of 16, fp32: planned vs plain torch rel L2 (\S+) " \
            r"\(limit 1e-04\), [0-9.]+ s: ok"


def test_check_without_comfyui_self_tests_diffusers() -> None:
    rc, lines, err = _check("--device", "cpu")
    assert rc == 0, (lines, err)
    _assert_found(lines)
    assert lines[5].startswith("ComfyUI: not found: `comfy` is not importable here"), lines[5]
    m = re.fullmatch(SELF_TEST.format(what="diffusers WanTransformer3DModel"), lines[6])
    assert m and float(m.group(1)) <= 1e-4, lines[6]
    assert lines[7:] == ["streamplan check: ok"]


@pytest.mark.skipif(not SHARED_TREES, reason=f"no ComfyUI snapshot at {ROOT.parent / 'shared'}/comfyui-*")
def test_check_with_comfyui_self_tests_its_wan_model() -> None:
    tree = SHARED_TREES[-1].parents[1]
    rc, lines, err = _check("--device", "cpu", env={"COMFYUI_PATH": str(tree)})
    assert rc == 0, (lines, err)
    _assert_found(lines)
    assert re.fullmatch(rf"ComfyUI: \S+ at {re.escape(str(tree))} \(COMFYUI_PATH\); the node pack .*", lines[5]), lines[5]
    m = re.fullmatch(SELF_TEST.format(what="ComfyUI WanModel"), lines[6])
    assert m and float(m.group(1)) <= 1e-4, lines[6]
    assert lines[7:] == ["streamplan check: ok"]


def test_check_bad_input_is_one_line_and_exit_1(tmp_path: Path) -> None:
    rc, lines, err = _check("--comfyui", str(tmp_path))
    assert rc == 1 and err.splitlines()[-1] == (
        f"streamplan check: error: --comfyui {tmp_path}: not a ComfyUI tree (no comfy/model_management.py)"), err
    rc, lines, err = _check("--device", "tpu")
    assert rc == 1 and err.splitlines()[-1].startswith("streamplan check: error: argument --device: invalid choice"), err


# --- scripts/comfy_check.py: what it needs --------------------------------------------------------

COMFY_CHECK = str(ROOT / "scripts" / "comfy_check.py")


def test_comfy_check_without_torch_says_how_to_run_it() -> None:
    # -S: without site-packages, so neither torch nor streamplan imports
    rc, out, err = _run(COMFY_CHECK, "--tiny", python=(sys.executable, "-S"))
    assert rc == 1 and out == ""
    assert re.fullmatch(r"comfy_check: error: needs torch, which \S+ cannot import \(ModuleNotFoundError: No module "
                        rf"named 'torch'\); run it with the project's environment, {re.escape(str(ROOT))}/\.venv/bin/"
                        r"python \(scripts/setup\.sh makes it\)\n", err), err
    rc, out, err = _run(COMFY_CHECK, "--help", python=(sys.executable, "-S"))
    assert rc == 0 and "--comfyui PATH" in out


def test_comfy_check_names_the_missing_tree_and_bad_arguments(tmp_path: Path) -> None:
    for env, args, message in (
        ({"COMFYUI_PATH": str(tmp_path)}, ["--tiny"],
         f"COMFYUI_PATH={tmp_path}: not a ComfyUI source tree (no comfy/sample.py); give a checkout of "
         "https://github.com/comfyanonymous/ComfyUI"),
        ({}, ["--comfyui", str(tmp_path)], f"--comfyui {tmp_path}: not a ComfyUI source tree (no comfy/sample.py); "
         "give a checkout of https://github.com/comfyanonymous/ComfyUI"),
        ({}, ["--models", "wan,sdxl"], "--models: expected a comma-separated list of wan, flux, minimax, got 'wan,sdxl'"),
        ({}, ["--steps", "0"], "--steps: must be >= 1, got 0"),
        ({}, ["--device", "gpu"], "--device: expected cpu, cuda, cuda:N or auto, got 'gpu'"),
        ({}, ["--out", str(tmp_path / "no" / "x.json")], f"--out {tmp_path}/no/x.json: cannot write there "
         f"(no writable folder {tmp_path}/no)"),
        ({}, ["--formats", "bf16,nvfp4"], "--formats: expected a comma-separated list of bf16, fp8, int8, "
         "convrot-int8, scaled-fp8, plain-e4m3, plain-e5m2, got 'bf16,nvfp4'"),
        ({}, ["--formats", "fp8", "--cli", str(tmp_path / "none")],
         f"--cli {tmp_path}/none: no streamplan command there (scripts/setup.sh builds build/streamplan)"),
    ):
        rc, out, err = _run(COMFY_CHECK, *args, env=env)
        assert rc == 1 and err.splitlines()[-1] == f"comfy_check: error: {message}", (args, err)


def test_comfy_check_names_a_module_comfyui_lacks(tmp_path: Path) -> None:
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "__init__.py").write_text("")
    (tmp_path / "comfy" / "sample.py").write_text("")
    (tmp_path / "comfy" / "cli_args.py").write_text("import a_module_comfyui_needs\n")
    rc, out, err = _run(COMFY_CHECK, "--tiny", "--device", "cpu", env={"COMFYUI_PATH": str(tmp_path)})
    assert rc == 1, err
    assert re.match(
        rf"comfy_check: error: ComfyUI's code \(from {re.escape(str(tmp_path))}\) imports the module "
        r"'a_module_comfyui_needs', which \S+ cannot import; install what ComfyUI needs into this Python \(pip install "
        rf"-r {re.escape(str(tmp_path))}/requirements\.txt\), or put it in COMFY_SITE \(pip install --target ",
        err.splitlines()[-1]), err


def test_comfy_check_runs_comfyui_sampling_on_the_cpu(tmp_path: Path) -> None:
    """The whole check at tiny widths on the CPU, from a random model and from an int8 and a
    plain fp8 checkpoint written by `streamplan convert`: every call planned, the table printed."""
    out = tmp_path / "rows.json"
    rc, stdout, err = _run(COMFY_CHECK, "--tiny", "--device", "cpu", "--models", "wan", "--formats", "bf16,int8,plain-e4m3",
                           "--lora-formats", "plain-e4m3", "--work", str(tmp_path), "--out", str(out))
    assert rc == 0, err
    rows = json.loads(out.read_text())
    assert [(r["format"], r["lora"]) for r in rows] == [("bf16", False), ("int8", False), ("plain-e4m3", False),
                                                         ("plain-e4m3", True)]
    for r in rows:
        assert r["planned_calls"] == r["calls"] >= 1 and r["fallbacks"] == [], r
        assert "calls planned" in r["status"], r["status"]
    assert "int8 (" in rows[1]["status"] and "fp8-e4m3-cast (" in rows[2]["status"]  # plain: cast, as ComfyUI does
    assert rows[3]["streamplan_rel_l2_vs_fp32"] <= 2 * rows[3]["comfy_rel_l2_vs_fp32"] + 1e-5
    assert stdout.splitlines()[0].split()[:3] == ["model", "format", "LoRA"]


VRAM_CHECK = str(ROOT / "scripts" / "comfy_vram_check.py")


def test_vram_check_runs_each_configuration_in_its_own_process(tmp_path: Path) -> None:
    """scripts/comfy_vram_check.py at tiny widths on the CPU (no cap there): ComfyUI alone, with the
    Memory Planner and with the Sparse Attention node, from an fp8 checkpoint written by `streamplan
    convert`; every planned call planned, each configuration's steps timed, the outputs compared;
    ComfyUI alone on noise perturbed by 1e-3 moves its output by about that much."""
    out = tmp_path / "rows.json"
    rc, stdout, err = _run(VRAM_CHECK, "--model", "wan", "--tiny", "--device", "cpu", "--configs", "d,b,c,f",
                           "--steps", "5", "--work", str(tmp_path), "--out", str(out), "--pinned-limit-gib", "2")
    assert rc == 0, err
    rows = {r["config"]: r for r in json.loads(out.read_text())}
    assert sorted(rows) == ["b", "c", "d", "f"] and rows["d"]["rel_l2_vs_d"] == 0.0
    assert 1e-5 < rows["f"]["rel_l2_vs_d"] < 0.1, rows["f"]
    assert rows["f"]["rel_l2_vs_f"] == 0.0 and rows["d"]["rel_l2_vs_f"] > 1e-5, rows["d"]
    for c in "bcd":
        assert len(rows[c]["step_s"]) == 5 and rows[c]["oom"] is None and rows[c]["checkpoint"].endswith(".fp8.safetensors")
        # On the CPU every weight is in host memory, none pinned.
        assert rows[c]["host_pinned_bytes"] == 0 and rows[c]["host_pageable_bytes"] > 0, rows[c]
        assert rows[c]["host_ram_bytes"] > 0 and rows[c]["comfy_max_pinned_bytes"] == 2 << 30
    for c in "bc":
        assert rows[c]["planned_calls"] == rows[c]["calls"] == 5, rows[c]
        assert rows[c]["rel_l2_vs_d"] <= 1e-4, rows[c]  # the CPU runs dense attention for sparse: no backend there
    assert "sparse attention (auto) on cpu" in rows["c"]["status"]
    assert stdout.splitlines()[0].split()[:3] == ["cfg", "what", "s/step"]
    rc, _stdout, err = _run(VRAM_CHECK, "--model", "wan", "--configs", "b,x")
    assert rc == 1 and "comfy_vram_check: error: --configs: expected a comma-separated list of a, b, c, d, e, f, got 'b,x'" \
        in err, err
