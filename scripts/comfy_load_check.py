#!/usr/bin/env python3
"""ComfyUI loads and runs the checkpoints `streamplan convert` writes.

With COMFYUI_PATH pointing to a ComfyUI source tree (its Python dependencies importable), for
each family it writes random-weight checkpoints (`streamplan make-checkpoint`, the same weights
in the original and the diffusers layout), converts each with `streamplan convert --to fp8`,
`--to int8` and `--to convrot-int8`, loads every file with ComfyUI's own loader
(comfy.sd.load_diffusion_model, as its "Load Diffusion Model" node does) and runs the
diffusion model's forward on the same random inputs as the unconverted original-layout
checkpoint loaded the same way:

  wan   wan2.1-1.3b widths, 1 block (ComfyUI reads the head count as dim/128 and a fixed
        256-wide time embedding, so the tiny preset's widths are not detectable)
  flux  flux1-dev widths, 1 double and 2 single blocks (ComfyUI fixes axes 16/56/56)
  minimax  minimax-h3 widths, 1 block and the 2 token-refiner blocks (the tiny preset's widths
        convert nothing to convrot-int8: no input width is a multiple of 256)

Printed per file: ComfyUI's model class; the quantization ComfyUI made of each Linear (count
per comfy_quant format, ConvRot group size where rotated) and the Linears it kept dense; the
largest rel L2 of a quantized weight as ComfyUI dequantizes it against the unconverted weight;
how many stored values and scales differ from what ComfyUI's own quantizer (its layout's
quantize, as when ComfyUI quantizes a model itself) makes of the unconverted weight in fp32
("!=comfy q", differing/total); whether ComfyUI, saving the loaded model, writes the quantized
layers' tensors exactly as the file holds them ("ComfyUI saves"); the rel L2 of the output
against the unconverted model; the quantized ops ComfyUI ran (comfy_kitchen ops seen by the
profiler). A file ComfyUI cannot load or run is a failure row with ComfyUI's error; so is a
file ComfyUI would save otherwise, and an output further than --max-rel from the unconverted
one.

    COMFYUI_PATH=/path/to/ComfyUI python3 scripts/comfy_load_check.py [--streamplan BIN]
        [--families wan,flux,minimax] [--formats fp8,int8,convrot-int8] [--layouts original,diffusers]
        [--device cpu] [--out FILE.json]

Exit status 1 when any row failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from comfy_check import comfy_import  # noqa: E402

FAMILIES = {  # make-checkpoint arguments: widths ComfyUI's model detection reads correctly
    "wan": ["--family", "wan2.1-1.3b", "--layers", "1"],
    "flux": ["--family", "flux1-dev", "--layers", "1"],
    "minimax": ["--family", "minimax-h3", "--layers", "1"],
}
LAYOUTS = {"minimax": ["original"]}  # the layouts a family has, where not all of --layouts


def inputs(family: str, dm: torch.nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random inputs of the forward: latents, timestep, text states (Flux: pooled vector, guidance)."""
    if family == "wan":  # 2 latent frames of 8x8 patches
        return {"x": torch.randn(1, 16, 2, 16, 16, generator=gen), "t": torch.tensor([700.0]),
                "context": torch.randn(1, 24, dm.text_embedding[0].in_features, generator=gen)}
    if family == "flux":  # 16x16 packed tokens
        return {"x": torch.randn(1, 16, 32, 32, generator=gen), "t": torch.tensor([0.7]),
                "context": torch.randn(1, 24, dm.txt_in.in_features, generator=gen),
                "y": torch.randn(1, dm.vector_in.in_layer.in_features, generator=gen),
                "guidance": torch.tensor([3.5])}
    # MiniMax H3: 2 latent frames of 4x4 patches, 8 audio rows per channel, text states
    return {"x": torch.randn(1, dm.video_patch_proj.in_features // 4, 2, 8, 8, generator=gen),
            "audio": torch.randn(1, dm.audio_patch_proj.in_features, 2, 8, generator=gen),
            "t": torch.tensor([700.0]),  # sigma * 1000, as ComfyUI's model_base passes it
            "context": torch.randn(1, 24, dm.condition_proj.in_features, generator=gen)}


def forward(family: str, dm: torch.nn.Module, args: dict[str, torch.Tensor], dev, dtype) -> torch.Tensor:
    """The diffusion model's forward as ComfyUI's model_base calls it (latents and text in the
    inference dtype, the timestep in fp32); the output flattened to one fp64 vector."""
    a = {k: v.to(dev, dtype if k != "t" else torch.float32) for k, v in args.items()}
    if family == "wan":
        y = dm(a["x"], a["t"], a["context"])
    elif family == "flux":
        y = dm(a["x"], a["t"], a["context"], y=a["y"], guidance=a["guidance"])
    else:  # ComfyUI refines the text once per sampling run (model_base.MiniMaxH3.extra_conds)
        y = dm([a["x"], a["audio"]], a["t"], dm.preprocess_text_embeds(a["context"]))
    parts = y if isinstance(y, (list, tuple)) else [y]
    return torch.cat([p.reshape(-1).double().cpu() for p in parts])


def quant_of(module: torch.nn.Module) -> str | None:
    fmt = getattr(module, "quant_format", None)
    if not fmt:
        return None
    params = getattr(module.weight, "_params", None)
    if getattr(params, "convrot", False):
        return f"{fmt}+convrot{getattr(params, 'convrot_groupsize', '?')}"
    return fmt


def comfy_quantized(qo, module: torch.nn.Module, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` (fp32) quantized by ComfyUI's own layout for the module's format: (stored values, scale)."""
    params = module.weight._params
    if module.quant_format == "float8_e4m3fn":
        q, p = qo.TensorCoreFP8E4M3Layout.quantize(w, scale="recalculate")
    else:
        q, p = qo.TensorWiseINT8Layout.quantize(w, per_channel=True, convrot=getattr(params, "convrot", False),
                                                convrot_groupsize=getattr(params, "convrot_groupsize", 256))
    return q, p.scale


def run_streamplan(binary: str, args: list[str]) -> None:
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"streamplan {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    print(f"[comfy_load_check] {r.stdout.strip()}", file=sys.stderr)


class Check:
    """Loads files with ComfyUI and runs them; the first file of a family is the reference."""

    def __init__(self, comfy, max_rel: float):
        import comfy.model_management
        import comfy.quant_ops
        import comfy.sd

        self.comfy, self.mm, self.qo, self.max_rel = comfy, comfy.model_management, comfy.quant_ops, max_rel
        # ComfyUI calls comfy_kitchen.int8_linear from Python for an int8 Linear whose input
        # activation it fuses (an MLP's down projection): no dispatcher op the profiler sees.
        self.fused = collections.Counter()
        if getattr(self.qo, "_CK_AVAILABLE", False):
            plain = self.qo.ck.int8_linear

            def counted(*args, **kwargs):
                self.fused["int8_linear(fused act)"] += 1
                return plain(*args, **kwargs)

            self.qo.ck.int8_linear = counted
        self.ref_out, self.ref_weights, self.args = None, {}, None

    def linears(self, dm: torch.nn.Module, row: dict):
        """Counts the Linears per quantization; compares quantized weights with the reference's."""
        quant, worst, differ, total = collections.Counter(), 0.0, 0, 0
        for name, m in dm.named_modules():
            w = getattr(m, "weight", None)
            if not isinstance(w, torch.Tensor) or w.dim() != 2 or not hasattr(m, "in_features"):
                continue
            q = quant_of(m)
            if q is None:
                row["dense_linears"] += 1
            else:
                quant[q] += 1
            dq = (w.dequantize() if hasattr(w, "dequantize") else w).detach().cpu()
            if self.ref_out is None:  # kept in bf16 where that is exact (bf16 checkpoints): half the memory
                half = dq.to(torch.bfloat16)
                self.ref_weights[name] = half if torch.equal(half.to(dq.dtype), dq) else dq.clone()
            elif q is not None and name in self.ref_weights:
                r, dq = self.ref_weights[name].double(), dq.double()
                worst = max(worst, float((dq - r).norm() / r.norm()))
                cq, cs = comfy_quantized(self.qo, m, r.float().to(w.device))
                stored, scale = w._qdata, w._params.scale
                same = stored.shape == cq.shape and scale.shape == cs.shape
                if same:
                    differ += int((stored.view(torch.uint8) != cq.view(torch.uint8)).sum())
                    differ += int((scale.float() != cs.float()).sum())
                else:
                    differ += stored.numel()
                total += stored.numel() + scale.numel()
        row["quant"] = dict(quant)
        if quant:
            row["weight_rel_l2"] = worst
            row["not_as_comfy_quantizes"] = f"{differ}/{total}"

    @staticmethod
    def resaved(dm: torch.nn.Module, path: str) -> str:
        """Quantized layers' weight, weight_scale, comfy_quant (and input_scale) as ComfyUI saves the
        loaded model (its state_dict) against the file's: "same (n)", or what differs (names,
        dtype, shape, bytes, the comfy_quant JSON). Biases are left out: ComfyUI holds them in
        its compute dtype."""
        from safetensors import safe_open

        sd = dm.state_dict()
        differ, n = [], 0
        with safe_open(path, "pt") as f:
            names = {k.removeprefix("model.diffusion_model."): k for k in f.keys()}
            layers = {k[: -len(".comfy_quant")] for k in sd if k.endswith(".comfy_quant")}
            for layer in sorted(layers):
                quant = [f"{layer}.{x}" for x in ("weight", "weight_scale", "comfy_quant", "input_scale")]
                saved, stored = {k for k in quant if k in sd}, {k for k in quant if k in names}
                if saved != stored:
                    differ.append(f"{layer}: saved {sorted(saved ^ stored)}")
                for k in sorted(saved & stored):
                    n += 1
                    a, b = sd[k], f.get_tensor(names[k])
                    a = getattr(a, "_qdata", a).detach().cpu()
                    if k.endswith(".comfy_quant"):
                        same = json.loads(bytes(a.tolist())) == json.loads(bytes(b.tolist()))
                    else:
                        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(
                            a.view(torch.uint8) if a.element_size() == 1 else a,
                            b.view(torch.uint8) if b.element_size() == 1 else b)
                    if not same:
                        differ.append(k)
        if not layers:
            return "-"
        return f"same ({n})" if not differ else f"{len(differ)} differ: {', '.join(differ[:3])}"

    def file(self, family: str, path: str, fmt: str, layout: str) -> dict:
        row = {"family": family, "layout": layout, "file": os.path.basename(path), "format": fmt, "class": "-",
               "quant": {}, "dense_linears": 0, "weight_rel_l2": None, "not_as_comfy_quantizes": "-",
               "resaved": "-", "rel_l2": None, "ops": {}, "error": None}
        stage = "load"
        try:
            t0 = time.time()
            patcher = self.comfy.sd.load_diffusion_model(path)
            self.mm.load_models_gpu([patcher])
            model = patcher.model
            dm = model.diffusion_model
            row["class"] = f"{type(model).__name__}/{type(dm).__name__}"
            self.linears(dm, row)
            row["resaved"] = self.resaved(dm, path)
            if "differ" in row["resaved"]:
                row["error"] = f"ComfyUI saves the quantized layers otherwise: {row['resaved']}"
            stage = "run"
            if self.args is None:
                self.args = inputs(family, dm, torch.Generator().manual_seed(0))
            dtype, dev = model.get_dtype_inference(), self.mm.get_torch_device()
            self.fused.clear()
            cpu = torch.profiler.ProfilerActivity.CPU
            with torch.inference_mode(), torch.profiler.profile(activities=[cpu]) as prof:
                y = forward(family, dm, self.args, dev, dtype)
            row["ops"] = {e.key.split("::")[1]: e.count for e in prof.key_averages()
                          if e.key.startswith("comfy_kitchen::") and ("quant" in e.key or "int8" in e.key)
                          or e.key == "aten::_scaled_mm"}
            row["ops"].update(self.fused)
            if not torch.isfinite(y).all():
                raise RuntimeError("output has non-finite values")
            if self.ref_out is None:
                self.ref_out = y
            else:
                row["rel_l2"] = float((y - self.ref_out).norm() / self.ref_out.norm())
                if row["rel_l2"] > self.max_rel and row["error"] is None:
                    row["error"] = f"output rel L2 {row['rel_l2']:.3g} > {self.max_rel}: ComfyUI misreads the file"
            row["seconds"] = time.time() - t0
        except Exception as e:  # a failure row with ComfyUI's own error
            tb = traceback.extract_tb(e.__traceback__)[-1]
            msg = " ".join(str(e).split())
            row["error"] = f"{stage}: {type(e).__name__}: {msg} ({os.path.basename(tb.filename)}:{tb.lineno})"
        self.mm.unload_all_models()
        return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streamplan", help="the streamplan binary (default: on PATH, else build/streamplan)",
                    default=shutil.which("streamplan") or os.path.join(HERE, "..", "build", "streamplan"))
    ap.add_argument("--families", default="wan,flux,minimax")
    ap.add_argument("--formats", default="fp8,int8,convrot-int8")
    ap.add_argument("--layouts", default="original,diffusers", help="layouts of the checkpoints converted")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-rel", type=float, default=0.1, help="largest output rel L2 that counts as a correct read")
    ap.add_argument("--workdir", help="where the checkpoints are written (default: a temporary folder, removed)")
    ap.add_argument("--out", help="JSON file of the rows")
    a = ap.parse_args()
    comfy = comfy_import(a.device)
    work = a.workdir or tempfile.mkdtemp(prefix="comfy_load_check-")
    os.makedirs(work, exist_ok=True)
    rows = []
    try:
        for family in [f for f in a.families.split(",") if f]:
            check = Check(comfy, a.max_rel)
            wanted = ["original"] + [x for x in a.layouts.split(",") if x and x != "original"]
            for layout in [x for x in wanted if x in LAYOUTS.get(family, wanted)]:
                src = os.path.join(work, f"{family}_{layout}.safetensors")  # same seed: same weights
                run_streamplan(a.streamplan, ["make-checkpoint", *FAMILIES[family], "--layout", layout,
                                              "--seed", "1", "--out", src, "--quiet"])
                if layout == "original":  # the reference: the unconverted checkpoint in ComfyUI
                    rows.append(check.file(family, src, "-", layout))
                for fmt in [f for f in a.formats.split(",") if f]:
                    out = os.path.join(work, f"{family}_{layout}_{fmt}.safetensors")
                    run_streamplan(a.streamplan, ["convert", "--to", fmt, src, out])
                    rows.append(check.file(family, out, fmt, layout))
                    os.remove(out)
                    if a.out:
                        with open(a.out, "w") as f:
                            json.dump(rows, f, indent=1)
                os.remove(src)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)

    rel = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
    print(f"{'file':40} {'ComfyUI class':24} {'quantized Linears (ComfyUI)':34} {'dense':>5} {'weight rel':>10} "
          f"{'!=comfy q':>13} {'ComfyUI saves':>13} {'out rel L2':>10} {'quantized ops ComfyUI ran':40} status")
    failed = 0
    for r in rows:
        q = ", ".join(f"{k} x{v}" for k, v in sorted(r["quant"].items())) or "-"
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(r["ops"].items())) or "-"
        status = "ok" if r["error"] is None else f"FAIL {r['error']}"
        failed += r["error"] is not None
        print(f"{r['file']:40} {r['class']:24} {q:34} {r['dense_linears']:5d} {rel(r['weight_rel_l2']):>10} "
              f"{r['not_as_comfy_quantizes']:>13} {r['resaved']:>13} {rel(r['rel_l2']):>10} {ops:40} {status}")
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
