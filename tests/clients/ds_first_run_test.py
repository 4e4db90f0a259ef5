#!/usr/bin/env python3
"""The deepspeed backend's first sweep on a fresh machine: DeepSpeed's C++ ops (its shared-memory
collectives, FusedAdam, CPUAdam) are built once before the first trial, with no timeout, and the
trials only load them. Real sweeps (ulysses-tune sweep with `backend: deepspeed`) on CPU with Gloo
and a tiny Llama, the real DeepSpeed and torch of the venv. Checks:

  - first run: with a fresh, empty TORCH_EXTENSIONS_DIR and a trial timeout (60 s) shorter than
    the ops' build (on a loaded 2-core machine 2-5 minutes), the sweep prints its one progress
    line once, builds the three ops into that directory before any trial starts (no op is
    written after the line's "done"), and both trials (ZeRO-1 with FusedAdam, ZeRO-1 with the
    optimizer offloaded: CPUAdam) are ok; no lock is left;
  - a planted lock in an op's build directory (as a build killed by a trial timeout leaves it):
    the sweep exits 2 with the one line naming it, before any trial (no database is written) and
    without removing it; ds_trial.py started directly on it exits 2 with the same line instead of
    waiting;
  - a trial that fails (out of memory: DeepSpeed's 2 GiB buckets under a 1 GiB cap) with tqdm
    progress printed on its stderr after its error stores the error line, not the progress.

  ds_first_run_test.py --bin BUILD/bin
"""
import argparse
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time

from deepspeed_backend_test import make_model

HERE = os.path.dirname(os.path.abspath(__file__))
DS_TRIAL = os.path.join(HERE, "..", "..", "tuner", "backends", "deepspeed", "ds_trial.py")
OPS = ("deepspeed_shm_comm", "fused_adam", "cpu_adam")
TRIAL_TIMEOUT_S = 60


def experiment(path, name, space, zero=1, bucket_mb=16, limit=2.0):
    with open(path, "w") as f:
        f.write(f"""name: {name}
hardware: cpu-local
world_size: 2
memory_limit_gib: {limit}
backend: deepspeed
base:
  model: {{load: {os.path.dirname(path)}/model}}
  data: {{source: synthetic, seed: 5}}
  zero: {{stage: {zero}, bucket_mb: {bucket_mb}}}
  train: {{device: cpu, steps: 2}}
  comm: {{timeout_s: 120, collective_timeout_s: 120}}
space:
  mesh.sp: [2]
{space}  sequence.length: [128]
objective: throughput
budget: {{trial_timeout_s: {TRIAL_TIMEOUT_S}}}
trial: {{warmup_steps: 1, steps: 2}}
search: {{method: grid, probe: false, prune: false}}
""")


def sweep(tune, path, db, python, env):
    """Runs the sweep; returns (exit status, stdout lines with the time each arrived, stderr)."""
    name = os.path.splitext(os.path.basename(path))[0]
    proc = subprocess.Popen([tune, "sweep", path, "--db", db, "--name", name, "--python", python],
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # progress pieces arrive as they are printed
        lines.append((time.time(), line.rstrip("\n")))
    stderr = proc.stderr.read()
    return proc.wait(), lines, stderr


def trials(db, name):
    con = sqlite3.connect(db)
    return con.execute("SELECT t.status, t.error, t.run_dir FROM trials t JOIN sweeps s "
                       "ON s.id = t.sweep_id WHERE s.name = ? ORDER BY t.id", (name,)).fetchall()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="directory of ulysses-tune and ulysses-train")
    args = p.parse_args()
    tune = os.path.join(args.bin, "ulysses-tune")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        make_model(os.path.join(tmp, "model"))
        ext = os.path.join(tmp, "torch_extensions")  # fresh and empty
        os.makedirs(ext)
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext)
        db = os.path.join(tmp, "results.db")

        # 1. The first run: the ops are built once, before the trials, which are ok.
        path = os.path.join(tmp, "first.yaml")
        experiment(path, "first", "  memory.offload: [none, optimizer]\n")
        start = time.time()
        status, lines, stderr = sweep(tune, path, db, sys.executable, env)
        wall = time.time() - start
        progress = [(t, line) for t, line in lines if line.startswith("deepspeed backend:")]
        sys.stdout.write("".join(line + "\n" for _, line in lines))
        if status != 0:
            failures.append(f"first sweep: exit {status}: {stderr.strip()[-500:]}")
        if len(progress) != 1 or "building DeepSpeed's CPU ops" not in progress[0][1] or \
                ext not in progress[0][1] or " done in " not in progress[0][1]:
            failures.append(f"first sweep: expected one progress line building into {ext}, "
                            f"got {[line for _, line in progress]}")
        else:
            done_at = progress[0][0]
            build_s = float(progress[0][1].rsplit(" done in ", 1)[1].split()[0])
            print(f"ops built in {build_s:.0f} s (trial timeout {TRIAL_TIMEOUT_S} s); "
                  f"sweep {wall:.0f} s")
            for op in OPS:
                so = os.path.join(ext, op, op + ".so")
                if not os.path.exists(so):
                    failures.append(f"first sweep: {so} was not built")
                elif os.stat(so).st_mtime > done_at + 1.0:
                    failures.append(f"first sweep: {so} was written after the build step, by a "
                                    f"trial")
                if os.path.exists(os.path.join(ext, op, "lock")):
                    failures.append(f"first sweep: {op}/lock left behind")
        rows = trials(db, "first")
        if len(rows) != 2 or any(r[0] != "ok" for r in rows):
            failures.append(f"first sweep: trials {[(r[0], r[1]) for r in rows]}")

        # 2. A lock left by a killed build: the sweep stops before any trial, naming it.
        lock = os.path.join(ext, "fused_adam", "lock")
        os.makedirs(os.path.dirname(lock), exist_ok=True)  # there unless the first run failed
        open(lock, "w").close()
        db2 = os.path.join(tmp, "stale.db")
        path = os.path.join(tmp, "stale.yaml")
        experiment(path, "stale", "")
        status, lines, stderr = sweep(tune, path, db2, sys.executable, env)
        expected = (f"error: deepspeed backend: {lock} is left from a build of DeepSpeed's ops "
                    f"that was killed")
        err_lines = stderr.strip().splitlines()
        if status != 2 or len(err_lines) != 1 or not err_lines[0].startswith(expected) or \
                not err_lines[0].endswith("remove it and run again"):
            failures.append(f"stale lock: exit {status}, stderr {stderr.strip()!r}")
        if os.path.exists(db2) or any(line.startswith("sweep ") for _, line in lines):
            failures.append("stale lock: the sweep went on past its --python check")
        if not os.path.exists(lock):
            failures.append("stale lock: the lock was removed")
        # A trial that would wait on it names it too (ds_trial.py as the sweep starts rank 0).
        run_dir = rows[0][2] if rows else ""
        rank_env = dict(env, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT="29999")
        try:
            trial = subprocess.run(
                [sys.executable, DS_TRIAL, "--config", os.path.join(run_dir, "run.yaml"),
                 "--ds-config", os.path.join(run_dir, "ds_config.json")], env=rank_env,
                capture_output=True, text=True, timeout=600)
            last = trial.stderr.strip().splitlines()[-1:]
            if trial.returncode != 2 or not last or not last[0].startswith(expected):
                failures.append(f"stale lock, trial: exit {trial.returncode}, {last}")
        except subprocess.TimeoutExpired:
            failures.append("stale lock, trial: ds_trial.py waited on the lock")
        os.remove(lock)

        # 3. A failed trial with tqdm progress on its stderr after its error line stores the error.
        wrapper = os.path.join(tmp, "python-with-progress")
        with open(wrapper, "w") as f:
            f.write(f"""#!/bin/sh
# The venv's Python; after a rank of ds_trial.py, tqdm's progress bars on its stderr.
"{sys.executable}" "$@"
status=$?
case "$1" in
  *ds_trial.py) "{sys.executable}" -c 'import tqdm
for _ in tqdm.tqdm(range(3), desc="Saving", mininterval=0): pass' ;;
esac
exit $status
""")
        os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR)
        path = os.path.join(tmp, "oom.yaml")
        experiment(path, "oom", "", bucket_mb=2048, limit=1.0)
        status, lines, stderr = sweep(tune, path, db, wrapper, env)
        rows = trials(db, "oom")
        if status != 0 or len(rows) != 1:
            failures.append(f"oom sweep: exit {status}, {len(rows)} trials: {stderr.strip()[-300:]}")
        else:
            err_logs = [os.path.join(rows[0][2], name) for name in sorted(os.listdir(rows[0][2]))
                        if name.startswith("rank-") and name.endswith(".err")]
            progress_after = any("Saving: 100%|" in open(log).read() for log in err_logs)
            if not progress_after:
                failures.append(f"oom sweep: no rank log holds tqdm's progress ({err_logs})")
            if rows[0][0] != "oom" or not rows[0][1].startswith("out of memory:"):
                failures.append(f"oom sweep: stored {rows[0][0]!r} {rows[0][1]!r}")
            print(f"oom trial's stored error: {rows[0][1]}")

    for failure in failures:
        print("FAIL:", failure)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
