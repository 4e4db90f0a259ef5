#!/usr/bin/env python3
"""Turns the quick campaign's working directory (scripts/campaign/quick.sh) into OUT: at most 8
files, none over 16 MiB, no folders, so that OUT can be copied off a node in one go:

  summary.md        what ran, what was skipped or cut and why, the headline ratios
  smoke.tsv         scripts/gpu-smoke.sh's table
  compare.md        bench/compare's tables (throughput, longest length) and ours/theirs ratios
  sweep-trials.txt  the sweep's trials (ulysses-tune list), DeepSpeed's after them
  recommended.yaml  the sweep's recommendation (runs as it is under ulysses-tune launch)
  plan-fit.txt      plan --fit on the sweep's trials: the fit and its errors on them
  campaign.tgz      everything the stages wrote, without model weights, data and binaries

  quick_report.py WORK OUT --elapsed SECONDS
"""
import argparse
import importlib.util
import io
import json
import os
import re
import sqlite3
import statistics
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import summary as campaign_summary  # noqa: E402  (the long campaign's summary: its readers)
from summary import read  # noqa: E402
STAGES = ["build", "unit", "smoke", "multirank", "compare", "sweep", "maxlen", "deepspeed"]
OUT_FILES = ["summary.md", "smoke.tsv", "compare.md", "sweep-trials.txt",
             "recommended.yaml", "plan-fit.txt", "campaign.tgz"]
MAX_FILE = 16 << 20
# Left out of the tarball: model weights and token data (made again by bench/compare), installed
# wheels, and any one file over the per-file cap (named in the tarball's MANIFEST.txt).
SKIP_DIRS = {"compare-data", "campaign-python", "__pycache__"}
SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".tokens", ".nsys-rep", ".so")
# The pairs whose tokens/s ratio is the headline: ours over theirs at the same length.
PAIRS = [("ours-plain", "hf-nockpt", "untiled, no checkpointing"),
         ("ours-tiled", "hf", "tiled MLP + loss vs checkpointing"),
         ("ours-alst", "hf", "ALST (offloads) vs checkpointing"),
         ("ours-alst", "ds-zero3", "ALST vs DeepSpeed ZeRO-3 + optimizer offload")]


def status(work, stage):
    s = campaign_summary.status(work, stage)
    if s["status"] == "not run":
        s["reason"] = "the campaign stopped before it"
    return s


def records(work, stage):
    recs = []
    for line in read(os.path.join(work, stage, "bench", "results.jsonl")).splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass  # a line cut by the deadline
    return recs


def compare_module():
    spec = importlib.util.spec_from_file_location(
        "compare", os.path.join(ROOT, "bench", "compare", "compare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ratios(runs):
    """[(length, label, ours, theirs, ratio of tokens/s, ours peak GiB, theirs peak GiB)]."""
    best = {}
    for r in runs:
        if r.get("kind") == "run" and r.get("status") == "ok":
            best.setdefault((r["length"], r["config"]), []).append(r)
    rows = []
    for length in sorted({k[0] for k in best}):
        for ours, theirs, label in PAIRS:
            a, b = best.get((length, ours)), best.get((length, theirs))
            if not a or not b:
                continue
            tps = lambda g: statistics.median(r["tokens_per_s"] for r in g)  # noqa: E731
            peak = lambda g: statistics.median((r.get("peak_bytes") or 0) for r in g) / 2**30  # noqa: E731
            rows.append((length, label, ours, theirs, tps(a) / tps(b), peak(a), peak(b)))
    return rows


def ratio_table(rows):
    if not rows:
        return ""
    lines = ["| length | pair | tokens/s ratio | ours peak GiB | theirs peak GiB |",
             "|---:|---|---:|---:|---:|"]
    lines += [f"| {length} | {ours} / {theirs} ({label}) | {ratio:.2f}x | {pa:.1f} | {pb:.1f} |"
              for length, label, ours, theirs, ratio, pa, pb in rows]
    return "\n".join(lines)


def fit_line(work):
    """plan --fit's errors on the trials it was fitted on: worst (fit.txt) and RMS (fit.json)."""
    text = read(os.path.join(work, "sweep", "fit.txt"))
    worst = {m.group(1): m.group(2) for m in
             re.finditer(r"^(memory|time):.*worst error ([-0-9.]+ %)", text, re.M)}
    try:
        with open(os.path.join(work, "sweep", "fit.json")) as f:
            fit = json.load(f)
    except (OSError, ValueError):
        fit = {}
    rms = {}
    for part in ("memory", "time"):
        value = (fit.get(part) or {}).get("rms_relative_error") if isinstance(fit, dict) else None
        if isinstance(value, (int, float)):
            rms[part] = f"{100 * value:.1f} %"
    parts = [f"{part} worst {worst[part]}" + (f", RMS {rms[part]}" if part in rms else "")
             for part in ("time", "memory") if part in worst]
    return "; ".join(parts)


def sweep_facts(work):
    """(status counts, the recommended trial's words) from the sweep's database."""
    db = os.path.join(work, "sweep", "results.db")
    if not os.path.exists(db):
        return {}, ""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    counts = dict(con.execute("SELECT status, count(*) FROM trials GROUP BY status").fetchall())
    rec = read(os.path.join(work, "sweep", "recommended", "recommended.yaml"))
    m = re.search(r"trial #(\d+)", rec)
    words = ""
    if m:
        row = con.execute("SELECT point, seqlen, tokens_per_s_per_rank, peak_mem_bytes FROM trials"
                          " WHERE id = ?", (int(m.group(1)),)).fetchone()
        if row:
            point = ", ".join(f"{k}={v}" for k, v in json.loads(row[0]).items())
            words = (f"trial #{m.group(1)}: {point} at {row[1]} tokens, "
                     f"{row[2] or 0:.0f} tokens/s, peak {(row[3] or 0) / 2**30:.2f} GiB above "
                     "the start-up baseline")
    con.close()
    return counts, words


def pack(work, path, cap):
    """WORK into path as .tgz, leaving out what SKIP_* names and files over `cap` bytes."""
    left_out = []
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for top, dirs, files in os.walk(work):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(files):
                full = os.path.join(top, name)
                rel = os.path.relpath(full, work)
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                size = os.path.getsize(full)
                if name.endswith(SKIP_SUFFIXES) or size > cap:
                    left_out.append(f"{rel} ({size} bytes)")
                    continue
                tar.add(full, arcname=os.path.join("campaign", rel))
        manifest = ("Left out (weights, data, binaries, or over the per-file cap of "
                    f"{cap} bytes):\n" + "".join(f"  {x}\n" for x in left_out)).encode()
        info = tarfile.TarInfo("campaign/MANIFEST.txt")
        info.size, info.mtime = len(manifest), int(time.time())
        tar.addfile(info, io.BytesIO(manifest))
    with open(path + ".tmp", "wb") as f:
        f.write(buf.getvalue())
    os.replace(path + ".tmp", path)
    return len(left_out)


def write(out, name, text, work=None):
    if work:  # the working directory is gone afterwards: its paths as the tarball names them
        text = text.replace(work.rstrip("/") + "/", "campaign/")
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text if text.endswith("\n") or not text else text + "\n")
    os.replace(path + ".tmp", path)


def summary(work, settings, elapsed, compare_md, rows):
    dry = settings.get("mode") == "dry-run"
    lines = ["# Quick GPU campaign", ""]
    if dry:
        lines += ["**Dry run** on CPU with tiny shapes: it shows that every stage works and what "
                  "OUT holds; its numbers measure nothing.", ""]
    else:
        lines += [f"GPU: {settings.get('gpu') or 'unknown'} (hardware profile "
                  f"`{settings.get('hardware')}`); model `{settings.get('model')}`, "
                  f"{settings.get('dtype')}.", ""]
    version = read(os.path.join(work, "build", "version.txt")).strip().replace("\n", "; ")
    torch_line = read(os.path.join(work, "build", "torch.txt")).strip()
    lines += [f"Wall time {elapsed} s of a {settings.get('budget_s')} s budget; host "
              f"{settings.get('host')}; build `{version or 'none'}`; {torch_line or 'torch ?'}.",
              ""]

    lines += ["## Headline", ""]
    head = []
    for length, label, ours, theirs, ratio, pa, pb in rows:
        head.append(f"- {length} tokens, {label}: ours {ratio:.2f}x transformers' tokens/s "
                    f"({ours} vs {theirs}; peak {pa:.1f} vs {pb:.1f} GiB)")
    counts, recommended = sweep_facts(work)
    if counts:
        finished = counts.get("ok", 0) + counts.get("oom", 0)
        head.append(f"- Sweep: {finished} trials finished ("
                    + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")")
    if recommended:
        head.append(f"- Recommended: {recommended}")
    fit = fit_line(work)
    if fit:
        head.append(f"- plan --fit's error on the sweep's own trials: {fit}")
    multirank = json.loads(read(os.path.join(work, "multirank", "multirank.json"), "{}"))
    if multirank.get("comparisons"):
        held = [c for c in multirank["comparisons"] if c["verdict"] == "ok"]
        head.append(f"- Multi-rank paths ({multirank['backend']}, {multirank['precision']}): "
                    f"{len(held)} of {len(multirank['comparisons'])} within "
                    f"{multirank['tolerance']:g} of their reference runs' losses"
                    + "".join(f"; {c['run']} {c['verdict']}" for c in multirank["comparisons"]
                              if c["verdict"] != "ok"))
    maxlen = [r for r in records(work, "maxlen") if r.get("kind") == "maxlen"]
    for r in maxlen:
        head.append(f"- Longest length {r['config']} trains: {r['longest_ok']}"
                    + (f" ({r['shortest_failed']} fails)" if r.get("shortest_failed") else "")
                    + (f"; {r['note']}" if r.get("note") else ""))
    lines += (head or ["_Nothing measured: see the stages._"]) + [""]

    lines += ["## Stages", "", "| stage | status | seconds | why |", "|---|---|---:|---|"]
    for stage in STAGES:
        s = status(work, stage)
        lines.append(f"| {stage} | {s['status']} | {s.get('seconds', '')} | "
                     f"{s.get('reason', '').replace('|', '/')} |")
    wheels = read(os.path.join(work, "setup", "wheels.txt")).strip()
    if wheels:
        lines += ["", "Wheels: " + wheels.replace("\n", "; ")]
    lines += ["", "## Comparison with transformers", "", compare_md or "_Not measured._", ""]
    if multirank.get("comparisons"):
        lines += ["## Multi-rank paths", "",
                  f"{multirank['backend']}, {multirank['precision']}, {multirank['steps']} steps; "
                  "each run against its reference on the same weights and tokens (peaks of "
                  "several ranks on one GPU are of several processes on one device; the "
                  "predictions are the cost model's for each run config, per rank).", "",
                  "| run | against | verdict | worst loss rel | peak MiB | predicted MiB | "
                  "reference peak MiB | reference predicted MiB |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
        for c in multirank["comparisons"]:
            worst = f"{c['worst_loss_rel']:.2e}" if c["worst_loss_rel"] is not None else "-"
            peaks = [f"{b / 2**20:.0f}" if b else "-"
                     for b in (c["peak_bytes"], c.get("predicted_peak_bytes"),
                               c["reference_peak_bytes"], c.get("reference_predicted_peak_bytes"))]
            lines.append(f"| {c['what']} | {c['reference']} | {c['verdict']} | {worst} | "
                         + " | ".join(peaks) + " |")
        lines.append("")
    lines += ["## Files", "",
              "`compare.md` (the comparison), `sweep-trials.txt`, `recommended.yaml`, "
              "`plan-fit.txt`, `smoke.tsv`; `campaign.tgz` holds every stage's "
              "commands (with exit status), logs and results, the sweep's database and report "
              "(`campaign/<stage>/`).", ""]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("--elapsed", type=int, required=True)
    args = p.parse_args()
    work, out = args.work, args.out
    settings = json.loads(read(os.path.join(work, "campaign.json"), "{}"))

    runs = records(work, "compare") + records(work, "maxlen")
    rows = ratios(runs)
    compare_md = ""
    if runs:
        compare_md = compare_module().table(runs)
        table = ratio_table(rows)
        if table:
            compare_md += "\nours / theirs at the same length (tokens/s; reserved peak):\n\n" + table
    trials = read(os.path.join(work, "sweep", "trials.txt"))
    ds_trials = read(os.path.join(work, "deepspeed", "trials.txt"))
    if ds_trials:
        trials += "\nDeepSpeed backend:\n" + ds_trials
    files = {
        "smoke.tsv": read(os.path.join(work, "smoke", "gpu-smoke.tsv")),
        "compare.md": compare_md,
        "sweep-trials.txt": trials,
        "recommended.yaml": read(os.path.join(work, "sweep", "recommended", "recommended.yaml")),
        "plan-fit.txt": read(os.path.join(work, "sweep", "fit.txt")),
    }
    # An OUT of an earlier quick run: its files are replaced, those this run has none for removed.
    for name in OUT_FILES:
        if name not in ("summary.md", "campaign.tgz") and not files.get(name):
            try:
                os.remove(os.path.join(out, name))
            except FileNotFoundError:
                pass
    for name, text in files.items():
        if text:
            write(out, name, text, work)
    write(out, "summary.md", summary(work, settings, args.elapsed, compare_md, rows))
    with open(os.path.join(work, "summary.md"), "w") as f:  # the tarball holds it too
        f.write(read(os.path.join(out, "summary.md")))
    cap = 4 << 20
    pack(work, os.path.join(out, "campaign.tgz"), cap)
    while os.path.getsize(os.path.join(out, "campaign.tgz")) > MAX_FILE and cap > 1 << 16:
        cap //= 4
        pack(work, os.path.join(out, "campaign.tgz"), cap)

    names = sorted(os.listdir(out))
    problems = [f"{n} is a folder" for n in names if os.path.isdir(os.path.join(out, n))]
    problems += [f"{n} is over 16 MiB" for n in names
                 if os.path.getsize(os.path.join(out, n)) > MAX_FILE]
    if len(names) > 8:  # the marker file included
        problems.append(f"{len(names)} files, more than 8")
    for problem in problems:
        print(f"quick_report: OUT: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
