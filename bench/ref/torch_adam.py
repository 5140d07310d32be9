#!/usr/bin/python3
"""PyTorch's Adam, timed, for `strata bench optimizer` (bench/bench_optimizer.cpp).

Started once per benchmark run; it builds one fp32 parameter of --params elements with a
gradient, and one torch.optim.Adam per variant (each with its own moments), takes one
untimed step with each so that their state exists, then answers commands on stdin, one
JSON line on stdout per command, so that the caller can interleave its own measurements
with these:

  time <variant> <steps>   ->  {"variant": ..., "seconds": [per-step wall times]}
  quit                     ->  exits

Variants: "default" (foreach=False, the loop over parameters) and "foreach" (foreach=True,
the multi-tensor kernels). With --deepspeed fp32 or bf16, also "deepspeed": DeepSpeed's
DeepSpeedCPUAdam (its OpenMP C++ op, built by bench/ref/deepspeed_op.py) on its own
parameter of --params elements, fp32 (fp32 weights and gradients) or bf16 (bf16 weights and
gradients, fp32 moments), with the same hyperparameters and thread count. Before timing,
DeepSpeed's result is checked against torch.optim on a small parameter (5 steps) and the
largest difference reported. With --offload-grad or --offload-copy 16-bit as well,
"deepspeed_offload": the same work as CpuAdam's 16-bit path done the way DeepSpeed's
ZeRO-Offload does it, since DeepSpeedCPUAdam has no fp32-master step that reads 16-bit
gradients or writes a 16-bit copy: the 16-bit gradient upcast into the fp32 master's
gradient (stage3.py's partition copy), DeepSpeedCPUAdam's fp32 step, and the fp32 weights
copied down into the 16-bit parameters, three passes timed together. When the op cannot be had, the ready line carries
"deepspeed_missing": one line naming what is missing and how to get it, and the rest runs.

The first line out is {"ready": true, "torch": version, ...}; any failure is
{"error": "..."} and a non-zero exit. Anything else a library prints goes to stderr, so
that stdout carries only these lines.
"""
import argparse
import json
import os
import sys
import time

_protocol = None  # the original stdout; fd 1 itself is pointed at stderr in main()


def reply(obj):
    _protocol.write(json.dumps(obj) + "\n")
    _protocol.flush()


def check_deepspeed(torch, ds, adamw, dtype, lr, weight_decay):
    """DeepSpeedCPUAdam against torch.optim.Adam/AdamW (foreach=False) over 5 steps of one
    parameter of 4099 elements: the largest |difference| of the weights in units of lr (each
    step moves a weight by about lr), and of the first moment relative to its largest value.
    DeepSpeed multiplies by 1/sqrt(bias correction) and fuses differently from torch, so
    fp32 differs by rounding; bf16 weights are rounded to bf16 every step."""
    torch.manual_seed(1)
    n = 4099
    p0 = torch.randn(n) * 0.5
    p_torch = torch.nn.Parameter(p0.clone())
    p_ds = torch.nn.Parameter(p0.clone().to(dtype))
    ref = (torch.optim.AdamW if adamw else torch.optim.Adam)([p_torch], lr=lr, weight_decay=weight_decay, foreach=False)
    opt = ds.DeepSpeedCPUAdam([p_ds], lr=lr, weight_decay=weight_decay, adamw_mode=adamw)
    for _ in range(5):
        g = torch.randn(n) * 1e-2
        p_torch.grad = g.clone()
        p_ds.grad = g.to(dtype)
        ref.step()
        opt.step()
    want = p_torch.detach()
    m_want = ref.state[p_torch]["exp_avg"]
    return {"params_max_abs_diff_over_lr": (p_ds.detach().float() - want).abs().max().item() / lr,
            "exp_avg_max_abs_diff_relative": ((opt.state[p_ds]["exp_avg"] - m_want).abs().max() /
                                              m_want.abs().max()).item(),
            "params_moved_fraction": (want != p0).float().mean().item()}


_TYPES = {"bf16": "bfloat16", "fp16": "float16"}


class OffloadStep:
    """DeepSpeed ZeRO-Offload's optimizer step over fp32 masters with 16-bit gradients in
    and/or a 16-bit parameter copy out: upcast the gradient into the master's fp32
    gradient, DeepSpeedCPUAdam.step() in fp32, copy the weights down (each only where the
    type is 16-bit). step() runs the three, as the other contenders' step()."""

    def __init__(self, torch, ds, args):
        n = args.params
        self.master = torch.nn.Parameter(torch.randn(n) * 0.5)
        self.master.grad = torch.zeros(n)
        g = torch.randn(n) * 1e-2
        self.grad16 = g.to(getattr(torch, _TYPES[args.offload_grad])) if args.offload_grad != "f32" else None
        if self.grad16 is None:
            self.master.grad.copy_(g)
        self.copy16 = (torch.empty(n, dtype=getattr(torch, _TYPES[args.offload_copy]))
                       if args.offload_copy != "none" else None)
        self.opt = ds.DeepSpeedCPUAdam([self.master], lr=args.lr, weight_decay=args.weight_decay,
                                       adamw_mode=args.adamw)

    def step(self):
        if self.grad16 is not None:
            self.master.grad.copy_(self.grad16)
        self.opt.step()
        if self.copy16 is not None:
            self.copy16.copy_(self.master.detach())


def check_offload(torch, ds, args):
    """OffloadStep on 4099 parameters over 3 steps against DeepSpeedCPUAdam's fp32 step
    given the same gradient upcast by hand: the masters must agree bit for bit, and the
    16-bit copy must be the masters rounded. Returns the largest |difference| of each."""
    small = argparse.Namespace(**{**vars(args), "params": 4099})
    torch.manual_seed(2)
    step = OffloadStep(torch, ds, small)
    ref = torch.nn.Parameter(step.master.detach().clone())
    ref.grad = torch.zeros(4099)
    opt = ds.DeepSpeedCPUAdam([ref], lr=args.lr, weight_decay=args.weight_decay, adamw_mode=args.adamw)
    for _ in range(3):
        ref.grad.copy_(step.grad16.float() if step.grad16 is not None else step.master.grad)
        step.step()
        opt.step()
    out = {"master_max_abs_diff": (step.master.detach() - ref.detach()).abs().max().item()}
    if step.copy16 is not None:
        out["copy_max_abs_diff"] = (step.copy16.float() - step.master.detach().to(step.copy16.dtype).float()).abs().max().item()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, required=True, help="elements in the parameter")
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--adamw", action="store_true", help="torch.optim.AdamW instead of Adam")
    ap.add_argument("--deepspeed", choices=("none", "fp32", "bf16"), default="none",
                    help="also time DeepSpeedCPUAdam with fp32 or bf16 weights and gradients")
    ap.add_argument("--offload-grad", choices=("f32", "bf16", "fp16"), default="f32",
                    help="with --deepspeed: the gradient type of the ZeRO-Offload pipeline (upcast before the step)")
    ap.add_argument("--offload-copy", choices=("none", "bf16", "fp16"), default="none",
                    help="with --deepspeed: the 16-bit parameter copy the ZeRO-Offload pipeline writes after the step")
    args = ap.parse_args()
    global _protocol
    _protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    # DeepSpeed's op runs on OpenMP: the same thread count as every other contender.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError as e:
        reply({"error": f"PyTorch is not importable by {sys.executable}: {e}"})
        return 1

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(args.params) * 0.5)
    param.grad = torch.randn(args.params) * 1e-2
    cls = torch.optim.AdamW if args.adamw else torch.optim.Adam
    optimizers = {
        name: cls([param], lr=args.lr, weight_decay=args.weight_decay, foreach=foreach)
        for name, foreach in (("default", False), ("foreach", True))
    }
    info = {"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "optimizer": cls.__name__, "params": args.params}
    if args.deepspeed != "none":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import deepspeed_op
        ds, missing = deepspeed_op.load()
        if ds is None:
            info["deepspeed_missing"] = missing
        else:
            import deepspeed
            dtype = torch.bfloat16 if args.deepspeed == "bf16" else torch.float32
            info["deepspeed"] = deepspeed.__version__
            info["deepspeed_dtype"] = args.deepspeed
            info["deepspeed_check"] = check_deepspeed(torch, ds, args.adamw, dtype, args.lr, args.weight_decay)
            ds_param = torch.nn.Parameter((torch.randn(args.params) * 0.5).to(dtype))
            ds_param.grad = (torch.randn(args.params) * 1e-2).to(dtype)
            optimizers["deepspeed"] = ds.DeepSpeedCPUAdam([ds_param], lr=args.lr, weight_decay=args.weight_decay,
                                                          adamw_mode=args.adamw)
            if args.offload_grad != "f32" or args.offload_copy != "none":
                optimizers["deepspeed_offload"] = OffloadStep(torch, ds, args)
                info["deepspeed_offload"] = {"grad": args.offload_grad, "copy": args.offload_copy,
                                             "check": check_offload(torch, ds, args)}
    for opt in optimizers.values():
        opt.step()  # creates the moments (first touch) outside the timing
    reply(info)

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            return 0
        if words[0] != "time" or len(words) != 3 or words[1] not in optimizers:
            reply({"error": f"bad command: {line.strip()!r}"})
            return 1
        opt, steps = optimizers[words[1]], int(words[2])
        seconds = []
        for _ in range(steps):
            start = time.perf_counter()
            opt.step()
            seconds.append(time.perf_counter() - start)
        reply({"variant": words[1], "seconds": seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
