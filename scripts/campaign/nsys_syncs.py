#!/usr/bin/env python3
"""Host syncs and host<->device copies per training step, from an Nsight Systems SQLite export
(`nsys export --type sqlite`, as `ulysses-tune profile` writes it to DIR/profile.sqlite).

Steps: the "step" NVTX ranges of domain "ulysses" (one per training step), after dropping each
thread's first --skip-steps (warmup). Counted inside them, per step:
  - CUDA runtime calls that block the host: cudaStreamSynchronize, cudaDeviceSynchronize,
    cudaEventSynchronize, cudaMemcpy (blocking), and cudaMemcpyAsync device-to-host
    (CUPTI_ACTIVITY_KIND_RUNTIME, names in StringIds; a copy's direction from its
    CUPTI_ACTIVITY_KIND_MEMCPY record, by correlationId);
  - copy time and bytes by direction (CUPTI_ACTIVITY_KIND_MEMCPY copyKind 1 = host to device,
    2 = device to host), the offload traffic.
Prints one JSON object (also to --out): steps, per-step counts by call, host_syncs_per_step (their
sum over the four sync calls; device-to-host cudaMemcpyAsync calls are listed beside it, as such a
copy is usually followed by a stream sync, or is one when the host buffer is pageable), copy ms,
bytes and calls per step by direction.
"""
import argparse
import json
import sqlite3
import sys

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")
COPY_KINDS = {1: "h2d", 2: "d2h"}


def tables(db):
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def step_windows(db, skip_steps, domain="ulysses", name="step"):
    """[(start, end)] of the step ranges of `domain`, each thread's first skip_steps dropped."""
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    domain_ids = {r[0] for r in db.execute(
        "SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = ?", (domain,))}
    by_thread = {}
    for start, end, text, text_id, domain_id, tid in db.execute(
            "SELECT start, end, text, textId, domainId, globalTid FROM NVTX_EVENTS "
            "WHERE eventType IN (59, 60) AND end IS NOT NULL"):
        label = text if text is not None else strings.get(text_id)
        if label == name and domain_id in domain_ids:
            by_thread.setdefault(tid, []).append((start, end))
    windows = []
    for ranges in by_thread.values():
        windows += sorted(ranges)[skip_steps:]
    return sorted(windows)


def inside(t, windows):
    return any(start <= t < end for start, end in windows)


def count(path, skip_steps):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    have = tables(db)
    for needed in ("StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        if needed not in have:
            raise SystemExit(f"error: {path}: no table {needed} (a profile with -t cuda,nvtx?)")
    windows = step_windows(db, skip_steps)
    if not windows:
        raise SystemExit(f"error: {path}: no 'step' NVTX ranges of domain ulysses after "
                         f"{skip_steps} warmup steps")
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    copy_kind = {}
    copies = {k: {"ms": 0.0, "bytes": 0, "count": 0} for k in COPY_KINDS.values()}
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in have:
        for start, end, kind, nbytes, correlation in db.execute(
                "SELECT start, end, copyKind, bytes, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
            copy_kind[correlation] = kind
            if kind in COPY_KINDS and inside(start, windows):
                c = copies[COPY_KINDS[kind]]
                c["ms"] += (end - start) / 1e6
                c["bytes"] += nbytes
                c["count"] += 1
    calls = {name: 0 for name in SYNC_CALLS + ("cudaMemcpyAsync_d2h",)}
    for start, name_id, correlation in db.execute(
            "SELECT start, nameId, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        name = strings.get(name_id, "").split("_v")[0]
        if not inside(start, windows):
            continue
        if name in calls:
            calls[name] += 1
        elif name == "cudaMemcpyAsync" and copy_kind.get(correlation) == 2:
            calls["cudaMemcpyAsync_d2h"] += 1
    steps = len(windows)
    per_step = {k: v / steps for k, v in calls.items()}
    return {"source": "nsys", "steps": steps, "skip_steps": skip_steps, "calls_per_step": per_step,
            "host_syncs_per_step": sum(per_step[k] for k in SYNC_CALLS),
            "d2h_copy_calls_per_step": per_step["cudaMemcpyAsync_d2h"],
            "copies_per_step": {k: {"ms": v["ms"] / steps, "bytes": v["bytes"] / steps,
                                    "count": v["count"] / steps} for k, v in copies.items()}}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite")
    p.add_argument("--skip-steps", type=int, default=1)
    p.add_argument("--out")
    args = p.parse_args()
    result = count(args.sqlite, args.skip_steps)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
