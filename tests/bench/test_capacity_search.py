"""bench/capacity_search.py (gpu-check.sh capacity): the search with a fake trial runner
(the walk up, the bisection down, the budget's stop, the ceiling, nothing passing), the
failure reasons read from a trial's output, bad arguments refused with exit 2, and one real
tiny Strata trial on the cpu backend (it passes: every step completes, the loss falls).
argv: the script's path, the strata binary."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

script, strata = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("capacity_search", script)
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)
failed = []


def check(name, cond, detail=""):
    if not cond:
        failed.append(name)
        print(f"FAILED {name}: {detail}")


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def fake(largest_passing, seconds=10.0, clock=None, reason="device memory: CUDA out of memory"):
    """A runner where rungs up to largest_passing pass; each trial takes `seconds` of the clock."""
    tried = []

    def run(k, timeout_s):
        tried.append(k)
        if clock:
            clock.t += min(seconds, timeout_s)
            if seconds > timeout_s:
                return {"passed": False, "reason": "timeout after 0 of 2 steps"}
        return {"passed": k <= largest_passing, "reason": "passed" if k <= largest_passing else reason}
    return run, tried


# Up from a prediction that passes: one rung at a time until one fails.
run, tried = fake(7)
r = cs.search(5, run, 100, 1e9, 60)
check("walk up", tried == [5, 6, 7, 8] and r["status"] == "exact" and r["answer"] == 7, (tried, r))
# Down from a prediction that fails: bisection between 0 and the failing rung, then between.
run, tried = fake(3)
r = cs.search(16, run, 100, 1e9, 60)
check("bisect down", tried == [16, 8, 4, 2, 3] and r["answer"] == 3 and r["hi"] == 4 and r["status"] == "exact",
      (tried, r))
# Not even rung 1.
run, tried = fake(0)
r = cs.search(4, run, 100, 1e9, 60)
check("none", r["status"] == "none" and r["answer"] == 0 and tried == [4, 2, 1], (tried, r))
check("none verdict", "none trains" in cs.verdict(r, 4), cs.verdict(r, 4))
# Every rung up to the top passes.
run, tried = fake(50)
r = cs.search(3, run, 5, 1e9, 60)
check("ceiling", r["status"] == "ceiling" and r["answer"] == 5 and tried == [3, 4, 5], (tried, r))
check("ceiling verdict", cs.verdict(r, 2).startswith(">= 10 layers"), cs.verdict(r, 2))
# The budget: 3 trials of 10 s fit in 35 s; the fourth would start with 5 s left, below the
# minimum of 6 given, so it does not; the answer is a bound.
clock = FakeClock()
run, tried = fake(50, seconds=10, clock=clock)
r = cs.search(1, run, 100, 35, 60, clock=clock, min_trial_s=6)
check("budget stop", r["status"] == "budget" and tried == [1, 2, 3] and r["answer"] == 3, (tried, r))
check("budget verdict", cs.verdict(r, 4) == ">= 12 layers, search stopped at budget", cs.verdict(r, 4))
# A trial cut short by the budget (its timeout below --trial-timeout) is not a failure.
clock = FakeClock()
run, tried = fake(50, seconds=30, clock=clock)
r = cs.search(1, run, 100, 50, 40, clock=clock)
check("budget cut", r["status"] == "budget" and r["hi"] is None and r["answer"] == 1
      and r["trials"][-1]["reason"] == "stopped at the search's budget", r)
# A real timeout (the full per-trial limit) is a failure and the search goes on below it.
clock = FakeClock()
run, tried = fake(50, seconds=100, clock=clock)
r = cs.search(2, run, 100, 1000, 40, clock=clock)
check("timeout fails", r["trials"][0]["reason"] == "timeout after 0 of 2 steps" and r["status"] == "none", r)
# The same error twice in a row (not a size): the search stops instead of bisecting on.
run, tried = fake(0, reason="error (exit 1): strata: error: cuda backend: Strata was built without CUDA")
r = cs.search(9, run, 100, 1e9, 60)
check("same error stops", r["status"] == "error" and tried == [9, 4], (tried, r))
check("same error verdict", cs.verdict(r, 4).startswith("search stopped: the same error at 36 and 16 layers"),
      cs.verdict(r, 4))
run, tried = fake(2, reason="error (exit 1): something at 40 GiB")
r = cs.search(3, run, 100, 1e9, 60)
check("one error is a failure", r["status"] == "exact" and r["answer"] == 2, (tried, r))
try:
    cs.search(0, fake(1)[0], 10, 100, 10)
    check("bad start", False, "no error")
except cs.UsageError as e:
    check("bad start", "--start is rung 0" in str(e), e)

# Reasons.
check("reason oom kill", cs.classify(-9, "", False).startswith("host memory (killed, exit 137"), cs.classify(-9, "", False))
check("reason 137", cs.classify(137, "step 1\n", False).startswith("host memory"), "")
check("reason disk", cs.classify(1, "x\nstrata: error: write: No space left on device\n", False)
      == "disk full: strata: error: write: No space left on device", cs.classify(1, "No space left on device", False))
check("reason cuda", cs.classify(1, "torch.OutOfMemoryError: CUDA out of memory. Tried", False).startswith("device memory"),
      "")
check("reason budget", cs.classify(1, "strata: error: the pinned budget of 1 KiB is too small: ...", False)
      .startswith("tier budget"), "")
check("reason timeout", cs.classify(-9, "", True) == "timeout", "")
check("reason other", cs.classify(3, "a\nsomething broke\n", False) == "error (exit 3): something broke", "")
check("loss not falling", cs.loss_verdict([5.0, 5.1, 5.2], 3) == (False, "loss not falling (5.0000 -> 5.2000)"), "")
check("steps short", cs.loss_verdict([5.0], 3)[1] == "only 1 of 3 steps completed", "")

# Bad arguments: exit 2 with the fix named.
with tempfile.TemporaryDirectory() as d:
    base = [sys.executable, script, "--out", d, "--strata", strata]
    for extra, want in ((["--system", "megatron", "--family", "gpt"], "--system 'megatron': give one of strata, fsdp2"),
                        (["--system", "strata", "--family", "bert"], "--family 'bert': give gpt or llama"),
                        (["--system", "fsdp2", "--family", "llama"], "give --family gpt, or --system strata for llama"),
                        (["--system", "strata", "--family", "gpt", "--steps", "1"], "a falling loss needs at least 2"),
                        (["--system", "strata", "--family", "gpt", "--strata", os.path.join(d, "nosuch")],
                         "is not an executable: build it")):
        p = subprocess.run(base + extra, capture_output=True, text=True)
        check("args " + extra[1] + extra[3], p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr[-500:]))

    # One real trial: a tiny GPT on the cpu backend, its budgets from strata plan --cluster cpu.
    out = os.path.join(d, "out")
    p = subprocess.run([sys.executable, script, "--system", "strata", "--family", "gpt", "--model", "gpt-125m",
                        "--d-model", "64", "--heads", "2", "--vocab", "256", "--seq", "32", "--layer-step", "1",
                        "--max-layers", "1", "--backend", "cpu", "--cluster", "cpu", "--hbm", "256MiB", "--host-ram",
                        "1GiB", "--lr", "1e-3", "--trial-timeout", "120", "--budget", "200", "--dir", d, "--out", out,
                        "--strata", strata], capture_output=True, text=True, timeout=300)
    print(p.stdout[-3000:], p.stderr[-2000:])
    check("real trial exit", p.returncode == 0, p.returncode)
    doc = json.load(open(os.path.join(out, "capacity-strata-gpt.json")))
    t = doc["trials"][0] if doc["trials"] else {}
    check("real trial passes", t.get("passed") and t.get("reason") == "passed" and t.get("layers") == 1, t)
    check("real trial loss falls", len(t.get("losses", [])) == 3 and t["losses"][-1] < t["losses"][0], t)
    check("real trial params", t.get("params", 0) > 0 and t.get("peak_host_bytes", 0) > 0, t)
    check("real trial ceiling", doc["status"] == "ceiling" and doc["answer"] == 1, doc["status"])
    check("markdown", "| 1 | " in open(os.path.join(out, "capacity-strata-gpt.md")).read(), "")
    check("scratch removed", [n for n in os.listdir(d) if n.startswith("strata-capacity-")] == [], os.listdir(d))

print("all passed" if not failed else f"{len(failed)} failed: {', '.join(failed)}")
sys.exit(1 if failed else 0)
