"""The tensors a module held when a handle attached to it, and whether it still holds them.

A handle reads the module's tensors once (``_C.Attached``) and checks on every call that they
are the ones it read. The cheap check walks the parameter and buffer objects the module holds,
weakly referenced, with their storage: the same objects on the same storage say that nothing
was swapped (a ModelPatcher patch, a LoRA merged, weights loaded or moved). Anything else is
decided by the fingerprint of the module's ``state_dict`` (what the handle read), in which small
host tensors count by their bytes: a host may make them anew on every call (ComfyUI's
``comfy_quant`` JSON of a quantized weight), and every other tensor by its storage.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator

import torch

BY_CONTENT_BYTES = 4096


def _tensors(module: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, str, torch.Tensor]]:
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, t in table.items():
                if t is not None:
                    yield sub, name, t


def _storage(t: torch.Tensor) -> Any:
    """Where a tensor's data lives, with its shape and dtype; for a wrapper subclass without
    storage of its own (ComfyUI's QuantizedTensor), that of the tensors it holds."""
    try:
        return t.data_ptr(), tuple(t.shape), t.dtype, t.device
    except RuntimeError:
        flatten = getattr(t, "__tensor_flatten__", None)
        if flatten is None:
            return None
        names, _ctx = flatten()
        return tuple(_storage(getattr(t, n)) for n in names), tuple(t.shape), t.dtype, t.device


def _identity(t: torch.Tensor) -> Any:
    if t.device.type == "cpu" and t.is_contiguous() and t.numel() * t.element_size() <= BY_CONTENT_BYTES:
        try:
            return bytes(t.detach().reshape(-1).view(torch.uint8).numpy())
        except (RuntimeError, TypeError):  # a layout or dtype numpy cannot view
            pass
    return t.data_ptr()


def fingerprint(module: torch.nn.Module, hook_names: Any) -> tuple[Any, ...]:
    """The module's state_dict as the handle reads it, and the names of the weights a host's
    hook patches (a host that starts or stops patching is a change)."""
    return tuple(
        (name, _identity(t), tuple(t.shape), t.dtype, t.device)
        for name, t in module.state_dict(keep_vars=True).items()
    ) + (hook_names,)


class ModuleState:
    """The module's tensors at attach: its fingerprint and the objects it held, with their storage."""

    def __init__(self, module: torch.nn.Module, hook_names: Any) -> None:
        self.fingerprint = fingerprint(module, hook_names)
        self._held = [(sub, name, weakref.ref(t), _storage(t)) for sub, name, t in _tensors(module)]

    def unchanged(self, module: torch.nn.Module, hook_names: Any) -> bool:
        """The same hook and the same objects on the same storage (False says: look closer)."""
        if hook_names != self.fingerprint[-1]:
            return False
        held, n = self._held, 0
        for sub, name, t in _tensors(module):
            if n >= len(held):
                return False
            was_sub, was_name, ref, storage = held[n]
            if was_sub is not sub or was_name != name or ref() is not t or storage is None or storage != _storage(t):
                return False
            n += 1
        return n == len(held)
