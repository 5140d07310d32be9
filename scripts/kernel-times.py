#!/usr/bin/env python3
"""Where the GPU time of a profiled step goes: Nsight Compute's CSV in, a table per process out.

    python3 scripts/kernel-times.py NCU.csv [--top N] [--out TABLE.md]

NCU.csv is what `ncu --csv --log-file NCU.csv --metrics gpu__time_duration.sum ...` wrote
(scripts/gpu-check.sh profile runs it over `strata bench step --cuda-profile`, which
brackets one step of Strata and one of PyTorch in CUDA's profiler capture). Both of
ncu's CSV layouts are read: the default one (a row per kernel and metric, with "Metric
Name", "Metric Unit" and "Metric Value" columns) and --page raw (a column per metric, its
unit in the row under the header). Lines before the header (ncu's own ==PROF== lines) are
skipped.

For each process (ncu profiles every process with --target-processes all: strata and
the PyTorch reference's python), kernels are grouped by name (templates and parameters
cut off, so one kernel's instances are one row), and the table gives each group's calls,
total milliseconds and share of that process's kernel time, largest first, the rest
summed in one row. The time is each kernel's duration with the kernels serialised by
the profiler: the sum is the GPU's busy time, not the step's wall time (no overlap, no
gaps between kernels).

Exit 0 with the tables on stdout (and in --out); 1 with a message naming the problem
when the file is missing, has no kernel rows, or has no gpu__time_duration.sum.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"
UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
         "second": 1.0, "s": 1.0}


class BadInput(Exception):
    pass


def number(text):
    """ncu's numbers may carry thousands separators ("12,345.6")."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        raise BadInput(f"'{text}' is not a number") from None


def scale(unit):
    if unit not in UNITS:
        raise BadInput(f"unknown time unit '{unit}' for {METRIC}; expected one of {', '.join(sorted(UNITS))}")
    return UNITS[unit]


def kernel_group(name):
    """'void ns::k<float, 4>(Args)' and 'k<bf16>' are both 'ns::k' / 'k': one row per kernel."""
    name = name.strip()
    name = re.sub(r"^void\s+", "", name)
    depth, out = 0, []
    for ch in name:  # drop template arguments and parameters, nested or not
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip()
    return short or name


def read_rows(path):
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    start = next((i for i, l in enumerate(lines) if '"Kernel Name"' in l or l.startswith("ID,")), None)
    if start is None:
        raise BadInput(f"{path} has no CSV header with a \"Kernel Name\" column: is it ncu --csv output?")
    return list(csv.reader(lines[start:]))


def kernel_times(rows):
    """[(process, kernel name, seconds)] from either CSV layout."""
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    for need in ("Kernel Name", "Process Name"):
        if need not in col:
            raise BadInput(f"the CSV header has no \"{need}\" column")
    proc, kern = col["Process Name"], col["Kernel Name"]
    out = []
    if "Metric Name" in col and "Metric Value" in col:  # one row per kernel and metric
        unit_col = col.get("Metric Unit")
        for r in body:
            if len(r) < len(header) or r[col["Metric Name"]] != METRIC:
                continue
            unit = r[unit_col] if unit_col is not None else "nsecond"
            out.append((r[proc], r[kern], number(r[col["Metric Value"]]) * scale(unit)))
    elif METRIC in col:  # --page raw: a column per metric, units in the first row under the header
        m = col[METRIC]
        unit = "nsecond"
        if body and body[0] and body[0][0] == "" and len(body[0]) > m:
            unit, body = body[0][m], body[1:]
        for r in body:
            if len(r) > m and r[m] != "":
                out.append((r[proc], r[kern], number(r[m]) * scale(unit)))
    else:
        raise BadInput(f"no {METRIC} in the CSV: profile with --metrics {METRIC}")
    if not out:
        raise BadInput(f"no kernel has a {METRIC} value: did the capture record any kernel (--profile-from-start off "
                       "needs cudaProfilerStart, which bench step --cuda-profile calls)?")
    return out


def tables(times, top):
    by_proc = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for proc, kern, s in times:
        g = by_proc[proc][kernel_group(kern)]
        g[0] += 1
        g[1] += s
    text = []
    for proc in sorted(by_proc):
        groups = sorted(by_proc[proc].items(), key=lambda kv: -kv[1][1])
        total = sum(v[1] for _, v in groups)
        calls = sum(v[0] for _, v in groups)
        text.append(f"### {proc}: {calls} kernels, {total * 1e3:.2f} ms of GPU time\n")
        text.append("| kernel | calls | ms | share |")
        text.append("| --- | ---: | ---: | ---: |")
        for name, (n, s) in groups[:top]:
            text.append(f"| `{name}` | {n} | {s * 1e3:.2f} | {100 * s / total:.1f}% |")
        rest = groups[top:]
        if rest:
            n, s = sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)
            text.append(f"| {len(rest)} other kernels | {n} | {s * 1e3:.2f} | {100 * s / total:.1f}% |")
        text.append("")
    return "\n".join(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --csv output with gpu__time_duration.sum")
    ap.add_argument("--top", type=int, default=25, help="rows per process before the rest is summed (default 25)")
    ap.add_argument("--out", help="also write the tables to this file")
    args = ap.parse_args()
    if args.top < 1:
        print(f"kernel-times.py: --top {args.top}: give at least 1", file=sys.stderr)
        return 1
    try:
        text = tables(kernel_times(read_rows(args.csv)), args.top)
    except BadInput as e:
        print(f"kernel-times.py: {e}", file=sys.stderr)
        return 1
    print(text)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as e:
            print(f"kernel-times.py: cannot write {args.out}: {e.strerror}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
