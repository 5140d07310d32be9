#!/usr/bin/python3
"""PyTorch's training step of Strata's GPT, timed, for `strata bench step`
(bench/bench_step.cpp), on the CPU or (--device cuda) wholly on the GPU.

The model is the PyTorch GPT of Strata's numerics tests (tests/model/gpt_reference.py:
GPT-2's blocks, tanh GELU, tied head), so both sides compute the same FLOPs; its
attention is F.scaled_dot_product_attention(is_causal=True) where the torch has it
(2.0 and up), the masked softmax of the reference otherwise. A step is what Strata's is:
--accum micro-batches of --micro-batch random sequences, forward under
torch.autocast(device, dtype=--precision) (none for f32), loss / accum backward, then
torch.optim.AdamW (fp32 parameters and moments, Strata's hyper-parameters; on cuda the
fused kernel) and zero_grad. On cuda everything stays in GPU memory and fp32 matmuls are
plain fp32 (no TF32), as cuBLAS's are in Strata's GptCuda; the step is timed from its
start to the loss read back, which waits for the GPU. Started once per benchmark run; answers commands on stdin with one JSON line
on stdout each:

  step     ->  {"seconds": wall time of one step, "loss": its last micro-batch's loss}
  profile  ->  the same, the step inside CUDA's profiler capture (torch.cuda.profiler.start
               / stop: what `ncu --profile-from-start off` records; `strata bench step
               --cuda-profile`); on the CPU an error
  quit     ->  exits

The first line out is {"ready": true, "torch": version, "threads": n, "attention": ...};
any failure is {"error": "..."} and a non-zero exit.
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve_steps(reply, sync, run_step):
    """The bench's protocol on stdin, for this script and peer_gpt_step.py: each `step`
    runs run_step() (after sync(), the GPU's synchronize, when given) and replies the dict
    it returns; `profile` likewise, inside CUDA's profiler capture (only where sync is
    given: on the GPU); `quit` or the end of input ends with 0. A bad command, or a step
    whose reply is an {"error": ...}, ends with 1 (the error replied)."""
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words == ["quit"]:
            return 0
        if words not in (["step"], ["profile"]):
            reply({"error": f"bad command: {line.strip()!r}"})
            return 1
        if words == ["profile"] and sync is None:
            reply({"error": "profile brackets a step for a CUDA profiler: run with --device cuda"})
            return 1
        if sync is not None:
            sync()
        if words == ["profile"]:
            import torch  # on the GPU, torch is imported already

            torch.cuda.profiler.start()
            try:
                out = run_step()
                sync()
            finally:
                torch.cuda.profiler.stop()
        else:
            out = run_step()
        reply(out)
        if "error" in out:
            return 1
    return 0


def load_reference_gpt():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "gpt_reference.py")
    spec = importlib.util.spec_from_file_location("gpt_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_gpt(torch, F, layers, d_model, heads, seq, vocab):
    """The reference GPT with the bench's weights (seed 0; zero biases, unit layer norms,
    N(0, 0.02) elsewhere), and the name of its attention. Shared by the peers' script
    (peer_gpt_step.py), so every run of bench step computes the same FLOPs."""
    ref = load_reference_gpt()
    attention = "masked softmax (torch < 2.0 has no scaled_dot_product_attention)"
    if hasattr(F, "scaled_dot_product_attention"):
        attention = "F.scaled_dot_product_attention(is_causal=True)"

        def block_forward(self, x):
            B, T, d = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

        ref.Block.forward = block_forward

    torch.manual_seed(0)
    model = ref.GPT(layers, d_model, heads, seq, vocab)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("bias"):
                t.zero_()
            elif "ln" in name:
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02)
    return model, attention


def import_torch(args, reply):
    """(torch, torch.nn.functional) set up for args.device and args.threads, or None after
    replying why not (shared with peer_gpt_step.py)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        reply({"error": f"PyTorch is not importable by {sys.executable}: {e}"})
        return None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            reply({"error": f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False)"})
            return None
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(args.threads)
    return torch, F


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("layers", "d-model", "heads", "seq", "vocab", "micro-batch", "accum", "threads"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--precision", choices=("f32", "bf16", "fp16"), required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    found = import_torch(args, reply)
    if found is None:
        return 1
    torch, F = found
    try:
        model, attention = build_gpt(torch, F, args.layers, args.d_model, args.heads, args.seq, args.vocab)
    except Exception as e:  # noqa: BLE001 - any failure is reported to the caller
        reply({"error": f"cannot build the GPT of tests/model/gpt_reference.py: {type(e).__name__}: {e}"})
        return 1
    model.to(args.device)
    extra = {"fused": True} if args.device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **extra)
    dtype = {"f32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    gen = torch.Generator().manual_seed(1)

    def step():
        loss = None
        for _ in range(args.accum):
            x = torch.randint(0, args.vocab, (args.micro_batch, args.seq), generator=gen).to(args.device)
            y = torch.randint(0, args.vocab, (args.micro_batch, args.seq), generator=gen).to(args.device)
            if dtype is None:
                _, loss = model(x, y)
            else:
                with torch.autocast(args.device, dtype=dtype):
                    _, loss = model(x, y)
            (loss / args.accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    reply({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads(), "attention": attention,
           "precision": args.precision, "device": device})

    def timed_step():
        start = time.perf_counter()
        loss = step()
        seconds = time.perf_counter() - start
        if not math.isfinite(loss):
            return {"error": f"the PyTorch step's loss is {loss}"}
        return {"seconds": seconds, "loss": loss}

    return serve_steps(reply, torch.cuda.synchronize if args.device == "cuda" else None, timed_step)


if __name__ == "__main__":
    sys.exit(main())
