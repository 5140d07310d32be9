#!/usr/bin/env python3
"""`strata import --hf`: a Hugging Face GPT2LMHeadModel directory (config.json, two bf16
safetensors shards with model.safetensors.index.json, names with the "transformer."
prefix, the tied lm_head and the attention-mask buffers present) into a checkpoint:

- `strata eval` on it gives the loss PyTorch computes from the same files (GPT-2's
  equations here, Conv1D weights [in, out]) on the same windows: relative 1e-5;
- `strata train --init-from` fine-tunes it 50 steps on text with falling loss, and its
  first step's loss is the imported model's; `--resume-from` the import gives that first
  step's loss too (an imported checkpoint has zero moments and no data position);
- bad input is a clear error and writes nothing: a BertModel config, a missing
  shard, a tensor whose shape disagrees with config.json, a truncated safetensors header,
  an --out that holds a checkpoint (untouched), --init-from a checkpoint of another shape.

usage: test_import_hf.py STRATA_BINARY
"""
import json
import math
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

L, d, H, T, V = 2, 64, 4, 32, 256


def gpt2_tensors(gen):
    w = {"wte.weight": torch.randn(V, d, generator=gen) * 0.1, "wpe.weight": torch.randn(T, d, generator=gen) * 0.05}
    for l in range(L):
        h = f"h.{l}."
        w[h + "ln_1.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        w[h + "ln_1.bias"] = 0.1 * torch.randn(d, generator=gen)
        w[h + "attn.c_attn.weight"] = torch.randn(d, 3 * d, generator=gen) * 0.1  # Conv1D [in, out]
        w[h + "attn.c_attn.bias"] = 0.05 * torch.randn(3 * d, generator=gen)
        w[h + "attn.c_proj.weight"] = torch.randn(d, d, generator=gen) * 0.1
        w[h + "attn.c_proj.bias"] = 0.05 * torch.randn(d, generator=gen)
        w[h + "ln_2.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        w[h + "ln_2.bias"] = 0.1 * torch.randn(d, generator=gen)
        w[h + "mlp.c_fc.weight"] = torch.randn(d, 4 * d, generator=gen) * 0.1
        w[h + "mlp.c_fc.bias"] = 0.05 * torch.randn(4 * d, generator=gen)
        w[h + "mlp.c_proj.weight"] = torch.randn(4 * d, d, generator=gen) * 0.05
        w[h + "mlp.c_proj.bias"] = 0.05 * torch.randn(d, generator=gen)
    w["ln_f.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
    w["ln_f.bias"] = 0.1 * torch.randn(d, generator=gen)
    return {k: v.to(torch.bfloat16) for k, v in w.items()}


def write_hf(path, tensors, config_overrides=None, drop=None):
    """A GPT2LMHeadModel directory as save_pretrained writes one, sharded in two."""
    path.mkdir(parents=True)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": L, "n_embd": d, "n_head": H,
              "n_positions": T, "n_ctx": T, "vocab_size": V, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    config.update(config_overrides or {})
    (path / "config.json").write_text(json.dumps(config))
    full = {"transformer." + k: v for k, v in tensors.items()}
    full["lm_head.weight"] = tensors["wte.weight"]
    for l in range(L):
        full[f"transformer.h.{l}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T).to(torch.bfloat16)
    names = sorted(full)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for f, ns in shards.items():
        save_file({n: full[n].contiguous().clone() for n in ns}, str(path / f), metadata={"format": "pt"})
        weight_map.update({n: f for n in ns})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if drop:
        (path / drop).unlink()


def gpt2_loss(w, tokens, windows, Te):
    """Mean cross-entropy over windows i*Te .. i*Te+Te (+1), float64, GPT-2's equations."""
    w = {k: v.double() for k, v in w.items()}

    def ln(x, p):
        return F.layer_norm(x, (d,), w[p + ".weight"], w[p + ".bias"], 1e-5)

    total = 0.0
    for b0 in range(0, windows, 64):
        idx = range(b0, min(windows, b0 + 64))
        xi = torch.stack([tokens[i * Te: i * Te + Te] for i in idx])
        yi = torch.stack([tokens[i * Te + 1: i * Te + Te + 1] for i in idx])
        B = xi.shape[0]
        x = w["wte.weight"][xi] + w["wpe.weight"][:Te]
        for l in range(L):
            h = f"h.{l}."
            q, k, v = (ln(x, h + "ln_1") @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]).split(d, dim=2)
            q, k, v = (t.view(B, Te, H, d // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
            att = att.masked_fill(~torch.ones(Te, Te, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, Te, d) @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
            f = F.gelu(ln(x, h + "ln_2") @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"], approximate="tanh")
            x = x + f @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
        logits = ln(x, "ln_f") @ w["wte.weight"].t()
        total += F.cross_entropy(logits.reshape(-1, V), yi.reshape(-1), reduction="sum").item()
    return total / (windows * Te)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def main():
    strata = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-import-") as dd:
        tmp = pathlib.Path(dd)
        rng = random.Random(5)
        words = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "to", "red", "big", "house", "and", "saw"]
        text = " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + "." for _ in range(1500))
        corpus = tmp / "corpus.txt"
        corpus.write_text(text)
        tokens = torch.tensor(list(text.encode()), dtype=torch.long)
        w = gpt2_tensors(torch.Generator().manual_seed(3))
        hf = tmp / "hf"
        write_hf(hf, w)

        ck = tmp / "imported"
        r = run([strata, "import", "--hf", str(hf), "--out", str(ck)])
        print(r.stdout + r.stderr)
        if r.returncode != 0 or not (ck / "step-00000000" / "manifest.json").exists():
            sys.exit(f"strata import failed ({r.returncode})")

        # eval against PyTorch on the same windows (the masters are the bf16 values exactly).
        n = 200
        r = run([strata, "eval", "--checkpoint", str(ck), "--data", str(corpus), "--max-windows", str(n),
                 "--precision", "f32", "--json"])
        got = json.loads(r.stdout) if r.returncode == 0 else {}
        want = gpt2_loss(w, tokens, n, T)
        rel = abs(got.get("loss", float("nan")) - want) / want
        print(f"imported model: strata eval {got.get('loss')}, PyTorch {want:.6f}, rel {rel:.2e}")
        if not rel <= 1e-5:
            failures.append(f"eval of the import: {r.stdout}{r.stderr}; PyTorch {want}")

        # Fine-tune with --init-from: the first step sees the imported weights; loss falls.
        cfg = {"train_micro_batch_size_per_gpu": 4,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
               "zero_optimization": {"stage": 3,
                                     "offload_param": {"device": "nvme", "nvme_path": str(tmp)},
                                     "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp)}},
               "strata": {"device_budget": "8MiB", "pinned_budget": "8MiB", "steps": 50, "checkpoint_every": 50,
                          "checkpoint_dir": str(tmp / "tuned"),
                          "model": {"layers": L, "d_model": d, "heads": H, "seq_len": T, "vocab": V},
                          "data": {"path": str(corpus), "format": "text"}}}
        (tmp / "cfg.json").write_text(json.dumps(cfg))
        m = tmp / "m.jsonl"
        r = run([strata, "train", "--config", str(tmp / "cfg.json"), "--init-from", str(ck), "--metrics", str(m),
                 "--quiet"])
        losses = [json.loads(x)["loss"] for x in m.read_text().splitlines()] if m.exists() else []
        print(f"fine-tuning losses: {[round(x, 3) for x in losses[:3]]} ... {[round(x, 3) for x in losses[-3:]]}")
        if r.returncode != 0 or len(losses) != 50:
            failures.append(f"--init-from: exit {r.returncode}, {len(losses)} steps\n{r.stdout}{r.stderr}")
        elif not (sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.2 and abs(losses[0] - want) < 0.3):
            failures.append(f"--init-from: losses {losses[:3]} ... {losses[-3:]}: not falling, or the first "
                            f"({losses[0]:.3f}) far from the imported model's ({want:.3f})")
        # --resume-from the import continues it as a checkpoint (no data position: from the start).
        r3 = run([strata, "train", "--config", str(tmp / "cfg.json"), "--resume-from", str(ck / "step-00000000"),
                  "--steps", "2", "--quiet", "--metrics", str(tmp / "m3.jsonl"),
                  "--set", f"strata.checkpoint_dir={tmp / 'resumed'}"])
        resumed = [json.loads(x)["loss"] for x in (tmp / "m3.jsonl").read_text().splitlines()] \
            if (tmp / "m3.jsonl").exists() else []
        if r3.returncode != 0 or len(resumed) != 2 or (losses and abs(resumed[0] - losses[0]) > 1e-9):
            failures.append(f"--resume-from the import: exit {r3.returncode}, losses {resumed} (--init-from's "
                            f"first: {losses[:1]})\n{r3.stdout}{r3.stderr}")
        # A random start is worse at step 1 than the import: the weights really came in.
        r2 = run([strata, "train", "--config", str(tmp / "cfg.json"), "--steps", "1", "--quiet", "--metrics",
                  str(tmp / "m0.jsonl"), "--set", f"strata.checkpoint_dir={tmp / 'fresh'}"])
        if r2.returncode == 0 and losses:
            fresh = json.loads((tmp / "m0.jsonl").read_text().splitlines()[0])["loss"]
            print(f"step 1: from the import {losses[0]:.4f}, from a random start {fresh:.4f}")
            if abs(fresh - losses[0]) < 1e-3:
                failures.append("--init-from gave the loss of a random start: the weights were not loaded")

        # Bad input: each a clear error, nothing written.
        def refused(name, args, needle, code=2):  # 2: bad input; 1: a damaged file (CorruptionError)
            out = tmp / f"out-{name}"
            r = run([strata, "import", "--out", str(out)] + args)
            msg = r.stdout + r.stderr
            if r.returncode != code or needle not in msg or (out / "step-00000000").exists() \
                    or any(out.glob(".step-*")):
                failures.append(f"{name}: exit {r.returncode}, expected {code} with '{needle}' and no checkpoint; "
                                f"got: {msg.strip()}")
            else:
                print(f"{name}: {msg.strip().splitlines()[-1]}")

        write_hf(tmp / "llama", w, {"architectures": ["BertModel"], "model_type": "bert"})
        refused("bert", ["--hf", str(tmp / "llama")], "describes a BertModel (model_type 'bert'), which Strata "
                "does not import: it imports GPT2LMHeadModel")
        write_hf(tmp / "noshard", w, drop="model-00002-of-00002.safetensors")
        refused("missing-shard", ["--hf", str(tmp / "noshard")], "model-00002-of-00002.safetensors' is missing")
        write_hf(tmp / "shape", w, {"n_embd": 32})
        refused("shape", ["--hf", str(tmp / "shape")], "the weights and config.json are of different models")
        write_hf(tmp / "cut", w)
        shard = tmp / "cut" / "model-00001-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:40])
        refused("truncated-header", ["--hf", str(tmp / "cut")], "(truncated)", code=1)
        write_hf(tmp / "erf", w, {"activation_function": "gelu"})
        refused("exact-gelu", ["--hf", str(tmp / "erf")], "activation_function = \"gelu\"")

        before = {p.name: p.stat().st_mtime_ns for p in (ck / "step-00000000").iterdir()}
        r = run([strata, "import", "--hf", str(hf), "--out", str(ck)])
        after = {p.name: p.stat().st_mtime_ns for p in (ck / "step-00000000").iterdir()}
        if r.returncode != 2 or "holds checkpoints already" not in r.stderr or before != after:
            failures.append(f"import over a checkpoint: exit {r.returncode}: {r.stderr.strip()}; files changed: "
                            f"{before != after}")
        # Bad arguments to the new commands: each exit 2 with the problem named, nothing written.
        for args, needle in (
                (["eval", "--checkpoint", str(ck), "--data", str(corpus), "--seq", str(T + 1)],
                 f"--seq {T + 1} is longer than the model's context of {T} tokens"),
                (["eval", "--checkpoint", str(ck), "--data", str(corpus), "--precision", "f8"], "f8"),
                (["export", "--checkpoint", str(ck), "--format", "hf", "--out", str(tmp / "x-hf"),
                  "--shard-size", "0"], "--shard-size is 0"),
                (["export", "--checkpoint", str(ck), "--format", "hf", "--out", str(tmp / "x-hf"),
                  "--shard-size", "lots"], "--shard-size"),
                (["train", "--config", str(tmp / "cfg.json"), "--init-from", str(tmp / "nothing"), "--quiet",
                  "--set", f"strata.checkpoint_dir={tmp / 'never'}"], "is not a directory"),
                # CLI11's usage error (docs/failure-behaviour.md: 100-127).
                (["train", "--config", str(tmp / "cfg.json"), "--init-from", str(ck), "--resume", "--quiet"],
                 "--resume excludes --init-from")):
            r = run([strata] + args)
            usage = "excludes" in needle
            if not (100 <= r.returncode <= 127 if usage else r.returncode == 2) or needle not in r.stderr \
                    or (tmp / "x-hf").exists() or (tmp / "never" / "step-00000001").exists():
                failures.append(f"{args[0]} {args[-2:]}: exit {r.returncode}, expected {'100-127' if usage else 2} "
                                f"with '{needle}': {r.stderr.strip()}")
        cfg["strata"]["model"]["d_model"] = 128
        cfg["strata"]["checkpoint_dir"] = str(tmp / "other")
        (tmp / "cfg2.json").write_text(json.dumps(cfg))
        r = run([strata, "train", "--config", str(tmp / "cfg2.json"), "--init-from", str(ck), "--quiet"])
        if r.returncode != 2 or "set strata.model to the checkpoint" not in r.stderr:
            failures.append(f"--init-from another shape: exit {r.returncode}: {r.stderr.strip()}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("strata import --hf: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
