#!/usr/bin/python3
"""The largest model that trains on this machine, found by trials: for one system (strata,
fsdp2 or deepspeed) and one family (gpt or llama), the ladder of `strata plan --largest`
(the width of --model kept, rung k has k x --layer-step layers) is searched by running a
trial per rung, each in its own process under --trial-timeout seconds.

  strata     strata train with a generated config (zero_optimization as --offload-param and
             --offload-optimizer, bf16, checkpointing, the budgets `strata plan` gives that
             rung on --cluster), on a small repeated text so that a few steps lower the loss
  fsdp2      bench/ref/peer_gpt_step.py --peer fsdp2: fully_shard with MixedPrecisionPolicy(bf16)
             and CPUOffloadPolicy
  deepspeed  bench/ref/peer_gpt_step.py --peer deepspeed-infinity: ZeRO-3 with offload_param and
             offload_optimizer on NVMe in --dir
  (the peers run Strata's GPT in PyTorch: the gpt family only)

A trial passes when all --steps steps complete and the last loss is below the first. The
search starts at --start (default: the rung `strata plan --largest` predicts for the
strategy), walks up one rung while trials pass, and bisects between the highest rung that
passed and the lowest that failed once one has failed. Each trial records the shape, its
parameters (the plan's count), pass or fail and the reason (device memory, host memory:
killed with exit 137 or SIGKILL, disk full, a tier budget Strata refuses, timeout, loss not
falling, another error), its peak device and host memory and its mean step time. The
search stops cleanly at --budget seconds with what it has: the answer is then a bound.
Writes capacity-SYSTEM-FAMILY.json and .md to --out. Exit 0 when the search ran (whatever
it found), 2 for bad arguments.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SYSTEMS = ("strata", "fsdp2", "deepspeed")
FAMILIES = {"gpt": "gpt-6.7b", "llama": "llama2-7b"}  # the ladder's width: the preset's
HERE = os.path.dirname(os.path.abspath(__file__))
PEER_SCRIPT = os.path.join(HERE, "ref", "peer_gpt_step.py")
GiB = 1 << 30


class UsageError(Exception):
    pass


# ----------------------------------------------------------------------------------------
# The search, apart from how a trial runs (tests/bench/test_capacity_search.py drives it
# with a fake runner).

def search(start, run_trial, max_rung, budget_s, trial_timeout_s, clock=time.monotonic, min_trial_s=5.0):
    """Trials from rung `start`: up one rung while they pass, then bisection between the
    highest passing rung (lo; 0: none yet) and the lowest failing one (hi). run_trial(rung,
    timeout_s) returns a dict with at least "passed" and "reason". Returns {"trials": [...],
    "answer": rung or 0, "status": "exact" | "none" | "ceiling" | "budget", "lo", "hi"}:
    exact, lo passed and lo + 1 failed; none, rung 1 failed; ceiling, every rung up to
    max_rung passed; budget, the search stopped with lo passed (or 0) and hi failed (or None)."""
    if not 1 <= start <= max_rung:
        raise UsageError(f"--start is rung {start}: give a rung from 1 to {max_rung} (--max-layers / --layer-step)")
    t0 = clock()
    trials, lo, hi, k = [], 0, None, start
    while True:
        left = budget_s - (clock() - t0)
        if left < min_trial_s:
            status = "budget"
            break
        timeout = min(trial_timeout_s, left)
        r = dict(run_trial(k, timeout))
        r["rung"] = k
        if not r["passed"] and r["reason"].startswith("timeout") and timeout < trial_timeout_s:
            r["reason"] = "stopped at the search's budget"  # cut short by the budget: not a failure
            trials.append(r)
            status = "budget"
            break
        trials.append(r)
        if same_error(trials[-2:]):
            status = "error"  # a broken setup, not a size: bisecting further would only repeat it
            break
        if r["passed"]:
            lo = max(lo, k)
        else:
            hi = k if hi is None else min(hi, k)
        if hi is not None and hi - lo <= 1:
            status = "exact" if lo > 0 else "none"
            break
        if hi is None and lo >= max_rung:
            status = "ceiling"
            break
        k = lo + 1 if hi is None else (lo + hi) // 2
    return {"trials": trials, "answer": lo, "status": status, "lo": lo, "hi": hi}


def same_error(last_two):
    """Two trials in a row failed with the same error that names no capacity limit (the
    reasons of classify() that start with "error"), numbers aside."""
    if len(last_two) < 2 or any(t["passed"] or not t["reason"].startswith("error") for t in last_two):
        return False
    a, b = (re.sub(r"[0-9.]+", "#", t["reason"]) for t in last_two)
    return a == b


def verdict(result, layer_step):
    """The answer in words, with its bound where the search did not finish."""
    lo, hi, s = result["lo"], result["hi"], result["status"]
    if s == "exact":
        return f"largest that trains: {lo * layer_step} layers (the next rung, {hi * layer_step}, failed)"
    if s == "none":
        return f"none trains: the lowest rung, {layer_step} layers, failed"
    if s == "error":
        a, b = (t["rung"] * layer_step for t in result["trials"][-2:])
        return (f"search stopped: the same error at {a} and {b} layers, not a capacity limit "
                f"(the table says which); {'>= ' + str(lo * layer_step) + ' layers passed' if lo else 'none passed'}")
    if s == "ceiling":
        return f">= {lo * layer_step} layers: every rung up to --max-layers passed"
    above = f", < {hi * layer_step} layers (failed)" if hi is not None else ""
    return (f">= {lo * layer_step} layers{above}, search stopped at budget" if lo
            else f"nothing passed yet{above}, search stopped at budget")


# ----------------------------------------------------------------------------------------
# Failure reasons, from a trial's exit status and output.

_REASONS = (
    ("disk full", re.compile(r"No space left on device|ENOSPC|disk (is )?full|free space on", re.I)),
    ("device memory", re.compile(r"CUDA out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|"
                                 r"CUBLAS_STATUS_ALLOC_FAILED|out of memory on (the )?device", re.I)),
    ("tier budget", re.compile(r"budget of .* is too small|short by .* Raise strata\.|OutOfBudget", re.I)),
    ("host memory", re.compile(r"std::bad_alloc|MemoryError|Cannot allocate memory|DefaultCPUAllocator: "
                               r"can't allocate", re.I)),
)


def classify(returncode, output, timed_out):
    """The reason a trial failed: 'timeout', 'host memory (killed, exit 137)', one of
    _REASONS with the line that says so, or the last line of its output."""
    if timed_out:
        return "timeout"
    for name, pattern in _REASONS:
        m = pattern.search(output)
        if m:
            line = output[output.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0].strip()
            return f"{name}: {line[:300]}"
    if returncode in (137, -signal.SIGKILL):
        return "host memory (killed, exit 137: the OOM killer)"
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    return f"error (exit {returncode}): {lines[-1][:300] if lines else 'no output'}"


# ----------------------------------------------------------------------------------------
# Processes: each trial in its own session, killed as a group at its deadline; its peak
# resident memory from wait4 (ru_maxrss of that child alone).

class Child:
    def __init__(self, cmd, timeout_s, env=None, stdin=None, cwd=None):
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE if stdin else self.out,
                                     stderr=self.out, text=True, env=env, cwd=cwd, start_new_session=True)
        self.timed_out = False
        self.timer = threading.Timer(timeout_s, self._kill)
        self.timer.start()

    def _kill(self):
        self.timed_out = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def finish(self):
        """(returncode, output, peak host bytes)."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.timer.cancel()
        self.out.seek(0)
        return self.proc.returncode, self.out.read(), usage.ru_maxrss * 1024


def strata_config(args, shape, budgets, steps, data, swap):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 50_000_000,
            "stage3_prefetch_bucket_size": 100_000_000}
    for key, dev in (("offload_param", args.offload_param), ("offload_optimizer", args.offload_optimizer)):
        zero[key] = {"device": dev, "nvme_path": swap} if dev == "nvme" else {"device": dev}
    model = {k: shape[k] for k in ("layers", "d_model", "heads", "seq_len", "vocab")}
    if shape.get("arch") == "llama":
        model.update({k: shape[k] for k in ("arch", "kv_heads", "ffn", "rope_theta", "norm_eps", "tied_head") if k in shape})
    return {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "weight_decay": 0.1}},
            "zero_optimization": zero, "activation_checkpointing": {"enabled": True}, "bf16": {"enabled": True},
            "strata": {"backend": args.backend, "device_budget": str(budgets["device"]),
                       "pinned_budget": str(budgets["pinned"]), "model": model,
                       "data": {"path": data, "format": "text"}, "steps": steps}}


def trial_result(passed, reason, losses, secs, peak_dev, peak_host, t0):
    mean = sum(secs[1:] or secs) / len(secs[1:] or secs) if secs else None  # the first step warms up
    return {"passed": passed, "reason": reason, "losses": losses, "step_s": mean, "peak_device_bytes": peak_dev,
            "peak_host_bytes": peak_host, "wall_s": time.monotonic() - t0}


def loss_verdict(losses, steps):
    if len(losses) < steps:
        return False, f"only {len(losses)} of {steps} steps completed"
    if not losses[-1] < losses[0]:
        return False, f"loss not falling ({losses[0]:.4f} -> {losses[-1]:.4f})"
    return True, "passed"


def run_strata(args, plan, rung, timeout_s, work):
    t0 = time.monotonic()
    shape, budgets = plan.rung(rung)
    os.makedirs(os.path.join(work, "swap"), exist_ok=True)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:  # a repeated sentence: learnable in a few steps at any size
        f.write("Strata trains the largest model this machine holds. " * (4 * args.seq * args.micro_batch // 50 + 64))
    cfg = os.path.join(work, "config.json")
    with open(cfg, "w") as f:
        json.dump(strata_config(args, shape, budgets, args.steps, data, os.path.join(work, "swap")), f)
    metrics = os.path.join(work, "metrics.jsonl")
    c = Child([args.strata, "train", "--config", cfg, "--metrics", metrics, "--quiet"], timeout_s, cwd=work)
    rc, out, peak_host = c.finish()
    recs = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            recs = [json.loads(ln) for ln in f if ln.strip()]
    losses = [r["loss"] for r in recs]
    peak_dev = max((r["peak"]["device"] for r in recs), default=None)
    passed, reason = loss_verdict(losses, args.steps)
    if rc != 0 or c.timed_out:
        passed, reason = False, classify(rc, out, c.timed_out)
        if c.timed_out:
            reason += f" after {len(losses)} of {args.steps} steps"
    return trial_result(passed, reason, losses, [r["seconds"] for r in recs], peak_dev, peak_host, t0)


def run_peer(args, plan, rung, timeout_s, work):
    t0 = time.monotonic()
    shape, _ = plan.rung(rung)
    peer = {"fsdp2": "fsdp2", "deepspeed": "deepspeed-infinity"}[args.system]
    cmd = [args.python, PEER_SCRIPT, "--peer", peer, "--layers", str(shape["layers"]), "--d-model",
           str(shape["d_model"]), "--heads", str(shape["heads"]), "--seq", str(shape["seq_len"]), "--vocab",
           str(shape["vocab"]), "--micro-batch", str(args.micro_batch), "--accum", "1", "--threads",
           str(args.threads), "--precision", "bf16", "--device", args.backend, "--nvme-dir", work, "--fixed-batch"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    c = Child(cmd, timeout_s, env=env, stdin=subprocess.PIPE)
    losses, secs, peak_dev, peak_host, error, ready_seen = [], [], None, None, None, False

    def ask(line):
        if line:
            c.proc.stdin.write(line + "\n")
            c.proc.stdin.flush()
        reply = c.proc.stdout.readline()
        return json.loads(reply) if reply.strip() else {"error": "the peer's process ended"}

    try:
        ready = ask(None)
        error = ready.get("error")
        ready_seen = bool(ready.get("ready"))
        for _ in range(args.steps if error is None else 0):
            r = ask("step")
            if "error" in r:
                error = r["error"]
                break
            losses.append(r["loss"])
            secs.append(r["seconds"])
            peak_dev = r.get("peak_device_bytes", peak_dev)
        if error is None:
            c.proc.stdin.write("quit\n")
            c.proc.stdin.flush()
    except (BrokenPipeError, json.JSONDecodeError, OSError) as e:
        error = error or f"the peer's protocol broke: {e}"
    try:
        c.proc.stdin.close()
    except OSError:
        pass
    rc, out, peak_host = c.finish()
    passed, reason = loss_verdict(losses, args.steps)
    if error is not None or c.timed_out:
        passed, reason = False, classify(rc, (error or "") + "\n" + out, c.timed_out)
        if c.timed_out:  # before ready: building the model (and DeepSpeed's ops, on first use)
            reason += f" after {len(losses)} of {args.steps} steps" if ready_seen else " before the peer was ready"
    return trial_result(passed, reason, losses, secs, peak_dev, peak_host, t0)


# ----------------------------------------------------------------------------------------
# The ladder, from `strata plan`: the shapes, their parameters and the budgets per rung.

class Plan:
    def __init__(self, args):
        self.args = args
        self.cache = {}

    def base_cmd(self):
        a = self.args
        cmd = [a.strata, "plan", "--model", a.model, "--cluster", a.cluster, "--seq", str(a.seq), "--precision", "bf16",
               "--offload-param", a.offload_param, "--offload-optimizer", a.offload_optimizer, "--micro-batch",
               str(a.micro_batch), "--json"]
        for flag in ("d_model", "heads", "vocab"):
            if getattr(a, flag):
                cmd += ["--" + flag.replace("_", "-"), str(getattr(a, flag))]
        for flag in ("hbm", "host_ram", "nvme_capacity"):
            if getattr(a, flag):
                cmd += ["--" + flag.replace("_", "-"), getattr(a, flag)]
        return cmd

    def run(self, extra):
        r = subprocess.run(self.base_cmd() + extra, capture_output=True, text=True, timeout=120)
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            raise UsageError(f"strata plan failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")

    def largest(self):
        return self.run(["--largest", "--layer-step", str(self.args.layer_step), "--max-layers",
                         str(self.args.max_layers)])

    def rung(self, k):
        """(model shape as strata.model has it, the plan's engine budgets) for rung k."""
        if k not in self.cache:
            j = self.run(["--layers", str(k * self.args.layer_step)])["plan"]
            self.cache[k] = (j["model"], j["engine_budgets"], j["model"]["params"])
        return self.cache[k][:2]

    def params(self, k):
        self.rung(k)
        return self.cache[k][2]


# ----------------------------------------------------------------------------------------
# Arguments, the tables, main.

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--system", required=True, help="strata, fsdp2 or deepspeed")
    ap.add_argument("--family", required=True, help="gpt or llama (the peers: gpt only)")
    ap.add_argument("--model", help="the preset whose width the ladder keeps (default: gpt-6.7b for gpt, "
                                    "llama2-7b for llama)")
    ap.add_argument("--d-model", type=int, help="the ladder's width over --model's (strata plan --d-model)")
    ap.add_argument("--heads", type=int, help="attention heads over --model's")
    ap.add_argument("--vocab", type=int, help="vocabulary over --model's")
    ap.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--layer-step", type=int, default=4, help="layers per rung (default 4)")
    ap.add_argument("--max-layers", type=int, default=256, help="the deepest rung (default 256)")
    ap.add_argument("--start", type=int, help="the first rung tried (default: strata plan --largest's answer)")
    ap.add_argument("--steps", type=int, default=3, help="steps per trial (default 3)")
    ap.add_argument("--trial-timeout", type=float, default=600, help="seconds per trial (default 600)")
    ap.add_argument("--budget", type=float, default=3600, help="seconds for the whole search (default 3600)")
    ap.add_argument("--out", required=True, help="directory for capacity-SYSTEM-FAMILY.json and .md")
    ap.add_argument("--dir", help="scratch for the trials (swap files: on the disk measured; default: a temp dir)")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--strata", default=os.path.join(HERE, "..", "build", "strata"), help="the strata binary")
    ap.add_argument("--python", default=sys.executable, help="the peers' Python (torch, deepspeed)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the peers' torch threads")
    ap.add_argument("--lr", type=float, default=1e-4, help="Strata's learning rate (the peers': 1e-4)")
    ap.add_argument("--cluster", default="h200-1", help="strata plan's cluster preset (default h200-1)")
    ap.add_argument("--hbm", help="strata plan --hbm over the preset")
    ap.add_argument("--host-ram", help="strata plan --host-ram over the preset")
    ap.add_argument("--nvme-capacity", help="strata plan --nvme-capacity over the preset")
    ap.add_argument("--offload-param", default="cpu", help="Strata's offload_param: none, cpu or nvme (default cpu)")
    ap.add_argument("--offload-optimizer", default="cpu", help="Strata's offload_optimizer (default cpu)")
    args = ap.parse_args(argv)
    if args.system not in SYSTEMS:
        raise UsageError(f"--system '{args.system}': give one of {', '.join(SYSTEMS)}")
    if args.family not in FAMILIES:
        raise UsageError(f"--family '{args.family}': give gpt or llama")
    if args.system != "strata" and args.family != "gpt":
        raise UsageError(f"--system {args.system} runs Strata's GPT in PyTorch (bench/ref/torch_gpt_step.py has no "
                         "Llama): give --family gpt, or --system strata for llama")
    args.model = args.model or FAMILIES[args.family]
    for dev in (args.offload_param, args.offload_optimizer):
        if dev not in ("none", "cpu", "nvme"):
            raise UsageError(f"offload device '{dev}': give none, cpu or nvme")
    for name in ("seq", "micro_batch", "layer_step", "max_layers", "steps", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} is {getattr(args, name)}: give 1 or more")
    if args.steps < 2:
        raise UsageError("--steps is 1: a falling loss needs at least 2 steps")
    if args.trial_timeout <= 0 or args.budget <= 0:
        raise UsageError("--trial-timeout and --budget are seconds: give more than 0")
    args.strata = os.path.abspath(args.strata)
    if not (os.path.isfile(args.strata) and os.access(args.strata, os.X_OK)):
        raise UsageError(f"--strata '{args.strata}' is not an executable: build it (cmake --build build) or name "
                         "the binary with --strata")
    if args.system != "strata" and not shutil.which(args.python):
        raise UsageError(f"--python '{args.python}' is not an executable: name a Python with torch (and deepspeed)")
    if args.start is not None and args.start < 1:
        raise UsageError(f"--start is {args.start}: give a rung of 1 or more")
    return args


def count(n):
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def gib(b):
    return "-" if b is None else f"{b / GiB:.1f}"


def write_tables(args, result, prediction, width, wall_s):
    os.makedirs(args.out, exist_ok=True)
    name = f"capacity-{args.system}-{args.family}"
    config = {k: getattr(args, k) for k in ("system", "family", "model", "seq", "micro_batch", "layer_step",
                                            "max_layers", "steps", "trial_timeout", "budget", "backend", "cluster",
                                            "offload_param", "offload_optimizer")}
    doc = {"config": config, "prediction": prediction, "verdict": verdict(result, args.layer_step), "wall_s": wall_s,
           **result}
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(doc, f, indent=2)
    strategy = ("bf16, ZeRO-3, offload_param " + args.offload_param + ", offload_optimizer " + args.offload_optimizer
                if args.system == "strata" else {"fsdp2": "fully_shard, MixedPrecisionPolicy(bf16), CPUOffloadPolicy",
                                                 "deepspeed": "ZeRO-3, offload_param and offload_optimizer nvme, bf16"}
                [args.system])
    lines = [f"## {args.system}, {args.family}: {doc['verdict']}", "",
             f"{strategy}; ladder at the width of {args.model} ({width}), seq {args.seq}, micro-batch {args.micro_batch}, "
             f"{args.layer_step} layers per rung, {args.steps} steps a trial, {args.backend}; "
             f"plan's prediction ({args.cluster}): {prediction}; search {wall_s:.0f} s of {args.budget:.0f} s", "",
             "| layers | parameters | result | reason | step s | peak device GiB | peak host GiB | wall s |",
             "|---:|---:|---|---|---:|---:|---:|---:|"]
    for t in result["trials"]:
        step = "-" if t.get("step_s") is None else f"{t['step_s']:.2f}"
        lines.append(f"| {t['layers']} | {count(t['params'])} | {'pass' if t['passed'] else 'FAIL'} | "
                     f"{t['reason'].replace('|', '/')} | {step} | {gib(t.get('peak_device_bytes'))} | "
                     f"{gib(t.get('peak_host_bytes'))} | {t['wall_s']:.0f} |")
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def main(argv=None):
    try:
        args = parse_args(argv)
        plan = Plan(args)
        largest = plan.largest()
    except UsageError as e:
        print(f"capacity_search.py: {e}", file=sys.stderr)
        return 2
    ans = largest.get("largest") or None
    prediction = (f"{ans['layers']} layers, {count(ans['params'])} parameters, binding {ans['binding']}"
                  if ans else "nothing fits")
    max_rung = args.max_layers // args.layer_step
    start = args.start or (ans["rung"] if ans else 1)
    scratch = tempfile.mkdtemp(prefix="strata-capacity-", dir=args.dir)
    runner = run_strata if args.system == "strata" else run_peer

    def run_trial(k, timeout_s):
        work = os.path.join(scratch, f"rung-{k}")
        os.makedirs(work, exist_ok=True)
        try:
            r = runner(args, plan, k, timeout_s, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)  # the next trial needs the disk
        r.update(layers=k * args.layer_step, params=plan.params(k))
        print(f"capacity_search.py: {args.system} {r['layers']} layers ({count(r['params'])}): "
              f"{'pass' if r['passed'] else 'FAIL'}: {r['reason']} ({r['wall_s']:.0f} s)", flush=True)
        return r

    t0 = time.monotonic()
    try:
        result = search(min(start, max_rung), run_trial, max_rung, args.budget, args.trial_timeout)
    except UsageError as e:
        print(f"capacity_search.py: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    w = largest["ladder"]["width"]
    width = f"{w['arch']}, d_model {w['d_model']}, heads {w['heads']}, vocab {w['vocab']}" + (
        f", kv_heads {w['kv_heads']}, ffn {w['ffn']}" if w["arch"] == "llama" else "")
    print(write_tables(args, result, prediction, width, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
