#!/usr/bin/env python3
"""PyTorch reference for Strata's GPT (model/gpt.hpp), in float64.

Builds the same GPT-2-style model with torch.nn modules (pre-LayerNorm blocks, causal
attention, tanh-GELU MLP, final LayerNorm, output head tied to wte), gives it random
weights (biases and layer-norm parameters random too, so their gradients are checked),
and writes binary files that tests/model/test_gpt_numerics.cpp reads:

  int32 magic 0x53475054 ("STGP"), version 2
  int32 layers, d_model, heads, seq_len, vocab, batch, steps, npos
  int32 precision                            0 f32, 1 bf16, 2 fp16
  f32   loss_scale                           the gradients below are of loss x loss_scale
  int32 positions[npos]                      positions whose logits are stored
  int32 tokens[steps][batch][seq_len + 1]    batch s: inputs [:, :-1], targets [:, 1:]
  f32   params, group by group, in Strata's flat layout (model/gpt_layout.hpp)
  f32   logits[batch][npos][vocab]           of batch 0
  f64   loss                                 of batch 0
  f32   grads, group by group, same layout   of batch 0's mean loss
  and in the f32 file only:
  f64   losses[steps]                        AdamW over batches 0..steps-1: the loss of
                                             batch s before step s's update
  f32   lr, beta1, beta2, eps, weight_decay  the optimizer's settings

--out writes the f32 reference: float64 torch.nn modules, the "true" value; Strata runs
in float32 and the test's tolerances are about float32 rounding, not about two float32
codes agreeing by accident.

--out-bf16 and --out-fp16 write the 16-bit references (same weights and tokens; one
batch, no AdamW steps): the same model written out functionally, rounding to the 16-bit
type exactly where docs/mixed-precision.md says Strata rounds (the weights as stored,
the layer norms' outputs, qkv, the attention output, GELU's output, every dY before its
backward matmuls, and every gradient once at the end) and computing in float64 in
between. The params stored are the fp32 ones; Strata rounds them as the reference does.
"""
import argparse
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC, VERSION = 0x53475054, 2
PRECISIONS = {"f32": (0, None), "bf16": (1, torch.bfloat16), "fp16": (2, torch.float16)}


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
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
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
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
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


def to_half(x, h):
    """x rounded to the 16-bit type h as Strata rounds its fp32 values, back in float64."""
    return x.to(torch.float32).to(h).to(torch.float64)


class Round(torch.autograd.Function):
    """A 16-bit copy of an activation: rounded forward; its gradient passes in full."""

    @staticmethod
    def forward(ctx, x, h):
        return to_half(x, h)

    @staticmethod
    def backward(ctx, g):
        return g, None


class Matmul(torch.autograd.Function):
    """Y = X W^T over 16-bit X, W; backward rounds dY once for both of its matmuls."""

    @staticmethod
    def forward(ctx, x, w, h):
        ctx.save_for_backward(x, w)
        ctx.h = h
        return x @ w.t()

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        d = to_half(dy, ctx.h)
        x2, d2 = x.reshape(-1, x.shape[-1]), d.reshape(-1, d.shape[-1])
        return d @ w, d2.t() @ x2, None


class Attention(torch.autograd.Function):
    """Causal attention over 16-bit q, k, v [B, H, T, hd]: P = softmax(q k^T / sqrt(hd))
    rounded for P v, the output rounded. Backward rounds dO, P and dS before their matmuls;
    D = rowsum(dO * O) reads the rounded dO and O."""

    @staticmethod
    def forward(ctx, q, k, v, h):
        T, hd = q.shape[-2], q.shape[-1]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        p = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(dim=-1)
        o = to_half(to_half(p, h) @ v, h)
        ctx.save_for_backward(q, k, v, p, o)
        ctx.h = h
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, p, o = ctx.saved_tensors
        h, scale = ctx.h, 1 / math.sqrt(q.shape[-1])
        do = to_half(do, h)
        ds = to_half(p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True)), h)
        return scale * ds @ k, scale * ds.transpose(-2, -1) @ q, to_half(p, h).transpose(-2, -1) @ do, None


def mixed_forward(m, p, idx, targets, h):
    """GPT m's forward in the 16-bit contract, over p: m's parameters -> 16-bit leaves."""
    B, T = idx.shape
    d = m.wte.weight.shape[1]
    x = F.embedding(idx, p[m.wte.weight]) + p[m.wpe.weight][:T]  # fp32 residual
    for b in m.h:
        hd = d // b.heads
        ln1 = Round.apply(F.layer_norm(x, (d,), p[b.ln_1.weight], p[b.ln_1.bias]), h)
        qkv = Round.apply(Matmul.apply(ln1, p[b.c_attn.weight], h) + p[b.c_attn.bias], h)
        q, k, v = (t.reshape(B, T, b.heads, hd).transpose(1, 2) for t in qkv.split(d, dim=2))
        y = Attention.apply(q, k, v, h).transpose(1, 2).reshape(B, T, d)
        x = x + Matmul.apply(y, p[b.attn_proj.weight], h) + p[b.attn_proj.bias]
        ln2 = Round.apply(F.layer_norm(x, (d,), p[b.ln_2.weight], p[b.ln_2.bias]), h)
        fc = Matmul.apply(ln2, p[b.c_fc.weight], h) + p[b.c_fc.bias]  # fp32
        gel = Round.apply(F.gelu(fc, approximate="tanh"), h)
        x = x + Matmul.apply(gel, p[b.mlp_proj.weight], h) + p[b.mlp_proj.bias]
    lnf = Round.apply(F.layer_norm(x, (d,), p[m.ln_f.weight], p[m.ln_f.bias]), h)
    logits = Matmul.apply(lnf, p[m.wte.weight], h)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def header(a, precision, loss_scale, positions):
    steps = a.steps if precision == "f32" else 1
    return (struct.pack("<11i", MAGIC, VERSION, a.layers, a.d_model, a.heads, a.seq_len, a.vocab, a.batch, steps,
                        len(positions), PRECISIONS[precision][0]) +
            struct.pack("<f", loss_scale) + struct.pack(f"<{len(positions)}i", *positions))


def f32(ts):
    return b"".join(t.detach().to(torch.float32).contiguous().numpy().tobytes() for t in ts)


def write_mixed(path, a, m, precision, loss_scale, tokens, positions):
    """The 16-bit reference: m's fp32 weights rounded to the type, batch 0's logits, loss
    and gradients (of loss x loss_scale) in the contract's rounding."""
    h = PRECISIONS[precision][1]
    groups = m.groups()
    p = {t: to_half(t.detach(), h).requires_grad_() for g in groups for t in g}
    x, y = tokens[0, :, :-1].long(), tokens[0, :, 1:].long()
    logits, loss = mixed_forward(m, p, x, y, h)
    (loss * loss_scale).backward()
    with open(path, "wb") as f:
        f.write(header(a, precision, loss_scale, positions))
        f.write(tokens[:1].numpy().tobytes())
        f.write(b"".join(f32(g) for g in groups))
        f.write(f32([logits[:, positions, :]]))
        f.write(struct.pack("<d", loss.item()))
        f.write(b"".join(f32([to_half(p[t].grad, h) for t in g]) for g in groups))
    print(f"wrote {path}: {precision} loss {loss.item():.6f}, gradients x {loss_scale}")


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
    p.add_argument("--out-bf16", help="also write the bf16 reference here")
    p.add_argument("--out-fp16", help="also write the fp16 reference here")
    p.add_argument("--fp16-loss-scale", type=float, default=1024.0)
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

    if a.out_bf16:
        write_mixed(a.out_bf16, a, m, "bf16", 1.0, tokens, positions)
    if a.out_fp16:
        write_mixed(a.out_fp16, a, m, "fp16", a.fp16_loss_scale, tokens, positions)

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
        f.write(header(a, "f32", 1.0, positions))
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
