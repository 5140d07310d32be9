#!/usr/bin/env python3
"""The collective watchdog (strata.collective_timeout, coll::set_collective_timeout).

A rank that falls behind must not hang the job without a word. With the timeout shorter
than the delay, every waiting rank prints which collective, on which communicator, how
long, and which ranks have not arrived, and the job exits with code 6: for a rank
stopped with SIGSTOP (it cannot answer), and for a rank busy outside collectives (it
answers, and is named as not arrived), over all_reduce, all_gather and barrier, at 2 and
3 ranks. A rank late by less than the timeout, or any delay with the watchdog off (0),
lets the job finish. Then `strata train` under mpirun with one rank stopped mid-run: exit
6 with the report, and the checkpoints saved before resume.

Usage: test_watchdog.py COLLECTIVE_STALL STRATA MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
from long_run_config import long_run_config  # noqa: E402

EXIT_TIMEOUT = 6
failures = []


def check(cond, what, out=""):
    if not cond:
        failures.append(what + ("\n--- output:\n" + out[-4000:] if out else ""))
        print("FAIL:", what)
    else:
        print("ok:", what)


def kill_tree(proc):
    """mpirun and every rank under it, stopped ones too (SIGKILL needs no SIGCONT)."""
    try:
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    except FileNotFoundError:
        children = []
    for pid in children:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()


def run_job(mpi, np, args, timeout):
    """Runs mpirun; returns (exit code, output, seconds). A job still running after
    `timeout` s is killed and reported as hung (exit code None)."""
    start = time.time()
    proc = subprocess.Popen(mpi + ["-np", str(np)] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.time() - start
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, _ = proc.communicate()
        return None, out, time.time() - start


def stall_cases(stall, mpi):
    # (op, how, np, late rank, delay s, timeout s)
    for op, how, np, late in [("all_reduce", "stop", 2, 1), ("all_gather", "stop", 3, 2),
                              ("barrier", "busy", 3, 1), ("all_reduce", "busy", 2, 0)]:
        delay = 60 if how == "busy" else 0
        code, out, took = run_job(mpi, np, [stall, op, how, str(late), str(delay), "2"], 90)
        label = f"{op}, rank {late} of {np} {'stopped' if how == 'stop' else 'busy'}, timeout 2 s"
        check(code == EXIT_TIMEOUT, f"{label}: the job exits with code {EXIT_TIMEOUT} (got {code}, {took:.0f} s)",
              out)
        check("collective timeout" in out and re.search(rf"in {op}( of \d+ \w+)? \(collective #4 on communicator", out),
              f"{label}: the report names the collective and its number", out)
        if how == "stop":
            check(re.search(rf"rank {late}: did not answer", out) is not None,
                  f"{label}: the stopped rank is named as not answering", out)
        else:
            check(re.search(rf"rank {late}: has not arrived: it has started 3 collectives on communicator \d+; "
                            r"it is in no collective", out) is not None,
                  f"{label}: the busy rank is named as not arrived, with where it is", out)
        waiting = [r for r in range(np) if r != late]
        check(re.search(r"Ranks in it: " + ", ".join(map(str, waiting)) + r"\b", out) is not None,
              f"{label}: the report lists the ranks waiting in it", out)
        check("Exiting with code 6" in out and "strata.collective_timeout" in out,
              f"{label}: the report says the exit code and the fix", out)
    # Late by less than the timeout, or with the watchdog off: the job finishes.
    for timeout in ["20", "0"]:
        code, out, took = run_job(mpi, 2, [stall, "all_reduce", "busy", "1", "4", timeout], 90)
        check(code == 0 and "job finished" in out and "collective timeout" not in out,
              f"a rank 4 s late, timeout {timeout}: the job finishes (got {code}, {took:.0f} s)", out)


def rank_pid(mpirun_pid, rank):
    """The pid of the process mpirun started as `rank`."""
    for pid in subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout.split():
        try:
            env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def train_case(strata, mpi):
    with tempfile.TemporaryDirectory(prefix="strata-watchdog-") as d:
        tmp = pathlib.Path(d)
        words = "the cat dog sat on a mat ran to red big house".split()
        rng = random.Random(5)
        (tmp / "corpus.txt").write_text(" ".join(rng.choice(words) for _ in range(20000)) + "\n")
        ckpt = tmp / "ckpt"
        cfg = long_run_config(tmp, ckpt, checkpoint_every=1)
        cfg["strata"]["collective_timeout"] = 3
        (tmp / "config.json").write_text(json.dumps(cfg))
        proc = subprocess.Popen(mpi + ["-np", "2", strata, "train", "--config", str(tmp / "config.json")],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.time() + 180
        while len(list(ckpt.glob("step-*"))) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        pid = rank_pid(proc.pid, 1)
        if pid is None or proc.poll() is not None:
            kill_tree(proc)
            check(False, "strata train under mpirun saved two checkpoints", proc.stdout.read())
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            out, _ = proc.communicate(timeout=90)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, code = proc.communicate()[0], None
        check(code == EXIT_TIMEOUT, f"strata train with rank 1 stopped exits with code {EXIT_TIMEOUT} (got {code})",
              out)
        check(re.search(r"rank 1: did not answer", out) is not None and "collective timeout: rank 0 of 2" in out,
              "strata train's report names the stopped rank", out)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        saved = sorted(ckpt.glob("step-*"))
        last = int(saved[-1].name.split("-")[1])
        code, out, _ = run_job(mpi, 2, [strata, "train", "--config", str(tmp / "config.json"), "--resume",
                                        "--steps", str(last + 1), "--quiet"], 180)
        check(code == 0, f"the run resumes from its last checkpoint ({saved[-1].name}) after the timeout", out)


def main():
    stall, strata = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    mpi = sys.argv[3:]
    stall_cases(stall, mpi)
    train_case(strata, mpi)
    if failures:
        print(f"\n{len(failures)} check(s) failed:\n" + "\n\n".join(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
