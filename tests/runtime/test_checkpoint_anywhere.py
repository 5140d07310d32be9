#!/usr/bin/env python3
"""A checkpoint of an NVMe run is complete on its own: after `strata train` with
parameters and optimizer on NVMe, the run's nvme_path and data file are removed, and
`strata sample` and `strata export` still read the checkpoint (issue #16, class 7).

Usage: test_checkpoint_anywhere.py STRATA_BINARY
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    return r.returncode, r.stdout + r.stderr


def main():
    strata = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-anywhere-") as d:
        tmp = pathlib.Path(d)
        swap, data, ckpt = tmp / "swap", tmp / "corpus.txt", tmp / "ckpt"
        swap.mkdir()
        data.write_text("the cat sat on the mat. the dog ran to the red house. " * 200)
        cfg = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 3,
                                  "offload_param": {"device": "nvme", "nvme_path": str(swap)},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": str(swap)}},
            "strata": {"device_budget": "8MiB", "pinned_budget": "8MiB",
                       "model": {"layers": 1, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 256},
                       "data": {"path": str(data)}, "steps": 3, "checkpoint_every": 3,
                       "checkpoint_dir": str(ckpt)},
        }
        (tmp / "c.json").write_text(json.dumps(cfg))
        rc, out = run([strata, "train", "--config", str(tmp / "c.json"), "--quiet"])
        if rc != 0:
            sys.exit(f"strata train failed (rc {rc}): {out}")
        shutil.rmtree(swap)
        data.unlink()
        rc, out = run([strata, "sample", "--checkpoint", str(ckpt), "--prompt", "the ", "--tokens", "8", "--seed", "1"])
        if rc != 0 or not out.startswith("the "):
            failures.append(f"sample without the run's nvme_path and data (rc {rc}): {out}")
        st = tmp / "m.safetensors"
        rc, out = run([strata, "export", "--checkpoint", str(ckpt), "--out", str(st)])
        if rc != 0 or not st.is_file():
            failures.append(f"export without the run's nvme_path and data (rc {rc}): {out}")
    for f in failures:
        print("FAIL:", f)
    print(f"{2 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
