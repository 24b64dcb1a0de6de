#!/usr/bin/env python3
"""Writes docs/benchmarks.json and docs/benchmarks.md from `streamplan bench --out` files.

    scripts/bench_doc.py --machine "1x NVIDIA H200 ..." --command "scripts/device.sh OUT" a.json b.json
"""
import argparse
import json
import os

TARGETS = {"peak_over_floor": 1.10, "time_over_naive": 1.02, "estimate_error": 0.05}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--docs", default=os.path.join(os.path.dirname(__file__), "..", "docs"))
    ap.add_argument("--chart", action="append", default=[], help="chart files (relative to docs/) to show")
    ap.add_argument("--notes", help="a Markdown file appended after the table")
    ap.add_argument("results", nargs="+")
    a = ap.parse_args()
    rows = []
    for f in a.results:
        rows += json.load(open(f))
    json.dump(rows, open(os.path.join(a.docs, "benchmarks.json"), "w"), indent=1)
    G = float(1 << 30)
    lines = [
        "# Benchmarks",
        "",
        f"Machine: {a.machine}.",
        "",
        f"Command: `{a.command}` (it runs `streamplan bench`). bf16, naive and planned alternating in one process on the same",
        "weights and inputs, one warm-up each, then 3 timed repetitions each (CUDA events), median time,",
        "largest peak. Peak activation = caching allocator peak above weights and inputs; floor = residual",
        "stream + global K + V.",
        "",
        f"Targets: planned peak <= {TARGETS['peak_over_floor']} x floor, planned time <= "
        f"{TARGETS['time_over_naive']} x naive, estimate within {TARGETS['estimate_error']:.0%} of measured.",
        "",
        "| case | tokens | naive GiB | planned GiB | floor GiB | planned/floor | planned/naive time | "
        "naive ms | planned ms | estimate/measured | rel L2 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        nv = f"{r['naive_peak_bytes'] / G:.2f}" if r["naive_peak_bytes"] is not None else "does not fit"
        nt = f"{r['planned_ms'] / r['naive_ms']:.3f}" if r["naive_ms"] else "n/a"
        nm = f"{r['naive_ms']:.1f}" if r["naive_ms"] else "n/a"
        rel = f"{r['rel_l2']:.2e}" if r["rel_l2"] is not None else "n/a"
        lines.append(
            f"| {r['case']} | {r['tokens']} | {nv} | {r['planned_peak_bytes'] / G:.2f} | {r['floor_bytes'] / G:.2f} | "
            f"{r['planned_peak_bytes'] / r['floor_bytes']:.3f} | {nt} | {nm} | {r['planned_ms']:.1f} | "
            f"{r['estimated_peak_bytes'] / r['planned_peak_bytes']:.4f} | {rel} |")
    lines.append("")
    lines += [f"![{c}]({c})" for c in a.chart]
    if a.notes:
        lines += ["", open(a.notes).read().rstrip()]
    open(os.path.join(a.docs, "benchmarks.md"), "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
