"""`strata train` with the layouts that keep collectives inside a node, under mpirun -np 4,
the 4 ranks taken as 2 nodes of 2 (strata.ranks_per_node), parameters and optimizer
states on NVMe: MiCS (zero_optimization.mics_shard_size 2) and ZeRO++ hpZ
(zero_optimization.zero_hpz_partition_size 2). For each:
- it follows flat ZeRO-3's losses (1e-5 relative; hpZ bit for bit);
- its checkpoint (MiCS: written by the first group) resumes flat, and a flat one resumes
  under it, each continuing as the uninterrupted run (checkpoints of any layout);
- bad input: a size that does not divide the world, groups that straddle nodes, a
  ranks_per_node that does not divide the world, the staged communicator, a size of 1.5,
  hpZ at stage 2, both at once, qwZ at stage 2, qgZ at stage 1, with MiCS and with the
  staged communicator: each refused, naming the fix, with exit 2 and nothing written.
- qwZ (zero_quantized_weights) and qgZ (zero_quantized_gradients, two hops over the 2
  nodes) over 200 steps on text in bf16, each alone and both with hpZ (ZeRO++ whole):
  every step's loss within 2% of flat's, the quantization errors in the metrics, fewer
  bytes over every rank.
Usage: test_hybrid_train.py STRATA MPIRUN"""
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


with tempfile.TemporaryDirectory(prefix="strata-hybrid-") as d:
    tmp = pathlib.Path(d)
    data = tmp / "corpus.txt"
    data.write_text(corpus(20000))

    def config(name, mics=None, steps=6, every=3, hpz=None):
        cfg = small_config(tmp, data, steps=steps, checkpoint_dir=tmp / f"ckpt-{name}", checkpoint_every=every,
                           nvme=True)
        cfg["strata"]["ranks_per_node"] = 2
        if mics:
            cfg["zero_optimization"]["mics_shard_size"] = mics
        if hpz:
            cfg["zero_optimization"]["zero_hpz_partition_size"] = hpz
        return cfg

    rc, out, flat = train(tmp, "flat", config("flat"))
    check(rc == 0 and sorted(flat) == list(range(1, 7)), f"flat ZeRO-3 at 4 ranks trains 6 steps (rc {rc})\n{out[-2000:]}")

    def layout(tag, title, key, says, ckpt_world, rtol):
        """Trains under `key` (a config's layout arguments), compares with flat, resumes both ways."""
        rc, out, runs = train(tmp, tag, config(tag, **key))
        check(rc == 0 and sorted(runs) == list(range(1, 7)), f"{title} at 4 ranks trains 6 steps (rc {rc})\n{out[-2000:]}")
        check(says in out, f"the {title} run says how it shards" + ("" if says in out else "\n" + out[-1500:]))
        if flat and runs:
            w = worst(runs, flat, range(1, 7))
            print(f"{title} against flat over 6 steps: worst relative loss difference {w:.2e}")
            check(w <= rtol, f"{title} follows flat within {rtol} ({w:.2e})")
        manifest = tmp / f"ckpt-{tag}" / "step-00000003" / "manifest.json"
        check(manifest.exists() and json.loads(manifest.read_text())["world_size"] == ckpt_world,
              f"the {title} checkpoint is written by a world of {ckpt_world}")
        # Across a change of layout, both ways: steps 4-6 as the uninterrupted run's.
        rc, out, flat_from = train(tmp, f"flat-from-{tag}", config(f"flat-from-{tag}"),
                                   extra=["--resume-from", str(tmp / f"ckpt-{tag}" / "step-00000003")])
        check(rc == 0 and sorted(flat_from) == [4, 5, 6], f"flat resumes a {title} checkpoint (rc {rc})\n{out[-1500:]}")
        if rc == 0 and runs:
            w = worst(flat_from, runs, [4, 5, 6])
            check(w <= rtol, f"flat resumed from {title} continues as {title} ran ({w:.2e})")
        rc, out, from_flat = train(tmp, f"{tag}-from-flat", config(f"{tag}-from-flat", **key),
                                   extra=["--resume-from", str(tmp / "ckpt-flat" / "step-00000003")])
        check(rc == 0 and sorted(from_flat) == [4, 5, 6], f"{title} resumes a flat checkpoint (rc {rc})\n{out[-1500:]}")
        if rc == 0 and flat:
            w = worst(from_flat, flat, [4, 5, 6])
            check(w <= rtol, f"{title} resumed from flat continues as flat ran ({w:.2e})")

    # MiCS: the first group (a world of 2) writes the checkpoint; gradients summed in
    # another order than flat's.
    layout("mics", "MiCS 2", {"mics": 2},
           "mics_shard_size 2: model states sharded within 2 groups of 2 ranks (within a node; 4 ranks: 2 nodes "
           "of 2 (strata.ranks_per_node)), replicated across them", 2, RTOL)
    # hpZ: every rank writes its shard; the same arithmetic as flat.
    layout("hpz", "hpZ 2", {"hpz": 2},
           "zero_hpz_partition_size 2: parameters gathered over all 4 ranks once after each change, then from "
           "secondary partitions within 2 groups of 2 ranks", 4, 0.0)

    # qwZ and qgZ over 200 steps on text: int8 gathers and reduce-scatters against flat's,
    # in memory and bf16, every step's loss within 2% (the bound), and each step's
    # quantization errors in the metrics.
    def long_run(name, qwz=False, qgz=False, hpz=None):
        cfg = small_config(tmp, data, steps=200)
        cfg["bf16"] = {"enabled": True}
        cfg["strata"]["ranks_per_node"] = 2
        if qwz:
            cfg["zero_optimization"]["zero_quantized_weights"] = True
        if qgz:
            cfg["zero_optimization"]["zero_quantized_gradients"] = True
        if hpz:
            cfg["zero_optimization"]["zero_hpz_partition_size"] = hpz
        path = write_config(tmp / f"{name}.json", cfg)
        metrics = tmp / f"{name}.jsonl"
        p = subprocess.run([mpirun] + MPI_FLAGS + ["-np", "4", strata, "train", "-c", str(path), "--metrics",
                           str(metrics)], capture_output=True, text=True, timeout=300, cwd=tmp)
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        return p.returncode, p.stdout + p.stderr, [r for r in rows if "loss" in r and "step" in r]

    def world_bytes(rows):
        """Bytes over every rank and, for qgZ's two hops, across the nodes: what crosses nodes."""
        return sum(r["collective_bytes"]["shard"] + r["collective_bytes"]["cross"] for r in rows)

    rc, out, flat200 = long_run("flat200")
    check(rc == 0 and len(flat200) == 200, f"flat bf16 trains 200 steps (rc {rc})\n{out[-1500:]}")
    for tag, qwz, qgz, hpz in (("qwZ", True, False, None), ("qgZ", False, True, None),
                               ("qwZ with qgZ and hpZ 2", True, True, 2)):
        rc, out, q200 = long_run(tag.replace(" ", "-"), qwz, qgz, hpz)
        check(rc == 0 and len(q200) == 200, f"{tag} trains 200 steps (rc {rc})\n{out[-1500:]}")
        if len(q200) == 200 and len(flat200) == 200:
            w = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(q200, flat200))
            werr = max(r.get("quantized_weights_error", 0) for r in q200)
            gerr = max(r.get("quantized_gradients_error", 0) for r in q200)
            crossed = world_bytes(q200) / world_bytes(flat200)
            print(f"{tag} against flat over 200 steps on text: worst relative loss difference {w:.2e}, loss "
                  f"{q200[0]['loss']:.4f} -> {q200[-1]['loss']:.4f} (flat {flat200[-1]['loss']:.4f}); "
                  f"quantization error at most {werr:.2e} (weights), {gerr:.2e} (gradients); bytes over every "
                  f"rank and across the nodes {crossed:.3f}x flat's")
            check(w <= 0.02, f"{tag} follows flat within 2% over 200 steps ({w:.2e})")
            check((0 < werr < 0.01) == qwz, f"{tag} reports its weights' quantization error ({werr:.2e})")
            check((0 < gerr < 0.05) == qgz, f"{tag} reports its gradients' quantization error ({gerr:.2e})")
            check(crossed < 0.8, f"{tag} sends fewer bytes over every rank and across the nodes ({crossed:.3f}x)")
            if qgz:
                check(all(r["collective_bytes"]["node"] > 0 and r["collective_bytes"]["cross"] > 0 for r in q200),
                      f"{tag}: every step's reduce-scatters went in two hops (node, then cross)")

    # Bad input: refused on every rank before anything is written.
    def refused(name, cfg, np, message):
        rc, out, losses = train(tmp, name, cfg, np=np)
        check(rc != 0 and message in out and not losses and not (tmp / f"ckpt-{name}").exists(),
              f"{name}: refused with '{message}' (rc {rc})" + ("" if message in out else "\n" + out[-1500:]))

    refused("mics3", config("mics3", 3), 4, "zero_optimization.mics_shard_size 3 does not divide the world size 4")
    refused("hpz3", config("hpz3", hpz=3), 4, "zero_optimization.zero_hpz_partition_size 3 does not divide the world size 4")
    hpz_straddle = config("hpz-straddle", hpz=2)
    hpz_straddle["strata"]["ranks_per_node"] = 1
    refused("hpz-straddle", hpz_straddle, 4,
            "zero_optimization.zero_hpz_partition_size 2 puts a secondary partition across node boundaries")
    hpz_staged = config("hpz-staged", hpz=2)
    hpz_staged["strata"]["device_communicator"] = "staged"
    refused("hpz-staged", hpz_staged, 4, "the staged device communicator cannot be split yet")
    hpz_stage2 = config("hpz-stage2", hpz=2)
    hpz_stage2["zero_optimization"]["stage"] = 2
    hpz_stage2["zero_optimization"].pop("offload_param", None)
    refused("hpz-stage2", hpz_stage2, 4, "zero_optimization.zero_hpz_partition_size 2 partitions stage 3's parameters")
    qwz2 = config("qwz-stage2")
    qwz2["zero_optimization"]["stage"] = 2
    qwz2["zero_optimization"].pop("offload_param", None)
    qwz2["zero_optimization"]["zero_quantized_weights"] = True
    refused("qwz-stage2", qwz2, 4, "zero_optimization.zero_quantized_weights quantizes stage 3's parameter gathers")
    qgz1 = config("qgz-stage1")
    qgz1["zero_optimization"]["stage"] = 1
    qgz1["zero_optimization"].pop("offload_param", None)
    qgz1["zero_optimization"]["zero_quantized_gradients"] = True
    refused("qgz-stage1", qgz1, 4, "zero_optimization.zero_quantized_gradients quantizes the gradient reduce-scatters "
            "of stages 2 and 3, and stage 1 all-reduces its gradient once a step")
    qgz_mics = config("qgz-mics", 2)
    qgz_mics["zero_optimization"]["zero_quantized_gradients"] = True
    refused("qgz-mics", qgz_mics, 4, "zero_optimization.zero_quantized_gradients quantizes a reduce-scatter over every "
            "rank, and mics_shard_size reduces within groups")
    qgz_staged = config("qgz-staged")
    qgz_staged["zero_optimization"]["zero_quantized_gradients"] = True
    qgz_staged["strata"]["device_communicator"] = "staged"
    refused("qgz-staged", qgz_staged, 4, "zero_optimization.zero_quantized_gradients splits the engine's communicator "
            "by node, and a staged one cannot be split")
    refused("hpz-and-mics", config("hpz-and-mics", mics=2, hpz=2), 4,
            "zero_hpz_partition_size and mics_shard_size are two ways to keep collectives inside a node")
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
