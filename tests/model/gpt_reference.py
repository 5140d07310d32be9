#!/usr/bin/env python3
"""PyTorch reference for Strata's GPT (model/gpt.hpp), in float64.

Builds the same GPT-2-style model with torch.nn modules (pre-LayerNorm blocks, causal
attention, tanh-GELU MLP, final LayerNorm, output head tied to wte), gives it random
weights (biases and layer-norm parameters random too, so their gradients are checked),
and writes one binary file that tests/model/test_gpt_numerics.cpp reads:

  int32 magic 0x53475054 ("STGP"), version 1
  int32 layers, d_model, heads, seq_len, vocab, batch, steps, npos
  int32 positions[npos]                      positions whose logits are stored
  int32 tokens[steps][batch][seq_len + 1]    batch s: inputs [:, :-1], targets [:, 1:]
  f32   params, group by group, in Strata's flat layout (model/gpt_layout.hpp)
  f32   logits[batch][npos][vocab]           of batch 0
  f64   loss                                 of batch 0
  f32   grads, group by group, same layout   of batch 0's mean loss
  f64   losses[steps]                        AdamW over batches 0..steps-1: the loss of
                                             batch s before step s's update
  f32   lr, beta1, beta2, eps, weight_decay  the optimizer's settings

The reference runs in float64 so that it is the "true" value; Strata runs in float32,
and the test's tolerances are about float32 rounding, not about two float32 codes
agreeing by accident.
"""
import argparse
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC, VERSION = 0x53475054, 1


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        hd = d // self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(B, T, self.heads, hd).transpose(1, 2)
        k = k.view(B, T, self.heads, hd).transpose(1, 2)
        v = v.view(B, T, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    def flat(self):  # Strata's block layout
        return [self.ln_1.weight, self.ln_1.bias, self.c_attn.weight, self.c_attn.bias,
                self.attn_proj.weight, self.attn_proj.bias, self.ln_2.weight, self.ln_2.bias,
                self.c_fc.weight, self.c_fc.bias, self.mlp_proj.weight, self.mlp_proj.bias]


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq_len, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def groups(self):  # Strata's parameter groups, each a list of tensors in layout order
        return ([[self.wte.weight, self.wpe.weight]] + [b.flat() for b in self.h] +
                [[self.ln_f.weight, self.ln_f.bias]])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=48)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=80)  # > one 64-row attention tile, not a multiple
    p.add_argument("--vocab", type=int, default=61)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()

    torch.manual_seed(a.seed)
    torch.set_default_dtype(torch.float64)
    m = GPT(a.layers, a.d_model, a.heads, a.seq_len, a.vocab)
    with torch.no_grad():
        for name, t in m.named_parameters():
            if name.endswith("bias"):
                t.copy_(0.1 * torch.randn_like(t))
            elif "ln" in name:
                t.copy_(1.0 + 0.1 * torch.randn_like(t))
            else:
                t.copy_(0.1 * torch.randn_like(t))
    groups = m.groups()
    tokens = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq_len + 1), dtype=torch.int32)
    positions = [0, 1, 63, 64, a.seq_len - 1]

    def f32(ts):
        return b"".join(t.detach().to(torch.float32).contiguous().numpy().tobytes() for t in ts)

    params = b"".join(f32(g) for g in groups)
    x, y = tokens[0, :, :-1].long(), tokens[0, :, 1:].long()
    logits, loss = m(x, y)
    loss.backward()
    grads = b"".join(f32([t.grad for t in g]) for g in groups)
    logits_sel = f32([logits[:, positions, :]])

    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.01
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    losses = []
    for s in range(a.steps):
        opt.zero_grad()
        _, l = m(tokens[s, :, :-1].long(), tokens[s, :, 1:].long())
        l.backward()
        opt.step()
        losses.append(l.item())

    with open(a.out, "wb") as f:
        f.write(struct.pack("<10i", MAGIC, VERSION, a.layers, a.d_model, a.heads, a.seq_len, a.vocab, a.batch,
                            a.steps, len(positions)))
        f.write(struct.pack(f"<{len(positions)}i", *positions))
        f.write(tokens.numpy().tobytes())
        f.write(params)
        f.write(logits_sel)
        f.write(struct.pack("<d", loss.item()))
        f.write(grads)
        f.write(struct.pack(f"<{a.steps}d", *losses))
        f.write(struct.pack("<5f", lr, b1, b2, eps, wd))
    print(f"wrote {a.out}: loss {loss.item():.6f}, AdamW losses {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
