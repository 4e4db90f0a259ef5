#!/usr/bin/env python3
"""Writes OUT/summary.md of a campaign (scripts/gpu-campaign.sh) from what its stages left in OUT:
the stage table (status, exit, seconds, result file), then one section per stage's result, then
every command each stage ran with its exit status. The same layout for a GPU run and a dry run;
a stage that has not succeeded shows its status in place of its section.

  summary.py OUT
"""
import glob
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAGES = ["build", "smoke", "compare-throughput", "compare-maxlen-ours", "compare-maxlen-theirs",
          "sweep", "plan-fit", "alst-run", "profile", "findings"]
RESULT = {"build": "build/version.txt", "smoke": "smoke/gpu-smoke.tsv",
          "compare-throughput": "compare-throughput/bench/summary.md",
          "compare-maxlen-ours": "compare-maxlen-ours/bench/summary.md",
          "compare-maxlen-theirs": "compare-maxlen-theirs/bench/summary.md",
          "sweep": "sweep/report/README.md", "plan-fit": "plan-fit/plan.txt",
          "alst-run": "alst-run/alst-run.json", "profile": "profile/syncs.json",
          "findings": "findings/findings.md"}


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def status(out, stage):
    text = read(os.path.join(out, stage, "status"))
    s = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return s if s else {"status": "not run"}


def block(text, limit=60):
    lines = text.rstrip("\n").splitlines()
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
    return "```\n" + "\n".join(lines) + "\n```"


def missing(out, *stages):
    states = [f"{s}: {status(out, s)['status']}" for s in stages]
    return "_Not available (" + "; ".join(states) + ")._"


def tsv_table(text):
    rows = [line.split("\t") for line in text.strip().splitlines()]
    if not rows:
        return ""
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)


def compare_tables(out):
    spec = importlib.util.spec_from_file_location(
        "compare", os.path.join(ROOT, "bench", "compare", "compare.py"))
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    records = []
    for stage in ("compare-throughput", "compare-maxlen-ours", "compare-maxlen-theirs"):
        for line in read(os.path.join(out, stage, "bench", "results.jsonl")).splitlines():
            if line.strip():
                records.append(json.loads(line))
    env = [r for r in records if r.get("kind") == "env"]
    records = [r for r in records if r.get("kind") != "env"] + env[:1]
    return compare.table(records) if len(records) > len(env[:1]) else ""


def main():
    out = sys.argv[1]
    settings = json.loads(read(os.path.join(out, "campaign.json"), "{}"))
    dry = settings.get("mode") == "dry-run"
    lines = ["# GPU campaign summary", ""]
    if dry:
        lines.append("**Dry run** on CPU with tiny shapes: it checks that every stage works and "
                     "shows the layout of a GPU run; its numbers measure nothing.")
    else:
        lines.append(f"GPU: {settings.get('gpu') or 'unknown'}; hardware profile "
                     f"`{settings.get('hardware')}`; model `{settings.get('model')}`, "
                     f"{settings.get('dtype')}.")
    version = read(os.path.join(out, "build", "version.txt")).strip().replace("\n", "; ")
    lines += ["", f"Build: `{version or 'not built'}` ({settings.get('build', '?')}); Python "
              f"`{settings.get('python', '?')}`; updated {settings.get('updated', '?')}.", ""]

    lines += ["## Stages", "", "| stage | status | exit | seconds | result | note |",
              "|---|---|---:|---:|---|---|"]
    for stage in STAGES:
        s = status(out, stage)
        result = RESULT[stage] if os.path.exists(os.path.join(out, RESULT[stage])) else ""
        lines.append(f"| {stage} | {s['status']} | {s.get('exit', '')} | "
                     f"{s.get('seconds', '')} | {result} | {s.get('reason', '')} |")
    lines.append("")

    lines += ["## Smoke", ""]
    smoke = read(os.path.join(out, "smoke", "gpu-smoke.tsv"))
    lines += [tsv_table(smoke) if smoke else missing(out, "smoke"), ""]

    lines += ["## Comparison with transformers", "",
              "Tokens/s, MFU and peak memory per configuration (bench/compare/README.md), then "
              "the longest length each trains.", ""]
    tables = compare_tables(out)
    lines += [tables if tables else missing(out, "compare-throughput", "compare-maxlen-ours",
                                           "compare-maxlen-theirs"), ""]

    lines += ["## One-GPU sweep", ""]
    trials = read(os.path.join(out, "sweep", "trials.txt"))
    if trials:
        lines += [block(trials, 40), "",
                  "Report: `sweep/report/README.md`; recommendation: `sweep/recommended/`.", ""]
    else:
        lines += [missing(out, "sweep"), ""]

    lines += ["## Cost model fitted on the sweep", ""]
    plan = read(os.path.join(out, "plan-fit", "plan.txt"))
    if plan:
        lines += [block(read(os.path.join(out, "plan-fit", "fit.txt")), 30), "", block(plan, 40), ""]
        for extra in sorted(glob.glob(os.path.join(out, "plan-fit", "plan-*.txt"))):
            lines += [f"`{os.path.relpath(extra, out)}`:", "", block(read(extra), 30), ""]
    else:
        lines += [missing(out, "plan-fit"), ""]

    lines += ["## GPU findings", "",
              "Offload copy time, peak reserved vs allocated memory and host syncs per step "
              "(scripts/campaign/findings.py).", ""]
    found = read(os.path.join(out, "findings", "findings.md"))
    lines += [found.rstrip() if found else missing(out, "alst-run", "profile", "findings"), ""]

    lines += ["## Commands", "", "Every command each stage ran, with its exit status; logs in "
              "`<stage>/log`.", ""]
    for stage in STAGES:
        commands = read(os.path.join(out, stage, "commands"))
        lines += [f"### {stage}", "", block(commands, 80) if commands.strip() else
                  f"_{status(out, stage)['status']}_", ""]
    with open(os.path.join(out, "summary.md.tmp"), "w") as f:
        f.write("\n".join(lines))
    os.replace(os.path.join(out, "summary.md.tmp"), os.path.join(out, "summary.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
