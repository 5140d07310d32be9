#!/usr/bin/env python3
"""`strata train` with strata.device_communicator = "staged" under mpirun at 2 and 4 ranks
(the cpu backend): the engine's device buffers go through the staged communicator, whose
choice rank 0 logs once with its reason, and every step's loss and gradient norm (17
digits, --metrics) equals the run on the default path (the mpi communicator), stage 3
with parameters and optimizer on NVMe, bf16. Each run takes a second or two.
  test_staged_train.py STRATA MPIRUN [MPIRUN FLAGS...]
"""
import json
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from small_run import corpus, small_config, write_config  # noqa: E402

failures = []


def check(cond, what, out=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
        if out:
            print(out[-3000:])


def records(path):
    return [(repr(r.get("loss")), repr(r.get("grad_norm"))) for r in map(json.loads, open(path))]


def main():
    strata, mpi = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory(prefix="strata-staged-train-") as d:
        tmp = pathlib.Path(d)
        data = tmp / "corpus.txt"
        data.write_text(corpus(20000))
        for world in (2, 4):
            got = {}
            for which in ("auto", "staged"):
                cfg = small_config(tmp, data, steps=3, nvme=True)
                cfg["bf16"] = {"enabled": True}
                cfg["train_micro_batch_size_per_gpu"] = 1
                cfg["strata"]["device_communicator"] = which
                conf = write_config(tmp / f"w{world}-{which}.json", cfg)
                metrics = tmp / f"w{world}-{which}.jsonl"
                p = subprocess.run(mpi + ["-np", str(world), strata, "train", "-c", str(conf), "--quiet", "--metrics",
                                          str(metrics)], capture_output=True, text=True, timeout=240, cwd=tmp)
                out = p.stdout + p.stderr
                check(p.returncode == 0, f"world {world}, {which}: strata train exits 0 (got {p.returncode})", out)
                if p.returncode != 0:
                    return
                logged = out.count("device collectives: staged")
                if which == "staged":
                    check(logged == 1, f"world {world}, staged: the choice is logged once (got {logged})", out)
                else:
                    check(logged == 0, f"world {world}, auto on cpu: the staged communicator is not used", out)
                got[which] = records(metrics)
            check(len(got["auto"]) == 3, f"world {world}: three steps recorded")
            check(got["staged"] == got["auto"],
                  f"world {world}: every step's loss and gradient norm are the default path's, bit for bit",
                  f"auto:   {got['auto']}\nstaged: {got['staged']}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)


main()
