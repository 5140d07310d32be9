#!/usr/bin/env python3
"""strata.lora against peft + PyTorch (the outside reference), on a small Llama.

1. transformers builds a random LlamaForCausalLM (grouped-query attention, untied head),
   peft wraps it with LoRA (r 4, alpha 8, q_proj and v_proj, init_lora_weights=False so
   B != 0 and the adapters change the function from the first step); both are saved.
2. `strata import --hf` the base, then `strata train --init-from CKPT --lora-init ADAPTER`
   with the base on NVMe (offload_param nvme, ZeRO-3) for STEPS steps, fp32, AdamW.
   The reference: the same peft model trained with torch.optim.AdamW (the same lr, betas,
   eps, weight decay) on the same batch. The data holds exactly one global batch of
   windows (4 of them, no held-out split), so both runs see the same tokens every step
   (Strata's shuffle permutes the windows; the mean loss does not depend on their order).
   Every step's loss must agree to REL_LOSS (fp32 both; only summation orders differ:
   measured 1.2e-8 at worst over the 8 steps, and AdamW's normalised steps keep it from
   growing; 1e-6 leaves room for another BLAS, and a wrong gradient moves it by 1e-3).
   A run checkpointed half-way and resumed gives the same losses bit for bit.
3. `strata export --format peft` is loaded by PeftModel.from_pretrained on the base: its
   loss equals `strata eval` of the checkpoint and of the reference trained model; `strata
   export --format hf` (the merged W + alpha/r B A) loaded by transformers alone gives the
   same loss.
Exit 77 (skip) where torch, transformers or peft is missing.
"""
import json
import pathlib
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
except Exception as e:  # noqa: BLE001
    print(f"SKIP: torch, transformers or peft is not importable here ({e})")
    sys.exit(77)

L, d, H, KV, FFN, T, V = 2, 64, 4, 2, 96, 32, 256
MICRO, STEPS, LR = 4, 8, 1e-2
R, ALPHA = 4, 8
REL_LOSS = 1e-6   # per-step loss, Strata against peft: fp32 both, only summation orders differ (measured 1.2e-8)
REL_EVAL = 1e-5   # a loss of the same weights computed by both


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")
    return r.stdout


def windows(tokens):
    x = torch.stack([tokens[i * T: i * T + T] for i in range(MICRO)])
    y = torch.stack([tokens[i * T + 1: i * T + T + 1] for i in range(MICRO)])
    return x, y


def loss_of(model, x, y):
    return F.cross_entropy(model(input_ids=x).logits.reshape(-1, V).double(), y.reshape(-1))


def main():
    strata = pathlib.Path(sys.argv[1])
    failures = []
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as td:
        tmp = pathlib.Path(td)
        cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=FFN, num_hidden_layers=L,
                          num_attention_heads=H, num_key_value_heads=KV, max_position_embeddings=T, rms_norm_eps=1e-6,
                          rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="eager")
        base = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for name, p in base.named_parameters():
                if "norm" not in name:
                    p.normal_(0.0, 0.08)
        base.save_pretrained(str(tmp / "base"), safe_serialization=True)
        lcfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                          init_lora_weights=False)
        peft_model = get_peft_model(base, lcfg)
        peft_model.save_pretrained(str(tmp / "adapter"))

        # One global batch of windows, as text (byte-level tokens).
        g = torch.Generator().manual_seed(1)
        data = bytes(torch.randint(32, 127, (MICRO * T + 1,), generator=g).tolist())
        (tmp / "data.txt").write_bytes(data)
        tokens = torch.tensor(list(data), dtype=torch.long)
        x, y = windows(tokens)

        # The reference: peft + torch AdamW.
        ref = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(tmp / "base")), str(tmp / "adapter"),
                                        is_trainable=True)
        params = [p for p in ref.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        ref_losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = loss_of(ref, x, y)
            loss.backward()
            opt.step()
            ref_losses.append(loss.item())
        with torch.no_grad():
            ref_final = loss_of(ref, x, y).item()

        run([strata, "import", "--hf", tmp / "base", "--out", tmp / "imported"])
        (tmp / "nvme").mkdir()
        conf = {"train_micro_batch_size_per_gpu": MICRO,
                "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                          "weight_decay": 0.0}},
                "zero_optimization": {"stage": 3,
                                      "offload_param": {"device": "nvme", "nvme_path": str(tmp / "nvme")}},
                "strata": {"device_budget": "64MiB", "pinned_budget": "64MiB", "steps": STEPS,
                           "checkpoint_every": STEPS, "checkpoint_dir": str(tmp / "tuned"),
                           "model": {"arch": "llama", "layers": L, "d_model": d, "heads": H, "kv_heads": KV,
                                     "ffn": FFN, "seq_len": T, "vocab": V, "rope_theta": 10000.0, "norm_eps": 1e-6},
                           "lora": {"rank": R, "alpha": ALPHA, "target": ["q_proj", "v_proj"]},
                           "data": {"path": str(tmp / "data.txt"), "format": "text"}}}
        (tmp / "cfg.json").write_text(json.dumps(conf))
        run([strata, "train", "--config", tmp / "cfg.json", "--init-from", tmp / "imported", "--lora-init",
             tmp / "adapter", "--quiet", "--metrics", tmp / "m.jsonl"])
        losses = [json.loads(s)["loss"] for s in (tmp / "m.jsonl").read_text().splitlines() if '"loss"' in s]
        if len(losses) != STEPS:
            failures.append(f"strata train recorded {len(losses)} losses, not {STEPS}")
        worst = 0.0
        for i, (a, b) in enumerate(zip(losses, ref_losses)):
            rel = abs(a - b) / b
            worst = max(worst, rel)
            print(f"step {i + 1}: strata {a:.7f}  peft {b:.7f}  rel {rel:.2e}")
            if rel > REL_LOSS:
                failures.append(f"step {i + 1}: strata loss {a}, peft {b} (rel {rel:.2e} > {REL_LOSS})")
        print(f"worst per-step relative loss difference {worst:.2e} (tolerance {REL_LOSS})")
        if not ref_losses[-1] < ref_losses[0] - 0.05:
            failures.append(f"the reference's loss did not fall ({ref_losses[0]} -> {ref_losses[-1]}): a test that "
                            "cannot tell")

        # Checkpoint and resume: half the steps, then --resume, gives the same losses bit for bit.
        conf["strata"]["checkpoint_dir"] = str(tmp / "halves")
        conf["strata"]["checkpoint_every"] = STEPS // 2
        (tmp / "cfg2.json").write_text(json.dumps(conf))
        run([strata, "train", "--config", tmp / "cfg2.json", "--init-from", tmp / "imported", "--lora-init",
             tmp / "adapter", "--quiet", "--metrics", tmp / "h.jsonl", "--steps", STEPS // 2])
        run([strata, "train", "--config", tmp / "cfg2.json", "--resume", "--quiet", "--metrics", tmp / "h.jsonl"])
        halves = [json.loads(s)["loss"] for s in (tmp / "h.jsonl").read_text().splitlines() if '"loss"' in s]
        print(f"resumed at step {STEPS // 2}: the same losses as the run through: {halves == losses}")
        if halves != losses:
            failures.append(f"a run resumed at step {STEPS // 2} gave {halves}, the run through {losses}")

        ev = json.loads(run([strata, "eval", "--checkpoint", tmp / "tuned", "--data", tmp / "data.txt",
                             "--max-windows", MICRO, "--precision", "f32", "--json"]))["loss"]
        run([strata, "export", "--checkpoint", tmp / "tuned", "--format", "peft", "--out", tmp / "peft_out"])
        run([strata, "export", "--checkpoint", tmp / "tuned", "--format", "hf", "--out", tmp / "hf_out",
             "--dtype", "f32"])
        with torch.no_grad():
            exported = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(tmp / "base")),
                                                 str(tmp / "peft_out")).eval()
            peft_loss = loss_of(exported, x, y).item()
            merged_loss = loss_of(LlamaForCausalLM.from_pretrained(str(tmp / "hf_out")).eval(), x, y).item()
        print(f"after training: strata eval {ev:.7f}, peft of the exported adapters {peft_loss:.7f}, transformers "
              f"of the merged export {merged_loss:.7f}, the reference's trained model {ref_final:.7f}")
        for what, v, tol in [("peft of --format peft", peft_loss, REL_EVAL),
                             ("transformers of --format hf (merged)", merged_loss, REL_EVAL),
                             ("the reference trained by peft + AdamW", ref_final, REL_LOSS)]:
            if abs(v - ev) / ev > tol:
                failures.append(f"{what}: loss {v}, strata eval {ev} (rel {abs(v - ev) / ev:.2e} > {tol})")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
