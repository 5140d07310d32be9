"""A LoRA fine-tuning step on one Llama shape, three ways, each in its own process:

  strata-pinned  strata.torch: the frozen base in Strata's pinned tier, adapters and their
                 AdamW states with it (bf16 working copies, fp32 masters)
  strata-nvme    the same with the base and the states on NVMe (--nvme DIR)
  peft           peft on plain PyTorch: the whole model on the device, AdamW on the adapters
  fsdp2          peft under FSDP2: fully_shard per decoder layer, MixedPrecisionPolicy(bf16),
                 CPUOffloadPolicy (world 1); cuda only

The model: transformers' LlamaForCausalLM with random weights (Llama-2-7B's shape by
default), LoRA r 16 / alpha 32 on q_proj and v_proj, bf16 compute, activation checkpointing
on (--no-checkpointing turns it off), --batch sequences of --seq tokens a step. Reported per
system: tokens/s over --steps timed steps after one untimed, peak device memory (PyTorch's
allocator, plus Strata's device tier, which Strata allocates itself), peak host RSS, the
first and last loss. Systems that cannot run say why instead.

    python3 bench/ref/lora_step.py --shape llama-2-7b --systems strata-pinned,peft,fsdp2 --steps 3 --json out.json
    python3 bench/ref/lora_step.py --shape tiny --systems strata-pinned,strata-nvme,peft --nvme /tmp/x   # cpu check

Run on the GPU machine by `scripts/gpu-check.sh lora7b`; runs on a CPU too (the cuda
backend is used when torch sees a GPU, else Strata's cpu backend).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SHAPES = {
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),
    "llama-1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=128),
}
SYSTEMS = ("strata-pinned", "strata-nvme", "peft", "fsdp2")
LR = 1e-4


def build(args, device, dtype):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[args.shape])
    with torch.device(device):  # random init on the GPU where there is one: seconds, not minutes
        model = LlamaForCausalLM(cfg).to(dtype)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0))
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    return model


def tokens(args, device, step):
    import torch
    g = torch.Generator().manual_seed(step)
    t = torch.randint(0, SHAPES[args.shape]["vocab_size"], (args.batch, args.seq), generator=g)
    return t.to(device)


def train_step(model, optimizer, autocast=None):
    """One step of the standard loop; autocast: the device type to run the forward under
    bf16 autocast (peft's fp32 adapters over a bf16 base)."""
    import torch
    from contextlib import nullcontext

    def step(t):
        with torch.autocast(autocast, dtype=torch.bfloat16) if autocast else nullcontext():
            loss = model(input_ids=t, labels=t).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()
    return step


def timed_steps(args, device, step_fn):
    import torch
    losses, times = [], []
    for s in range(args.steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(step_fn(tokens(args, device, s)))
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    timed = sum(times[1:])
    return {"tokens_per_s": args.batch * args.seq * args.steps / timed, "step_s": timed / args.steps,
            "first_loss": losses[0], "last_loss": losses[-1]}


def run_one(args):
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    system = args.only
    out = {"system": system, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    if system.startswith("strata"):
        import strata.torch
        model = build(args, "cuda" if cuda else "cpu", torch.bfloat16).to("cpu")
        nvme = system == "strata-nvme"
        if nvme and not args.nvme:
            raise SystemExit("strata-nvme needs --nvme DIR")
        where = {"device": "nvme", "nvme_path": args.nvme} if nvme else {"device": "cpu", "pin_memory": True}
        config = {"bf16": {"enabled": True},
                  "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
                  "zero_optimization": {"stage": 3, "offload_param": where, "offload_optimizer": where},
                  "strata": {"backend": "cuda" if cuda else "cpu", "device_budget": args.device_budget,
                             "pinned_budget": args.pinned_budget}}
        engine = strata.torch.initialize(model, config)
        model, optimizer = engine
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        out.update(timed_steps(args, engine.device, train_step(model, optimizer)))
        stats = engine.stats()
        out["strata_device_peak_bytes"] = stats["tiers"]["device"]["peak"]
        out["nvme_bytes_read_per_step"] = stats["bytes_moved"]["nvme->pinned"] / (args.steps + 1)
        engine.close()
    elif system == "peft":
        model = build(args, device, torch.bfloat16)
        for p in model.parameters():  # adapters in fp32, as peft's autocast_adapter_dtype makes them
            if p.requires_grad:
                p.data = p.data.float()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        out.update(timed_steps(args, device, train_step(model, opt, autocast=device.type)))
    elif system == "fsdp2":
        if not cuda:
            out["skipped"] = "FSDP2's CPUOffloadPolicy offloads from a GPU; this machine has none"
            return out
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("cuda:nccl,cpu:gloo", rank=0, world_size=1)
        model = build(args, device, torch.float32)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mp_policy=mp, offload_policy=CPUOffloadPolicy())
        fully_shard(model, mp_policy=mp, offload_policy=CPUOffloadPolicy())
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
        torch.cuda.reset_peak_memory_stats()
        out.update(timed_steps(args, device, train_step(model, opt)))
        dist.destroy_process_group()
    else:
        raise SystemExit(f"unknown system {system!r}; one of {', '.join(SYSTEMS)}")
    if cuda:
        out["torch_device_peak_bytes"] = torch.cuda.max_memory_allocated()
        out["device_peak_bytes"] = out["torch_device_peak_bytes"] + out.get("strata_device_peak_bytes", 0)
    out["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="llama-2-7b", choices=sorted(SHAPES))
    p.add_argument("--systems", default="strata-pinned,peft,fsdp2")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--nvme", help="a directory on the NVMe disk, for strata-nvme")
    p.add_argument("--device-budget", default="24GiB")
    p.add_argument("--pinned-budget", default="48GiB")
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--timeout", type=int, default=300, help="seconds per system")
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--only", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 1 or args.batch < 1 or args.seq < 2:
        p.error("--steps and --batch must be >= 1, --seq >= 2")
    if args.only:
        print("ROW " + json.dumps(run_one(args)), flush=True)
        return
    systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        p.error(f"--systems: unknown {bad or 'none given'}; choose from {', '.join(SYSTEMS)}")
    rows = []
    for s in systems:
        cmd = [sys.executable, __file__, "--only", s, "--shape", args.shape, "--steps", str(args.steps),
               "--batch", str(args.batch), "--seq", str(args.seq), "--device-budget", args.device_budget,
               "--pinned-budget", args.pinned_budget] + (["--nvme", args.nvme] if args.nvme else []) + \
              ([] if args.checkpointing else ["--no-checkpointing"])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            row = next((json.loads(l[4:]) for l in r.stdout.splitlines() if l.startswith("ROW ")), None)
            if row is None:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                row = {"system": s, "failed": f"exit {r.returncode}: " + " | ".join(tail)}
        except subprocess.TimeoutExpired:
            row = {"system": s, "failed": f"did not finish in {args.timeout} s"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = next((r for r in rows if r["system"] == "peft" and "tokens_per_s" in r), None)
    print(f"\n{args.shape}, batch {args.batch} x {args.seq} tokens, LoRA r 16 on q/v, checkpointing "
          f"{'on' if args.checkpointing else 'off'}")
    print(f"{'system':15} {'tokens/s':>10} {'vs peft':>8} {'device GiB':>11} {'host GiB':>9}  loss")
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"{r['system']:15} {r.get('skipped') or r.get('failed')}")
            continue
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        dev = f"{r['device_peak_bytes'] / 2**30:.1f}" if "device_peak_bytes" in r else "-"
        print(f"{r['system']:15} {r['tokens_per_s']:10.1f} {ratio:>8} {dev:>11} {r['host_peak_rss_bytes'] / 2**30:9.1f}"
              f"  {r['first_loss']:.3f} -> {r['last_loss']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "batch": args.batch, "seq": args.seq, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
