"""ComfyUI's modules for comparisons, from ComfyUI trees under .deps/ (git-ignored: ComfyUI is not
on PyPI). Without them the calling test is skipped with the reason (never passed).

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
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMFY_TREE = ROOT / ".deps" / "comfyui"
EXTRA_SITE = ROOT / ".deps" / "python"
FULL_TREE = ROOT / ".deps" / "comfyui-full"
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
        import torch

        cli_args = importlib.import_module("comfy.cli_args")
        if not torch.cuda.is_available():
            cli_args.args.cpu = True  # as `main.py --cpu`: ComfyUI's device setup asks no GPU driver
        return (importlib.import_module("comfy.ldm.wan.model"), importlib.import_module("comfy.ldm.flux.model"),
                importlib.import_module("comfy.ops"))
    except Exception as e:  # an incomplete tree or a missing dependency: say so rather than pass
        pytest.skip(f"cannot import ComfyUI's WanModel and Flux from {FULL_TREE}: {e!r}")
