#!/usr/bin/env python3
"""Outputs on a disk that fills (issue #37 classes 2, 8 and 11; docs/failure-behaviour.md,
"Full disk"), on a real small tmpfs that this test mounts (it skips, exit 77, where it
cannot: mounting needs CAP_SYS_ADMIN), filled to leave 0, 1 or 2 pages free:

- `strata train --metrics` stops the run with the error (exit 1, ENOSPC and --metrics
  named), a checkpoint of the step it stopped at and the record it could not write on
  stderr; the file holds whole records only, of consecutive steps; --resume continues.
  With --metrics-optional it warns once and the run goes on (exit 0), the file still
  whole records only;
- strata.trace leaves no file, or the earlier trace byte for byte, never a cut one, and
  no temporary file;
- `strata import --out` names --out (not strata.checkpoint_dir) as the fix and leaves
  --out as it found it: no lock file, no temporary checkpoint, no directory it made.

Standard output on /dev/full (train, sample, eval --json) is exit 1 saying so, not exit 0;
those cases need no mount.

usage: test_full_disk_outputs.py STRATA_BINARY
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_run import corpus, run, small_config, write_config  # noqa: E402

strata = os.path.abspath(sys.argv[1])
failures = []
PAGE = 4096


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def fill(disk, free_pages):
    """Writes disk/filler so that free_pages pages are left."""
    filler = disk / "filler"
    if filler.exists():
        filler.unlink()
    st = os.statvfs(disk)
    size = st.f_bavail * st.f_frsize - free_pages * PAGE
    with open(filler, "wb") as f:
        f.write(b"\0" * size)


def records(path):
    """The metrics file's lines as JSON; None when a line is not a whole record."""
    text = path.read_text() if path.exists() else ""
    if text and not text.endswith("\n"):
        return None
    try:
        return [json.loads(line) for line in text.splitlines()]
    except json.JSONDecodeError:
        return None


def metrics_case(tmp, disk, name, free_pages, with_checkpoints):
    metrics = disk / f"{name}.jsonl"
    ckpt = tmp / f"ckpt-{name}"
    cfg = write_config(tmp / f"{name}.json", small_config(tmp, tmp / "corpus.txt", steps=20,
                                                          checkpoint_dir=ckpt if with_checkpoints else None,
                                                          checkpoint_every=100))
    fill(disk, free_pages)
    rc, out = run(strata, ["train", "-c", str(cfg), "--quiet", "--metrics", str(metrics)], tmp)
    recs = records(metrics)
    what = f"--metrics with {free_pages} page(s) free{'' if with_checkpoints else ', no checkpoint_dir'}"
    check(rc == 1 and "No space left on device" in out and f"--metrics" in out and str(metrics) in out,
          f"{what}: exit 1 naming ENOSPC and --metrics (rc {rc}): {out.strip()[-500:]}")
    check(recs is not None and [r["step"] for r in recs] == list(range(1, len(recs) + 1)) and len(recs) < 20,
          f"{what}: whole records of steps 1 .. k only, k < 20: {None if recs is None else [r['step'] for r in recs]}")
    k = len(recs or [])
    lost = [l for l in out.splitlines() if f"the metrics record of step {k + 1}, not written: " in l]
    check(len(lost) == 1 and json.loads(lost[0].split("not written: ", 1)[1])["step"] == k + 1,
          f"{what}: step {k + 1}'s record is on stderr: {lost}")
    if not with_checkpoints:
        check("no checkpoint was written (strata.checkpoint_dir is not set)" in out,
              f"{what}: says that nothing was saved: {out.strip()[-300:]}")
        return
    check((ckpt / f"step-{k + 1:08d}").is_dir() and "continue with --resume" in out,
          f"{what}: a checkpoint of step {k + 1}, and how to continue: {sorted(os.listdir(ckpt))}")
    (disk / "filler").unlink()
    rc, out = run(strata, ["train", "-c", str(cfg), "--quiet", "--resume", "--metrics", str(metrics)], tmp)
    recs = records(metrics)
    steps = None if recs is None else [r["step"] for r in recs]
    check(rc == 0 and steps == list(range(1, k + 1)) + list(range(k + 2, 21)),
          f"{what}: --resume with room again goes on to step 20 (rc {rc}): {steps}; {out.strip()[-300:]}")


def standard_output_cases(tmp):
    """Standard output on /dev/full (no mount needed): a failed write is exit 1, not 0."""
    ckpt = tmp / "ckpt-stdout"
    cfg = write_config(tmp / "stdout.json", small_config(tmp, tmp / "corpus.txt", steps=2, checkpoint_dir=ckpt,
                                                         checkpoint_every=2))
    for name, args in (("train", ["train", "-c", str(cfg)]),
                       ("sample", ["sample", "--checkpoint", str(ckpt), "--tokens", "50"]),
                       ("eval --json", ["eval", "--checkpoint", str(ckpt), "--data", str(tmp / "corpus.txt"),
                                        "--max-windows", "4", "--json"])):
        with open("/dev/full", "w") as full:
            rc, out = run(strata, args, tmp, stdout=full)
        check(rc == 1 and "writing standard output failed (No space left on device)" in out,
              f"{name} > /dev/full: exit 1, saying its output is incomplete (rc {rc}): {out.strip()[-300:]}")


def main(tmp, disk):

    # Class 2: --metrics, stopping the run, at three points of the file.
    for free in (0, 1, 2):
        metrics_case(tmp, disk, f"m{free}", free, True)
    metrics_case(tmp, disk, "m-no-ckpt", 1, False)
    # Marked optional: one warning, the run goes on.
    cfg = write_config(tmp / "opt.json", small_config(tmp, tmp / "corpus.txt", steps=20))
    metrics = disk / "opt.jsonl"
    fill(disk, 1)
    rc, out = run(strata, ["train", "-c", str(cfg), "--quiet", "--metrics", str(metrics), "--metrics-optional"], tmp)
    recs = records(metrics)
    check(rc == 0 and out.count("No space left on device") == 1 and "is no longer written" in out,
          f"--metrics-optional: one warning, exit 0 (rc {rc}): {out.strip()[-400:]}")
    check(recs is not None and 0 < len(recs) < 20 and [r["step"] for r in recs] == list(range(1, len(recs) + 1)),
          f"--metrics-optional: whole records only: {None if recs is None else len(recs)}")

    # Class 8: a trace on a full disk: nothing, or the earlier trace as it was.
    cfg = write_config(tmp / "trace.json", small_config(tmp, tmp / "corpus.txt", steps=8, nvme=True))
    earlier = tmp / "earlier-trace.json"
    rc, out = run(strata, ["train", "-c", str(cfg), "--quiet", "--set", f"strata.trace={earlier}"], tmp)
    check(rc == 0 and json.loads(earlier.read_text())["traceEvents"] and earlier.stat().st_size > 2 * PAGE,
          f"a trace on a disk with room is whole JSON of more than two pages (rc {rc}): {out.strip()[-300:]}")
    for name, free, before in (("new", 1, None), ("new-0", 0, None), ("over-earlier", 1, earlier.read_bytes()),
                               ("over-earlier-0", 0, earlier.read_bytes())):
        trace = disk / f"{name}.json"
        (disk / "filler").unlink(missing_ok=True)
        if before is not None:
            trace.write_bytes(before)
        fill(disk, free)
        rc, out = run(strata, ["train", "-c", str(cfg), "--quiet", "--set", f"strata.trace={trace}"], tmp)
        check("trace not written" in out and "No space left on device" in out,
              f"trace {name}, {free} page(s) free: says it was not written, and why (rc {rc}): {out.strip()[-300:]}")
        now = trace.read_bytes() if trace.exists() else None
        check(now == before, f"trace {name}: {'no file' if before is None else 'the earlier trace'} at the path, "
              f"not a cut one ({'none' if now is None else len(now)} bytes)")
        leftovers = [f for f in os.listdir(disk) if ".tmp" in f]
        check(not leftovers, f"trace {name}: no temporary file left: {leftovers}")
        if trace.exists():
            trace.unlink()

    # Class 11: import --out on a full disk.
    ckpt = tmp / "ckpt-import"
    cfg = write_config(tmp / "imp.json", small_config(tmp, tmp / "corpus.txt", steps=1, checkpoint_dir=ckpt,
                                                      checkpoint_every=1))
    rc, out = run(strata, ["train", "-c", str(cfg), "--quiet"], tmp)
    hf = tmp / "hf"
    rc2, out2 = run(strata, ["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(hf)], tmp)
    check(rc == 0 and rc2 == 0, f"a model directory to import (rc {rc}, {rc2}): {(out + out2).strip()[-300:]}")
    (disk / "empty").mkdir()
    for name, out_dir, existed in (("a new directory", disk / "new", False),
                                   ("an empty directory", disk / "empty", True),
                                   ("new nested directories", disk / "a" / "b" / "c", False)):
        for free in (1, 2):
            fill(disk, free)
            rc, out = run(strata, ["import", "--hf", str(hf), "--out", str(out_dir)], tmp)
            check(rc == 1 and "No space left on device" in out and "--out" in out and "checkpoint_dir" not in out,
                  f"import into {name}, {free} page(s) free: exit 1, the fix names --out (rc {rc}): {out.strip()[-400:]}")
            left = sorted(os.listdir(out_dir)) if out_dir.exists() else None
            check(left == ([] if existed else None) and not (disk / "a").exists(),
                  f"import into {name}, {free} page(s) free: --out as it was ({'empty' if existed else 'absent'}): {left}")


with tempfile.TemporaryDirectory(prefix="strata-full-disk-") as d:
    tmp = pathlib.Path(d)
    (tmp / "corpus.txt").write_text(corpus(40000))
    standard_output_cases(tmp)
    disk = tmp / "disk"
    disk.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"SKIP: cannot mount a small tmpfs here ({p.stderr.strip()}); needs CAP_SYS_ADMIN")
        sys.exit(1 if failures else 77)
    try:
        main(tmp, disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)])

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("outputs on a full disk lose nothing and leave nothing cut")
