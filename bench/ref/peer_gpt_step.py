#!/usr/bin/python3
"""A peer's training step of Strata's GPT, timed, for `strata bench step --peers`
(bench/step_peers.cpp): what a user who needs offload would otherwise run.

  --peer deepspeed-offload   DeepSpeed ZeRO-3, offload_optimizer cpu (ZeRO-Offload)
  --peer deepspeed-infinity  DeepSpeed ZeRO-3, offload_param nvme + offload_optimizer nvme
                             (ZeRO-Infinity) in --nvme-dir, through DeepSpeed's async_io op
  --peer fsdp2               torch.distributed.fsdp.fully_shard with MixedPrecisionPolicy and
                             CPUOffloadPolicy (parameters, gradients and the AdamW step on the host)

The model is torch_gpt_step.py's (tests/model/gpt_reference.py with its weights), so the
FLOPs are the bench's. One process, world size 1 (gloo on the cpu, nccl on cuda); on the
cpu DeepSpeed runs on its CPU accelerator (DS_ACCELERATOR=cpu, set here unless given), on
cuda on its CUDA one. A step is --accum micro-batches of --micro-batch random sequences
and the optimizer step, as Strata's: DeepSpeed's engine.backward / engine.step with
gradient_accumulation_steps --accum (its own loss scaling by 1/accum), AdamW with Strata's
hyper-parameters (DeepSpeedCPUAdam in AdamW mode where the optimizer is offloaded), bf16 or
fp16 as DeepSpeed's "bf16"/"fp16" sections have it (16-bit weights for compute, fp32
master weights and moments), fp32 with neither. DeepSpeed builds its ops (cpu_adam,
async_io) with ninja on first use under $TORCH_EXTENSIONS_DIR (default here
~/.cache/strata/torch_extensions, outside the repository).

Protocol (bench/include/strata/bench/reference_process.hpp): the first line out is
{"ready": true, "peer": ..., "torch": ..., "deepspeed": ..., ...}, or {"error": why};
then per line in:

  step   ->  {"seconds": wall time of one step, "loss": its last micro-batch's loss,
              "read_bytes", "written_bytes": this process's storage I/O during the step
              (/proc/self/io read_bytes and write_bytes: bytes that reached or came from the
              block layer; DeepSpeed's O_DIRECT aio included, page-cache hits not),
              "peak_host_bytes": the process's peak resident memory (VmHWM) since ready,
              "peak_device_bytes": on cuda, torch.cuda.max_memory_allocated() since start}
  quit   ->  exits
"""
import argparse
import importlib.util
import json
import math
import os
import socket
import sys
import time

PEERS = ("deepspeed-offload", "deepspeed-infinity", "fsdp2")


# The protocol's stream: the stdout this process was started with. DeepSpeed logs to
# stdout and the op builds print there, so main() points fd 1 (and sys.stdout) at stderr.
_protocol = sys.stdout


def reply(obj):
    _protocol.write(json.dumps(obj) + "\n")
    _protocol.flush()


def keep_stdout_for_replies():
    global _protocol
    _protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def proc_io():
    """(read_bytes, write_bytes) of this process, or (None, None) where /proc/self/io is missing."""
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        return int(fields["read_bytes"]), int(fields["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None, None


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def reset_peak_rss():
    """Restart VmHWM from the current resident size (Linux 4.0+): the peak then covers the steps."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def load_torch_step():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_gpt_step.py")
    spec = importlib.util.spec_from_file_location("torch_gpt_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def init_world(torch, device):
    """A process group of one (gloo on the cpu, nccl on cuda), as a launcher would set it up."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:  # a free port: several peers run side by side
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if device == "cuda":
        torch.cuda.set_device(0)


def deepspeed_config(args, largest_param):
    """ZeRO-3 as Strata's engine is set up in bench step (bench/bench_step.cpp
    engine_options): no persistent parameters, 16M-element sub-groups, 60M-element
    prefetch buckets; with offload, DeepSpeed's documented settings for ZeRO-Offload and
    ZeRO-Infinity. ZeRO-Infinity takes one swap buffer per parameter in flight: with no
    persistent parameters and 60M-element prefetches DeepSpeed 0.19.8 stops at the first
    step ("Not enough swap in buffers 0 for 1 params", 124M GPT, 5 buffers), so it runs
    with Hugging Face's "auto" values (prefetch bucket 0.9 d^2, parameters under 10 d
    elements persistent), every parameter released after use (stage3_max_reuse_distance
    0; the default keeps parameters reused soon, each holding a buffer, and the second step
    stops the same way) and 8 buffers the size of the largest parameter."""
    d = args.d_model
    zero = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "sub_group_size": 16_000_000,
        "stage3_prefetch_bucket_size": 60_000_000,
        "overlap_comm": True,
        "contiguous_gradients": True,
    }
    if args.peer == "deepspeed-offload":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": args.device == "cuda"}
    else:
        zero["stage3_prefetch_bucket_size"] = int(0.9 * d * d)
        zero["stage3_param_persistence_threshold"] = 10 * d
        zero["stage3_max_reuse_distance"] = 0  # release each parameter after use: it holds a swap buffer
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": args.nvme_dir, "pin_memory": args.device == "cuda",
                                     "buffer_count": 4, "fast_init": False}
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.nvme_dir, "pin_memory": args.device == "cuda",
                                 "buffer_count": 8, "buffer_size": largest_param, "max_in_cpu": 0}
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.accum,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        # DeepSpeed's defaults for ZeRO-Infinity's NVMe (docs: "aio"); one thread per process.
        "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                "overlap_events": True},
    }
    if args.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif args.precision == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 16}
    return config


def make_deepspeed(args, torch, model):
    try:
        import deepspeed
    except Exception as e:  # deepspeed raises more than ImportError when half-installed
        raise PeerUnavailable(f"DeepSpeed is not importable by {sys.executable} ({type(e).__name__}: {e}); "
                              f"scripts/install-deps.sh puts it in .venv: pass --python .venv/bin/python")
    if args.peer == "deepspeed-infinity":
        from deepspeed.ops.op_builder import AsyncIOBuilder
        if not AsyncIOBuilder().is_compatible(verbose=False):
            raise PeerUnavailable(
                "DeepSpeed's async_io op (ZeRO-Infinity's NVMe swapping) cannot build: it compiles against libaio's "
                "header and libaio.so (Debian: apt-get install libaio-dev, which scripts/install-deps.sh installs; "
                "elsewhere CPATH and LIBRARY_PATH naming where libaio.h and libaio.so are)")
    import logging
    deepspeed.utils.logger.setLevel(logging.WARNING)
    import deepspeed.comm as dist
    dist.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo", verbose=False)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=deepspeed_config(args, max(p.numel() for p in model.parameters())))

    def step():
        loss = None
        for _ in range(args.accum):
            x, y = batch(args, torch)
            _, loss = engine(x, y)
            engine.backward(loss)  # scaled by 1 / gradient_accumulation_steps inside
            engine.step()          # the optimizer steps at the accumulation boundary
        return loss.item()

    optimizer = type(engine.optimizer.optimizer).__name__ if hasattr(engine.optimizer, "optimizer") else "?"
    return step, {"deepspeed": deepspeed.__version__, "optimizer": optimizer,
                  "accelerator": deepspeed.get_accelerator().device_name()}


def make_fsdp2(args, torch, model):
    import torch.distributed as dist
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError as e:
        raise PeerUnavailable(f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard): {e}")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=args.device == "cuda")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(args.device, (1,))
    for block in model.h:
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def step():
        loss = None
        for _ in range(args.accum):
            x, y = batch(args, torch)
            _, loss = model(x, y)
            (loss / args.accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, {"optimizer": "torch.optim.AdamW over the host's fp32 shards"}


class PeerUnavailable(Exception):
    pass


_gen = None


def batch(args, torch):
    global _gen
    if _gen is None or args.fixed_batch:  # --fixed-batch: the first batch again, every micro-step
        _gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.micro_batch, args.seq), generator=_gen).to(args.device)
    y = torch.randint(0, args.vocab, (args.micro_batch, args.seq), generator=_gen).to(args.device)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=PEERS, required=True)
    for name in ("layers", "d-model", "heads", "seq", "vocab", "micro-batch", "accum", "threads"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--precision", choices=("f32", "bf16", "fp16"), required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--nvme-dir", help="directory of deepspeed-infinity's swap files")
    ap.add_argument("--fixed-batch", action="store_true",
                    help="the same random batch every micro-step, so that a few steps lower the loss "
                         "(bench/capacity_search.py's pass criterion); default: a new batch each")
    args = ap.parse_args()
    keep_stdout_for_replies()
    if args.peer == "deepspeed-infinity" and not args.nvme_dir:
        reply({"error": "--peer deepspeed-infinity needs --nvme-dir"})
        return 1
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/strata/torch_extensions"))
    # torch builds DeepSpeed's ops with ninja, found on PATH; a pip-installed one sits
    # beside this Python in a venv that is not activated.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    found = load_torch_step().import_torch(args, reply)
    if found is None:
        return 1
    torch, F = found
    try:
        model, attention = load_torch_step().build_gpt(torch, F, args.layers, args.d_model, args.heads, args.seq,
                                                       args.vocab)
        if args.device == "cuda" and args.peer == "deepspeed-offload":
            model.to("cuda")
        init_world(torch, args.device)
        make = make_fsdp2 if args.peer == "fsdp2" else make_deepspeed
        step, info = make(args, torch, model)
    except PeerUnavailable as e:
        reply({"error": str(e)})
        return 1
    except Exception as e:  # noqa: BLE001 - any failure is reported to the caller, in one line
        last = str(e).strip().splitlines()
        reply({"error": f"{args.peer} failed to start: {type(e).__name__}: {last[-1] if last else ''}"})
        return 1

    read0, _ = proc_io()
    reply(dict({"ready": True, "peer": args.peer, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "attention": attention, "precision": args.precision, "device": args.device,
                "io_counters": read0 is not None}, **info))
    reset_peak_rss()

    def timed_step():
        r0, w0 = proc_io()
        start = time.perf_counter()
        try:
            loss = step()
        except Exception as e:  # noqa: BLE001
            last = str(e).strip().splitlines()
            return {"error": f"{args.peer}'s step failed: {type(e).__name__}: {last[-1] if last else ''}"}
        seconds = time.perf_counter() - start
        r1, w1 = proc_io()
        if not math.isfinite(loss):
            return {"error": f"{args.peer}'s loss is {loss}"}
        out = {"seconds": seconds, "loss": loss, "peak_host_bytes": peak_rss_bytes()}
        if args.device == "cuda":
            out["peak_device_bytes"] = torch.cuda.max_memory_allocated()
        if r0 is not None:
            out["read_bytes"], out["written_bytes"] = r1 - r0, w1 - w0
        return out

    return load_torch_step().serve_steps(reply, torch.cuda.synchronize if args.device == "cuda" else None,
                                         timed_step)


if __name__ == "__main__":
    sys.exit(main())
