#!/usr/bin/env python3
"""PyTorch reference for Strata's Llama (model/gpt.hpp with arch llama), in float64.

Hugging Face's LlamaForCausalLM equations written out with torch.nn modules: RMSNorm
(fp32 variance, then the gain), rotary embeddings in the rotate-half convention with
rope_theta, grouped-query attention (k and v repeated to the query heads that share
them), a SwiGLU MLP, no biases, final RMSNorm and an untied (or tied) head. Where
`transformers` imports, the same weights are loaded into transformers' own
LlamaForCausalLM (float64, eager attention) and its logits, loss and every gradient
must agree with this module's to 1e-5 relative (transformers keeps RMSNorm and the
rotary angles in float32), or the script fails: the reference is Hugging Face's model,
not our reading of it.

Writes the file tests/model/test_gpt_numerics.cpp reads (gpt_reference.py's format,
version 3: the architecture's fields after the header):

  int32 magic 0x53475054, version 3
  int32 layers, d_model, heads, seq_len, vocab, batch, steps, npos, precision (0: f32)
  int32 arch (1: llama), kv_heads, ffn, tied_head
  f64   rope_theta, norm_eps
  f32   loss_scale (1)
  int32 positions[npos]; int32 tokens[steps][batch][seq_len + 1]
  f32   params, group by group, in Strata's layout (model/gpt_layout.hpp)
  f32   logits[batch][npos][vocab]; f64 loss; f32 grads (layout as params)
  f64   losses[steps] (AdamW, the loss of batch s before step s); f32 lr, beta1, beta2, eps, wd
"""
import argparse
import math
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC, VERSION = 0x53475054, 3


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, hd = a.d_model, a.d_model // a.heads
        self.heads, self.kv, self.hd = a.heads, a.kv_heads, hd
        self.input_layernorm = RMSNorm(d, a.norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, a.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, a.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, a.norm_eps)
        self.gate_proj = nn.Linear(d, a.ffn, bias=False)
        self.up_proj = nn.Linear(d, a.ffn, bias=False)
        self.down_proj = nn.Linear(a.ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(dim=-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(B, T, d))
        n = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))

    def flat(self):  # Strata's block layout (llama_block_layout)
        return [self.input_layernorm.weight, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight,
                self.o_proj.weight, self.post_attention_layernorm.weight, self.gate_proj.weight,
                self.up_proj.weight, self.down_proj.weight]


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed_tokens = nn.Embedding(a.vocab, a.d_model)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.d_model, a.norm_eps)
        self.lm_head = None if a.tied else nn.Linear(a.d_model, a.vocab, bias=False)

    def rope(self, T):
        # As LlamaRotaryEmbedding computes them whatever the model's dtype: in float32.
        hd = self.a.d_model // self.a.heads
        inv = 1.0 / (self.a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        f = torch.arange(T).float()[:, None] * inv[None, :]
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().double(), emb.sin().double()

    def forward(self, idx, targets=None):
        cos, sin = self.rope(idx.shape[1])
        x = self.embed_tokens(idx)
        for b in self.layers:
            x = b(x, cos, sin)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = self.norm(x) @ head.t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def groups(self):
        final = [self.norm.weight] + ([] if self.lm_head is None else [self.lm_head.weight])
        return [[self.embed_tokens.weight]] + [b.flat() for b in self.layers] + [final]

    def hf_state_dict(self):
        """This model's weights under Hugging Face's names."""
        sd = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm.weight}
        if self.lm_head is not None:
            sd["lm_head.weight"] = self.lm_head.weight
        for i, b in enumerate(self.layers):
            p = f"model.layers.{i}."
            for name in ("input_layernorm", "post_attention_layernorm"):
                sd[p + name + ".weight"] = getattr(b, name).weight
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[p + "self_attn." + name + ".weight"] = getattr(b, name).weight
            for name in ("gate_proj", "up_proj", "down_proj"):
                sd[p + "mlp." + name + ".weight"] = getattr(b, name).weight
        return sd


def check_against_transformers(m, a, x, y, logits, loss):
    """transformers' LlamaForCausalLM on the same weights: logits, loss and gradients."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # noqa: BLE001  (any import failure: not installed beside this torch)
        print(f"transformers not importable ({type(e).__name__}: {e}); checked against the equations only")
        return
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.seq_len, rms_norm_eps=a.norm_eps, rope_theta=a.rope_theta,
                      tie_word_embeddings=a.tied, attention_bias=False, mlp_bias=False,
                      attn_implementation="eager")
    hf = LlamaForCausalLM(cfg).double()
    ours = m.hf_state_dict()
    missing, unexpected = hf.load_state_dict({k: v.detach() for k, v in ours.items()}, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq") and not (a.tied and k == "lm_head.weight")]
    if a.tied and hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        sys.exit("transformers' LlamaForCausalLM did not tie lm_head to embed_tokens")
    if missing or unexpected:
        sys.exit(f"transformers' LlamaForCausalLM has other weights: missing {missing}, unexpected {unexpected}")
    out = hf(input_ids=x, labels=None)
    hf_loss = F.cross_entropy(out.logits.reshape(-1, a.vocab), y.reshape(-1))
    hf_loss.backward()
    worst = (out.logits - logits).abs().max().item() / logits.abs().max().item()
    worst = max(worst, abs(hf_loss.item() - loss.item()) / loss.item())
    hf_params = dict(hf.named_parameters())
    for name, p in ours.items():
        g = hf_params[name].grad
        worst = max(worst, (g - p.grad).abs().max().item() / p.grad.abs().max().item())
    print(f"transformers' LlamaForCausalLM against the equations: worst relative difference {worst:.3g}")
    # transformers computes RMSNorm (hidden_states.to(float32)) and the rotary angles in
    # float32 even in a float64 model: float32-level differences (measured 4.4e-7) are its
    # own rounding; a wrong equation (rotate-half pairing, kv head mapping, eps placement)
    # differs by 1e-2 and more.
    if worst > 1e-5:
        sys.exit("the reference equations disagree with transformers' LlamaForCausalLM")


def f32(ts):
    return b"".join(t.detach().to(torch.float32).contiguous().numpy().tobytes() for t in ts)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=48)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)   # grouped-query attention
    p.add_argument("--ffn", type=int, default=80)
    p.add_argument("--seq-len", type=int, default=80)   # > one 64-row attention tile, not a multiple
    p.add_argument("--vocab", type=int, default=61)
    p.add_argument("--rope-theta", type=float, default=500000.0)  # Llama 3's, not the default 10000
    p.add_argument("--norm-eps", type=float, default=1e-6)
    p.add_argument("--tied", action="store_true")       # default: an untied lm_head
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=11)
    a = p.parse_args()

    torch.manual_seed(a.seed)
    torch.set_default_dtype(torch.float64)
    m = Llama(a)
    with torch.no_grad():
        for name, t in m.named_parameters():
            t.copy_(1.0 + 0.1 * torch.randn_like(t) if "norm" in name else 0.1 * torch.randn_like(t))
    groups = m.groups()
    tokens = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq_len + 1), dtype=torch.int32)
    positions = [0, 1, 63, 64, a.seq_len - 1]

    params = f32([t for g in groups for t in g])
    x, y = tokens[0, :, :-1].long(), tokens[0, :, 1:].long()
    logits, loss = m(x, y)
    loss.backward()
    check_against_transformers(m, a, x, y, logits, loss)
    grads = f32([t.grad for g in groups for t in g])
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
        f.write(struct.pack("<11i", MAGIC, VERSION, a.layers, a.d_model, a.heads, a.seq_len, a.vocab, a.batch,
                            a.steps, len(positions), 0))
        f.write(struct.pack("<4i", 1, a.kv_heads, a.ffn, int(a.tied)))
        f.write(struct.pack("<2d", a.rope_theta, a.norm_eps))
        f.write(struct.pack("<f", 1.0) + struct.pack(f"<{len(positions)}i", *positions))
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
