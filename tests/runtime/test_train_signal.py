#!/usr/bin/env python3
"""`strata train` stopped by a signal: SIGTERM (a scheduler's preemption) mid-run ends the
run after the step in flight with a checkpoint of that step and exit status 128 + 15, and
--resume continues from it; without strata.checkpoint_dir it says that nothing was saved;
a second SIGINT stops at once, saying so, and --resume still works.

Usage: test_train_signal.py STRATA_BINARY
"""
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long_run_config import long_run_config  # noqa: E402


def corpus(n):
    words = "the cat dog sat on a mat ran to red big house".split()
    rng = random.Random(5)
    return " ".join(rng.choice(words) for _ in range(n)) + "\n"


def config(tmp, with_dir):
    return long_run_config(tmp, tmp / "ckpt" if with_dir else None)


def metrics(path):
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def run_until_steps_then_signal(strata, cfg_path, metrics_path, steps, sig):
    proc = subprocess.Popen([strata, "train", "--config", str(cfg_path), "--metrics", str(metrics_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while len(metrics(metrics_path)) < steps:
        if proc.poll() is not None:
            sys.exit(f"strata train ended early ({proc.returncode}):\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            sys.exit("strata train wrote no metrics in 180 s")
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def main():
    strata = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-signal-") as d:
        tmp = pathlib.Path(d)
        (tmp / "corpus.txt").write_text(corpus(20000))
        cfg = tmp / "cfg.json"
        cfg.write_text(json.dumps(config(tmp, True)))
        m1 = tmp / "m1.jsonl"
        rc, out = run_until_steps_then_signal(strata, cfg, m1, 3, signal.SIGTERM)
        last = metrics(m1)[-1]["step"]
        print(out)
        if rc != 128 + signal.SIGTERM:
            failures.append(f"exit status {rc}, expected {128 + signal.SIGTERM}")
        if f"stopped by signal {int(signal.SIGTERM)}" not in out or "--resume" not in out:
            failures.append("no 'stopped by signal 15 ... --resume' line")
        saved = sorted(p.name for p in (tmp / "ckpt").glob("step-*"))
        if saved != [f"step-{last:08d}"]:
            failures.append(f"checkpoints {saved}, expected exactly step-{last:08d} (the last step the run logged)")
        if last >= 1000:
            failures.append(f"the run went on to step {last} after the signal")

        # --resume continues from the saved step.
        m2 = tmp / "m2.jsonl"
        r = subprocess.run([strata, "train", "--config", str(cfg), "--resume", "--steps", str(last + 2),
                            "--metrics", str(m2)], capture_output=True, text=True, timeout=300)
        steps = [m["step"] for m in metrics(m2)]
        if r.returncode != 0 or steps != [last + 1, last + 2]:
            failures.append(f"resume: exit {r.returncode}, steps {steps}, expected [{last + 1}, {last + 2}]\n"
                            f"{r.stdout}{r.stderr}")

        # Without a checkpoint directory: stops and says nothing was saved.
        cfg2 = tmp / "cfg2.json"
        cfg2.write_text(json.dumps(config(tmp, False)))
        rc, out = run_until_steps_then_signal(strata, cfg2, tmp / "m3.jsonl", 2, signal.SIGINT)
        if rc != 128 + signal.SIGINT or "no checkpoint was written" not in out:
            failures.append(f"SIGINT without checkpoint_dir: exit {rc}, output:\n{out}")

        # A second Ctrl-C stops at once and says so (it used to exit silently); the lock
        # dies with the process and the checkpoints before are intact: --resume works.
        # Steps of ~0.05 s or more (4096 tokens), so that the second signal, 10 ms after the
        # first, lands while the step the first one lets finish is still running. When the
        # run was faster (it stopped normally: "stopped by signal 2"), the attempt is made
        # again with a new checkpoint_dir, up to 5 times.
        for attempt in range(5):
            slow = config(tmp, True)
            slow["train_micro_batch_size_per_gpu"] = 64
            slow["strata"].update({"checkpoint_dir": str(tmp / f"ckpt-slow-{attempt}"), "device_budget": "128MiB",
                                   "pinned_budget": "128MiB"})
            cfg4 = tmp / f"cfg4-{attempt}.json"
            cfg4.write_text(json.dumps(slow))
            m4 = tmp / f"m4-{attempt}.jsonl"
            proc = subprocess.Popen([strata, "train", "--config", str(cfg4), "--metrics", str(m4)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.time() + 180
            while len(metrics(m4)) < 2 and proc.poll() is None and time.time() < deadline:
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            time.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=120)
            if "stopped by signal 2" in out and "a second interrupt" not in out:
                print(f"attempt {attempt}: the run stopped before the second signal came; again")
                continue
            print(out)
            if proc.returncode != -signal.SIGINT or "strata: a second interrupt: stopping at once" not in out \
                    or "strata: interrupt: stopping after the step in flight" not in out:
                failures.append(f"second SIGINT: exit {proc.returncode}, expected death by SIGINT with both "
                                f"messages; output:\n{out}")
            # The lock died with the process; the checkpoints before are intact: --resume works.
            r = subprocess.run([strata, "train", "--config", str(cfg4), "--resume", "--steps", "3", "--quiet"],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                failures.append(f"--resume after the second SIGINT: exit {r.returncode}\n{r.stdout}{r.stderr}")
            break
        else:
            failures.append("second SIGINT: in 5 attempts the run always stopped before the second signal came")

    if failures:
        print("FAILED:\n" + "\n".join(failures))
        return 1
    print(f"stopped at step {last} with a checkpoint of it; resumed to {last + 2}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
