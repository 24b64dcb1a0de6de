"""What an installation of streamplan found, and a self-test: ``python -m streamplan.check``.

Run it after installing (into the project's .venv, or into ComfyUI's Python). One line each:

    streamplan: the version, where it is installed, the build (CUDA with nvcc, or CPU)
    torch: its version and CUDA, and whether it is the torch streamplan was built against
    CUDA available: the devices torch sees (name, compute capability), or why none
    kernels: the architectures the CUDA kernels were compiled for, whether they cover each device
    consumers: the attention consumers
    ComfyUI: the tree found (--comfyui PATH, COMFYUI_PATH, or `comfy` importable, as when run
             from ComfyUI's folder), its version, and whether its custom_nodes hold the node pack
    self-test <device>: a tiny random-weight Wan 2.1 module (ComfyUI's WanModel where ComfyUI is
             found, else diffusers' WanTransformer3DModel), planned in slabs of 16 tokens and
             compared with its own forward in plain torch (rel L2 against a limit)

and last ``streamplan check: ok`` (exit status 0), or ``streamplan check: FAILED (...)`` naming
the checks that failed (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import math
import os
import sys
import time
from typing import Any, Callable, Iterator, NoReturn

import torch

import streamplan
from streamplan import _C

# A tiny Wan 2.1 (2 heads of 32, 2 blocks) and one call of it: latents [16, 3, 8, 12], 72 tokens
# in 2 x 2 patches, 7 text tokens.
DIM, HEADS, FFN, TEXT_DIM, FREQ_DIM, LAYERS, TEXT_LEN = 64, 2, 96, 32, 32, 2, 7
LATENTS = (1, 16, 3, 8, 12)
TOKEN_CHUNK = 16
LIMITS = {"cpu": 1e-4, "cuda": 1e-3}  # rel L2, fp32 (CUDA: other kernels' rounding)


def _fail(message: str) -> NoReturn:
    raise SystemExit(f"streamplan check: error: {message}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        _fail(message)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Seeded values of a usable scale for every parameter (ComfyUI's ops leave them uninitialized)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            v = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2 or name.endswith("scale_shift_table"):
                v = v / math.sqrt(p.shape[-1] if p.dim() < 2 else p[0].numel())
            else:  # biases small, norm gains near 1
                v = 0.05 * v if name.endswith("bias") else 1.0 + 0.1 * v
            p.copy_(v.to(p.dtype))


# --- ComfyUI -----------------------------------------------------------------------------------

def comfy_tree(path: str | None) -> tuple[str | None, str]:
    """The ComfyUI tree (or None) and how it was found, or why none was."""
    given = path or os.environ.get("COMFYUI_PATH")
    if given:
        where = "--comfyui" if path else "COMFYUI_PATH"
        if not os.path.isfile(os.path.join(given, "comfy", "model_management.py")):
            _fail(f"{where} {given}: not a ComfyUI tree (no comfy/model_management.py)")
        return os.path.abspath(given), where
    spec = importlib.util.find_spec("comfy")
    if spec is not None and spec.submodule_search_locations:
        return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0])), "importable"
    return None, "not found: `comfy` is not importable here; run the check from ComfyUI's folder, or give --comfyui PATH"


def comfy_modules(tree: str) -> tuple[Any, Any]:
    """(comfy.ldm.wan.model, comfy.ops) from `tree`; without CUDA, ComfyUI's device setup as its --cpu."""
    if tree not in sys.path:
        sys.path.insert(0, tree)
    if not torch.cuda.is_available():
        importlib.import_module("comfy.cli_args").args.cpu = True
    return importlib.import_module("comfy.ldm.wan.model"), importlib.import_module("comfy.ops")


def comfy_line(tree: str | None, how: str) -> str:
    if tree is None:
        return f"ComfyUI: {how}"
    version = "unknown version"
    try:
        with open(os.path.join(tree, "comfyui_version.py")) as f:
            version = next((ln.split("=", 1)[1].strip().strip("\"'") for ln in f if ln.startswith("__version__")),
                           version)
    except OSError:
        pass
    nodes = os.path.join(tree, "custom_nodes")
    packs = []
    if os.path.isdir(nodes):
        for entry in sorted(os.listdir(nodes)):
            init = os.path.join(nodes, entry, "__init__.py")
            with contextlib.suppress(OSError), open(init) as f:
                if "streamplan.comfy_nodes" in f.read():
                    packs.append(entry)
    node = (f"the node pack is custom_nodes/{', '.join(packs)}" if packs else
            f"the node pack is not in {nodes} (link it: ln -s <repository>/comfyui {nodes}/streamplan)")
    return f"ComfyUI: {version} at {tree} ({how}); {node}"


# --- the self-test -----------------------------------------------------------------------------

def tiny_comfy_wan(tree: str) -> tuple[torch.nn.Module, Callable[[torch.nn.Module, str], torch.Tensor], str]:
    wan, ops = comfy_modules(tree)
    m = wan.WanModel(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=DIM, ffn_dim=FFN, freq_dim=FREQ_DIM,
                     text_dim=TEXT_DIM, out_dim=16, num_heads=HEADS, num_layers=LAYERS, qk_norm=True,
                     cross_attn_norm=True, eps=1e-6, operations=ops.disable_weight_init, dtype=torch.float32,
                     device="cpu")

    def call(module: torch.nn.Module, device: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(2)
        x, context = torch.randn(LATENTS, generator=g), torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g)
        return module(x.to(device), torch.tensor([730.0], device=device), context.to(device), transformer_options={})

    return m, call, "ComfyUI WanModel"


def tiny_diffusers_wan() -> tuple[torch.nn.Module, Callable[[torch.nn.Module, str], torch.Tensor], str]:
    from diffusers import WanTransformer3DModel

    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=DIM // HEADS,
                              in_channels=16, out_channels=16, text_dim=TEXT_DIM, freq_dim=FREQ_DIM, ffn_dim=FFN,
                              num_layers=LAYERS, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)

    def call(module: torch.nn.Module, device: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(2)
        x, context = torch.randn(LATENTS, generator=g), torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g)
        return module(hidden_states=x.to(device), timestep=torch.tensor([730.0], device=device),
                      encoder_hidden_states=context.to(device), return_dict=False)[0]

    return m, call, "diffusers WanTransformer3DModel"


@contextlib.contextmanager
def _exact_fp32() -> Iterator[None]:
    """No TF32 in plain torch's matmuls and convolutions while the reference runs."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def self_test(tree: str | None, device: str) -> tuple[bool, str]:
    """(passed, the line) of the tiny module on `device`, planned against its own forward."""
    try:
        m, call, what = tiny_comfy_wan(tree) if tree is not None else tiny_diffusers_wan()
    except ImportError as e:
        if tree is not None:
            return False, f"cannot import ComfyUI's WanModel from {tree}: {type(e).__name__}: {e}"
        return False, f"not run: it needs ComfyUI (--comfyui PATH) or diffusers to build a module ({e})"
    except Exception as e:  # noqa: BLE001 - ComfyUI's own set-up failing: say what it was
        return False, f"cannot build the module: {type(e).__name__}: {e}"
    _randomize(m, 0)
    m = m.to(device).eval().requires_grad_(False)
    start = time.time()
    try:
        with torch.no_grad(), _exact_fp32():
            want = call(m, device)
            handle = streamplan.apply(m, token_chunk=TOKEN_CHUNK)
            try:
                got = call(m, device)
            finally:
                streamplan.remove(m)
    except Exception as e:  # noqa: BLE001 - the check reports what broke, whatever it is
        return False, f"{what} on {device}: {type(e).__name__}: {e}"
    tokens = LATENTS[2] * (LATENTS[3] // 2) * (LATENTS[4] // 2)
    head = f"{what}, {LAYERS} blocks, {tokens} tokens in slabs of {TOKEN_CHUNK}, fp32"
    if handle.planned_calls != 1:
        return False, f"{head}: did not run planned: {handle.fallbacks}"
    err = float((got.double() - want.double()).norm() / want.double().norm())
    limit = LIMITS["cuda" if device.startswith("cuda") else "cpu"]
    ok = bool(err <= limit)  # NaN fails
    return ok, (f"{head}: planned vs plain torch rel L2 {err:.1e} (limit {limit:.0e}), {time.time() - start:.1f} s: "
                + ("ok" if ok else "FAILED"))


# --- what was found ----------------------------------------------------------------------------

def found_lines() -> tuple[list[str], list[str], list[str]]:
    """(lines, failed checks, CUDA devices to self-test on)."""
    failed: list[str] = []
    build = f"{_C.build_kind} build" + (f", nvcc {_C.nvcc_version}" if _C.build_kind == "CUDA" else "")
    lines = [f"streamplan: {streamplan.__version__} at {os.path.dirname(os.path.abspath(streamplan.__file__))} ({build})"]
    built_for = _C.torch_version
    matches = torch.__version__.split("+")[0] == built_for
    if not matches:
        failed.append("torch")
    lines.append(f"torch: {torch.__version__} at {os.path.dirname(torch.__file__)}, CUDA {torch.version.cuda or 'none'} "
                 f"(streamplan was built against torch {built_for}: {'matches' if matches else 'MISMATCH'})")
    archs = [a.strip() for a in _C.cuda_archs.split(",") if a.strip()]
    devices: list[str] = []
    if not torch.cuda.is_available():
        why = "torch has no CUDA" if torch.version.cuda is None else "torch.cuda.is_available() is False"
        lines.append(f"CUDA available: no ({why}); planned runs use the CPU")
    else:
        seen = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            sm = f"sm_{major}{minor}"
            covered = any(a.rstrip("a") == sm for a in archs)
            if _C.build_kind == "CUDA" and not covered:
                failed.append(f"kernels for cuda:{i}")
            seen.append(f"cuda:{i} {torch.cuda.get_device_name(i)} ({sm}{'' if covered else ', NOT among the kernels'})")
            devices.append(f"cuda:{i}")
        lines.append(f"CUDA available: yes, {len(seen)} device(s): " + "; ".join(seen))
    if _C.build_kind == "CUDA":
        gemm = "built" if _C.fused_8bit_gemm else "not built (int8 / fp8 run at::_int_mm / _scaled_mm)"
        lines.append(f"kernels: {', '.join(archs) or 'none'} (fused 8-bit GEMM for sm_90a: {gemm})")
        if devices and torch.version.cuda and torch.version.cuda.split(".")[0] != _C.nvcc_version.split(".")[0]:
            failed.append("CUDA version")
            lines.append(f"CUDA version: torch's CUDA {torch.version.cuda}, the kernels' nvcc {_C.nvcc_version}: MISMATCH")
    else:
        lines.append("kernels: none (a CPU build: nvcc was not found when it was built); CUDA devices run "
                     "ATen operations only")
    lines.append(f"consumers: {', '.join(streamplan.consumers())}")
    return lines, failed, devices


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m streamplan.check", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", metavar="PATH", help="a ComfyUI tree (default: COMFYUI_PATH, or `comfy` importable)")
    ap.add_argument("--device", choices=("all", "cpu", "cuda"), default="all",
                    help="where the self-test runs: all (the CPU and each CUDA device; default), cpu, cuda")
    a = ap.parse_args(argv)
    lines, failed, cuda_devices = found_lines()
    for line in lines:
        print(line, flush=True)
    tree, how = comfy_tree(a.comfyui)
    print(comfy_line(tree, how), flush=True)
    if a.device == "cuda" and not cuda_devices:
        _fail("--device cuda: no CUDA device is available")
    targets = ([] if a.device == "cuda" else ["cpu"]) + ([] if a.device == "cpu" else cuda_devices)
    for device in targets:
        ok, line = self_test(tree, device)
        print(f"self-test {device}: {line}", flush=True)
        if not ok:
            failed.append(f"self-test {device}")
    print("streamplan check: " + (f"FAILED ({', '.join(failed)})" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
