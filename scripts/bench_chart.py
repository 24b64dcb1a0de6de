#!/usr/bin/env python3
"""Chart of `streamplan bench --out` results: peak activation (naive, planned, floor) and
step time (naive, planned) per case.

    scripts/bench_chart.py results.json chart.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = json.load(open(src))
    names = [r["case"] for r in rows]
    gib = float(1 << 30)
    x = range(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(rows)), 4.5))
    w = 0.27
    naive = [(r["naive_peak_bytes"] or 0) / gib for r in rows]
    a.bar([i - w for i in x], naive, w, label="naive")
    a.bar(list(x), [r["planned_peak_bytes"] / gib for r in rows], w, label="planned")
    a.bar([i + w for i in x], [r["floor_bytes"] / gib for r in rows], w, label="floor")
    a.set_ylabel("peak activation (GiB)")
    a.set_xticks(list(x), names, rotation=30, ha="right")
    a.legend()
    b.bar([i - w / 2 for i in x], [(r["naive_ms"] or 0) / 1000 for r in rows], w, label="naive")
    b.bar([i + w / 2 for i in x], [r["planned_ms"] / 1000 for r in rows], w, label="planned")
    b.set_ylabel("step time (s)")
    b.set_yscale("log")
    b.set_xticks(list(x), names, rotation=30, ha="right")
    b.legend()
    dev = rows[0]["device"] if rows else ""
    fig.suptitle(f"streamplan bench, {dev}, {rows[0]['dtype'] if rows else ''}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
