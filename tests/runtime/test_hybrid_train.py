"""`strata train` with zero_optimization.mics_shard_size under mpirun -np 4, the 4 ranks
taken as 2 nodes of 2 (strata.ranks_per_node), parameters and optimizer states on NVMe:
- MiCS 2 follows flat ZeRO-3's losses (1e-5 relative);
- a MiCS checkpoint (written by the first group) resumes flat, and a flat one resumes
  under MiCS, each continuing as the uninterrupted run (checkpoints of any layout);
- bad input: a shard size that does not divide the world, groups that straddle nodes,
  a ranks_per_node that does not divide the world, MiCS with the staged communicator,
  a size of 1.5: each refused, naming the fix, with exit 2 and nothing written.
Usage: test_mics_train.py STRATA MPIRUN"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_run import corpus, small_config, write_config  # noqa: E402

# As tests/CMakeLists.txt's STRATA_MPIEXEC_FLAGS (containers: no CMA, running as root).
MPI_FLAGS = ["--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", "self,vader",
             "--mca", "btl_vader_single_copy_mechanism", "none"]
RTOL = 1e-5
strata, mpirun = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def train(tmp, name, cfg, np=4, extra=()):
    """(rc, output, {step: loss})"""
    path = write_config(tmp / f"{name}.json", cfg)
    metrics = tmp / f"{name}.jsonl"
    p = subprocess.run([mpirun] + MPI_FLAGS + ["-np", str(np), strata, "train", "-c", str(path), "--metrics",
                       str(metrics)] + list(extra), capture_output=True, text=True, timeout=300, cwd=tmp)
    losses = {}
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            r = json.loads(line)
            if "loss" in r and "step" in r:
                losses[r["step"]] = r["loss"]
    return p.returncode, p.stdout + p.stderr, losses


def worst(a, b, steps):
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)


with tempfile.TemporaryDirectory(prefix="strata-mics-") as d:
    tmp = pathlib.Path(d)
    data = tmp / "corpus.txt"
    data.write_text(corpus(20000))

    def config(name, mics, steps=6, every=3):
        cfg = small_config(tmp, data, steps=steps, checkpoint_dir=tmp / f"ckpt-{name}", checkpoint_every=every,
                           nvme=True)
        cfg["strata"]["ranks_per_node"] = 2
        if mics:
            cfg["zero_optimization"]["mics_shard_size"] = mics
        return cfg

    rc, out, flat = train(tmp, "flat", config("flat", None))
    check(rc == 0 and sorted(flat) == list(range(1, 7)), f"flat ZeRO-3 at 4 ranks trains 6 steps (rc {rc})\n{out[-2000:]}")
    rc, out, mics = train(tmp, "mics", config("mics", 2))
    check(rc == 0 and sorted(mics) == list(range(1, 7)), f"MiCS 2 at 4 ranks trains 6 steps (rc {rc})\n{out[-2000:]}")
    check("mics_shard_size 2: model states sharded within 2 groups of 2 ranks (within a node; 4 ranks: 2 nodes "
          "of 2 (strata.ranks_per_node)), replicated across them" in out, "the run says how it shards")
    if flat and mics:
        w = worst(mics, flat, range(1, 7))
        print(f"MiCS 2 against flat over 6 steps: worst relative loss difference {w:.2e}")
        check(w <= RTOL, f"MiCS follows flat within {RTOL} ({w:.2e})")
    # The first group wrote the checkpoint: its ranks' files, a world of 2.
    manifest = tmp / "ckpt-mics" / "step-00000003" / "manifest.json"
    check(manifest.exists() and json.loads(manifest.read_text())["world_size"] == 2,
          "the MiCS checkpoint is the first group's: world_size 2")
    # Across a change of layout, both ways: steps 4-6 as the uninterrupted run's.
    rc, out, flat_from_mics = train(tmp, "flat-from-mics", config("flat-from-mics", None),
                                    extra=["--resume-from", str(tmp / "ckpt-mics" / "step-00000003")])
    check(rc == 0 and sorted(flat_from_mics) == [4, 5, 6], f"flat resumes a MiCS checkpoint (rc {rc})\n{out[-1500:]}")
    if rc == 0 and mics:
        w = worst(flat_from_mics, mics, [4, 5, 6])
        check(w <= RTOL, f"flat resumed from MiCS continues as MiCS ran ({w:.2e})")
    rc, out, mics_from_flat = train(tmp, "mics-from-flat", config("mics-from-flat", 2),
                                    extra=["--resume-from", str(tmp / "ckpt-flat" / "step-00000003")])
    check(rc == 0 and sorted(mics_from_flat) == [4, 5, 6], f"MiCS resumes a flat checkpoint (rc {rc})\n{out[-1500:]}")
    if rc == 0 and flat:
        w = worst(mics_from_flat, flat, [4, 5, 6])
        check(w <= RTOL, f"MiCS resumed from flat continues as flat ran ({w:.2e})")

    # Bad input: refused on every rank before anything is written.
    def refused(name, cfg, np, message):
        rc, out, losses = train(tmp, name, cfg, np=np)
        check(rc != 0 and message in out and not losses and not (tmp / f"ckpt-{name}").exists(),
              f"{name}: refused with '{message}' (rc {rc})" + ("" if message in out else "\n" + out[-1500:]))

    refused("mics3", config("mics3", 3), 4, "zero_optimization.mics_shard_size 3 does not divide the world size 4")
    bad = config("rpn3", 2)
    bad["strata"]["ranks_per_node"] = 3
    refused("rpn3", bad, 4, "strata.ranks_per_node 3 does not divide the world size 4")
    straddle = config("straddle", 3)
    refused("straddle", straddle, 6, "zero_optimization.mics_shard_size 3 puts groups across node boundaries")
    staged = config("staged", 2)
    staged["strata"]["device_communicator"] = "staged"
    refused("staged", staged, 4, "the staged device communicator cannot be split yet")
    half = config("half", 2)
    half["zero_optimization"]["mics_shard_size"] = 1.5
    refused("half", half, 4, "zero_optimization.mics_shard_size is 1.5")

print("PASS" if not failures else f"FAILED: {len(failures)}")
sys.exit(1 if failures else 0)
