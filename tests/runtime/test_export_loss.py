"""`strata train` -> `strata export` -> PyTorch: a GPT-2 written here from GPT-2's own
definition (Conv1D weights [in, out], tied head), loaded from the exported safetensors
file, gives the held-out loss that `strata train --eval-batches` printed, on the same
held-out windows (model/data.hpp: the last 5% of the seq_len-token windows, in file
order). Tolerance: relative 1e-5 (float32 in Strata, float64 here).

With --precision bf16 the run trains with "bf16": {"enabled": true} and exports in what
it trained in (bf16 safetensors, checked). The PyTorch model computes in float64 on the
bf16 weights; Strata evaluates with 16-bit activations (docs/mixed-precision.md), so the
losses differ by the rounding of those, not by the weights: relative 1e-4 (measured
1.9e-6; the rounding errors of 384 positions average out in the mean loss).

`strata eval` on the same checkpoint gives PyTorch's mean loss over the same windows (a
context shorter than the model's and the first 150 windows; the whole file): relative 1e-5.

usage: test_export_loss.py --strata BIN --workdir DIR [--precision f32|bf16]
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

p = argparse.ArgumentParser()
p.add_argument("--strata", required=True)
p.add_argument("--workdir", required=True)
p.add_argument("--precision", choices=("f32", "bf16"), default="f32")
a = p.parse_args()
shutil.rmtree(a.workdir, ignore_errors=True)
os.makedirs(a.workdir)

# Text with structure to learn: sentences from a small grammar.
rng = random.Random(5)
words = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "to", "red", "big", "house", "and", "saw"]
text = " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + "." for _ in range(3000))
data = os.path.join(a.workdir, "corpus.txt")
with open(data, "w") as f:
    f.write(text)

L, d, H, T, V, micro, eval_batches = 2, 64, 4, 32, 256, 4, 3
cfg = {
    "train_micro_batch_size_per_gpu": micro,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3,
                          "offload_param": {"device": "nvme", "nvme_path": a.workdir},
                          "offload_optimizer": {"device": "nvme", "nvme_path": a.workdir}},
    "strata": {"device_budget": "8MiB", "pinned_budget": "8MiB",
               "model": {"layers": L, "d_model": d, "heads": H, "seq_len": T, "vocab": V},
               "data": {"path": data, "format": "text"}, "steps": 30, "checkpoint_every": 30,
               "checkpoint_dir": os.path.join(a.workdir, "ckpt")},
}
if a.precision == "bf16":
    cfg["bf16"] = {"enabled": True}
cfg_path = os.path.join(a.workdir, "config.json")
with open(cfg_path, "w") as f:
    json.dump(cfg, f)
out = subprocess.run([a.strata, "train", "--config", cfg_path, "--eval-batches", str(eval_batches)],
                     capture_output=True, text=True)
print(out.stdout[-2000:], out.stderr[-2000:])
if out.returncode != 0:
    sys.exit("strata train failed")
m = re.search(r"held-out loss ([0-9.]+)", out.stdout)
if not m:
    sys.exit("strata train printed no held-out loss")
strata_loss = float(m.group(1))
st = os.path.join(a.workdir, "model.safetensors")
r = subprocess.run([a.strata, "export", "--checkpoint", cfg["strata"]["checkpoint_dir"], "--out", st],
                   capture_output=True, text=True)
if r.returncode != 0:
    sys.exit("strata export failed: " + r.stderr)

exported = load_file(st)
want_dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
bad = [k for k, v in exported.items() if v.dtype != want_dtype]
if bad:
    sys.exit(f"exported tensors not {want_dtype} (the trained precision is the default): {bad}")
w = {k: v.double() for k, v in exported.items()}


def ln(x, p):
    return F.layer_norm(x, (d,), w[p + ".weight"], w[p + ".bias"], 1e-5)


def gpt2(idx):
    B, Tn = idx.shape
    x = w["wte.weight"][idx] + w["wpe.weight"][:Tn]
    for l in range(L):
        h = f"h.{l}."
        qkv = ln(x, h + "ln_1") @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]  # Conv1D
        q, k, v = qkv.split(d, dim=2)
        q, k, v = (t.view(B, Tn, H, d // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
        att = att.masked_fill(~torch.ones(Tn, Tn, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, Tn, d)
        x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        f = F.gelu(ln(x, h + "ln_2") @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + f @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].t()


tokens = torch.tensor(list(text.encode()), dtype=torch.long)
windows = (len(tokens) - 1) // T
heldout = int(windows * 0.05)
first = windows - heldout
losses = []
for b in range(eval_batches):
    idx = [first + b * micro + i for i in range(micro)]
    x = torch.stack([tokens[i * T: i * T + T] for i in idx])
    y = torch.stack([tokens[i * T + 1: i * T + T + 1] for i in idx])
    losses.append(F.cross_entropy(gpt2(x).reshape(-1, V), y.reshape(-1)).item())
torch_loss = sum(losses) / len(losses)
rel = abs(torch_loss - strata_loss) / torch_loss
print(f"held-out loss: strata {strata_loss:.6f}, PyTorch on the exported weights {torch_loss:.6f}, rel diff {rel:.2e}")
# strata prints 6 decimals; float32 rounding is far below 1e-5. In bf16 Strata rounds its
# activations (see the top), PyTorch here does not.
if rel > (1e-4 if a.precision == "bf16" else 1e-5):
    sys.exit("the exported model's loss differs from Strata's")

# `strata eval` on the same checkpoint and text: the mean loss over windows of Te + 1
# tokens at offsets 0, Te, 2Te, ... in file order, against the same windows here; once with
# a shorter context than the model's (the first Te rows of wpe) and the first 150 windows,
# once with the model's own over the whole file. `strata eval` computes in the trained
# precision, as the held-out loss above: relative 1e-5 (f32), 1e-4 (bf16).
for Te, max_windows in ((T // 2 + 3, 150), (T, None)):
    cmd = [a.strata, "eval", "--checkpoint", cfg["strata"]["checkpoint_dir"], "--data", data, "--json"]
    cmd += ["--seq", str(Te)] + (["--max-windows", str(max_windows)] if max_windows else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("strata eval failed: " + r.stdout + r.stderr)
    got = json.loads(r.stdout)
    n = (len(tokens) - 1) // Te
    if max_windows:
        n = min(n, max_windows)
    total = 0.0
    for b0 in range(0, n, 64):
        idx = range(b0, min(n, b0 + 64))
        x = torch.stack([tokens[i * Te: i * Te + Te] for i in idx])
        y = torch.stack([tokens[i * Te + 1: i * Te + Te + 1] for i in idx])
        total += F.cross_entropy(gpt2(x).reshape(-1, V), y.reshape(-1), reduction="sum").item()
    want = total / (n * Te)
    rel = abs(got["loss"] - want) / want
    print(f"strata eval --seq {Te}: loss {got['loss']:.6f} over {got['windows']} windows, {got['tokens']} tokens; "
          f"PyTorch {want:.6f} over {n} windows; rel diff {rel:.2e}")
    if got["windows"] != n or got["tokens"] != n * Te or got["precision"] != a.precision \
            or rel > (1e-4 if a.precision == "bf16" else 1e-5):
        sys.exit("strata eval differs from PyTorch on the same windows")
print("1 passed, 0 failed")
