#!/usr/bin/env python3
"""scripts/kernel-times.py on Nsight Compute CSV in both of ncu's layouts (written here in
the form ncu writes them: its ==PROF== lines first, quoted fields, thousands separators):
kernels grouped by name per process, milliseconds and shares right, the rest summed, and
each refusal naming its problem. No GPU: the CSV is the input."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "kernel-times.py")
HEAD = ['"ID"', '"Process ID"', '"Process Name"', '"Host Name"', '"Kernel Name"', '"Context"', '"Stream"',
        '"Block Size"', '"Grid Size"', '"Device"', '"CC"']
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(path, *extra):
    p = subprocess.run([sys.executable, SCRIPT, path, *extra], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def q(*fields):
    return ",".join('"' + f + '"' for f in fields)


def details(rows):
    lines = ["==PROF== Connected to process 101 (/work/strata)", "==PROF== Profiling \"k\" - 0: 0%....100%",
             ",".join(HEAD + ['"Section Name"', '"Metric Name"', '"Metric Unit"', '"Metric Value"'])]
    for i, (proc, name, unit, value) in enumerate(rows):
        lines.append(q(str(i), "101", proc, "h", name, "1", "13", "(256, 1, 1)", "(64, 1, 1)", "0", "9.0",
                       "Command line profiler metrics", "gpu__time_duration.sum", unit, value))
        # another metric of the same kernel, which must not count
        lines.append(q(str(i), "101", proc, "h", name, "1", "13", "(256, 1, 1)", "(64, 1, 1)", "0", "9.0",
                       "Command line profiler metrics", "sm__cycles_elapsed.avg", "cycle", "999,999"))
    return "\n".join(lines) + "\n"


with tempfile.TemporaryDirectory(prefix="kernel-times-") as tmp:
    # The default layout: strata's three kernels (one in two instantiations) and python's one.
    a = os.path.join(tmp, "details.csv")
    with open(a, "w") as f:
        f.write(details([
            ("strata", "void strata::cu::norm_fwd<Bf16T, 4>(const unsigned short *, int)", "usecond", "1,500"),
            ("strata", "void strata::cu::norm_fwd<Fp16T, 4>(const unsigned short *, int)", "usecond", "500"),
            ("strata", "sm90_xmma_gemm_bf16bf16_bf16f32(Params)", "msecond", "3"),
            ("strata", "void strata::cu::gelu<Bf16T>(float *, long)", "nsecond", "1,000,000"),
            ("python3", "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>(Params)", "usecond", "250"),
        ]))
    rc, out, err = run(a)
    check(rc == 0, f"details layout: exit 0 (rc {rc}, {err.strip()})")
    check("### python3: 1 kernels, 0.25 ms of GPU time" in out, "python's kernels in a table of their own")
    check("### strata: 4 kernels, 6.00 ms of GPU time" in out, "strata's 4 kernels, 6 ms (units and separators)")
    check("| `sm90_xmma_gemm_bf16bf16_bf16f32` | 1 | 3.00 | 50.0% |" in out, "the gemm's row, largest first")
    check("| `strata::cu::norm_fwd` | 2 | 2.00 | 33.3% |" in out, "one row for both instantiations of norm_fwd")
    check("| `strata::cu::gelu` | 1 | 1.00 | 16.7% |" in out, "gelu in nanoseconds")
    check(out.index("sm90_xmma") < out.index("norm_fwd") < out.index("gelu"), "rows by time, largest first")
    # --top 1: the rest in one row; --out writes the same tables.
    table = os.path.join(tmp, "t.md")
    rc, out, err = run(a, "--top", "1", "--out", table)
    check(rc == 0 and "| 2 other kernels | 3 | 3.00 | 50.0% |" in out, f"--top 1 sums the rest (rc {rc}): {out}")
    check(os.path.exists(table) and open(table).read().strip() == out.strip(), "--out holds the printed tables")

    # The raw layout: a column per metric, the units in the row under the header.
    b = os.path.join(tmp, "raw.csv")
    with open(b, "w") as f:
        f.write(",".join(HEAD + ['"gpu__time_duration.sum"', '"sm__cycles_elapsed.avg"']) + "\n")
        f.write(q(*([""] * 11), "nsecond", "cycle") + "\n")
        f.write(q("0", "7", "strata", "h", "adam_kernel<F32T, void>(AdamStepArgs)", "1", "13", "(256, 1, 1)",
                  "(4096, 1, 1)", "0", "9.0", "2,000,000", "5") + "\n")
        f.write(q("1", "7", "strata", "h", "adam_kernel<F32T, void>(AdamStepArgs)", "1", "13", "(256, 1, 1)",
                  "(4096, 1, 1)", "0", "9.0", "1,000,000", "5") + "\n")
    rc, out, err = run(b)
    check(rc == 0 and "### strata: 2 kernels, 3.00 ms of GPU time" in out and "| `adam_kernel` | 2 | 3.00 | 100.0% |" in out,
          f"raw layout (rc {rc}, {err.strip()}): {out}")

    # Refusals: each names the problem.
    rc, _, err = run(os.path.join(tmp, "missing.csv"))
    check(rc == 1 and "cannot read" in err, f"a missing file: exit 1, 'cannot read' (rc {rc}): {err.strip()}")
    c = os.path.join(tmp, "none.csv")
    with open(c, "w") as f:
        f.write("==PROF== Disconnected from process 101\n")
    rc, _, err = run(c)
    check(rc == 1 and "no CSV header" in err, f"no header: exit 1 naming it (rc {rc}): {err.strip()}")
    d = os.path.join(tmp, "other.csv")
    with open(d, "w") as f:
        f.write(",".join(HEAD + ['"sm__cycles_elapsed.avg"']) + "\n" + q(*([""] * 11), "cycle") + "\n")
    rc, _, err = run(d)
    check(rc == 1 and "--metrics gpu__time_duration.sum" in err, f"no duration metric: the fix named (rc {rc}): {err.strip()}")
    e = os.path.join(tmp, "empty.csv")
    with open(e, "w") as f:
        f.write(details([]))
    rc, _, err = run(e)
    check(rc == 1 and "did the capture record any kernel" in err, f"no kernel rows: exit 1 (rc {rc}): {err.strip()}")
    g = os.path.join(tmp, "unit.csv")
    with open(g, "w") as f:
        f.write(details([("strata", "k(int)", "fortnight", "1")]))
    rc, _, err = run(g)
    check(rc == 1 and "unknown time unit 'fortnight'" in err, f"an unknown unit: exit 1 naming it (rc {rc}): {err.strip()}")
    rc, _, err = run(a, "--top", "0")
    check(rc == 1 and "--top 0: give at least 1" in err, f"--top 0 refused (rc {rc}): {err.strip()}")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("all kernel-times checks passed")
