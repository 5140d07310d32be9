#!/usr/bin/env python3
"""`strata train` killed with SIGKILL at random points, 50 times, recovers every time.

Two chains of runs, each into its own checkpoint_dir and nvme_path: one process, and
`mpirun -np 2` where one rank's process is killed (rank 0 and rank 1 in turn) and mpirun
must end the job. Each run of a chain resumes (--resume) the one killed before it, and is
killed in turn: at start-up (a random delay; under mpirun counted from the end of
MPI_Init's PMIx handshake, whose interruption hangs Open MPI 4.1's mpirun itself), during
a step (a random delay after the metrics file reaches a random step), during a save (as
soon as a new .step-N.tmp appears), or at a save's kill point
(STRATA_CHECKPOINT_KILL=before-manifest|before-rename, rank 0). After each kill:

- the process (every rank) is gone, within a timeout: mpirun does not hang;
- nothing is left in nvme_path (the swap files have no name) and no strata-swap-* file
  anywhere; the lock is free (flock succeeds at once);
- checkpoint_dir holds only the lock file, checkpoints step-N whose manifest and rank
  files are whole (sizes as the manifest says), and .step-N.tmp leftovers of killed saves
  beyond the latest complete checkpoint (a later save of step N replaces its leftover);
- every loss the killed run logged equals the uninterrupted run's at that step, exactly.

The next run must start from the latest complete checkpoint (its first logged step is
that step + 1: no checkpoint that looks complete is skipped), and is not refused as
"in use" (no stale lock). Each chain ends with a run to the last step, whose losses must
equal the uninterrupted run's and which leaves no .tmp behind.

The one-process chain runs the speculative optimizer (strata.speculative_optimizer) with
gradient clipping that undoes some of its steps, so kills also land between a speculative
update and its validation.

The kill points are random; the seed is printed (--seed reruns the same choices; the
timing of a kill still varies). --kills N scales the number of kills (default 50, about
30% of them under mpirun).

Usage: test_crash_resume.py STRATA_BINARY [--mpirun MPIRUN] [--kills N] [--seed N]
"""
import argparse
import fcntl
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long_run_config import long_run_config  # noqa: E402

STEPS = 60           # steps of each chain's run
EVERY = 3            # checkpoint_every
RUN_TIMEOUT = 120    # seconds a run may take to start, reach its kill point or end
EXIT_TIMEOUT = 60    # seconds for a killed run (mpirun and every rank) to be gone
MPI_FLAGS = ["--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", "self,vader",
             "--mca", "btl_vader_single_copy_mechanism", "none"]


def corpus(n):
    words = "the cat dog sat on a mat ran to red big house".split()
    rng = random.Random(5)
    return " ".join(rng.choice(words) for _ in range(n)) + "\n"


def metrics(path):
    """The complete lines of a metrics file, and whether its last line is cut short."""
    if not path.exists():
        return [], False
    text = path.read_text()
    lines = text.split("\n")
    torn = lines[-1] != ""
    return [json.loads(l) for l in lines[:-1] if l.strip()], torn


def children(pid):
    """Every live descendant of pid, by /proc."""
    kids = {}
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            kids.setdefault(int(fields[1]), []).append(int(p.name))
    out, pending = [], [pid]
    while pending:
        for k in kids.get(pending.pop(), []):
            out.append(k)
            pending.append(k)
    return out


def rank_pids(mpirun_pid):
    """{rank: pid} of the strata processes mpirun started (their OMPI_COMM_WORLD_RANK)."""
    ranks = {}
    for pid in children(mpirun_pid):
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "strata":
                continue
            env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                ranks[int(e.split(b"=", 1)[1])] = pid
    return ranks


def past_pmix_handshake(pid):
    """Whether an Open MPI rank has its shared-memory (vader) segment mapped: MPI_Init is
    past its PMIx connection to mpirun. Open MPI 4.1's mpirun hangs (after "PMIX ERROR:
    UNREACHABLE in file .../ptl_base_connection_hdlr.c") when a rank dies during that
    handshake, a plain MPI_Init-and-barrier program as well as strata; the start-up kills
    wait for it."""
    try:
        return "vader_segment" in pathlib.Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def alive(pid):
    """Whether the process has not finished exiting. A killed multi-threaded process's
    leader shows as a zombie while its other threads (the thread pools, io_uring's
    workers) still run their exit, and its files (the checkpoint_dir lock among them)
    close only when the last one has: it is gone when no thread of it is left."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text()
        if state[state.rindex(")") + 2] != "Z":
            return True
        return any(t != str(pid) for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError):
        return False


def kill_tree(proc):
    for pid in children(proc.pid) + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass


def checkpoints(ckpt):
    """{step: dir} of the step-N directories that have a manifest.json."""
    out = {}
    if ckpt.is_dir():
        for p in ckpt.iterdir():
            if p.name.startswith("step-") and (p / "manifest.json").exists():
                out[int(p.name[5:])] = p
    return out


def latest(ckpt):
    return max(checkpoints(ckpt), default=0)


def tmp_dirs(ckpt):
    """{(name, inode)} of the .step-N.tmp directories: a save in progress or a killed one."""
    out = set()
    try:
        for e in os.scandir(ckpt):
            if e.name.startswith(".step-") and e.name.endswith(".tmp"):
                out.add((e.name, e.inode()))
    except OSError:
        pass
    return out


class Chain:
    """Runs into one checkpoint_dir, one after another, at one world size."""

    def __init__(self, name, root, strata, world, mpirun):
        self.name, self.root, self.strata, self.world, self.mpirun = name, root, strata, world, mpirun
        self.ckpt, self.nvme = root / "ckpt", root / "nvme"
        root.mkdir()
        self.nvme.mkdir()
        cfg = long_run_config(root.parent, self.ckpt, checkpoint_every=EVERY)
        cfg["strata"]["steps"] = STEPS
        if world == 1:
            # The one-process chain runs the speculative optimizer, with clipping that
            # undoes some of its steps: kills land inside speculative steps too.
            cfg["strata"]["speculative_optimizer"] = True
            cfg["gradient_clipping"] = 1.0
        for k in ("offload_param", "offload_optimizer"):
            cfg["zero_optimization"][k]["nvme_path"] = str(self.nvme)
        self.cfg = root / "cfg.json"
        self.cfg.write_text(json.dumps(cfg))
        self.runs = 0
        self.kind = "reference"
        self.fresh = True    # the next run is the first into checkpoint_dir: no --resume
        self.segments = []   # the step each run to the end resumed from
        self.failures = []
        self.exit_s = 0.0    # the longest a killed run took to be gone
        self.in_save = 0     # kills that left a .step-N.tmp (the kill landed in a save)

    def fail(self, what):
        self.failures.append(f"{self.name} run {self.runs} ({self.kind}): {what}")

    def start(self, env_kill=None, resume=True, ckpt=None):
        self.runs += 1
        m = self.root / f"m{self.runs}.jsonl"
        log = self.root / f"log{self.runs}.txt"
        cmd = [self.strata, "train", "--config", str(self.cfg), "--metrics", str(m), "--quiet"]
        if resume:
            cmd.append("--resume")
        if ckpt is not None:
            cmd += ["--set", f"strata.checkpoint_dir={ckpt}"]
        if self.world > 1:
            cmd = [self.mpirun] + MPI_FLAGS + ["-np", str(self.world)] + cmd
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env.pop("STRATA_CHECKPOINT_KILL", None)
        if env_kill:
            env["STRATA_CHECKPOINT_KILL"] = env_kill
        self.log = log
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return proc, m, log

    def reference(self):
        """The uninterrupted run (its own checkpoint_dir): loss per step, start-up and step time."""
        t0 = time.time()
        proc, m, log = self.start(resume=False, ckpt=self.root / "ref-ckpt")
        first = None
        while proc.poll() is None:
            if first is None and metrics(m)[0]:
                first = time.time()
            if time.time() - t0 > RUN_TIMEOUT:
                kill_tree(proc)
                sys.exit(f"{self.name}: the reference run took more than {RUN_TIMEOUT} s")
            time.sleep(0.005)
        rows = metrics(m)[0]
        if proc.returncode != 0 or [r["step"] for r in rows] != list(range(1, STEPS + 1)):
            sys.exit(f"{self.name}: the reference run failed ({proc.returncode}):\n{log.read_text()}")
        first = first or time.time()
        self.ref = {r["step"]: r["loss"] for r in rows}
        self.startup_s = first - t0
        self.step_s = max(0.001, (time.time() - first) / STEPS)
        shutil.rmtree(self.root / "ref-ckpt")

    def check_losses(self, m, start, log):
        rows, torn = metrics(m)
        if torn:
            self.fail(f"the metrics file {m.name} ends in a partial line")
        steps = [r["step"] for r in rows]
        if steps and steps != list(range(start + 1, start + 1 + len(steps))):
            self.fail(f"logged steps {steps[0]}..{steps[-1]} {steps}, expected consecutive from {start + 1} "
                      f"(the latest complete checkpoint is step {start})\n{log.read_text()}")
        for r in rows:
            if r["loss"] != self.ref.get(r["step"]):
                self.fail(f"step {r['step']}: loss {r['loss']!r}, the uninterrupted run's {self.ref.get(r['step'])!r}")
                break
        return steps[-1] if steps else start

    def check_dirs(self, before_swap):
        """After a run ended: no swap file, a free lock, only whole checkpoints and later leftovers."""
        left = sorted(p.name for p in self.nvme.iterdir())
        if left:
            self.fail(f"left in nvme_path: {left}")
        swaps = [str(p) for p in self.root.parent.rglob("strata-swap-*") if str(p) not in before_swap]
        if swaps:
            self.fail(f"swap files left: {swaps}")
        lock = self.ckpt / ".strata-lock"
        if lock.exists():
            with open(lock) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except OSError as e:
                    self.fail(f"the lock is still held after the run ended ({e}): {lock.read_text()!r}")
        done = latest(self.ckpt)
        if not self.ckpt.is_dir():
            return
        for p in sorted(self.ckpt.iterdir()):
            n = p.name
            if n == ".strata-lock":
                continue
            if n == ".strata-probe":  # a kill between the start-up probe's create and unlink:
                continue              # the next start replaces and removes it (checkpoint.cpp)
            if n.startswith(".step-") and n.endswith(".tmp") and n[6:-4].isdigit():
                if int(n[6:-4]) <= done:
                    self.fail(f"{n} left behind although step-{int(n[6:-4]):08d} or a later one was saved since")
                continue
            if n.startswith("step-") and n[5:].isdigit():
                self.check_checkpoint(p)
                continue
            self.fail(f"unexpected file in checkpoint_dir: {n}")

    def check_checkpoint(self, p):
        try:
            man = json.loads((p / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            self.fail(f"{p.name} has no readable manifest: {e}")
            return
        want = {f["name"]: f["bytes"] for f in man["files"]}
        have = {q.name: q.stat().st_size for q in p.iterdir() if q.name != "manifest.json"}
        if man.get("step") != int(p.name[5:]) or man.get("world_size") != self.world or have != want:
            self.fail(f"{p.name}: step {man.get('step')}, world {man.get('world_size')}, files {have}, "
                      f"the manifest says {want}")

    def wait_exit(self, proc, pids):
        """Waits for the killed run (mpirun and its ranks) to be gone; a hang is a failure."""
        t0 = time.time()
        try:
            proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(f"the run did not end within {EXIT_TIMEOUT} s of the kill (ranks {pids}, alive: "
                      f"{[p for p in pids if alive(p)]}, processes under it: {children(proc.pid)}); killing it; "
                      f"its output:\n{self.log.read_text()}" +
                      ("(Open MPI's mpirun hangs when a rank dies in MPI_Init's PMIx handshake: see "
                       "past_pmix_handshake)" if "PMIX ERROR" in self.log.read_text() else ""))
            kill_tree(proc)
            return
        deadline = time.time() + EXIT_TIMEOUT
        while any(alive(p) for p in pids):
            if time.time() > deadline:
                self.fail(f"ranks {[p for p in pids if alive(p)]} outlived mpirun by {EXIT_TIMEOUT} s")
                kill_tree(proc)
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                return
            time.sleep(0.01)
        self.exit_s = max(self.exit_s, time.time() - t0)

    def trial(self, rng, kind, victim=0):
        """One run, killed as `kind` says; then the checks. Returns False when the run was not killed."""
        self.kind = f"{kind}, rank {victim}" if self.world > 1 else kind
        start = latest(self.ckpt)
        before_swap = {str(p) for p in self.root.parent.rglob("strata-swap-*")}
        old_tmps = tmp_dirs(self.ckpt)
        env_kill = kind if kind in ("before-manifest", "before-rename") else None
        proc, m, log = self.start(env_kill=env_kill, resume=not self.fresh)
        self.fresh = False
        t0 = time.time()
        target = min(start + rng.randint(1, 2 * EVERY + 1), STEPS - 1)
        delay = rng.uniform(0, self.startup_s) if kind == "startup" else rng.uniform(0, self.step_s)
        pids, victim_pid = [], None
        since = t0 if self.world == 1 else None  # start-up delays count from the ranks' start
        while True:
            if proc.poll() is not None:
                break
            if time.time() - t0 > RUN_TIMEOUT:
                self.fail(f"{kind}: no kill point reached in {RUN_TIMEOUT} s; killing it")
                kill_tree(proc)
                break
            victim_pid = proc.pid
            if self.world > 1:
                if since is None:
                    if len(pids) < self.world:
                        ranks = rank_pids(proc.pid)
                        pids = sorted(ranks.values())
                        seen = time.time()
                    # Every rank started and past MPI_Init's PMIx handshake (or 10 s on).
                    if len(pids) < self.world or (not all(past_pmix_handshake(p) for p in pids)
                                                  and time.time() - seen < 10):
                        time.sleep(0.001)
                        continue
                    since = time.time()
                victim_pid = ranks[victim]
            fire = False
            if kind == "startup":
                fire = time.time() - since >= delay
            elif kind == "step":
                rows = metrics(m)[0]
                if rows and rows[-1]["step"] >= target:
                    time.sleep(delay)
                    fire = True
            elif kind == "save":
                fire = bool(tmp_dirs(self.ckpt) - old_tmps)
            if fire:
                try:
                    os.kill(victim_pid, signal.SIGKILL)
                except OSError:
                    pass
                break
            time.sleep(0.0005 if kind == "save" else 0.002)
        self.wait_exit(proc, pids)
        rc = proc.returncode
        last = self.check_losses(m, start, log)
        if rc == 0:
            if last < STEPS:
                self.fail(f"{kind}: exit 0 before the last step ({last})")
            return False  # finished before the kill point: not a kill
        out = log.read_text()
        if "in use by another strata train" in out:
            self.fail(f"refused as in use (a stale lock?):\n{out}")
        elif self.world == 1 and rc != -signal.SIGKILL:
            self.fail(f"{kind}: exit status {rc}, expected death by SIGKILL:\n{out}")
        if env_kill:
            # The hook fired at the first save: its step's .tmp is left (with the manifest
            # before the rename), and no step-N of it.
            n = (start // EVERY + 1) * EVERY
            tmp = self.ckpt / f".step-{n:08d}.tmp"
            if n <= STEPS and (not tmp.is_dir() or (tmp / "manifest.json").exists() != (kind == "before-rename")
                               or latest(self.ckpt) != start):
                self.fail(f"{kind}: expected {tmp.name} ({'with' if kind == 'before-rename' else 'without'} a "
                          f"manifest) and no new checkpoint; found {sorted(p.name for p in self.ckpt.iterdir())}")
        self.check_dirs(before_swap)
        if tmp_dirs(self.ckpt) - old_tmps:
            self.in_save += 1
        return True

    def finish(self):
        """The last run: to the end, every loss the uninterrupted run's, nothing left behind."""
        start = latest(self.ckpt)
        self.kind = "to the end"
        self.segments.append(start)
        before_swap = {str(p) for p in self.root.parent.rglob("strata-swap-*")}
        proc, m, log = self.start(resume=True)
        try:
            proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(f"the last run did not end in {RUN_TIMEOUT} s")
            kill_tree(proc)
        last = self.check_losses(m, start, log)
        if proc.returncode != 0 or (last != STEPS and start != STEPS):
            self.fail(f"the last run: exit {proc.returncode}, last step {last}, expected {STEPS}:\n"
                      f"{log.read_text()}")
        self.check_dirs(before_swap)
        leftovers = sorted(n for n, _ in tmp_dirs(self.ckpt))
        if leftovers or latest(self.ckpt) != STEPS:
            self.fail(f"after the last run: leftovers {leftovers}, latest checkpoint step {latest(self.ckpt)}")
        shutil.rmtree(self.ckpt)  # the next run starts over
        self.fresh = True


def run_chain(chain, rng, kills, kinds, counts):
    """kills runs of chain, each killed at a random point of a kind drawn in turn from
    kinds (shuffled each round), rank 0 and 1 in turn; then the last run. A chain that
    comes within 3 saves of the end is run to the end and started over, so that every
    kill point lies before the last step."""
    chain.reference()
    done, order, turn, misses = 0, [], 0, 0
    while done < kills and not chain.failures:
        if latest(chain.ckpt) >= STEPS - 3 * EVERY:
            chain.finish()
            continue
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        kind = order.pop()
        victim = 0
        if chain.world > 1 and kind not in ("before-manifest", "before-rename"):  # the hook kills rank 0
            victim, turn = turn % chain.world, turn + 1
        if chain.trial(rng, kind, victim):
            done += 1
            key = f"{chain.name} {kind}" + (f" rank {victim}" if chain.world > 1 else "")
            counts[key] = counts.get(key, 0) + 1
        elif latest(chain.ckpt) >= STEPS:
            # The run reached the end before its kill point: a start-up delay drawn from
            # the first run's start-up time, longer than this whole (warm) run. Its
            # losses were checked; the chain starts over. Every run ending so is a fault.
            misses += 1
            if misses > 5:
                chain.fail(f"{misses} runs ended before their kill points, after {done} kills")
            shutil.rmtree(chain.ckpt)
            chain.fresh = True
    if misses:
        print(f"{chain.name}: {misses} run(s) reached the end before their kill points; the chain started over")
    if not chain.failures:
        chain.finish()
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("strata")
    ap.add_argument("--mpirun", default=shutil.which("mpirun"))
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    strata = os.path.abspath(args.strata)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"seed {seed} (rerun with --seed {seed})", flush=True)
    rng = random.Random(seed)
    mpi_kills = round(args.kills * 0.3) if args.mpirun else 0
    single_kills = args.kills - mpi_kills
    kinds = ["startup", "step", "step", "save", "before-manifest", "before-rename"]
    counts = {}
    failures = []
    t0 = time.time()
    total = 0
    with tempfile.TemporaryDirectory(prefix="strata-crash-") as d:
        tmp = pathlib.Path(d)
        (tmp / "corpus.txt").write_text(corpus(20000))
        for name, world, n in (("1 process", 1, single_kills), ("mpirun -np 2", 2, mpi_kills)):
            if n == 0:
                continue
            chain = Chain(name, tmp / f"world{world}", strata, world, args.mpirun)
            total += run_chain(chain, rng, n, kinds, counts)
            failures += chain.failures
            print(f"{name}: {chain.runs - 1} runs, {chain.in_save} killed in a save (a .tmp left), "
                  f"{len(chain.segments)} run{'s' if len(chain.segments) > 1 else ''} to the end (resumed from step "
                  f"{', '.join(map(str, chain.segments))}); "
                  f"start-up {chain.startup_s:.2f} s, step {chain.step_s * 1000:.0f} ms, a killed run gone within "
                  f"{chain.exit_s:.2f} s; {time.time() - t0:.0f} s so far", flush=True)
    for k in sorted(counts):
        print(f"  {counts[k]:3d}  {k}")
    print(f"{total} kills in {time.time() - t0:.0f} s, seed {seed}")
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        return 1
    if total != args.kills:
        print(f"FAILED: {total} kills, expected {args.kills}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
