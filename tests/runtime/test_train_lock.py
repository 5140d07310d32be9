#!/usr/bin/env python3
"""Two `strata train` processes, one checkpoint_dir: while the first trains, the second is
refused at once (exit 2) with an error naming the first's pid and host; after the first is
killed with SIGKILL (no clean-up ran), a third run into the directory trains and saves: the
kernel released the lock with its holder.

Usage: test_train_lock.py STRATA_BINARY
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long_run_config import long_run_config  # noqa: E402


def config(tmp):
    return long_run_config(tmp, tmp / "ckpt", checkpoint_every=100000)


def main():
    strata = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-lock-") as d:
        tmp = pathlib.Path(d)
        (tmp / "corpus.txt").write_text("the cat sat on a mat. the dog ran to the red house. " * 2000)
        cfg = tmp / "cfg.json"
        cfg.write_text(json.dumps(config(tmp)))
        m1 = tmp / "m1.jsonl"
        first = subprocess.Popen([strata, "train", "--config", str(cfg), "--metrics", str(m1), "--quiet"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 180
        while not (m1.exists() and m1.read_text().strip()):
            if first.poll() is not None:
                sys.exit(f"the first strata train ended early ({first.returncode}):\n{first.stdout.read()}")
            if time.time() > deadline:
                first.kill()
                sys.exit("the first strata train wrote no metrics in 180 s")
            time.sleep(0.05)

        second = subprocess.run([strata, "train", "--config", str(cfg), "--steps", "2"],
                                capture_output=True, text=True, timeout=300)
        want = (f"checkpoint_dir {tmp / 'ckpt'} is in use by another strata train "
                f"(pid {first.pid} on host {socket.gethostname()}); wait for it or choose another checkpoint_dir")
        print(second.stderr.strip())
        if second.returncode != 2 or want not in second.stderr:
            failures.append(f"second run: exit {second.returncode}, expected 2 and '{want}'; output:\n"
                            f"{second.stdout}{second.stderr}")
        if first.poll() is not None:
            failures.append(f"the first run ended ({first.returncode}) while the second was refused")

        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
        third = subprocess.run([strata, "train", "--config", str(cfg), "--steps", "2", "--quiet"],
                               capture_output=True, text=True, timeout=300)
        if third.returncode != 0 or not (tmp / "ckpt" / "step-00000002" / "manifest.json").exists():
            failures.append(f"after SIGKILL of the holder: exit {third.returncode}, output:\n"
                            f"{third.stdout}{third.stderr}")

    if failures:
        print("FAILED:\n" + "\n".join(failures))
        return 1
    print("second run refused naming the holder; after SIGKILL of the holder a new run trained and saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
