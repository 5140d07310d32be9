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
the multi-tensor kernels). The first line out is {"ready": true, "torch": version, ...};
any failure is {"error": "..."} and a non-zero exit.
"""
import argparse
import json
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, required=True, help="elements in the parameter")
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--adamw", action="store_true", help="torch.optim.AdamW instead of Adam")
    args = ap.parse_args()
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
    for opt in optimizers.values():
        opt.step()  # creates the moments (first touch) outside the timing
    reply({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "optimizer": cls.__name__, "params": args.params})

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
