"""Strata's learning-rate schedules against DeepSpeed's own classes.

For each case below, the `scheduler` section of a run config goes two ways:
  - to lr_schedule_dump (tests/runtime/lr_schedule_dump.cpp), which parses the whole config
    with Strata's parse_config and prints LrSchedule::lr_at(0 .. N-1), the lr of optimizer
    steps 1 .. N;
  - to deepspeed.runtime.lr_schedules.<type>(optimizer, **params), built the way
    DeepSpeedEngine._scheduler_from_config builds it, on a torch optimizer whose lr is the
    config's optimizer.params.lr, then driven the way DeepSpeedEngine._take_model_step
    drives it: the optimizer steps with param_groups[0]["lr"], then scheduler.step().
Every lr must agree to 1e-12 relative (both sides compute in double with the same
formulas; what is left is the last bit of libm's log and cos). A zero must be exactly
zero. Each reference sequence must change along the way, so a schedule stuck at a
constant cannot pass.

usage: test_lr_schedule.py --dump BIN
"""
import argparse
import json
import logging
import subprocess
import sys

try:
    import torch
    from deepspeed.runtime import lr_schedules
except ImportError as e:  # without DeepSpeed there is nothing to compare against
    sys.exit(f"test_lr_schedule.py needs torch and deepspeed ({e}); set STRATA_PYTHON to a Python that has them "
             "(scripts/install-deps.sh installs deepspeed into .venv)")

REL_TOL = 1e-12

# (name, optimizer lr, scheduler section, optimizer steps to compare). Steps go past
# warmup_num_steps and, where there is one, total_num_steps.
CASES = [
    ("WarmupLR log, the docs' example", 1e-4,
     {"type": "WarmupLR",
      "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000, "warmup_type": "log"}},
     1100),
    ("WarmupLR linear, min > 0", 1e-3,
     {"type": "WarmupLR",
      "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 17, "warmup_type": "linear"}},
     40),
    ("WarmupLR, warmup_max_lr from optimizer.params.lr", 3e-4,
     {"type": "WarmupLR", "params": {"warmup_num_steps": 25}}, 40),
    ("WarmupLR, no params at all (DeepSpeed's defaults)", 6e-4,
     {"type": "WarmupLR", "params": {}}, 1010),
    ("WarmupLR, warmup_num_steps 1 (DeepSpeed makes it 2)", 1e-3,
     {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 2e-3, "warmup_num_steps": 1}}, 6),
    ("WarmupDecayLR log", 1e-3,
     {"type": "WarmupDecayLR",
      "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "total_num_steps": 100}},
     130),
    ("WarmupDecayLR linear", 1e-3,
     {"type": "WarmupDecayLR",
      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 5e-4, "warmup_num_steps": 30, "total_num_steps": 331,
                 "warmup_type": "linear"}},
     350),
    ("WarmupDecayLR, default warmup_max_lr is 0.001, not the optimizer's lr", 0.5,
     {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5, "total_num_steps": 20}}, 25),
    ("WarmupDecayLR, total_num_steps == warmup_num_steps", 1e-3,
     {"type": "WarmupDecayLR",
      "params": {"warmup_min_lr": 1e-6, "warmup_max_lr": 1e-3, "warmup_num_steps": 12, "total_num_steps": 12}},
     20),
    ("WarmupCosineLR log", 3e-4,
     {"type": "WarmupCosineLR",
      "params": {"total_num_steps": 100, "warmup_num_steps": 10, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}},
     130),
    ("WarmupCosineLR linear, DeepSpeed's default ratios", 1e-3,
     {"type": "WarmupCosineLR", "params": {"total_num_steps": 257, "warmup_num_steps": 20, "warmup_type": "linear"}},
     280),
    ("WarmupCosineLR, total_num_steps == warmup_num_steps", 2e-4,
     {"type": "WarmupCosineLR",
      "params": {"total_num_steps": 8, "warmup_num_steps": 8, "warmup_min_ratio": 0.05, "cos_min_ratio": 0.2}},
     15),
    ("WarmupCosineLR, warmup_num_steps 1, cos_min_ratio 0", 1e-3,
     {"type": "WarmupCosineLR", "params": {"total_num_steps": 40, "warmup_num_steps": 1, "cos_min_ratio": 0.0}}, 45),
]


def deepspeed_lrs(optimizer_lr, scheduler, steps):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=optimizer_lr)
    cls = getattr(lr_schedules, scheduler["type"])
    sched = cls(optimizer, **scheduler.get("params", {}))  # as DeepSpeedEngine._scheduler_from_config
    lrs = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))  # the lr this optimizer step uses
        optimizer.step()
        sched.step()  # as DeepSpeedEngine._take_model_step, after the optimizer's step
    return lrs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="the lr_schedule_dump executable")
    args = ap.parse_args()
    # DeepSpeed logs a warning when its get_lr runs before the first step (by design, at
    # construction); it is noise here.
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)

    request = [{"config": {"optimizer": {"type": "AdamW", "params": {"lr": lr}}, "scheduler": sch}, "steps": n}
               for _, lr, sch, n in CASES]
    run = subprocess.run([args.dump], input=json.dumps(request), capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"{args.dump} failed ({run.returncode}): {run.stderr}")
    ours_all = json.loads(run.stdout)
    if len(ours_all) != len(CASES):
        sys.exit(f"{args.dump} returned {len(ours_all)} sequences for {len(CASES)} cases")

    failures = 0
    for (name, lr, sch, n), ours in zip(CASES, ours_all):
        if isinstance(ours, dict):
            print(f"FAIL {name}: Strata refused the config: {ours['error']}")
            failures += 1
            continue
        ref = deepspeed_lrs(lr, sch, n)
        if len(set(ref)) < 2:
            print(f"FAIL {name}: the reference takes only {len(set(ref))} distinct values; the case tests nothing")
            failures += 1
            continue
        if len(ours) != n:
            print(f"FAIL {name}: {len(ours)} learning rates, expected {n}")
            failures += 1
            continue
        # JSON has no NaN or infinity: the dump writes them as null.
        ours = [float("nan") if a is None else a for a in ours]
        bad = [(s, a, b) for s, (a, b) in enumerate(zip(ours, ref))
               if not abs(a - b) <= REL_TOL * abs(b) or (b == 0) != (a == 0)]
        worst = max((abs(a - b) / abs(b) for a, b in zip(ours, ref) if b != 0), default=0.0)
        if bad:
            failures += 1
            print(f"FAIL {name}: {len(bad)} of {n} steps differ; first: optimizer step {bad[0][0] + 1}: "
                  f"Strata {bad[0][1]!r}, DeepSpeed {bad[0][2]!r}")
        else:
            print(f"ok   {name}: {n} steps, worst relative difference {worst:.2e}, "
                  f"lr from {ref[0]:.3g} via {max(ref):.3g} to {ref[-1]:.3g}")
    import deepspeed
    print(f"reference: DeepSpeed {deepspeed.__version__}, torch {torch.__version__}")
    if failures:
        sys.exit(f"{failures} of {len(CASES)} cases differ from DeepSpeed")


if __name__ == "__main__":
    main()
