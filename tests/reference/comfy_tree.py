"""ComfyUI's MiniMaxH3Model for comparisons, from a ComfyUI tree at .deps/comfyui (git-ignored:
ComfyUI is not on PyPI) with comfy_kitchen importable or under .deps/python. Without them the
calling test is skipped with the reason (never passed)."""

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMFY_TREE = ROOT / ".deps" / "comfyui"
EXTRA_SITE = ROOT / ".deps" / "python"


def minimax_h3_modules():
    """(comfy.ldm.minimax.model, comfy.ops), or pytest.skip naming what is missing."""
    if not (COMFY_TREE / "comfy" / "ldm" / "minimax" / "model.py").is_file():
        pytest.skip(f"no ComfyUI tree at {COMFY_TREE} (comfy/ldm/minimax/model.py): comparison not run")
    for p in (EXTRA_SITE, COMFY_TREE):
        if p.is_dir() and str(p) not in sys.path:
            sys.path.insert(0, str(p))
    try:
        importlib.import_module("comfy_kitchen")
    except ImportError as e:
        pytest.skip(f"comfy_kitchen is not importable ({e}); ComfyUI's H3 attention needs it")
    try:
        return importlib.import_module("comfy.ldm.minimax.model"), importlib.import_module("comfy.ops")
    except Exception as e:  # an incomplete tree: say so rather than pass
        pytest.skip(f"cannot import ComfyUI's comfy.ldm.minimax.model from {COMFY_TREE}: {e!r}")
