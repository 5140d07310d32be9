#!/usr/bin/env python3
"""No output of a run replaces one of its inputs (issue #37 class 1; docs/failure-behaviour.md,
"Outputs: never an input"). Each run below names, as an output, a file the same run reads
(its data, its config, the checkpoint it reads, the model directory it imports, the data
it evaluates), spelled directly, through a symbolic link or through `..`, or as its
standard output appended to (`>>`), or names one new file as two outputs. Each is refused
with exit 2 and a message naming both, and every input is byte for byte what it was.

usage: test_output_identity.py STRATA_BINARY
"""
import hashlib
import os
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_run import corpus, run, small_config, write_config  # noqa: E402

strata = os.path.abspath(sys.argv[1])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def tree(path):
    """Every file under path (or path itself) with the hash of its bytes."""
    p = pathlib.Path(path)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


with tempfile.TemporaryDirectory(prefix="strata-output-identity-") as d:
    tmp = pathlib.Path(d)
    data = tmp / "corpus.txt"
    data.write_text(corpus(20000))
    ckpt_dir = tmp / "ckpt"
    cfg = write_config(tmp / "cfg.json", small_config(tmp, data, steps=2, checkpoint_dir=ckpt_dir, checkpoint_every=2))
    rc, out = run(strata, ["train", "-c", str(cfg), "--quiet"], tmp)
    check(rc == 0, f"a first run saves a checkpoint (rc {rc}): {out.strip()[-300:]}")
    step = ckpt_dir / "step-00000002"
    hf = tmp / "hf"
    rc, out = run(strata, ["export", "--checkpoint", str(step), "--format", "hf", "--out", str(hf)], tmp)
    check(rc == 0, f"the checkpoint exported as a model directory to import (rc {rc}): {out.strip()[-300:]}")
    (tmp / "sub").mkdir()
    (tmp / "data-link.txt").symlink_to(data)
    (tmp / "manifest-link.json").symlink_to(step / "manifest.json")

    # The runs below save nothing, so that each starts as the one before it did.
    run_cfg = write_config(tmp / "run.json", small_config(tmp, data, steps=2))
    inputs = [data, cfg, run_cfg, ckpt_dir, hf]
    before = {}
    for p in inputs:
        before.update(tree(p))
    backup = tmp / "backup"
    backup.mkdir()
    for p in inputs:
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, backup / p.name)

    train = ["train", "-c", str(run_cfg), "--quiet"]
    cases = [
        # (name, args, file the standard output is appended to, what the message says)
        ("strata.trace = the data file", train + ["--set", f"strata.trace={data}"], None,
         f"strata.trace '{data}' is the same file as strata.data.path"),
        ("--metrics = the data file", train + ["--metrics", str(data)], None,
         f"--metrics '{data}' is the same file as strata.data.path"),
        ("--metrics = the config file", train + ["--metrics", str(run_cfg)], None,
         f"--metrics '{run_cfg}' is the same file as the config file"),
        ("--metrics = a symbolic link to the data file", train + ["--metrics", str(tmp / "data-link.txt")], None,
         "is the same file as strata.data.path"),
        ("strata.trace = the data file through ..", train + ["--set", f"strata.trace={tmp / 'sub' / '..' / 'corpus.txt'}"],
         None, "is the same file as strata.data.path"),
        ("--metrics and strata.trace one new name", train + ["--metrics", str(tmp / "new.json"), "--set",
                                                             f"strata.trace={tmp / 'new.json'}"], None,
         "are the same file: one output would replace the other"),
        ("train's standard output >> the data file", ["train", "-c", str(run_cfg)], data,
         "standard output (redirected to"),
        ("eval's standard output >> the data it evaluates", ["eval", "--checkpoint", str(step), "--data", str(data)],
         data, "is the same file as --data"),
        ("sample's standard output >> the checkpoint's manifest", ["sample", "--checkpoint", str(step), "--tokens", "4"],
         step / "manifest.json", "is the same file as the checkpoint"),
        ("sample's standard output >> a link to the manifest", ["sample", "--checkpoint", str(step), "--tokens", "4"],
         tmp / "manifest-link.json", "is the same file as the checkpoint"),
        ("import --out = --hf", ["import", "--hf", str(hf), "--out", str(hf)], None,
         f"--out '{hf}' is the same file as --hf"),
        ("import --out = --hf through ..", ["import", "--hf", str(hf), "--out", str(tmp / "sub" / ".." / "hf")], None,
         "is the same file as --hf"),
    ]
    for name, args, redirect, message in cases:
        if redirect is None:
            rc, out = run(strata, args, tmp)
        else:
            with open(redirect, "a") as f:
                rc, out = run(strata, args, tmp, stdout=f)
        check(rc == 2 and message in out, f"{name}: exit 2 with \"{message}\" (rc {rc}): {out.strip()[-400:]}")
        after = {}
        for p in inputs:
            after.update(tree(p))
        check(after == before, f"{name}: every input is unchanged")
        if after != before:  # put them back, so that each case is judged on its own
            for p in inputs:
                if p.is_dir():
                    shutil.rmtree(p)
                    shutil.copytree(backup / p.name, p, symlinks=True)
                else:
                    shutil.copy2(backup / p.name, p)

    # Outputs of their own are fine, beside the inputs and in the checkpoint_dir.
    rc, out = run(strata, train + ["--metrics", str(tmp / "m.jsonl"), "--set", f"strata.trace={tmp / 't.json'}"], tmp)
    check(rc == 0 and (tmp / "m.jsonl").exists() and (tmp / "t.json").exists(),
          f"a run whose outputs are files of their own runs (rc {rc}): {out.strip()[-300:]}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all outputs of a run are refused where they are its inputs")
