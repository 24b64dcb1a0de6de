#!/usr/bin/env python3
"""ComfyUI's own sampling with and without the "Streamplan Memory Planner" node.

Given a ComfyUI source tree (COMFYUI_PATH; its Python dependencies importable, or in the
folder COMFY_SITE), builds random-weight ComfyUI models and samples them with ComfyUI's
sampling function (comfy.sample.sample: euler, simple schedule, CFG), in one process:

  wan    Wan 2.1 14B widths with 2 layers (comfy.model_base.WAN21), latents for 81 frames at
         1280 x 720 (--tiny: a few tokens at test widths)
  flux   Flux.1-dev widths with 2 double and 4 single blocks (comfy.model_base.Flux), 1024 x 1024
  minimax  MiniMax H3 widths with 2 blocks (and its text refiner; comfy.model_base.MiniMaxH3, from
         a checkpoint through ComfyUI's loader), the joint video + audio latent of 10 s at
         1376 x 768 (243 frames: 72 x 48 x 86 video latents, 405 audio latents)

Each model is sampled four ways: without and with the node, each without and with a rank-16
LoRA that ComfyUI loads itself (comfy.lora.load_lora onto the ModelPatcher, as its LoRA loader
does). In bf16 (on a GPU) ComfyUI also samples the same weights in fp32, the reference. The
latents with the node are compared with those without, and both with the fp32 reference (rel
L2); the peak of the caching allocator above what was allocated before sampling is printed for
each run, with the time of each sampling.

--formats runs the models from quantized checkpoints as ComfyUI's users load them: the random
weights are saved (fp32, ComfyUI's layout), written in each format by `streamplan convert`
(--cli) and loaded by ComfyUI's own loader (tests/reference/comfy_formats.py): `fp8` and
`int8` (comfy_quant), `scaled-fp8`, `plain-e4m3` (float8 weights ComfyUI casts per layer), ...;
`bf16` is the random model above. The reference is ComfyUI in fp32 on the dequantized weights;
the LoRA runs on the fp8 formats and bf16 (--lora-formats).

    .venv/bin/python scripts/comfy_check.py [--comfyui PATH] [--models wan,flux] [--steps 2]
    .venv/bin/python scripts/comfy_check.py --formats fp8,scaled-fp8,plain-e4m3,int8 --models wan
    .venv/bin/python scripts/comfy_check.py --tiny --device cpu      # a quick run on the CPU
    .venv/bin/python scripts/comfy_check.py --models wan --formats fp8 --profile   # where the time goes

--profile prints, for the timed sampling without and with the node, the 12 device kernels that
took the most time (torch.profiler), to the standard error.

It needs torch and streamplan importable (the project's .venv has both: scripts/setup.sh) and
a ComfyUI source tree: --comfyui PATH, else COMFYUI_PATH, else .deps/comfyui-full, else the
newest ../shared/comfyui-* beside the repository. What is missing is one line naming it and how
to get it, exit status 1. Writes --out (JSON) and prints a short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
MODELS = ("wan", "flux", "minimax")
from comfy_formats import FORMATS  # noqa: E402  (tests/reference)
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
VENV_HINT = f"run it with the project's environment, {VENV_PYTHON} (scripts/setup.sh makes it)"

try:
    import torch
except ImportError as torch_missing:  # main() says so, after the arguments (--help needs no torch)
    torch = None  # type: ignore[assignment]
    TORCH_MISSING = f"{type(torch_missing).__name__}: {torch_missing}"


def fail(message: str, prog: str = "comfy_check") -> NoReturn:
    raise SystemExit(f"{prog}: error: {message}")


def comfy_tree(path: str | None = None) -> str:
    """The ComfyUI source tree: `path`, else COMFYUI_PATH, else .deps/comfyui-full, else the newest
    ../shared/comfyui-*; an error naming where it looked when it is not a ComfyUI tree."""
    given = path or os.environ.get("COMFYUI_PATH")
    if given:
        where = "--comfyui " if path else "COMFYUI_PATH="
        if not os.path.isfile(os.path.join(given, "comfy", "sample.py")):
            fail(f"{where}{given}: not a ComfyUI source tree (no comfy/sample.py); give a checkout of "
                 "https://github.com/comfyanonymous/ComfyUI")
        return given
    local = os.path.join(ROOT, ".deps", "comfyui-full")
    if os.path.isfile(os.path.join(local, "comfy", "sample.py")):
        return local
    snapshots = os.path.join(os.path.dirname(ROOT), "shared", "comfyui-*")
    shared = sorted(glob.glob(os.path.join(snapshots, "comfy", "sample.py")), key=os.path.getmtime)
    if shared:
        return os.path.dirname(os.path.dirname(shared[-1]))
    fail(f"no ComfyUI source tree: none at {local} or {snapshots}; give one with --comfyui PATH or COMFYUI_PATH=PATH "
         "(a checkout of https://github.com/comfyanonymous/ComfyUI)")


def comfy_import(device: str, tree: str | None = None):
    """ComfyUI's package `comfy` from `tree` (see comfy_tree), with its dependencies importable or in
    COMFY_SITE (default .deps/comfy-site); an error naming a missing module and how to get it."""
    tree = comfy_tree(tree)
    site = os.environ.get("COMFY_SITE", os.path.join(ROOT, ".deps", "comfy-site"))
    for p in (site, tree):
        if os.path.isdir(p) and p not in sys.path:
            sys.path.insert(0, p)
    try:
        import comfy.cli_args

        if device == "cpu":
            comfy.cli_args.args.cpu = True
        import comfy.latent_formats
        import comfy.lora
        import comfy.model_base
        import comfy.model_patcher
        import comfy.nested_tensor
        import comfy.sample
        import comfy.sd
        import comfy.supported_models_base
        import comfy.utils
    except ModuleNotFoundError as e:
        if e.name and (e.name == "comfy" or e.name.startswith("comfy.")):
            fail(f"ComfyUI tree {tree}: cannot import {e.name} ({e}); give a whole ComfyUI source tree")
        fail(f"ComfyUI's code (from {tree}) imports the module '{e.name}', which {sys.executable} cannot import; "
             f"install what ComfyUI needs into this Python (pip install -r {os.path.join(tree, 'requirements.txt')}), "
             f"or put it in COMFY_SITE (pip install --target {site} --no-deps einops psutil torchvision==0.26.0), "
             f"or {VENV_HINT}")
    return comfy


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        fail(message, self.prog)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked before anything is built: an error names the option and the value."""
    ap = _Parser(prog="comfy_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", metavar="PATH", help="ComfyUI source tree (default: COMFYUI_PATH, .deps/comfyui-full, "
                    "../shared/comfyui-*)")
    ap.add_argument("--models", default="wan,flux", help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--steps", type=int, default=2, help="sampling steps (>= 1)")
    ap.add_argument("--tiny", action="store_true", help="test widths instead of the real ones")
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: cuda where available)")
    ap.add_argument("--out", metavar="FILE", help="write the rows as JSON")
    ap.add_argument("--formats", default="bf16", help="comma-separated weight formats, of: bf16 (random weights "
                    "in the compute dtype), " + ", ".join(FORMATS) + " (checkpoints written by streamplan convert)")
    ap.add_argument("--lora-formats", default="bf16,fp8,scaled-fp8,plain-e4m3",
                    help="the formats also sampled with a rank-16 LoRA")
    ap.add_argument("--cli", metavar="PATH", default=os.environ.get("STREAMPLAN_BIN", os.path.join(ROOT, "build", "streamplan")),
                    help="the streamplan command that converts (default: $STREAMPLAN_BIN, build/streamplan)")
    ap.add_argument("--work", metavar="DIR", help="where the checkpoints are written (default: a temporary folder)")
    ap.add_argument("--profile", action="store_true", help="the kernels that took the most time, per timed sampling")
    ap.add_argument("--no-fp32", action="store_true", help="no fp32 reference (no errors against it)")
    ap.add_argument("--token-chunks", default="", metavar="LIST",
                    help="comma-separated rows per slab: each also sampled with the node forced to that token chunk "
                         "(rows with token_chunk set; the default rows have it null)")
    ap.add_argument("--sparse", type=float, metavar="KV",
                    help="with the Streamplan Sparse Attention node too (video KV budget KV, backend auto, the first "
                         "and last step at 0.5); the node's error against ComfyUI is then the approximation's")
    ap.add_argument("--reps", type=int, default=1, metavar="N",
                    help="time N samplings of ComfyUI alone and of the node (default chunk), alternating; the "
                         "medians are the row's times (default 1)")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error(f"--reps: expected a positive count, got {a.reps}")
    formats = a.formats.split(",")
    bad = [f for f in formats if f != "bf16" and f not in FORMATS]
    if bad or not a.formats:
        ap.error(f"--formats: expected a comma-separated list of bf16, {', '.join(FORMATS)}, got '{a.formats}'")
    if formats != ["bf16"] and not os.access(a.cli, os.X_OK):
        ap.error(f"--cli {a.cli}: no streamplan command there (scripts/setup.sh builds build/streamplan)")
    if formats != ["bf16"] and a.tiny and "flux" in a.models.split(","):
        ap.error("--formats with --tiny: wan only (ComfyUI's detection gives Flux 24 heads, more than tiny widths hold)")
    models = a.models.split(",")
    bad = [m for m in models if m not in MODELS]
    if bad or not a.models:
        ap.error(f"--models: expected a comma-separated list of {', '.join(MODELS)}, got '{a.models}'")
    a.models = ",".join(dict.fromkeys(models))
    try:
        a.token_chunks = [int(c) for c in a.token_chunks.split(",") if c]
    except ValueError:
        ap.error(f"--token-chunks: expected comma-separated positive integers, got '{a.token_chunks}'")
    if any(c < 1 for c in a.token_chunks):
        ap.error(f"--token-chunks: each must be >= 1, got '{','.join(map(str, a.token_chunks))}'")
    if a.steps < 1:
        ap.error(f"--steps: must be >= 1, got {a.steps}")
    if not (a.device in ("auto", "cpu", "cuda") or (a.device.startswith("cuda:") and a.device[5:].isdigit())):
        ap.error(f"--device: expected cpu, cuda, cuda:N or auto, got '{a.device}'")
    if a.out:
        folder = os.path.dirname(os.path.abspath(a.out))
        if os.path.isdir(a.out) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            why = "a folder" if os.path.isdir(a.out) else f"no writable folder {folder}"
            ap.error(f"--out {a.out}: cannot write there ({why})")
    return a


def checked_environment(a: argparse.Namespace) -> None:
    """torch and streamplan importable, the device present: else an error saying how to get them."""
    if torch is None:
        fail(f"needs torch, which {sys.executable} cannot import ({TORCH_MISSING}); {VENV_HINT}")
    try:
        import streamplan  # noqa: F401
    except ImportError as e:
        fail(f"needs the streamplan package, which {sys.executable} cannot import ({type(e).__name__}: {e}); "
             f"{VENV_HINT}, or install it into this Python (pip install --no-build-isolation {ROOT}: comfyui/README.md)")
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {a.device}: torch {torch.__version__} sees no CUDA device here; use --device cpu (with --tiny)")


def model_config(comfy, family: str, tiny: bool, dtype: torch.dtype, layers: int = 2):
    base = comfy.supported_models_base.BASE
    if family == "wan":
        # tiny: heads of 128, the smallest ComfyUI's detection of a checkpoint gives back
        unet = (dict(dim=256, ffn_dim=512, num_heads=2, freq_dim=256, text_dim=4096) if tiny else
                dict(dim=5120, ffn_dim=13824, num_heads=40, freq_dim=256, text_dim=4096))
        unet.update(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, out_dim=16, num_layers=layers, eps=1e-6,
                    qk_norm=True, cross_attn_norm=True, text_len=512, dtype=dtype)

        class Cfg(base):
            unet_config = unet
            unet_extra_config = {}
            sampling_settings = {"shift": 8.0}
            latent_format = comfy.latent_formats.Wan21
        return Cfg(unet), comfy.model_base.WAN21
    unet = (dict(hidden_size=32, num_heads=2, axes_dim=[4, 6, 6], context_in_dim=32, vec_in_dim=24) if tiny else
            dict(hidden_size=3072, num_heads=24, axes_dim=[16, 56, 56], context_in_dim=4096, vec_in_dim=768))
    unet.update(in_channels=16, out_channels=16, patch_size=2, mlp_ratio=4.0, depth=2, depth_single_blocks=4,
                theta=10000, qkv_bias=True, guidance_embed=True, image_model="flux", dtype=dtype)
    import dataclasses

    import comfy.ldm.flux.model as flux_model
    if "txt_ids_dims" in {f.name for f in dataclasses.fields(flux_model.FluxParams)}:
        unet["txt_ids_dims"] = []  # no text positions on the rope axes (Flux.1)

    class Cfg(base):
        unet_config = unet
        unet_extra_config = {}
        sampling_settings = {"shift": 1.15, "multiplier": 1.0}
        latent_format = comfy.latent_formats.Flux
    return Cfg(unet), comfy.model_base.Flux


def h3_config(tiny: bool, layers: int = 2):
    """MiniMax H3 with `layers` blocks (0: all of them): its widths, or (tiny) what ComfyUI's
    loader detects at test widths."""
    from dataclasses import replace

    import minimax_h3

    cfg = minimax_h3.COMFY_TINY if tiny else minimax_h3.REAL
    return replace(cfg, layers=layers) if layers else cfg


def h3_latent(comfy, tiny: bool, seed: int):
    """The joint latent of MiniMax H3 as ComfyUI's EmptyMiniMaxH3LatentAV makes it (video, audio)
    for 10 s at 1376 x 768 (tiny: 5 frames at 96 x 64), filled from `seed`."""
    video, audio = ((1, 24, 2, 4, 6), (1, 32, 2, 8)) if tiny else ((1, 24, 72, 48, 86), (1, 32, 2, 405))
    g = torch.Generator().manual_seed(seed)
    return comfy.nested_tensor.NestedTensor((torch.randn(video, generator=g), torch.randn(audio, generator=g)))


def flat(t) -> torch.Tensor:
    """A sampler's output as one fp32 tensor (the streams of a joint latent one after another)."""
    if getattr(t, "is_nested", False):
        return torch.cat([x.flatten().float() for x in t.unbind()])
    return t.float()


def source_checkpoint(comfy, family: str, tiny: bool, work: Path, layers: int = 2, dtype: torch.dtype = None,
                      device: str = "cpu") -> Path:
    """The family's random model (fp32 unless `dtype`, drawn on `device`) saved in ComfyUI's
    layout (once per family, layers and dtype): what `streamplan convert` reads."""
    import make_reference
    from safetensors.torch import save_file

    dtype = dtype or torch.float32
    blocks = "" if layers == 2 else f"-{layers or 'all'}"
    name = f"{family}{'-tiny' if tiny else ''}{blocks}"
    path = work / f"{name}{'' if dtype == torch.float32 else '-' + str(dtype).split('.')[-1]}.safetensors"
    if not path.exists() and family == "minimax":
        import minimax_h3

        save_file(minimax_h3.make_state_dict(h3_config(tiny, layers), seed=0, dtype=dtype), str(path))
    elif not path.exists():
        cfg, cls = model_config(comfy, family, tiny, dtype, layers)
        model = cls(cfg, device=torch.device(device))
        make_reference.randomize(model.diffusion_model, torch.Generator(device).manual_seed(0))
        save_file({k: v.to("cpu", dtype).contiguous() for k, v in model.diffusion_model.state_dict().items()},
                  str(path))
        del model
    return path


@contextlib.contextmanager
def profiled(title: str, cuda: bool):
    """With a title: the block under torch.profiler, then printed to the standard error under that
    title: its 12 device kernels that took the most time and, on a GPU, where the device waited
    for the host (idle_stretches)."""
    if not title:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=90)
    print(f"[comfy_check] profile, {title}:\n{table}", file=sys.stderr)
    if cuda:
        print(idle_stretches(prof.events()), file=sys.stderr)


def idle_stretches(events, least_us: float = 50.0) -> str:
    """Where the device ran no kernel for at least `least_us` between its first and last kernel,
    by what the host ran at the middle of each such stretch: the innermost host event there,
    under the outermost streamplan.* or ComfyUI-level annotation (record_function)."""
    from collections import defaultdict

    from torch.autograd import DeviceType

    kernels = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA)
    host = [e for e in events if e.device_type == DeviceType.CPU]
    if not kernels:
        return "[comfy_check] no device kernels"
    gaps, end = [], kernels[0][1]
    for a, b in kernels[1:]:
        if a - end >= least_us:
            gaps.append((end, a))
        end = max(end, b)
    span = end - kernels[0][0]
    edges, counts, between, last = (5.0, 20.0, least_us), [0, 0, 0, 0], [0.0, 0.0, 0.0, 0.0], kernels[0][1]
    for a, b in kernels[1:]:
        gap = max(a - last, 0.0)
        i = sum(gap >= e for e in edges)
        counts[i] += 1
        between[i] += gap / 1e3
        last = max(last, b)
    histogram = ", ".join(f"{lo}-{hi} us: {n} ({ms:.1f} ms)" for lo, hi, n, ms in
                          zip(("0", "5", "20", f"{least_us:.0f}"), ("5", "20", f"{least_us:.0f}", "inf"), counts, between))
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for a, b in gaps:
        mid = (a + b) / 2
        covering = [e for e in host if e.time_range.start <= mid <= e.time_range.end]
        inner = min(covering, key=lambda e: e.time_range.end - e.time_range.start, default=None)
        outer = [e.name for e in covering if e.name.startswith("streamplan.")]
        name = f"{outer[0] + ' > ' if outer else ''}{inner.name if inner else '(no host event)'}"
        by[name][0] += (b - a) / 1e3
        by[name][1] += 1
    idle = sum(b - a for a, b in gaps) / 1e3
    lines = [f"[comfy_check] {len(kernels)} kernels; gaps between them: {histogram}",
             f"[comfy_check] device idle {idle:.1f} ms of {span / 1e3:.1f} ms in {len(gaps)} stretches of "
             f">= {least_us:.0f} us; what the host ran then (ms, stretches):"]
    for name, (ms, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:12]:
        lines.append(f"    {ms:9.1f} {n:6d}  {name[:150]}")
    return "\n".join(lines)


def rel(x: torch.Tensor | None, ref: torch.Tensor | None) -> float | None:
    """The rel L2 of x against ref (None where either is missing)."""
    if x is None or ref is None:
        return None
    return float((x.double() - ref.double()).norm() / ref.double().norm())


def main() -> int:
    a = parse_args()
    checked_environment(a)
    comfy = comfy_import(a.device, a.comfyui)
    import comfy_formats
    import make_reference

    import streamplan
    from streamplan import comfy_nodes

    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cuda = device.type == "cuda"
    rows = []
    work = a.work or tempfile.mkdtemp(prefix="comfy_check-")
    os.makedirs(work, exist_ok=True)
    for family, fmt in [(m, f) for m in a.models.split(",") if m for f in a.formats.split(",")]:
        t0 = time.time()
        cfg, cls = (None, None) if family == "minimax" else model_config(comfy, family, a.tiny, dtype)
        if fmt == "bf16" and family == "minimax":  # the random checkpoint, loaded by ComfyUI in dtype and fp32
            src = source_checkpoint(comfy, family, a.tiny, Path(work))
            patcher = comfy_formats.load(comfy, src, dtype)
            patcher32 = None if dtype == torch.float32 else comfy_formats.load(comfy, src, torch.float32)
            model = patcher.model
            compute = dtype
        elif fmt == "bf16":  # built in dtype, ComfyUI's fp32 layers kept
            model = cls(cfg, device=device)
            gen = torch.Generator(device).manual_seed(0)
            make_reference.randomize(model.diffusion_model, gen)
            patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)
            patcher32 = None
            compute = dtype
            if dtype != torch.float32:  # the reference: ComfyUI in fp32 on the same (rounded) weights
                cfg32, _ = model_config(comfy, family, a.tiny, torch.float32)
                model32 = cls(cfg32, device=device)
                model32.diffusion_model.load_state_dict(model.diffusion_model.state_dict())
                patcher32 = comfy.model_patcher.ModelPatcher(model32, load_device=device, offload_device=device)
        else:
            path = comfy_formats.convert(Path(a.cli), source_checkpoint(comfy, family, a.tiny, Path(work)), fmt)
            patcher = comfy_formats.load(comfy, path, FORMATS[fmt].load_dtype())
            # the reference: ComfyUI in fp32 on the weights it dequantized
            patcher32 = comfy_formats.load(comfy, path, torch.float32, comfy_formats.dequantized_state_dict(patcher))
            model = patcher.model
            compute = model.get_dtype_inference()  # ComfyUI's choice for the file
        if family == "minimax":
            noise = h3_latent(comfy, a.tiny, 1)
            ctx_dim, ctx_len = h3_config(a.tiny).text_dim, 512
        else:
            if family == "wan":
                shape = (1, 16, 3, 8, 12) if a.tiny else (1, 16, 21, 90, 160)
                ctx_dim, ctx_len = cfg.unet_config["text_dim"], 512
            else:
                shape = (1, 16, 16, 12) if a.tiny else (1, 16, 128, 128)
                ctx_dim, ctx_len = cfg.unet_config["context_in_dim"], 512
            noise = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        latent = noise * 0.0
        g = torch.Generator().manual_seed(2)
        extra = {}
        if family == "flux":
            extra = {"pooled_output": torch.randn(1, cfg.unet_config["vec_in_dim"], generator=g), "guidance": 3.5}
        positive = [[torch.randn(1, ctx_len, ctx_dim, generator=g), dict(extra)]]
        negative = [[torch.randn(1, ctx_len, ctx_dim, generator=g), dict(extra)]]
        lora = comfy.lora.load_lora(
            comfy_formats.lora_state_dict(model, 16, torch.Generator(device).manual_seed(3), torch.float32),
            comfy.lora.model_lora_keys_unet(model, {}))
        print(f"[comfy_check] {family} {fmt}: built in {time.time() - t0:.0f} s, {len(lora)} LoRA weights",
              file=sys.stderr)

        def sample(p, profile_as: str = "") -> tuple[torch.Tensor, float, int]:
            if cuda:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            start = time.time()
            with profiled(a.profile and profile_as, cuda):
                out = comfy.sample.sample(p, noise, a.steps, 5.0, "euler", "simple", positive, negative,
                                          latent, disable_pbar=True, seed=4)
                if cuda:
                    torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base if cuda else 0
            return flat(out), time.time() - start, peak

        plain = None
        for with_lora in (False, True) if fmt in a.lora_formats.split(",") else (False,):
            p = patcher.clone()
            if with_lora:
                p.add_patches(lora, 1.0)
            fp32 = None
            if patcher32 is not None and not a.no_fp32:
                p32 = patcher32.clone()
                if with_lora:
                    p32.add_patches(lora, 1.0)
                fp32 = sample(p32)[0]
                p32.unpatch_model()
            name = f"{family} {fmt}{' LoRA' if with_lora else ''}"
            raised = None
            try:
                sample(p)  # weights loaded (and patched) once before measuring
                ref, ref_s, ref_peak = sample(p, f"{name}, ComfyUI alone")
            except Exception as e:  # noqa: BLE001 - ComfyUI's own forward refuses the model as loaded: a row
                raised = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                ref, ref_s, ref_peak = None, None, None
                print(f"[comfy_check] {name}: ComfyUI alone raised {raised}", file=sys.stderr)
            own = got_default = None
            comfy_times = [] if ref_s is None else [ref_s]
            for chunk in [None, *a.token_chunks]:
                planned_model, _status = comfy_nodes.StreamplanMemoryPlanner().patch(p, "none", "comfy", False)
                if a.sparse is not None:
                    planned_model, _status = comfy_nodes.StreamplanSparseAttentionAdvanced().patch(
                        planned_model, a.sparse, "auto", 1, 0.5, 1, 0.5)
                wrapper = planned_model.wrappers["diffusion_model"]["streamplan"][0]
                wrapper.token_chunk = chunk
                reports: list[str] = []
                wrapper.report = reports.append
                run = f"{name}, with the node" + (f", token chunk {chunk}" if chunk else "")
                sample(planned_model)  # the plans of this geometry
                got, got_s, got_peak = sample(planned_model, run)
                node_times = [got_s]
                if chunk is None and ref is not None:
                    for _ in range(a.reps - 1):  # alternating, so that a drift of the clocks hits both alike
                        comfy_times.append(sample(p)[1])
                        node_times.append(sample(planned_model)[1])
                    got_s = statistics.median(node_times)
                print(f"[comfy_check] {run}:\n{wrapper.status()}", file=sys.stderr)
                handles = list(wrapper.handles.values())
                if a.profile:
                    for hd in handles:
                        print(f"[comfy_check] {run}, the plan:\n{hd.explain()}", file=sys.stderr)
                planned_calls = sum(hd.planned_calls for hd in handles)
                calls = sum(hd.calls for hd in handles) + sum(len(c) for _m, _why, c in wrapper.refused.values())
                fallbacks = sorted({f.code for hd in handles for f in hd.fallbacks} |
                                   {why.code for _m, why, _c in wrapper.refused.values()})
                if chunk is None:
                    got_default = got
                    own = got if ref is None else ref  # what the LoRA's effect is measured on
                lora_effect = rel(own, plain)
                rows.append({"model": family, "format": fmt, "lora": with_lora, "steps": a.steps, "sparse_kv": a.sparse,
                             "dtype": str(compute),
                             "device": torch.cuda.get_device_name() if cuda else "cpu", "token_chunk": chunk,
                             "rel_l2": rel(got, ref), "vs_default_node": rel(got, got_default),
                             "lora_changes_latents_by": lora_effect, "comfy_rel_l2_vs_fp32": rel(ref, fp32),
                             "streamplan_rel_l2_vs_fp32": rel(got, fp32), "comfy_raised": raised,
                             "comfy_s": statistics.median(comfy_times) if comfy_times else None,
                             "streamplan_s": got_s, "comfy_s_all": comfy_times, "streamplan_s_all": node_times,
                             "comfy_peak_bytes": ref_peak,
                             "streamplan_peak_bytes": got_peak, "planned_calls": planned_calls, "calls": calls,
                             "fallbacks": fallbacks, "report": reports[-1] if reports else "", "status": wrapper.status()})
                if a.out:
                    with open(a.out, "w") as f:
                        json.dump(rows, f, indent=1)
                for hd in wrapper.handles.values():
                    if streamplan.handle_of(hd.module) is hd:
                        streamplan.remove(hd.module)
            plain = own if plain is None else plain
    G = float(1 << 30)
    print(f"{'model':7} {'format':10} {'LoRA':5} {'chunk':>6} {'LoRA effect':>11} {'sp vs comfy':>11} {'comfy err':>9} {'sp err':>9} "
          f"{'comfy s':>8} {'sp s':>8} {'comfy GiB':>10} {'sp GiB':>8} planned fallbacks")
    e = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
    f = lambda v, w, d: "-".rjust(w) if v is None else f"{v:{w}.{d}f}"  # noqa: E731
    for r in rows:
        print(f"{r['model']:7} {r['format']:10} {str(r['lora']):5} {r['token_chunk'] or '-':>6} {e(r['lora_changes_latents_by']):>11} "
              f"{e(r['rel_l2']):>11} {e(r['comfy_rel_l2_vs_fp32']):>9} {e(r['streamplan_rel_l2_vs_fp32']):>9} "
              f"{f(r['comfy_s'], 8, 2)} {f(r['streamplan_s'], 8, 2)} "
              f"{f(r['comfy_peak_bytes'] and r['comfy_peak_bytes'] / G, 10, 3)} {r['streamplan_peak_bytes'] / G:8.3f} "
              f"{r['planned_calls']}/{r['calls']} {','.join(r['fallbacks']) or '-'}"
              + (f"  (ComfyUI alone raised {r['comfy_raised'].split(':')[0]})" if r["comfy_raised"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
