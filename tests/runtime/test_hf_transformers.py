#!/usr/bin/env python3
"""Hugging Face round trip through `transformers` itself (PyPI; skipped, exit 77, when it
is not importable beside the test's torch), for GPT2LMHeadModel and for LlamaForCausalLM
(grouped-query attention: 4 heads, 2 kv heads; an untied head; rope_theta 500000):

1. a model built by transformers from its config, saved with save_pretrained in bf16 and
   sharded (max_shard_size 100KB: several files and an index), is imported by
   `strata import --hf`; `strata eval` gives transformers' own loss on the same windows
   (relative 1e-5: Strata computes in fp32 from the bf16 values, transformers in float64,
   but for Llama's RMSNorm and rotary angles, which it keeps in float32);
2. `strata train --init-from` fine-tunes it (GPT-2 20 steps, Llama 50 with falling loss);
   `strata export --format hf` (sharded, f32) is loaded by from_pretrained, whose loss
   equals `strata eval` of the fine-tuned checkpoint (relative 1e-5);
3. importing that export again gives the same `strata eval` loss to the last digit;
4. Llama's bad input: rope_scaling (Llama 3.1), num_key_value_heads that disagrees with
   the weights, a missing shard, tokens beyond the vocabulary: each a clear error, and no
   checkpoint written or touched.

usage: test_hf_transformers.py STRATA_BINARY
"""
import json
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except Exception as e:  # noqa: BLE001
    print(f"SKIP: transformers is not importable here ({e}); pip install transformers")
    sys.exit(77)

L, d, H, T, V = 2, 64, 4, 32, 256
KV, FFN, THETA = 2, 96, 500000.0  # Llama's


def make_model(arch):
    """(model class, an untrained bf16 model, Strata's strata.model for it)."""
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = GPT2Config(n_layer=L, n_embd=d, n_head=H, n_positions=T, vocab_size=V, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel, GPT2LMHeadModel(cfg).to(torch.bfloat16), \
            {"layers": L, "d_model": d, "heads": H, "seq_len": T, "vocab": V}
    cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=FFN, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, max_position_embeddings=T, rms_norm_eps=1e-6, rope_theta=THETA,
                      tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # transformers initialises with std 0.02: larger weights give a loss to lower
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
    return LlamaForCausalLM, model.to(torch.bfloat16), \
        {"arch": "llama", "layers": L, "d_model": d, "heads": H, "kv_heads": KV, "ffn": FFN, "seq_len": T, "vocab": V,
         "rope_theta": THETA, "norm_eps": 1e-6}


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


def round_trip(strata, arch, root, corpus, tokens, n, failures):
    tmp = root / arch
    tmp.mkdir()
    Model, model, strata_model = make_model(arch)
    steps = 20 if arch == "gpt2" else 50
    hf = tmp / "hf"
    model.save_pretrained(str(hf), safe_serialization=True, max_shard_size="100KB")
    shards = sorted(p.name for p in hf.glob("*.safetensors"))
    print(f"transformers wrote {len(shards)} shards: {shards[:2]}...")

    ck = tmp / "imported"
    r = run([strata, "import", "--hf", str(hf), "--out", str(ck)])
    print(r.stdout.strip())
    if r.returncode != 0:
        sys.exit(f"strata import failed: {r.stderr}")
    got, want = strata_eval(strata, ck, corpus, n), hf_loss(Model.from_pretrained(str(hf)), tokens, n, T)
    rel = abs(got - want) / want
    print(f"{arch} 1. imported: strata eval {got:.6f}, transformers {want:.6f}, rel {rel:.2e}")
    if rel > 1e-5:
        failures.append(f"{arch} import: strata eval {got}, transformers {want}")

    conf = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
            "zero_optimization": {"stage": 3},
            "strata": {"device_budget": "64MiB", "pinned_budget": "64MiB", "steps": steps,
                       "checkpoint_every": steps, "checkpoint_dir": str(tmp / "tuned"), "model": strata_model,
                       "data": {"path": str(corpus), "format": "text"}}}
    (tmp / "cfg.json").write_text(json.dumps(conf))
    m = tmp / "m.jsonl"
    r = run([strata, "train", "--config", str(tmp / "cfg.json"), "--init-from", str(ck), "--quiet",
             "--metrics", str(m)])
    if r.returncode != 0:
        sys.exit(f"{arch}: strata train --init-from failed: {r.stdout}{r.stderr}")
    losses = [json.loads(x)["loss"] for x in m.read_text().splitlines()]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"{arch} 2. fine-tuning {len(losses)} steps: mean loss of the first 10 {first:.4f}, of the last 10 "
          f"{last:.4f}")
    if not last < first - 0.1:
        failures.append(f"{arch} fine-tuning: the loss did not fall ({first:.4f} -> {last:.4f})")
    out = tmp / "export"
    r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--format", "hf", "--out", str(out),
             "--dtype", "f32", "--shard-size", "150KB"])
    print(r.stdout.strip())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    if r.returncode != 0 or len(files) < 2 or not (out / "model.safetensors.index.json").exists():
        failures.append(f"{arch} export --format hf: exit {r.returncode}, files {files}: {r.stderr}")
    else:
        got = strata_eval(strata, tmp / "tuned", corpus, n)
        want = hf_loss(Model.from_pretrained(str(out)), tokens, n, T)
        rel = abs(got - want) / want
        print(f"{arch} 2. fine-tuned: strata eval {got:.6f}, transformers on the export {want:.6f}, rel {rel:.2e}")
        if rel > 1e-5:
            failures.append(f"{arch} export: strata eval {got}, transformers {want}")
        r = run([strata, "import", "--hf", str(out), "--out", str(tmp / "again")])
        again = strata_eval(strata, tmp / "again", corpus, n) if r.returncode == 0 else None
        print(f"{arch} 3. re-imported: strata eval {again}")
        if again != got:
            failures.append(f"{arch} re-import: {again} != {got} ({r.stderr.strip()})")
    # --force replaces an earlier export, and nothing else.
    r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--format", "hf", "--out", str(out)])
    if r.returncode != 2 or "pass --force" not in r.stderr:
        failures.append(f"{arch} export over an export without --force: exit {r.returncode}: {r.stderr}")
    (tmp / "other").mkdir()
    (tmp / "other" / "notes.txt").write_text("mine")
    r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--format", "hf", "--out",
             str(tmp / "other"), "--force"])
    if r.returncode != 2 or "never replaced" not in r.stderr or not (tmp / "other" / "notes.txt").exists():
        failures.append(f"{arch} export --force over a directory of other files: exit {r.returncode}: {r.stderr}")
    if arch == "llama":
        # --format safetensors: one file with Hugging Face's names, as LlamaForCausalLM has them.
        st = tmp / "tuned.safetensors"
        r = run([strata, "export", "--checkpoint", str(tmp / "tuned"), "--out", str(st)])
        want = set(Model.from_pretrained(str(out)).state_dict())
        got = set()
        if r.returncode == 0:
            with safe_open(str(st), framework="pt") as f:
                got = set(f.keys())
        if r.returncode != 0 or got != want:
            failures.append(f"llama export --format safetensors: exit {r.returncode}, names differ: "
                            f"{sorted(got ^ want)[:4]} {r.stderr.strip()}")
        else:
            print(f"llama export --format safetensors: {len(got)} tensors, LlamaForCausalLM's names")
        llama_bad_input(strata, tmp, hf, ck, failures)


def llama_bad_input(strata, tmp, hf, ck, failures):
    def variant(name, edit=None, drop=None):
        v = tmp / name
        shutil.copytree(hf, v)
        if edit:
            cfg = json.loads((v / "config.json").read_text())
            cfg.update(edit)
            (v / "config.json").write_text(json.dumps(cfg))
        if drop:
            (v / drop).unlink()
        return v

    shards = sorted(p.name for p in hf.glob("model-*.safetensors"))
    # Scaled rotary embeddings as transformers 4.x writes them (rope_scaling) and as 5.x does
    # (rope_parameters, which also holds the base).
    cases = [("rope-scaling", variant("rope", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
              "rope_scaling"),
             ("rope-parameters", variant("rope5", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                                                      "rope_theta": THETA}}), "rope_parameters"),
             ("kv-heads", variant("kv", {"num_key_value_heads": 4}), "the weights and config.json are of different"),
             ("missing-shard", variant("noshard", drop=shards[-1]), "is missing"),
             ("unsupported", variant("mistral", {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}),
              "it imports GPT2LMHeadModel (model_type gpt2) and LlamaForCausalLM")]
    for name, path, needle in cases:
        out = tmp / f"out-{name}"
        r = run([strata, "import", "--hf", str(path), "--out", str(out)])
        if r.returncode != 2 or needle not in r.stderr or (out / "step-00000000").exists():
            failures.append(f"llama {name}: exit {r.returncode}, expected 2 with '{needle}': {r.stderr.strip()}")
        else:
            print(f"llama {name}: {r.stderr.strip().splitlines()[-1]}")
    # Tokens beyond the vocabulary (an llm.c uint16 file of ids up to 299 for a vocabulary of 256).
    bad = tmp / "beyond.bin"
    header = [20240520, 1, 600] + [0] * 253
    bad.write_bytes(b"".join(x.to_bytes(4, "little") for x in header) +
                    b"".join((i % 300).to_bytes(2, "little") for i in range(600)))
    before = {p.name: p.stat().st_mtime_ns for p in (ck / "step-00000000").iterdir()}
    r = run([strata, "eval", "--checkpoint", str(ck), "--data", str(bad), "--json"])
    after = {p.name: p.stat().st_mtime_ns for p in (ck / "step-00000000").iterdir()}
    if r.returncode != 2 or "vocab" not in r.stderr or before != after:
        failures.append(f"llama tokens beyond the vocabulary: exit {r.returncode}: {r.stderr.strip()}")
    else:
        print(f"llama tokens beyond the vocabulary: {r.stderr.strip().splitlines()[-1]}")


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
        for arch in ("gpt2", "llama"):
            round_trip(strata, arch, tmp, corpus, tokens, 150, failures)

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("Hugging Face round trip through transformers: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
