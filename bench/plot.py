#!/usr/bin/python3
"""Draws one PNG from a `strata bench <benchmark> --json` report.

`strata bench ... --plot FILE.png` runs this (with /usr/bin/python3, which has
matplotlib) on the report it has just made. It can also be run by hand:

    /usr/bin/python3 bench/plot.py report.json --out FILE.png
    /usr/bin/python3 bench/plot.py --self-test DIR   # every plot from made-up reports

The report's "benchmark" field picks the plot:
  io           bandwidth against block size (one line per depth) and against depth (one
               line per block size), a row of panels per pattern; fio dashed
  copy         bandwidth against copy size, per direction; memcpy dashed
  capacity     effective bandwidth against working-set size, with the tiers' raw
               bandwidths and the bound they allow; the tier budgets marked
  optimizer    GB/s of each contender (CpuAdam, STREAM triads, PyTorch), min-max bars
  collectives  bus bandwidth against size per collective; the MPI references dashed
  step         step time split into compute and exposed transfer, one stacked bar per
               row (see plot_step for the row keys it reads)
Every plot draws medians, with min-max bars where the report has them.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0
DPI = 90


def size_label(b):
    b = int(b)
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if b >= (1 << shift) and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def title_of(doc, what):
    m = doc.get("machine", {})
    cpu = m.get("cpu_model", "")
    return f"strata bench {doc['benchmark']}: {what}\n{cpu}, {m.get('cores', '?')} cores".strip()


def errbar(ax, xs, med, lo, hi, label, style="-", marker="o", colour=None):
    lo_err = [max(0.0, m - v) for m, v in zip(med, lo)]
    hi_err = [max(0.0, v - m) for m, v in zip(med, hi)]
    ax.errorbar(xs, med, yerr=[lo_err, hi_err], linestyle=style, marker=marker, capsize=3, label=label,
                color=colour)


def log2_sizes(ax, xs):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(x) for x in ticks])
    ax.minorticks_off()


def plot_io(doc, fig):
    points = doc["points"]
    patterns = sorted({p["pattern"] for p in points})
    axes = fig.subplots(len(patterns), 2, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, pattern in enumerate(patterns):
        mine = [p for p in points if p["pattern"] == pattern]
        for col, (by, along) in enumerate((("depth", "block_size"), ("block_size", "depth"))):
            ax = axes[row][col]
            groups = sorted({p[by] for p in mine})
            for i, g in enumerate(groups):
                items = sorted((p for p in mine if p[by] == g), key=lambda p: p[along])
                xs = [p[along] for p in items]
                name = f"qd={g}" if by == "depth" else f"bs={size_label(g)}"
                for side, style in (("strata", "-"), ("fio", "--")):
                    if all(side in p for p in items):
                        s = [p[side] for p in items]
                        errbar(ax, xs, [v["median_bytes_per_s"] / MIB for v in s],
                               [v["min_bytes_per_s"] / MIB for v in s], [v["max_bytes_per_s"] / MIB for v in s],
                               f"{side} {name}", style, "o" if side == "strata" else "s", colours[i % len(colours)])
            if along == "block_size":
                log2_sizes(ax, [p[along] for p in mine])
                ax.set_xlabel("block size")
            else:
                ax.set_xscale("log", base=2)
                ticks = sorted({p[along] for p in mine})
                ax.set_xticks(ticks)
                ax.set_xticklabels([str(t) for t in ticks])
                ax.minorticks_off()
                ax.set_xlabel("queue depth")
            ax.set_ylabel(f"{pattern} MiB/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title_of(doc, doc.get("engine_description", "NVMe through the I/O engine")), fontsize=9)


def plot_copy(doc, fig):
    ax = fig.subplots()
    rows = doc["rows"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, d in enumerate(sorted({r["direction"] for r in rows})):
        rs = sorted((r for r in rows if r["direction"] == d), key=lambda r: r["size_bytes"])
        xs = [r["size_bytes"] for r in rs]
        c = colours[i % len(colours)]
        errbar(ax, xs, [r["strata_gbps"] for r in rs], [r["strata_min_gbps"] for r in rs],
               [r["strata_max_gbps"] for r in rs], f"strata copy stream, {d}", "-", "o", c)
        errbar(ax, xs, [r["ref_gbps"] for r in rs], [r["ref_min_gbps"] for r in rs],
               [r["ref_max_gbps"] for r in rs], f"memcpy, {d}", "--", "s", c)
    log2_sizes(ax, [r["size_bytes"] for r in rows])
    ax.set_xlabel("copy size")
    ax.set_ylabel("GB/s (median, min-max bars)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title_of(doc, doc["config"].get("device", "")), fontsize=9)


def plot_capacity(doc, fig):
    ax = fig.subplots()
    rows = sorted(doc["rows"], key=lambda r: r["working_set_bytes"])
    cfg = doc["config"]
    xs = [r["working_set_bytes"] for r in rows]
    errbar(ax, xs, [r["strata_gbps"] for r in rows], [r["strata_min_gbps"] for r in rows],
           [r["strata_max_gbps"] for r in rows], "strata: tiered store, to device", "-", "o", "C0")
    bound = [(r["working_set_bytes"], r["bound_gbps"]) for r in rows if r.get("bound_gbps") is not None]
    ax.plot([x for x, _ in bound], [y for _, y in bound], "k--", marker="x",
            label="bound from raw tiers (perfect overlap)")
    serial = [(r["working_set_bytes"], r["serial_gbps"]) for r in rows if r.get("serial_gbps") is not None]
    if serial:
        ax.plot([x for x, _ in serial], [y for _, y in serial], "--", color="grey", marker="+",
                label="raw tiers with no overlap")
    ax.plot(xs, [r["memcpy_gbps"] for r in rows], ":", marker="s", color="C1", label="memcpy (raw copy tier)")
    nv = [(r["working_set_bytes"], r["nvme_raw_gbps"]) for r in rows if r.get("nvme_raw_gbps") is not None]
    if nv:
        ax.plot([x for x, _ in nv], [y for _, y in nv], ":", marker="^", color="C2", label="NVMe raw O_DIRECT reads")
    for key, name in (("device_budget_bytes", "device budget"), ("pinned_budget_bytes", "pinned budget")):
        if key in cfg:
            ax.axvline(cfg[key], color="grey", alpha=0.5)
            ax.text(cfg[key], 0.98, " " + name, transform=ax.get_xaxis_transform(), fontsize=7, va="top",
                    rotation=90, color="grey")
    log2_sizes(ax, xs)
    ys = [r["strata_gbps"] for r in rows if r["strata_gbps"] > 0]
    if ys and max(ys) / min(ys) > 20:  # a working set resident on the device moves nothing
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("working set (tensors cycled in a fixed order)")
    ax.set_ylabel("GB/s (median, min-max bars)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title_of(doc, f"tensors of {size_label(cfg.get('tensor_bytes', 0))}, "
                               f"lookahead {cfg.get('lookahead_tensors', '?')}"), fontsize=9)


def plot_optimizer(doc, fig):
    ax = fig.subplots()
    rows = doc["rows"]
    names = [r["name"] for r in rows]
    med = [r["gbps"] for r in rows]
    lo = [r["min_gbps"] for r in rows]
    hi = [r["max_gbps"] for r in rows]
    ys = range(len(rows))
    ax.barh(ys, med, xerr=[[m - v for m, v in zip(med, lo)], [v - m for m, v in zip(med, hi)]], capsize=3,
            color=["C0" if n.startswith("strata") else "C7" for n in names])
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s moved (median, min-max bars)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title_of(doc, f"{doc['config'].get('params', '?')} params"), fontsize=9)


def plot_collectives(doc, fig):
    rows = doc["rows"]
    colls = sorted({r["collective"] for r in rows})
    axes = fig.subplots(1, len(colls), squeeze=False)[0]
    for ax, c in zip(axes, colls):
        # One line set per scope (--scope world node cross); reports before scopes have none.
        scopes = list(dict.fromkeys(r.get("scope", "world") for r in rows))
        xs = []
        for scope in scopes:
            rs = sorted((r for r in rows if r["collective"] == c and r.get("scope", "world") == scope),
                        key=lambda r: r["size_bytes"])
            sx = [r["size_bytes"] for r in rs]
            xs += sx
            tag = "" if len(scopes) == 1 else f" ({scope})"
            ax.plot(sx, [r["busbw_gbps"] for r in rs], "-o", label="strata" + tag)
            if rs and all(r.get("ref_busbw_gbps") is not None for r in rs):
                ax.plot(sx, [r["ref_busbw_gbps"] for r in rs], "--s", label="MPI blocking" + tag)
                ax.plot(sx, [r["ref_nb_busbw_gbps"] for r in rs], ":^", label="MPI non-blocking + wait" + tag)
        log2_sizes(ax, sorted(set(xs)))
        for lab in ax.get_xticklabels():
            lab.set_rotation(60)
            lab.set_fontsize(6)
        ax.set_xlabel("size")
        ax.set_ylabel("bus bandwidth GB/s")
        ax.set_title(c, fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title_of(doc, f"{doc['config'].get('ranks', '?')} ranks, {doc['config'].get('backend', '')}"),
                 fontsize=9)


def plot_step(doc, fig):
    """One stacked bar per row: compute time, then exposed (not hidden) transfer time.

    Row keys read: "label" (bar name), "compute_s" and "exposed_transfer_s" (medians, in
    seconds); optional "step_min_s"/"step_max_s" (whiskers on the bar's total) and
    "reference_s" (the in-memory step, drawn as a marker).
    """
    ax = fig.subplots()
    rows = doc["rows"]
    labels = [str(r["label"]) for r in rows]
    comp = [r["compute_s"] * 1e3 for r in rows]
    exposed = [r["exposed_transfer_s"] * 1e3 for r in rows]
    xs = list(range(len(rows)))
    ax.bar(xs, comp, label="compute", color="C0")
    ax.bar(xs, exposed, bottom=comp, label="exposed transfer", color="C3")
    if all("step_min_s" in r and "step_max_s" in r for r in rows):
        tot = [c + e for c, e in zip(comp, exposed)]
        ax.errorbar(xs, tot, yerr=[[t - r["step_min_s"] * 1e3 for t, r in zip(tot, rows)],
                                   [r["step_max_s"] * 1e3 - t for t, r in zip(tot, rows)]],
                    fmt="none", ecolor="k", capsize=4, label="step min-max")
    ref = [(x, r["reference_s"] * 1e3) for x, r in zip(xs, rows) if r.get("reference_s") is not None]
    if ref:
        ax.plot([x for x, _ in ref], [y for _, y in ref], "k_", markersize=22, mew=2, label="in-memory step")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7, rotation=20)
    ax.set_ylabel("ms per step (median)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title_of(doc, "step time: compute and exposed transfer"), fontsize=9)


PLOTS = {"io": plot_io, "copy": plot_copy, "capacity": plot_capacity, "optimizer": plot_optimizer,
         "collectives": plot_collectives, "step": plot_step}


def draw(doc, out):
    bench = doc.get("benchmark")
    if bench not in PLOTS:
        sys.exit(f"no plot for benchmark {bench!r}; known: {', '.join(sorted(PLOTS))}")
    rows = doc.get("points") if bench == "io" else doc.get("rows")
    if not rows:
        sys.exit(f"the {bench} report has no rows to plot")
    tall = bench == "io" and len({p["pattern"] for p in rows}) > 1
    fig = plt.figure(figsize=(9, 3.2 * len({p["pattern"] for p in rows})) if tall else (7.5, 4.6))
    PLOTS[bench](doc, fig)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def self_test(out_dir):
    """Made-up reports of every kind, each drawn; checks the files are PNGs."""
    os.makedirs(out_dir, exist_ok=True)
    machine = {"cpu_model": "test cpu", "cores": 2}
    st = {"median_bytes_per_s": 1e9, "min_bytes_per_s": 0.9e9, "max_bytes_per_s": 1.1e9}
    docs = {
        "io": {"points": [{"pattern": p, "block_size": b, "depth": d, "strata": st, "fio": st}
                          for p in ("read", "write") for b in (65536, 1 << 20) for d in (1, 16)]},
        "copy": {"config": {"device": "cpu"}, "rows": [
            {"direction": d, "size_bytes": s, "strata_gbps": 5, "strata_min_gbps": 4, "strata_max_gbps": 6,
             "ref_gbps": 6, "ref_min_gbps": 5, "ref_max_gbps": 7} for d in ("h2d", "d2h") for s in (4096, 1 << 20)]},
        "capacity": {"config": {"device_budget_bytes": 64 << 20, "pinned_budget_bytes": 256 << 20,
                                "tensor_bytes": 8 << 20, "lookahead_tensors": 4}, "rows": [
            {"working_set_bytes": w, "strata_gbps": g, "strata_min_gbps": g * 0.9, "strata_max_gbps": g * 1.1,
             "bound_gbps": g * 1.2, "memcpy_gbps": 8, "nvme_raw_gbps": n}
            for w, g, n in ((128 << 20, 6, None), (1 << 30, 1.5, 1.7))]},
        "optimizer": {"config": {"params": 1000}, "rows": [
            {"name": n, "gbps": 10, "min_gbps": 9, "max_gbps": 11} for n in ("strata CpuAdam", "STREAM triad")]},
        "collectives": {"config": {"ranks": 2, "backend": "mpi"}, "rows": [
            {"collective": c, "size_bytes": s, "busbw_gbps": 1, "ref_busbw_gbps": 1.1, "ref_nb_busbw_gbps": 1.0}
            for c in ("all_gather", "reduce_scatter") for s in (1024, 1 << 20)]},
        "step": {"rows": [{"label": l, "compute_s": 0.2, "exposed_transfer_s": e, "step_min_s": 0.2 + e * 0.9,
                           "step_max_s": 0.2 + e * 1.2, "reference_s": 0.2}
                          for l, e in (("in memory", 0.0), ("offload cpu", 0.03), ("offload nvme", 0.12))]},
    }
    for name, doc in docs.items():
        doc.update({"benchmark": name, "machine": machine})
        path = os.path.join(out_dir, f"{name}.png")
        draw(doc, path)
        with open(path, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                sys.exit(f"{path} is not a PNG")
        print(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", help="report written by `strata bench <benchmark> --json`")
    ap.add_argument("--out", help="PNG file to write")
    ap.add_argument("--self-test", metavar="DIR", help="draw every plot from made-up reports into DIR")
    args = ap.parse_args()
    if args.self_test:
        self_test(args.self_test)
        return
    if not args.json or not args.out:
        ap.error("give a report and --out FILE.png (or --self-test DIR)")
    with open(args.json) as f:
        doc = json.load(f)
    draw(doc, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
