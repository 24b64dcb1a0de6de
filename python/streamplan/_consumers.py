"""Attention consumers written in Python (register_consumer): their functions and the caps
checked against the C++ consumer contract, by name."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from . import _C

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Attention consumers registered from Python: name -> (function, checked caps).
_CONSUMERS: dict[str, tuple[Callable[..., torch.Tensor], dict[str, Any]]] = {}
_CAP_FLAGS = ("accepts_bounded_q", "requires_global_k", "requires_global_v", "slab_output", "strided_heads")
_CAP_KEYS = (*_CAP_FLAGS, "dtypes", "q_align", "kv_align", "call_bytes", "call_allocations")


def _checked_caps(caps: Mapping[str, Any] | None) -> dict[str, Any]:
    if caps is None:
        return {}
    if not isinstance(caps, Mapping):
        raise TypeError(f"caps: expected a dict, got {type(caps).__name__}")
    out: dict[str, Any] = {}
    for key, value in caps.items():
        if key in _CAP_FLAGS:
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"caps['{key}']: expected True, False or None (undeclared), got {value!r}")
        elif key == "dtypes":
            value = [value] if isinstance(value, str) else list(value)
            bad = [d for d in value if d not in _DTYPES]
            if bad:
                raise ValueError(f"caps['dtypes']: {bad} not among {sorted(_DTYPES)}")
        elif key in ("q_align", "kv_align", "call_allocations"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"caps['{key}']: expected an int >= 1, got {value!r}")
        elif key == "call_bytes":
            if value is not None and not callable(value):
                raise TypeError(f"caps['call_bytes']: expected a function of the call's shape dict, got {value!r}")
        else:
            raise ValueError(f"caps: unknown key {key!r} (known: {', '.join(_CAP_KEYS)})")
        out[key] = value
    return out


def register_consumer(
    name: str,
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int], torch.Tensor],
    caps: Mapping[str, Any] | None = None,
) -> None:
    """Registers an attention consumer written in Python, for ``apply(..., consumer=name)``.

    ``fn(q, k, v, q_start, q_total, layer)`` receives a Q slab ``[1, G, rows, head_dim]`` (G head
    groups; grouped-query heads folded into rows), the global K and V ``[1, G, kv_rows,
    head_dim]``, the slab's first query row ``q_start`` among the sublayer's ``q_total`` query
    rows, and the block index ``layer``; it returns the slab's output, of the Q slab's shape,
    dtype and device (``softmax(q k^T / sqrt(head_dim)) v`` for exact attention). The tensors
    are views of the planned run's buffers, valid during the call. Under a ulysses sequence
    split each call holds one rank's consecutive rows, so ``q_start`` is always their place.

    ``caps`` are the fields of the C++ consumer contract: ``accepts_bounded_q``,
    ``requires_global_k``, ``requires_global_v``, ``slab_output``, ``strided_heads`` (True,
    False, or absent: undeclared; ``strided_heads``: q, k and v may be views of token-major
    ``[rows, heads, head_dim]`` buffers, heads strided inside rows), ``dtypes`` (``"fp32"``, ``"bf16"``, ``"fp16"``), ``q_align``, ``kv_align``
    (ints), ``call_bytes`` (a function of the call's shape dict returning the bytes a call
    allocates; default: its output slab) and ``call_allocations`` (int: how many separate
    tensors those bytes are, default 1; on CUDA each large one may hold up to 1 MiB more). What a consumer leaves undeclared fails closed for
    the transformations that need it (streamed Q), with the reason in the plan.

    Raises:
        ValueError: `name` is taken, or a cap is unknown or out of range (the message names it).
        TypeError: `fn` is not callable, or a cap has the wrong type.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: expected a function, got {fn!r}")
    if name in _C.consumers() or name in _CONSUMERS:
        raise ValueError(f"name: consumer {name!r} is registered already")
    _CONSUMERS[name] = (fn, _checked_caps(caps))


def unregister_consumer(name: str) -> None:
    """Removes a consumer registered from Python; modules attached with it keep it."""
    if name not in _CONSUMERS:
        raise ValueError(f"name: no consumer {name!r} was registered from Python")
    del _CONSUMERS[name]


def consumers() -> list[str]:
    """Names of the attention consumers ``apply(..., consumer=NAME)`` accepts."""
    return sorted([*_C.consumers(), *_CONSUMERS])
