"""A PyTorch training loop in which Strata holds the parameters and the Adam states.

A small GPT (token and position embeddings, a few pre-LayerNorm transformer blocks, a
final LayerNorm and an LM head) is trained on a synthetic next-token task through
strata.torch, the way a DeepSpeed user trains:

    engine = strata.torch.initialize(model, config, groups=[...])
    loss = engine(x, y); engine.backward(loss); engine.step()

The embeddings, each block and the head are one Strata parameter group each (given
explicitly here; without groups= the automatic rule would give the token table, the
head's LayerNorm and its Linear groups of their own): ZeRO-3 sharded, with the parameter shards
and the optimizer states (fp32 master weights, Adam moments) offloaded to NVMe (a
temporary directory here). PyTorch holds no parameters at all; it only computes.
python/strata/torch.py says how (module hooks, saved-tensor hooks, one autograd Function
per group), docs/embedding.md what is verified.

With --check, the same model is also trained by plain PyTorch with torch.optim.AdamW
from the same initial weights and data, and the losses of the two runs must agree to a
relative 1e-6 at every step (see TOLERANCE).

    python examples/torch_transformer.py --steps 20 --check
"""
import argparse
import copy
import json
import math
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import strata.torch

# Relative tolerance on each step's loss between Strata and torch.optim.AdamW. Both run
# the same fp32 arithmetic on the same values (Strata's CPU Adam follows torch's AdamW
# kernel operation by operation, and the flat group gradient holds exactly the parameters'
# gradients); what differs is that Strata keeps the learning rate and weight decay as
# float32 (3e-3 becomes 3.0000000261e-3), which moves single weights by an ulp now and
# then. Measured over 20 steps: at most 1e-7 relative (about one ulp of the loss);
# 1e-6 leaves room for that to grow over the steps, and is far below what a wrong
# gradient, a stale parameter or a skipped update gives (1e-3 and more).
TOLERANCE = 1e-6


# ---------------------------------------------------------------------------------------
# The model: plain PyTorch, nothing Strata-specific.

class Embed(nn.Module):
    def __init__(self, vocab, d, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)  # weight [vocab, d]
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)  # [seq, d]

    def forward(self, idx):
        return self.tok(idx) + self.pos[: idx.shape[1]]


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)  # weight [3d, d]
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d=64, heads=4, layers=4, seq=32):
        super().__init__()
        self.embed = Embed(vocab, d, seq)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = Head(vocab, d)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batch(step, size, seq, vocab):
    """Sequences t_i = (a + b*i) mod vocab with a, b per sequence: predictable after two tokens."""
    g = torch.Generator().manual_seed(1000 + step)
    a = torch.randint(0, vocab, (size, 1), generator=g)
    b = torch.randint(1, 8, (size, 1), generator=g)
    s = (a + b * torch.arange(seq + 1)) % vocab
    return s[:, :-1], s[:, 1:]


# ---------------------------------------------------------------------------------------
# Strata underneath.

def strata_config(nvme_dir, lr, weight_decay):
    nvme = {"device": "nvme", "nvme_path": nvme_dir}
    return {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": weight_decay}},
        "zero_optimization": {"stage": 3, "offload_param": nvme, "offload_optimizer": nvme,
                              "stage3_param_persistence_threshold": 0},
        "strata": {"backend": "cpu", "device_budget": "64MiB", "pinned_budget": "64MiB", "checksums": True},
    }


# ---------------------------------------------------------------------------------------

def train_with_strata(model, args, nvme_dir):
    groups = [model.embed, *model.blocks, model.head]
    with strata.torch.initialize(model, strata_config(nvme_dir, args.lr, args.weight_decay), groups) as engine:
        # The model keeps stand-ins (no elements) where its parameters were.
        assert all(p.numel() == 0 for p in model.parameters()), "PyTorch still holds parameters"
        losses = []
        for step in range(args.steps):
            x, y = batch(step, args.batch, args.seq, args.vocab)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses, engine.stats()


def train_with_torch(model, args):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay)
    losses = []
    for step in range(args.steps):
        x, y = batch(step, args.batch, args.seq, args.vocab)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--nvme-dir", help="directory for the NVMe tier (default: a temporary one)")
    p.add_argument("--check", action="store_true", help="also train with torch.optim.AdamW and compare losses")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's intra-op threads; 1 by default: the model is tiny, and on a busy 2-core machine "
                        "OpenMP's spinning threads compete with Strata's own and slow the run down tenfold")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = TinyGPT(vocab=args.vocab, layers=args.layers, seq=args.seq)
    reference = copy.deepcopy(model) if args.check else None

    with tempfile.TemporaryDirectory(prefix="strata-example-") as tmp:
        losses, stats = train_with_strata(model, args, args.nvme_dir or tmp)
    print("step  strata loss" + ("   torch loss   rel diff" if args.check else ""))
    ref = train_with_torch(reference, args) if args.check else None
    worst = 0.0
    for s, l in enumerate(losses):
        line = f"{s:4d}  {l:11.6f}"
        if ref:
            rel = abs(l - ref[s]) / abs(ref[s])
            worst = max(worst, rel)
            line += f"  {ref[s]:11.6f}  {rel:9.2e}"
        print(line)
    print(json.dumps({k: stats[k] for k in ("trace_departures", "gathers", "prefetched", "exposed_wait_s",
                                            "optimizer_steps")}),
          "nvme bytes:", stats["tiers"]["nvme"]["used"], "moved nvme->pinned:", stats["bytes_moved"]["nvme->pinned"])
    ok = losses[-1] < 0.8 * losses[0]
    if not ok:
        print(f"FAIL: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
    if stats["tiers"]["nvme"]["used"] == 0 or stats["bytes_moved"]["nvme->pinned"] == 0:
        print("FAIL: nothing lived on or came from the NVMe tier")
        ok = False
    if args.check:
        print(f"worst relative loss difference {worst:.2e} (tolerance {TOLERANCE:.0e})")
        if worst > TOLERANCE:
            print("FAIL: Strata's losses differ from torch.optim.AdamW's")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
