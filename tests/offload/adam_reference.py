#!/usr/bin/python3
"""Reference results for CpuAdam, made with PyTorch (tests/offload/test_cpu_adam.cpp).

Runs torch.optim.Adam and torch.optim.AdamW (foreach=False) for a few steps on seeded
inputs and writes the inputs and torch's results to one little-endian binary file:

  header   : u32 magic 0x4D414453 ("SDAM"), u32 version 2, u32 case count, u32 reserved
  per case : u32 variant (0 Adam, 1 AdamW), u32 steps, u64 n,
             f64 lr, beta1, beta2, eps, weight_decay,
             u32 grad type (0 f32, 1 bf16, 2 fp16), f32 grad scale,
             f32 params0[n], grads[steps][n] (f32, or u16 bits), inputs (moments start at 0)
             f32 params[n], f32 exp_avg[n], f32 exp_avg_sq[n], after `steps` steps
             u16 params_bf16[n], u16 params_fp16[n]           torch's .to(bfloat16/float16)
  trailer  : u64 count, f32 values[count], u16 bf16[count], u16 fp16[count]
             special values for the conversions: ties, subnormals, overflow, inf, NaN

Torch is given the gradient CpuAdam reads: the stored gradient (rounded to bf16 or fp16
by torch's .to) widened to fp32 and multiplied by the fp32 scale, one rounding.

Any failure, including a Python without PyTorch, exits non-zero and leaves no file, so
that the tests depending on it fail instead of reading a stale one.
"""
import argparse
import os
import struct
import sys

MAGIC = 0x4D414453
VERSION = 2
GRAD_TYPES = {"f32": 0, "bf16": 1, "fp16": 2}

# (variant, n, steps, lr, beta1, beta2, eps, weight_decay, grad type, stored gradient
# multiplier, grad scale). The sizes are not multiples of the vector widths (8, 16) and
# the largest spans several threads' chunks. The gradient is stored as
# (grad * multiplier).to(type) and read back times the scale: a multiplier of 1024 with
# a scale of 1/2048 is an fp16 loss scale undone together with an averaging over two.
CASES = [
    (1, 1, 3, 1e-3, 0.9, 0.999, 1e-8, 0.01, "f32", 1.0, 1.0),
    (0, 7, 5, 1e-3, 0.9, 0.999, 1e-8, 0.01, "f32", 1.0, 1.0),
    (1, 37, 5, 3e-3, 0.8, 0.95, 1e-6, 0.1, "f32", 1.0, 1.0),
    (0, 1000, 6, 1e-2, 0.9, 0.99, 1e-8, 0.05, "f32", 1.0, 1.0),
    (1, 4099, 6, 1e-3, 0.9, 0.999, 1e-8, 0.01, "f32", 1.0, 1.0),
    (0, 100003, 4, 2e-3, 0.85, 0.995, 1e-7, 0.02, "f32", 1.0, 1.0),
    (1, 300017, 4, 5e-4, 0.9, 0.999, 1e-8, 0.1, "f32", 1.0, 1.0),
    (0, 4099, 3, 1e-3, 0.9, 0.999, 1e-8, 0.0, "f32", 1.0, 1.0),  # Adam without decay: torch skips grad.add
    # Scaled gradients of each type. Scales that are not powers of two round the product.
    (0, 4099, 4, 1e-3, 0.9, 0.999, 1e-8, 0.01, "f32", 1.0, 1 / 3),
    (1, 37, 5, 3e-3, 0.8, 0.95, 1e-6, 0.1, "bf16", 1.0, 0.7),
    (0, 1000, 5, 1e-2, 0.9, 0.99, 1e-8, 0.05, "bf16", 1.0, 1 / 3),
    (1, 100003, 4, 2e-3, 0.85, 0.995, 1e-7, 0.02, "bf16", 1.0, 0.7),
    (0, 4099, 5, 1e-3, 0.9, 0.999, 1e-8, 0.01, "fp16", 1.0, 0.7),  # small gradients: fp16 subnormals
    (1, 100003, 4, 5e-4, 0.9, 0.999, 1e-8, 0.1, "fp16", 1024.0, 1 / 2048),
    (0, 1001, 3, 1e-3, 0.9, 0.999, 1e-8, 0.01, "bf16", 1.0, 1.0),
]


def special_values(torch):
    """float32 values that exercise every branch of the 16-bit conversions."""
    bits = []
    for base in (0x3F800000, 0x477FE000, 0x38800000, 0x33000000, 0x387FC000, 0x7F7F0000):
        for low in (0x0000, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x18000):
            bits.append(base + low)
    bits += [0x477FEFFF, 0x477FF000, 0x477FF001, 0x7F7FFFFF, 0x7F800000, 0x00000001, 0x007FFFFF,
             0x33000001, 0x33800000, 0x337FFFFF, 0x34000000, 0x38000000, 0x00000000]
    t = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    g = torch.Generator().manual_seed(7)
    spread = (torch.rand(2000, generator=g) * 80 - 40).exp2() * torch.randn(2000, generator=g)
    t = torch.cat([t, -t, spread])
    return t.contiguous()


def f32(t):
    return t.detach().contiguous().numpy().astype("<f4").tobytes()


def u16(t):
    """The bits of a 16-bit tensor (numpy has no bfloat16, so go through int16)."""
    import torch
    return t.detach().contiguous().view(torch.int16).numpy().view("<u2").tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="binary file to write")
    args = ap.parse_args()
    if os.path.exists(args.out):
        os.remove(args.out)
    try:
        import torch
    except ImportError as e:
        sys.exit(f"adam_reference.py: PyTorch is required to make the CPU Adam reference "
                 f"({sys.executable}: {e}). Install it (scripts/install-deps.sh puts it in .venv).")
    torch.manual_seed(1234)
    torch.set_num_threads(1)

    chunks = [struct.pack("<IIII", MAGIC, VERSION, len(CASES), 0)]
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for variant, n, steps, lr, beta1, beta2, eps, wd, gtype, multiplier, scale in CASES:
        p0 = torch.randn(n) * 0.5
        grads = torch.randn(steps, n) * torch.logspace(-4, 1, n)[torch.randperm(n)]
        stored = (grads * multiplier).to(dtypes[gtype])
        scale32 = torch.tensor(scale, dtype=torch.float32)  # a float32 times a float32 tensor
        p = torch.nn.Parameter(p0.clone())
        cls = torch.optim.AdamW if variant == 1 else torch.optim.Adam
        opt = cls([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd, foreach=False)
        for k in range(steps):
            p.grad = stored[k].float() * scale32
            opt.step()
        st = opt.state[p]
        assert int(st["step"]) == steps
        chunks.append(struct.pack("<IIQ5dIf", variant, steps, n, lr, beta1, beta2, eps, wd,
                                  GRAD_TYPES[gtype], scale32.item()))
        chunks += [f32(p0), f32(stored) if gtype == "f32" else u16(stored), f32(p), f32(st["exp_avg"]),
                   f32(st["exp_avg_sq"]), u16(p.detach().to(torch.bfloat16)), u16(p.detach().to(torch.float16))]

    sv = special_values(torch)
    chunks += [struct.pack("<Q", sv.numel()), f32(sv), u16(sv.to(torch.bfloat16)), u16(sv.to(torch.float16))]

    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
    os.replace(tmp, args.out)
    print(f"adam_reference.py: torch {torch.__version__}, {len(CASES)} cases -> {args.out}")


if __name__ == "__main__":
    main()
