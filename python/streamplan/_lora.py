"""LoRA inputs of :func:`streamplan.apply`: files or state dicts with their strengths.

The C++ side (src/models/lora_file.hpp) matches the keys onto the module's weights through the
recognition tables and applies the adapters lazily per slab; this module only reads the files
and normalizes the argument, and warns about keys that were not applied.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping, Sequence, Union

import torch

LoraSource = Union[str, "os.PathLike[str]", Mapping[str, torch.Tensor]]
LoraArg = Union[LoraSource, tuple]


def _read(source: LoraSource, index: int) -> tuple[str, dict[str, torch.Tensor]]:
    if isinstance(source, (str, os.PathLike)):
        from safetensors.torch import load_file

        path = os.fspath(source)
        return path, load_file(path)
    if isinstance(source, Mapping):
        bad = [k for k, v in source.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"lora[{index}]: expected a state dict of str -> torch.Tensor, got the entry {bad[0]!r}")
        return f"state dict {index}", dict(source)
    raise TypeError(f"lora[{index}]: expected a safetensors path or a state dict, got {type(source).__name__}")


def inputs(lora: Sequence[LoraArg] | None) -> list[tuple[str, dict[str, torch.Tensor], float]]:
    """(name, tensors, strength) of each entry: a path or state dict, or a (source, strength) pair."""
    if lora is None:
        return []
    if isinstance(lora, (str, os.PathLike, Mapping)) or (isinstance(lora, tuple) and len(lora) == 2
                                                         and isinstance(lora[1], (int, float))):
        lora = [lora]
    out = []
    for i, entry in enumerate(lora):
        source, strength = entry if isinstance(entry, tuple) else (entry, 1.0)
        if isinstance(strength, bool) or not isinstance(strength, (int, float)):
            raise TypeError(f"lora[{i}]: expected a number as the strength, got {strength!r}")
        name, tensors = _read(source, i)
        out.append((name, tensors, float(strength)))
    return out


def warn(report: Mapping[str, Any], seen: set[str]) -> None:
    """Warns once per key about LoRA keys that match no weight or were not applied."""
    for kind in ("unmatched", "unapplied"):
        new = [k for k in report[kind] if k not in seen]
        if new:
            seen.update(new)
            what = "match no weight of the module" if kind == "unmatched" else "were not applied"
            warnings.warn(f"streamplan: {len(new)} LoRA key(s) {what}: " + "; ".join(new[:10])
                          + (" ..." if len(new) > 10 else ""), stacklevel=3)
