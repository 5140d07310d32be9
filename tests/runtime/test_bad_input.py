"""`strata` with inputs and outputs that used to hang, crash or destroy something
(issue #16; docs/failure-behaviour.md): each is refused with a clear message and exit
code 2, quickly. Everything it creates is in its own temporary directory; /dev/null and
/dev/zero are only stat()ed, and the runs that name them are refused before writing.

usage: test_bad_input.py STRATA_BINARY SOURCE_DIR
"""
import os
import stat
import subprocess
import sys
import tempfile
import time

strata, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, timeout=60):
    """(rc, output, seconds); a run that does not finish within timeout is a failure, not a hang.
    It runs in the temporary directory, so that nothing lands anywhere else."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([strata] + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        return "timeout", out, time.monotonic() - t0


def refused(name, args, message, timeout=60):
    rc, out, secs = run(args, timeout)
    check(rc == 2 and message in out, f"{name}: exit 2 with \"{message}\" (rc {rc}, {secs:.1f} s): {out.strip()[-400:]}")
    return out


def snapshot(path):
    st = os.stat(path)
    return (st.st_mode, st.st_rdev, st.st_ino, st.st_dev)


def tree(path):
    return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                  for d, _, fs in os.walk(path) for f in fs)


fortunes = os.path.join(src, "configs", "fortunes.json")
data = os.path.join(src, "README.md")
small = ["--set", "zero_optimization.offload_param.device=none", "--set", "zero_optimization.offload_optimizer.device=none"]
cwd = None

with tempfile.TemporaryDirectory(prefix="strata-bad-input-") as work:
    cwd = work
    small += ["--set", "strata.checkpoint_dir=" + os.path.join(work, "run-checkpoints")]
    # A checkpoint layout (runtime/checkpoint.cpp): the output checks refuse before the
    # checkpoint is read, so a stand-in is enough.
    step = os.path.join(work, "ckpt", "step-00000010")
    os.makedirs(step)
    for f, text in (("manifest.json", "{}"), ("rank-0.bin", "shard")):
        with open(os.path.join(step, f), "w") as fh:
            fh.write(text)
    ckpt_before = tree(os.path.join(work, "ckpt"))

    # Class 2: outputs that could destroy what they replace.
    null_before = snapshot("/dev/null")
    check(stat.S_ISCHR(null_before[0]), "/dev/null is a character device before")
    refused("export --out /dev/null --force", ["export", "--checkpoint", step, "--out", "/dev/null", "--force"],
            "--out '/dev/null' is a character device, not a regular file")
    null_after = snapshot("/dev/null")
    check(null_after == null_before and stat.S_ISCHR(null_after[0]), "/dev/null is the same character device after")
    refused("export --out into a checkpoint",
            ["export", "--checkpoint", step, "--out", os.path.join(step, "model.safetensors"), "--force"],
            f"lies inside checkpoint directory '{step}'")
    refused("export --out over a shard",
            ["export", "--checkpoint", step, "--out", os.path.join(step, "rank-0.bin"), "--force"],
            f"lies inside checkpoint directory '{step}'")
    refused("export --out named as a checkpoint",
            ["export", "--checkpoint", step, "--out", os.path.join(work, "ckpt", "step-00000020"), "--force"],
            "takes the name of a checkpoint")
    fifo_out = os.path.join(work, "out.fifo")
    os.mkfifo(fifo_out)
    refused("train --metrics a FIFO", ["train", "-c", fortunes, "--set", f"strata.data.path={data}"] + small +
            ["--metrics", fifo_out], f"--metrics '{fifo_out}' is a FIFO (named pipe), not a regular file", timeout=60)
    refused("train --metrics into a checkpoint", ["train", "-c", fortunes, "--set", f"strata.data.path={data}"] + small +
            ["--metrics", os.path.join(step, "m.jsonl")], "lies inside checkpoint directory")
    refused("train strata.trace into a checkpoint", ["train", "-c", fortunes, "--set", f"strata.data.path={data}"] +
            small + ["--steps", "1", "--set", "strata.device_budget=256MiB", "--set",
                     f"strata.trace={os.path.join(step, 't.json')}"],
            "strata.trace '" + os.path.join(step, "t.json") + "' lies inside checkpoint directory", timeout=120)
    check(tree(os.path.join(work, "ckpt")) == ckpt_before, "the checkpoint directory is unchanged")

    # Class 4: crashes. A number beyond a double, nesting 100,000 deep.
    def config(name, text):
        p = os.path.join(work, name)
        with open(p, "w") as fh:
            fh.write(text)
        return p
    refused("config with 1e400", ["train", "-c", config("huge.json", '{"train_micro_batch_size_per_gpu": 1e400}')],
            "number overflow parsing '1e400'")
    refused("config nested 100000 deep", ["train", "-c", config("deep.json", "[" * 100000 + "]" * 100000)],
            "nests objects and arrays more than 64 deep")
    deep_manifest = os.path.join(work, "deep-ckpt", "step-00000001")
    os.makedirs(deep_manifest)
    with open(os.path.join(deep_manifest, "manifest.json"), "w") as fh:
        fh.write('{"a":' * 100000 + "1" + "}" * 100000)
    rc, out, secs = run(["sample", "--checkpoint", deep_manifest])
    check(rc == 1 and "is not valid JSON: it is damaged" in out,
          f"sample with a manifest nested 100000 deep: exit 1, damaged (rc {rc}): {out.strip()[-300:]}")

    # Class 5: hangs. A FIFO with no writer as config and as data, /dev/zero as config.
    fifo_in = os.path.join(work, "in.fifo")
    os.mkfifo(fifo_in)
    refused("train -c FIFO", ["train", "-c", fifo_in], f"config file '{fifo_in}' is not a regular file (it is a FIFO",
            timeout=30)
    refused("train -c /dev/zero", ["train", "-c", "/dev/zero"],
            "config file '/dev/zero' is not a regular file (it is a character device)", timeout=30)
    refused("train with a FIFO as data", ["train", "-c", fortunes, "--set", f"strata.data.path={fifo_in}"] + small,
            f"data file '{fifo_in}' is not a regular file (it is a FIFO", timeout=30)

    # Sizes bounded before allocation, quickly.
    _, _, secs = run(["plan", "--d-model", "2147483647"])
    refused("plan --d-model 2147483647", ["plan", "--d-model", "2147483647"],
            "model d_model = 2147483647 is more than Strata's limit of 1048576")
    check(secs < 10, f"plan --d-model 2147483647 answers in {secs:.1f} s")
    refused("plan --nodes 1000000000", ["plan", "--nodes", "1000000000"], "--nodes is 1000000000: give at most 1048576")

    # offload_optimizer.ratio and the GPU optimizer: out of range, without a host share, and
    # without a GPU, each a clear refusal before any work.
    rc, out, _ = run(["plan", "--optimizer-ratio", "1.5"])
    check(100 <= rc <= 127 and "--optimizer-ratio: Value 1.5 not in range" in out,
          f"plan --optimizer-ratio 1.5: a usage error naming the range (rc {rc}): {out.strip()[-300:]}")
    refused("plan --optimizer-ratio 0.5 --offload-optimizer none",
            ["plan", "--optimizer-ratio", "0.5", "--offload-optimizer", "none"],
            "offload_optimizer.ratio below 1 splits the optimizer between the GPU and offload_optimizer.device")
    refused("train with ratio 0.5 and optimizer none",
            ["train", "-c", fortunes, "--set", "zero_optimization.offload_optimizer.ratio=0.5"] + small,
            "set the device to \"cpu\" or \"nvme\"", timeout=30)
    refused("train with ratio 0.5 on the cpu backend",
            ["train", "-c", fortunes, "--set", "zero_optimization.offload_param.device=none", "--set",
             "zero_optimization.offload_optimizer.device=cpu", "--set", "zero_optimization.offload_optimizer.ratio=0.5",
             "--set", f"strata.data.path={data}", "--set", f"strata.checkpoint_dir={os.path.join(work, 'ck-ratio')}"],
            "the cpu backend has none: drop ratio", timeout=60)
    check(not os.path.exists(os.path.join(work, "ck-ratio", "step-00000001")),
          "train with ratio 0.5 on the cpu backend saved nothing")
    # Activation checkpoints and gather limits (issue #13): each refused before any step.
    refused("train with cpu_checkpointing and checkpointing off",
            ["train", "-c", fortunes, "--set", "activation_checkpointing.cpu_checkpointing=true"] + small,
            "set enabled to true, or drop cpu_checkpointing", timeout=30)
    refused("train with a tile factor that does not divide the linears",
            ["train", "-c", fortunes, "--set", "strata.tile_factor=3"] + small,
            "strata.tile_factor = 3 does not divide every linear", timeout=30)
    refused("train with a tile factor of 0", ["train", "-c", fortunes, "--set", "strata.tile_factor=0"] + small,
            "tile_factor", timeout=30)
    refused("train with a prefetch bucket of 0",
            ["train", "-c", fortunes, "--set", "zero_optimization.stage3_prefetch_bucket_size=0"] + small,
            "stage3_prefetch_bucket_size", timeout=30)
    refused("plan with a tile factor that does not divide the linears",
            ["plan", "--model", "gpt-1t", "--cluster", "dgx-2", "--tile-factor", "3"],
            "strata.tile_factor = 3 does not divide every linear", timeout=30)
    refused("plan with tiles at stage 2", ["plan", "--stage", "2", "--tile-factor", "2"],
            "--tile-factor, --tile-size and --bucket-elems cut stage 3's gathers", timeout=30)
    refused("train with a tile size below one row of a linear",
            ["train", "-c", fortunes, "--set", "strata.tile_size=10"] + small,
            "strata.tile_size = 10 is smaller than one output row", timeout=30)
    for flag in ("--tile-size", "--bucket-elems", "--sub-group"):  # unsigned: -5 must not wrap around
        rc, out, _ = run(["plan", flag, "-5"])
        check(100 <= rc <= 127 and f"{flag}: must be a whole number of elements, 0 or more, not -5" in out,
              f"plan {flag} -5: a usage error (rc {rc}): {out.strip()[-300:]}")
    refused("plan with a tile size below one row of a linear",
            ["plan", "--model", "gpt-1t", "--cluster", "dgx-2", "--tile-size", "1000"],
            "strata.tile_size = 1000 is smaller than one output row", timeout=30)
    refused("plan with a tile factor of 0", ["plan", "--tile-factor", "0"], "--tile-factor must be at least 1",
            timeout=30)
    refused("train with partition_activations",
            ["train", "-c", fortunes, "--set", "activation_checkpointing.enabled=true", "--set",
             "activation_checkpointing.partition_activations=true"] + small,
            "activation_checkpointing.partition_activations = true is not supported", timeout=30)
    # A tier too small is a runtime failure (exit 1), named before the first step.
    rc, out, _ = run(["train", "-c", fortunes, "--set", "activation_checkpointing.enabled=true", "--set",
                      f"strata.data.path={data}", "--set", f"strata.checkpoint_dir={os.path.join(work, 'ck-cp')}",
                      "--set", f"zero_optimization.offload_param.nvme_path={work}", "--set",
                      f"zero_optimization.offload_optimizer.nvme_path={work}"], timeout=60)
    check(rc == 1 and "activation_checkpointing.cpu_checkpointing moves them off the device" in out and
          not os.path.exists(os.path.join(work, "ck-cp", "step-00000001")),
          f"train with the checkpoints beyond the device budget: exit 1 naming cpu_checkpointing (rc {rc}): "
          f"{out.strip()[-300:]}")
    refused("train with stage3_max_live_parameters below a block",
            ["train", "-c", fortunes, "--set", "zero_optimization.stage3_max_live_parameters=1000", "--set",
             f"strata.data.path={data}"] + small,
            "zero_optimization.stage3_max_live_parameters = 1000 is smaller than the largest parameter group", timeout=30)
    refused("plan --cpu-checkpointing --no-checkpointing", ["plan", "--cpu-checkpointing", "--no-checkpointing"],
            "--no-checkpointing turns it off")
    refused("bench step --cpu-checkpointing without --checkpointing", ["bench", "step", "--cpu-checkpointing", "--dir", work],
            "--cpu-checkpointing moves the checkpoints of --checkpointing: give both", timeout=30)
    rc, out, _ = run(["bench", "step", "--gpu-optimizer", "--optimizer-ratio", "1.5", "--dir", work])
    check(100 <= rc <= 127 and "--optimizer-ratio: Value 1.5 not in range" in out,
          f"bench step --optimizer-ratio 1.5: a usage error naming the range (rc {rc}): {out.strip()[-300:]}")
    refused("bench step --gpu-optimizer on the cpu backend", ["bench", "step", "--gpu-optimizer", "--dir", work],
            "--gpu-optimizer needs --backend cuda", timeout=30)
    refused("bench step --cuda-profile on the cpu backend", ["bench", "step", "--cuda-profile", "PyTorch", "--dir", work],
            "--cuda-profile brackets a configuration's step for a CUDA profiler (ncu, nsys): give --backend cuda too",
            timeout=30)
    refused("bench step --cuda-profile with --warmup 0",
            ["bench", "step", "--backend", "cuda", "--warmup", "0", "--cuda-profile", "PyTorch", "--dir", work],
            "--cuda-profile records a configuration's last warm-up step", timeout=30)
    refused("bench step --speculation-inline without --speculative", ["bench", "step", "--speculation-inline", "--dir", work],
            "--speculation-inline says where the speculative optimizer steps: give --speculative too", timeout=30)
    rc, out, _ = run(["bench", "step", "--optimizer-threads", "100000", "--dir", work])
    check(100 <= rc <= 127 and "--optimizer-threads: Value 100000 not in range" in out,
          f"bench step --optimizer-threads 100000: a usage error naming the range (rc {rc}): {out.strip()[-300:]}")
    refused("bench step --no-f32 without a 16-bit precision", ["bench", "step", "--no-f32", "--dir", work],
            "--no-f32 leaves out the fp32 configurations beside the 16-bit ones", timeout=30)

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("all bad-input checks passed")
