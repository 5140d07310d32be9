#!/usr/bin/env python3
"""The held-out loss is never missing without a word (issue #37 class 10;
docs/training.md, "Held-out loss"):

- `strata train --eval-batches N` prints it, with --quiet too, and records it in --metrics
  ({"heldout_loss": ..., "heldout_batches": ...}), saying how many of the N batches the
  held-out split held;
- on data whose held-out split holds no batch it says why there is none, on stdout and in
  --metrics (heldout_loss null and the reason);
- `strata eval --heldout` evaluates the same held-out windows from the checkpoint and
  gives the loss train printed; on data without held-out windows it says why (exit 2).

usage: test_heldout_loss.py STRATA_BINARY
"""
import json
import os
import pathlib
import re
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


def heldout_records(path):
    return [r for r in (json.loads(l) for l in path.read_text().splitlines()) if "heldout_loss" in r]


def printed_loss(out):
    m = re.search(r"held-out loss ([0-9.]+)", out)
    return float(m.group(1)) if m else None


with tempfile.TemporaryDirectory(prefix="strata-heldout-") as d:
    tmp = pathlib.Path(d)
    # 40000 bytes: 2499 windows of 17 tokens, 124 held out (62 batches of 2); 200 bytes: 12
    # windows, none held out (5% of 12 rounds down to 0).
    (tmp / "big.txt").write_text(corpus(40000))
    (tmp / "tiny.txt").write_text(corpus(200))
    cases = [
        # (name, data, --eval-batches, --quiet, batches evaluated, what the output says)
        ("--eval-batches 2 --quiet", "big.txt", 2, True, 2, "held-out loss"),
        ("--eval-batches 3", "big.txt", 3, False, 3, "held-out loss"),
        ("--eval-batches 100, 62 held out", "big.txt", 100, True, 62, "over 62 of the 100 batches asked"),
        ("--eval-batches 2 on data with no held-out windows", "tiny.txt", 2, False, 0,
         "no held-out loss: the data's held-out split has 0 windows"),
        ("--eval-batches 1 --quiet on data with no held-out windows", "tiny.txt", 1, True, 0,
         "no held-out loss: the data's held-out split has 0 windows"),
    ]
    for i, (name, data, batches, quiet, evaluated, message) in enumerate(cases):
        ckpt = tmp / f"ckpt{i}"
        cfg = write_config(tmp / f"cfg{i}.json", small_config(tmp, tmp / data, steps=3, checkpoint_dir=ckpt,
                                                              checkpoint_every=3))
        metrics = tmp / f"m{i}.jsonl"
        rc, out = run(strata, ["train", "-c", str(cfg), "--eval-batches", str(batches), "--metrics", str(metrics)] +
                      (["--quiet"] if quiet else []), tmp)
        check(rc == 0 and message in out, f"{name}: exit 0, says \"{message}\" (rc {rc}): {out.strip()[-300:]}")
        recs = heldout_records(metrics) if metrics.exists() else []
        check(len(recs) == 1 and recs[0].get("heldout_batches") == evaluated and recs[0].get("step") == 3,
              f"{name}: one held-out record in --metrics, {evaluated} batches, at step 3: {recs}")
        if evaluated == 0:
            check(bool(recs) and recs[0]["heldout_loss"] is None and "held-out split has 0 windows" in
                  recs[0].get("heldout_note", ""), f"{name}: the record says why there is no loss: {recs}")
            rc, out = run(strata, ["eval", "--checkpoint", str(ckpt), "--data", str(tmp / data), "--heldout"], tmp)
            check(rc == 2 and "held-out split has 0 windows" in out,
                  f"{name}: eval --heldout says why there is none, exit 2 (rc {rc}): {out.strip()[-300:]}")
            continue
        loss = printed_loss(out)
        check(loss is not None and bool(recs) and abs(recs[0]["heldout_loss"] - loss) < 1e-6,
              f"{name}: the loss printed ({loss}) is the one in --metrics ({recs[0]['heldout_loss'] if recs else None})")
        # The same windows from the checkpoint of the last step: micro-batch 2, one rank.
        rc, out = run(strata, ["eval", "--checkpoint", str(ckpt), "--data", str(tmp / data), "--heldout",
                               "--max-windows", str(2 * evaluated), "--json"], tmp)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        ev = json.loads(lines[0]) if rc == 0 and lines else {}
        check(rc == 0 and ev.get("windows") == 2 * evaluated and loss is not None and
              abs(ev.get("loss", 0) - loss) < 1e-5 * max(1.0, loss),
              f"{name}: eval --heldout on the checkpoint gives the same loss ({ev.get('loss')} vs {loss}; rc {rc})")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("the held-out loss is printed, recorded, or its absence explained")
