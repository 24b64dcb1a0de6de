#!/usr/bin/env python3
"""Checks streamplan's forward of a family against diffusers'.

    compare.py --bin PATH/streamplan --family wan|flux [--variant dev|schnell] [--keep DIR]
               [--seed N] [--tol 1e-4]

1. make_reference.py writes a small random-weight model, its inputs and diffusers' fp32 CPU output
   into a temporary folder (or DIR with --keep, which is then left in place).
2. Runs  PATH run --checkpoint DIR/model.safetensors --inputs DIR/inputs.safetensors
                  --output DIR/out.safetensors --dtype fp32 --device cpu --chunk 16 --json
   which must write `output` (planned schedule) and `naive_output` (naive schedule), each in the
   layout of the reference (see make_reference.py). Its stdout is kept as DIR/run.json.
3. Requires rel L2 = ||x - ref|| / ||ref|| <= tol for both.

Exit status: 0 pass; 1 a mismatch; 2 the reference or the streamplan run failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(code, msg):
    print(f"compare.py: FAIL: {msg}", file=sys.stderr)
    sys.exit(code)


def run(cmd, what, timeout):
    print("+ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        fail(2, f"{what}: cannot start: {e}")
    except subprocess.TimeoutExpired:
        fail(2, f"{what}: no result within {timeout} s")
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        sys.stderr.write(p.stderr[-4000:])
        fail(2, f"{what} exited with status {p.returncode}")
    return p


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


def check(dirpath, args, name):
    import torch
    from safetensors.torch import load_file

    ref = load_file(os.path.join(dirpath, "reference.safetensors"))["output"]
    out_path = os.path.join(dirpath, "out.safetensors")
    if not os.path.exists(out_path):
        fail(2, f"streamplan run wrote no {out_path}")
    out = load_file(out_path)
    refnorm = ref.double().norm().item()
    if not refnorm > 0:
        fail(2, "the reference output is zero: nothing to compare against")
    results = {}
    for key in ("output", "naive_output"):
        if key not in out:
            fail(1, f"{out_path} has no tensor '{key}' (has: {sorted(out)})")
        t = out[key]
        if tuple(t.shape) != tuple(ref.shape):
            fail(1, f"'{key}' has shape {list(t.shape)}, the reference {list(ref.shape)}")
        if not torch.isfinite(t).all():
            fail(1, f"'{key}' has non-finite values")
        results[key] = rel_l2(t, ref)
    between = rel_l2(out["output"], out["naive_output"])
    print(f"{name}: reference norm {refnorm:.4f}, shape {list(ref.shape)}")
    for key, r in results.items():
        verdict = "ok" if r <= args.tol else "FAIL"
        print(f"{name}: {key:13s} rel L2 vs diffusers = {r:.3e}  (tol {args.tol:g})  {verdict}")
    print(f"{name}: planned vs naive rel L2 = {between:.3e}")
    bad = [k for k, r in results.items() if not r <= args.tol]
    if bad:
        hint = "" if args.keep else " (rerun with --keep DIR to inspect the files)"
        fail(1, f"{name}: {', '.join(bad)} differ from diffusers beyond {args.tol:g}{hint}")
    print(f"{name}: PASS")


def write_sidecar(d, family):
    """The sidecar streamplan needs for what names and shapes cannot tell, from config.json."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    hd = cfg["attention_head_dim"]
    if family == "wan":
        h = 2 * (hd // 6)
        side = {"family": "wan2.1", "head_dim": hd, "eps": cfg["eps"],
                "rope": {"theta": 10000, "axes_dim": [hd - 2 * h, h, h]}}
    else:
        side = {"family": "flux1", "eps": 1e-6,
                "rope": {"theta": 10000, "axes_dim": list(cfg["axes_dims_rope"])}}
    path = os.path.join(d, "sidecar.json")
    with open(path, "w") as f:
        json.dump(side, f)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the streamplan executable")
    ap.add_argument("--family", required=True, choices=["wan", "flux"])
    ap.add_argument("--variant", choices=["dev", "schnell"], default="dev", help="flux only")
    ap.add_argument("--keep", metavar="DIR", help="write and keep the files in DIR")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--timeout", type=int, default=600, help="seconds for each step")
    args = ap.parse_args(argv)
    name = args.family + (f"-{args.variant}" if args.family == "flux" else "")

    def go(d):
        run([sys.executable, os.path.join(HERE, "make_reference.py"), "--family", args.family,
             "--variant", args.variant, "--out", d, "--seed", str(args.seed), "--quiet"],
            "make_reference.py", args.timeout)
        sidecar = write_sidecar(d, args.family)
        p = run([args.bin, "run", "--sidecar", sidecar,
                 "--checkpoint", os.path.join(d, "model.safetensors"),
                 "--inputs", os.path.join(d, "inputs.safetensors"),
                 "--output", os.path.join(d, "out.safetensors"),
                 "--dtype", "fp32", "--device", "cpu", "--chunk", "16", "--json"],
                "streamplan run", args.timeout)
        with open(os.path.join(d, "run.json"), "w") as f:
            f.write(p.stdout)
        check(d, args, name)

    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        go(os.path.abspath(args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix=f"streamplan-ref-{name}-") as d:
            go(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
