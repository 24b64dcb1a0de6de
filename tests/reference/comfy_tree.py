"""ComfyUI's modules for comparisons, from ComfyUI trees under .deps/ (git-ignored: ComfyUI is not
on PyPI) or, where those are missing, from the ComfyUI source snapshot beside the repository,
../shared/comfyui-*/ (a whole ComfyUI master tree with MiniMax H3; what its imports need is in
requirements.txt). Without any tree the calling test is skipped with the reason (never passed).

Two trees, each imported as the package `comfy`:
  .deps/comfyui       comfy/ldm/minimax/model.py and the few modules it calls (README.md there),
                      with comfy_kitchen importable or under .deps/python: MiniMaxH3Model;
  .deps/comfyui-full  a ComfyUI source tree (comfy/ and its Python siblings), with what it
                      imports beyond torch (einops, psutil, torchvision) importable or under
                      .deps/comfy-site:
                      WanModel, Flux.

Both are called `comfy`, so each fixture imports its tree with the other's modules out of
sys.modules and keeps it that way until the test module's end (`isolated`).
"""

import contextlib
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _shared_tree() -> Path | None:
    """The newest ComfyUI snapshot in ../shared (named comfyui-<commit>), if any."""
    trees = sorted((ROOT.parent / "shared").glob("comfyui-*/comfy/model_management.py"), key=lambda p: p.stat().st_mtime)
    return trees[-1].parents[1] if trees else None


def _tree(name: str) -> Path:
    local = ROOT / ".deps" / name
    return local if local.is_dir() else (SHARED_TREE or local)


SHARED_TREE = _shared_tree()
COMFY_TREE = _tree("comfyui")
EXTRA_SITE = ROOT / ".deps" / "python"
FULL_TREE = _tree("comfyui-full")
FULL_SITE = ROOT / ".deps" / "comfy-site"


def _is_comfy(name: str) -> bool:
    return name == "comfy" or name.startswith("comfy.")


@contextlib.contextmanager
def isolated(*paths: Path):
    """`comfy` importable from `paths` only, for the duration; the previous state after."""
    saved_modules = {k: sys.modules.pop(k) for k in [k for k in sys.modules if _is_comfy(k)]}
    saved_path = list(sys.path)
    sys.path[:0] = [str(p) for p in paths if p.is_dir()]
    try:
        yield
    finally:
        for k in [k for k in sys.modules if _is_comfy(k)]:
            del sys.modules[k]
        sys.modules.update(saved_modules)
        sys.path[:] = saved_path


def _without_gpu_driver() -> None:
    """Without CUDA, ComfyUI's device setup as `main.py --cpu` (it asks no GPU driver then); a tree
    without comfy/cli_args.py has no device setup to configure."""
    import torch

    if torch.cuda.is_available():
        return
    try:
        cli_args = importlib.import_module("comfy.cli_args")
    except ImportError:
        return
    cli_args.args.cpu = True


def minimax_h3_modules():
    """(comfy.ldm.minimax.model, comfy.ops), or pytest.skip naming what is missing. Call inside
    `isolated(EXTRA_SITE, COMFY_TREE)`."""
    if not (COMFY_TREE / "comfy" / "ldm" / "minimax" / "model.py").is_file():
        pytest.skip(f"no ComfyUI tree at {COMFY_TREE} (comfy/ldm/minimax/model.py): comparison not run")
    try:
        importlib.import_module("comfy_kitchen")
    except ImportError as e:
        pytest.skip(f"comfy_kitchen is not importable ({e}); ComfyUI's H3 attention needs it")
    try:
        _without_gpu_driver()
        return importlib.import_module("comfy.ldm.minimax.model"), importlib.import_module("comfy.ops")
    except Exception as e:  # an incomplete tree: say so rather than pass
        pytest.skip(f"cannot import ComfyUI's comfy.ldm.minimax.model from {COMFY_TREE}: {e!r}")


def wan_flux_modules():
    """(comfy.ldm.wan.model, comfy.ldm.flux.model, comfy.ops), or pytest.skip naming what is
    missing. Call inside `isolated(FULL_SITE, FULL_TREE)`."""
    for rel in ("comfy/ldm/wan/model.py", "comfy/ldm/flux/model.py", "comfy/model_management.py"):
        if not (FULL_TREE / rel).is_file():
            pytest.skip(f"no ComfyUI tree at {FULL_TREE} ({rel}): comparison not run")
    try:
        _without_gpu_driver()
        return (importlib.import_module("comfy.ldm.wan.model"), importlib.import_module("comfy.ldm.flux.model"),
                importlib.import_module("comfy.ops"))
    except Exception as e:  # an incomplete tree or a missing dependency: say so rather than pass
        pytest.skip(f"cannot import ComfyUI's WanModel and Flux from {FULL_TREE}: {e!r}")


def h3_lacks(model: Any, gate_compress: bool = False, pdd_heads: int = 1) -> str | None:
    """What of a MiniMax H3 variant the tree's MiniMaxH3Model (module `model`) does not build, or
    None. Trees of 2026-08 on dropped the gated-compress attention and the PDD head bank."""
    init = inspect.signature(model.MiniMaxH3Model.__init__).parameters
    if gate_compress and "gate_compress" not in init:
        return "the gated-compress projection (no gate_compress argument)"
    if pdd_heads > 1 and "sample_sigmas" not in inspect.getsource(model):
        return "a PDD head bank (no sample_sigmas schedule in its forward)"
    return None


def skip_unless_h3_builds(model: Any, gate_compress: bool = False, pdd_heads: int = 1) -> None:
    """pytest.skip naming the tree and the variant's part its MiniMaxH3Model lacks (the variant is
    compared with the plain-torch reference in tests/reference/test_minimax_h3_streamplan.py)."""
    lacks = h3_lacks(model, gate_compress, pdd_heads)
    if lacks is not None:
        pytest.skip(f"ComfyUI's MiniMaxH3Model at {COMFY_TREE} does not build {lacks}: this variant "
                    "has no ComfyUI peer there")


def h3_forward_takes(model: Any, name: str) -> bool:
    """Whether the tree's MiniMaxH3Model.forward takes the argument `name` (older trees: denoise masks)."""
    return name in inspect.signature(model.MiniMaxH3Model.forward).parameters
