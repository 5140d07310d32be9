"""A `strata train` run small enough to take a second or two (one block, d_model 32,
context 16, bytes), for the tests that look at what a run reads and writes rather than
at what it learns (test_output_identity.py, test_full_disk_outputs.py,
test_heldout_loss.py). Everything lives under the directory the caller gives."""
import json
import random
import subprocess


def corpus(n_chars, seed=5):
    words = "the cat dog sat on a mat ran to red big house".split()
    rng = random.Random(seed)
    text = []
    size = 0
    while size < n_chars:
        w = rng.choice(words)
        text.append(w)
        size += len(w) + 1
    return " ".join(text)[:n_chars] + "\n"


def small_config(tmp, data, steps=2, checkpoint_dir=None, checkpoint_every=0, nvme=False):
    """The config as a dict; `nvme` puts parameters and optimizer states on NVMe in tmp/swap."""
    strata = {
        "device_budget": "8MiB", "pinned_budget": "8MiB",
        "model": {"layers": 1, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 256},
        "data": {"path": str(data), "format": "text"},
        "steps": steps,
    }
    if checkpoint_dir is not None:
        strata["checkpoint_dir"] = str(checkpoint_dir)
        strata["checkpoint_every"] = checkpoint_every
    zero = {"stage": 3}
    if nvme:
        (tmp / "swap").mkdir(exist_ok=True)
        zero["offload_param"] = {"device": "nvme", "nvme_path": str(tmp / "swap")}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": str(tmp / "swap")}
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": zero,
        "strata": strata,
    }


def write_config(path, cfg):
    path.write_text(json.dumps(cfg, indent=1))
    return path


def run(strata, args, cwd, timeout=120, stdout=None):
    """(rc, stdout + stderr). `stdout`: an open file the run's standard output goes to
    instead of being captured (a shell's redirection)."""
    try:
        if stdout is None:
            p = subprocess.run([strata] + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
            return p.returncode, p.stdout + p.stderr
        p = subprocess.run([strata] + args, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout,
                           cwd=cwd)
        return p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return "timeout", out
