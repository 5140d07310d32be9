#!/usr/bin/env python3
"""Hugging Face round trip through `transformers` itself (PyPI; skipped, exit 77, when it
is not importable beside the test's torch):

1. a GPT2LMHeadModel built by transformers from a GPT2Config, saved with save_pretrained
   in bf16 and sharded (max_shard_size 100KB: several files and an index), is imported
   by `strata import --hf`; `strata eval` gives transformers' own loss on the same windows
   (relative 1e-5: Strata computes in fp32 from the bf16 values, transformers in float64);
2. `strata train --init-from` fine-tunes it 20 steps; `strata export --format hf`
   (sharded, f32) is loaded by GPT2LMHeadModel.from_pretrained, whose loss equals
   `strata eval` of the fine-tuned checkpoint (relative 1e-5);
3. importing that export again gives the same `strata eval` loss to the last digit.

usage: test_hf_transformers.py STRATA_BINARY
"""
import json
import pathlib
import random
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel
except Exception as e:  # noqa: BLE001
    print(f"SKIP: transformers is not importable here ({e}); pip install transformers")
    sys.exit(77)

L, d, H, T, V = 2, 64, 4, 32, 256


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def hf_loss(model, tokens, n, Te):
    model = model.double().eval()
    total = 0.0
    with torch.no_grad():
        for b0 in range(0, n, 64):
            idx = range(b0, min(n, b0 + 64))
            x = torch.stack([tokens[i * Te: i * Te + Te] for i in idx])
            y = torch.stack([tokens[i * Te + 1: i * Te + Te + 1] for i in idx])
            logits = model(input_ids=x).logits
            total += F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="sum").item()
    return total / (n * Te)


def strata_eval(strata, ck, corpus, n):
    r = run([strata, "eval", "--checkpoint", str(ck), "--data", str(corpus), "--max-windows", str(n),
             "--precision", "f32", "--json"])
    if r.returncode != 0:
        sys.exit(f"strata eval failed: {r.stdout}{r.stderr}")
    return json.loads(r.stdout)["loss"]


def main():
    strata = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-hf-") as dd:
        tmp = pathlib.Path(dd)
        rng = random.Random(7)
        words = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "to", "red", "big", "house", "and", "saw"]
        text = " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + "." for _ in range(1500))
        corpus = tmp / "corpus.txt"
        corpus.write_text(text)
        tokens = torch.tensor(list(text.encode()), dtype=torch.long)
        n = 150

        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=L, n_embd=d, n_head=H, n_positions=T, vocab_size=V, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg).to(torch.bfloat16)
        hf = tmp / "hf"
        model.save_pretrained(str(hf), safe_serialization=True, max_shard_size="100KB")
        shards = sorted(p.name for p in hf.glob("*.safetensors"))
        print(f"transformers wrote {len(shards)} shards: {shards[:2]}...")

        ck = tmp / "imported"
        r = run([strata, "import", "--hf", str(hf), "--out", str(ck)])
        print(r.stdout.strip())
        if r.returncode != 0:
            sys.exit(f"strata import failed: {r.stderr}")
        got, want = strata_eval(strata, ck, corpus, n), hf_loss(GPT2LMHeadModel.from_pretrained(str(hf)), tokens, n, T)
        rel = abs(got - want) / want
        print(f"1. imported: strata eval {got:.6f}, transformers {want:.6f}, rel {rel:.2e}")
        if rel > 1e-5:
            failures.append(f"import: strata eval {got}, transformers {want}")

        conf = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
                "zero_optimization": {"stage": 3},
                "strata": {"device_budget": "64MiB", "pinned_budget": "64MiB", "steps": 20, "checkpoint_every": 20,
                           "checkpoint_dir": str(tmp / "tuned"),
                           "model": {"layers": L, "d_model": d, "heads": H, "seq_len": T, "vocab": V},
                           "data": {"path": str(corpus), "format": "text"}}}
        (tmp / "cfg.json").write_text(json.dumps(conf))
        r = run([strata, "train", "--config", str(tmp / "cfg.json"), "--init-from", str(ck), "--quiet"])
        if r.returncode != 0:
            sys.exit(f"strata train --init-from failed: {r.stdout}{r.stderr}")
        out = tmp / "export"
        r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--format", "hf", "--out", str(out),
                 "--dtype", "f32", "--shard-size", "150KB"])
        print(r.stdout.strip())
        files = sorted(p.name for p in out.glob("*.safetensors"))
        if r.returncode != 0 or len(files) < 2 or not (out / "model.safetensors.index.json").exists():
            failures.append(f"export --format hf: exit {r.returncode}, files {files}: {r.stderr}")
        else:
            got = strata_eval(strata, tmp / "tuned", corpus, n)
            want = hf_loss(GPT2LMHeadModel.from_pretrained(str(out)), tokens, n, T)
            rel = abs(got - want) / want
            print(f"2. fine-tuned: strata eval {got:.6f}, transformers on the export {want:.6f}, rel {rel:.2e}")
            if rel > 1e-5:
                failures.append(f"export: strata eval {got}, transformers {want}")
            r = run([strata, "import", "--hf", str(out), "--out", str(tmp / "again")])
            again = strata_eval(strata, tmp / "again", corpus, n) if r.returncode == 0 else None
            print(f"3. re-imported: strata eval {again}")
            if again != got:
                failures.append(f"re-import: {again} != {got} ({r.stderr.strip()})")
        # --force replaces an earlier export, and nothing else.
        r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--format", "hf", "--out", str(out)])
        if r.returncode != 2 or "pass --force" not in r.stderr:
            failures.append(f"export over an export without --force: exit {r.returncode}: {r.stderr}")
        (tmp / "other").mkdir()
        (tmp / "other" / "notes.txt").write_text("mine")
        r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--format", "hf", "--out",
                 str(tmp / "other"), "--force"])
        if r.returncode != 2 or "never replaced" not in r.stderr or not (tmp / "other" / "notes.txt").exists():
            failures.append(f"export --force over a directory of other files: exit {r.returncode}: {r.stderr}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("Hugging Face round trip through transformers: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
