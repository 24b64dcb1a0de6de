"""The Residency node's settings and where ComfyUI left a module's weights (streamplan.comfy_nodes)."""

from __future__ import annotations

import dataclasses

import torch

from . import _api

RESIDENCY_KEY = "streamplan_residency"  # transformer_options entry of the Residency node
DEVICE_MEMORY_HELP = ('"auto": what ComfyUI\'s model management reports free on the device when sampling starts, '
                      "less its reserve; or a size (\"6GiB\")")
AUTO_STEP = 256 << 20  # "auto" device memory is rounded down to this
RESIDENT_HELP = '"auto" (chosen under the device memory) or the most blocks streamplan keeps on the device'


@dataclasses.dataclass(frozen=True)
class ResidencySettings:
    """The Residency node's inputs: the device memory the planned calls may use beside the
    weights ComfyUI holds on the device ("auto" or a size) and the most blocks streamplan keeps
    there ("auto" or a count). The weights ComfyUI left in host memory stream through slots."""

    device_memory: str = "auto"
    resident_blocks: str = "auto"

    def __post_init__(self) -> None:
        self.bytes_on(None)  # names a bad size
        self.blocks()

    def blocks(self) -> int | str:
        t = str(self.resident_blocks).strip().lower()
        if t == "auto":
            return "auto"
        if not t.isdigit() or int(t) < 1:
            raise ValueError(f"resident_blocks: {self.resident_blocks!r} is not {RESIDENT_HELP}")
        return int(t)

    def bytes_on(self, device: torch.device | None) -> int:
        """The device memory in bytes (0 for "auto" without a device)."""
        t = str(self.device_memory).strip()
        if t.lower() != "auto":
            return _api._device_memory_bytes(t)
        if device is None:
            return 0
        import comfy.model_management as mm

        free = int(mm.get_free_memory(device)) - int(mm.extra_reserved_memory())
        return max(free // AUTO_STEP * AUTO_STEP, AUTO_STEP)  # in steps: samplings alike share their plans


def host_placed(module: torch.nn.Module, device: torch.device) -> bool:
    """Whether ComfyUI left some of the module's weights in host memory while the call runs on
    a GPU (its low-VRAM partial loading)."""
    if device.type == "cpu":
        return False
    return any(t.device.type == "cpu" and t.dtype != torch.uint8
               for t in (*module.parameters(), *module.buffers()))


def host_bytes(module: torch.nn.Module) -> tuple[int, int]:
    """Bytes of the module's weights in host memory: (pinned, pageable)."""
    pinned = pageable = 0
    seen: set[int] = set()
    for t in module.state_dict().values():  # plain tensors, a quantized weight's parts included
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        if t.is_pinned():
            pinned += t.nbytes
        else:
            pageable += t.nbytes
    return pinned, pageable
