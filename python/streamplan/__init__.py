"""streamplan: run diffusers' transformer modules with bounded activation memory.

Attach the planner to a live module; the pipeline calls the module as before::

    import streamplan

    handle = streamplan.apply(pipe.transformer, budget="auto")
    latents = pipe(prompt_embeds=..., output_type="latent").frames
    print(handle.explain())          # the plan of the last call's geometry
    print(handle.fallbacks)          # calls that ran the original forward, and why
    streamplan.remove(pipe.transformer)

The module's own parameters are the weights (no copies); one plan is made per geometry and
cached. Calls that carry what the planner does not model (attention masks, LoRA scales,
ControlNet residuals, image conditioning, hooks on submodules, autograd) run the original
forward and are recorded in ``handle.fallbacks``. Attention consumers written in Python plug
in with ``register_consumer``.
"""

from __future__ import annotations

import torch  # loads libtorch before the extension that links it

try:
    from . import _C
except ImportError as e:  # a missing or mismatched libtorch, CUDA runtime or C++ runtime
    raise ImportError(
        f"streamplan's extension module does not load with torch {torch.__version__} ({e}); it must be built "
        "against the torch installed here: reinstall streamplan into this Python (pip install --no-build-isolation "
        "., comfyui/README.md), then run python -m streamplan.check"
    ) from e

if _C.torch_version != torch.__version__.split("+")[0]:
    raise ImportError(
        f"streamplan was built against torch {_C.torch_version}, but torch {torch.__version__} is installed; "
        "reinstall streamplan (pip install --no-build-isolation .) against this torch, "
        "then run python -m streamplan.check"
    )

from ._api import (  # noqa: E402
    Fallback,
    Handle,
    apply,
    handle_of,
    kv_budget_at,
    remove,
)
from ._consumers import consumers, register_consumer, unregister_consumer  # noqa: E402
from ._C import BudgetError, DeviceMemoryError, OutOfMemoryError, RecognizeError  # noqa: E402

__version__: str = _C.__version__
# Plans a handle keeps, one per geometry: past it the least recently used one goes.
PLAN_CACHE_SIZE: int = _C.plan_cache_size

__all__ = [
    "BudgetError",
    "DeviceMemoryError",
    "Fallback",
    "Handle",
    "OutOfMemoryError",
    "PLAN_CACHE_SIZE",
    "RecognizeError",
    "apply",
    "consumers",
    "handle_of",
    "kv_budget_at",
    "register_consumer",
    "remove",
    "unregister_consumer",
]
