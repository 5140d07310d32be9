#!/usr/bin/python3
"""Plots `strata bench io --json FILE` results.

For each pattern (read, write, randread, randwrite) it writes two PNGs into --out:
  io-<pattern>-vs-block.png  bandwidth against block size, one line per queue depth
  io-<pattern>-vs-depth.png  bandwidth against queue depth, one line per block size
Strata's medians are solid lines with min-max bars; fio's (when the run had --vs-fio)
are dashed lines in the same colour.

usage: /usr/bin/python3 bench/plot_io.py results.json [--out DIR]
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0


def size_label(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= (1 << shift) and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def series(points, pattern, key, by, along):
    """{by value: [(along value, point)]} for one pattern, sorted along the x axis."""
    out = {}
    for p in points:
        if p["pattern"] != pattern:
            continue
        out.setdefault(p[by], []).append((p[along], p))
    for v in out.values():
        v.sort(key=lambda t: t[0])
    return dict(sorted(out.items()))


def draw(ax, xs, stats, colour, label, dashed):
    med = [s["median_bytes_per_s"] / MIB for s in stats]
    lo = [m - s["min_bytes_per_s"] / MIB for m, s in zip(med, stats)]
    hi = [s["max_bytes_per_s"] / MIB - m for m, s in zip(med, stats)]
    ax.errorbar(xs, med, yerr=[lo, hi], color=colour, linestyle="--" if dashed else "-",
                marker="s" if dashed else "o", capsize=3, label=label)


def plot(doc, pattern, by, along, out_dir):
    points = doc["points"]
    groups = series(points, pattern, "strata", by, along)
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (value, items) in enumerate(groups.items()):
        colour = colours[i % len(colours)]
        xs = [x for x, _ in items]
        name = f"qd={value}" if by == "depth" else f"bs={size_label(value)}"
        draw(ax, xs, [p["strata"] for _, p in items], colour, f"strata {name}", False)
        if all("fio" in p for _, p in items):
            draw(ax, xs, [p["fio"] for _, p in items], colour, f"fio {name}", True)
    ax.set_xscale("log", base=2)
    xs_all = sorted({x for items in groups.values() for x, _ in items})
    ax.set_xticks(xs_all)
    ax.set_xticklabels([size_label(x) if along == "block_size" else str(x) for x in xs_all])
    ax.set_xlabel("block size" if along == "block_size" else "queue depth")
    ax.set_ylabel("MiB/s (median, min-max bars)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"{pattern}: {doc.get('engine_description', doc.get('engine', ''))}", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    name = f"io-{pattern}-vs-{'block' if along == 'block_size' else 'depth'}.png"
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="file written by `strata bench io --json`")
    ap.add_argument("--out", default=".", help="directory for the PNGs (default: .)")
    args = ap.parse_args()
    with open(args.json) as f:
        doc = json.load(f)
    if doc.get("tool") != "strata bench io":
        sys.exit(f"{args.json}: not a `strata bench io --json` file")
    os.makedirs(args.out, exist_ok=True)
    patterns = sorted({p["pattern"] for p in doc["points"]})
    written = []
    for pattern in patterns:
        for by, along in (("depth", "block_size"), ("block_size", "depth")):
            path = plot(doc, pattern, by, along, args.out)
            if path:
                written.append(path)
    for p in written:
        print(p)
    if not written:
        sys.exit("no points to plot")


if __name__ == "__main__":
    main()
