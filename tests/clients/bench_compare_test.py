#!/usr/bin/env python3
"""bench/compare in its dry-run form (CPU, fp32, a tiny model): ulysses-train against transformers
(and DeepSpeed ZeRO-3 when the venv has it) end to end. Checks the JSON lines (one env record,
runs interleaved ours/theirs per repeat, every run ok), that both sides trained the same model on
the same tokens (step-1 losses within 1e-5 relative), that the harness's FLOP count equals the
trainer's (summary.json model_flops_per_step) and MFU = TFLOP/s / peak, that each searched
configuration got a bracket (longest ok < shortest failed), that `compare.py table` reprints
summary.md, and that an --out it did not make is refused untouched.

Usage: bench_compare_test.py --bin BUILD/bin   (run with the venv's Python)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(ROOT, "bench", "compare", "compare.py")


def check_python_choice(tmp, bin_dir):
    """Started by a python3 without torch (as the README's line runs it on a machine where only
    the venv has torch), the harness uses the project's venv for transformers' side; a --python
    without torch and transformers is refused in one line before anything is written."""
    bare = "/usr/bin/python3"
    if not os.path.exists(bare) or subprocess.run([bare, "-c", "import torch"],
                                                  capture_output=True).returncode == 0:
        print(f"skip: no python3 without torch at {bare}")
        return
    out = os.path.join(tmp, "bare")
    refused = subprocess.run([bare, COMPARE, "run", "--dry-run", "--out", out, "--bin", bin_dir,
                              "--python", bare], capture_output=True, text=True)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --python: " + bare), refused.stderr
    assert not os.path.exists(out), "a refused run wrote its --out"
    # The default: the venv is found (the run goes on to the next check, the bad --configs).
    found = subprocess.run([bare, COMPARE, "run", "--dry-run", "--out", out, "--bin", bin_dir,
                            "--configs", "nope"], capture_output=True, text=True)
    assert found.returncode != 0 and "unknown configuration 'nope'" in found.stderr, (
        found.stdout + found.stderr)
    assert not os.path.exists(out), "a refused run wrote its --out"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        check_python_choice(tmp, args.bin)
        out = os.environ.get("BENCH_COMPARE_TEST_OUT") or os.path.join(tmp, "out")
        run = subprocess.run([sys.executable, COMPARE, "run", "--dry-run", "--out", out,
                              "--bin", args.bin, "--python", sys.executable],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        records = [json.loads(x) for x in open(os.path.join(out, "results.jsonl"))]
        env = records[0]
        assert env["kind"] == "env" and env["device"] == "cpu" and env["dtype"] == "fp32", env
        configs = env["configs"]
        has_ds = env.get("deepspeed") is not None
        assert configs == ["ours-alst", "hf"] + (["ds-zero3"] if has_ds else []), configs

        runs = [r for r in records if r["kind"] == "run"]
        assert all(r["status"] == "ok" for r in runs), [r for r in runs if r["status"] != "ok"]
        # Interleaved: each repeat runs every length, and at each length every configuration.
        order = [(r["rep"], r["length"], r["config"]) for r in runs]
        expected = [(rep, length, c) for rep in range(env["reps"]) for length in env["lengths"]
                    for c in configs]
        assert order == expected, order
        for length in env["lengths"]:
            losses = {r["config"]: r["loss"][0] for r in runs if r["length"] == length}
            ref = losses["hf"]
            for config, loss in losses.items():
                assert abs(loss - ref) <= 1e-5 * abs(ref), (length, losses)
        for r in runs:
            if r["side"] == "ours":
                trainer = r["ours_model_flops_per_step"]
                ours = r["model_flops_per_token"] * r["length"]
                assert abs(trainer - ours) <= 1e-9 * ours, (trainer, ours)
            assert abs(r["mfu"] - r["tflops"] / env["peak_tflops"]) < 1e-12, r
            assert r["peak_bytes"] == r["peak_rss_bytes"] > 0, r

        found = {r["config"]: r for r in records if r["kind"] == "maxlen"}
        assert set(found) == {"ours-alst", "hf"}, found
        for r in found.values():
            assert r["longest_ok"] > 0 and r["shortest_failed"] > r["longest_ok"], r
            probes = [x for x in records if x["kind"] == "probe" and x["config"] == r["config"]]
            assert len(probes) == r["probes"], (r, [(x["length"], x["status"]) for x in probes])
            assert all(x["limit_gib"] == 0.1 for x in probes), probes

        table = subprocess.run([sys.executable, COMPARE, "table",
                                os.path.join(out, "results.jsonl")], capture_output=True, text=True)
        assert table.returncode == 0, table.stderr
        assert table.stdout == open(os.path.join(out, "summary.md")).read(), table.stdout

        foreign = os.path.join(tmp, "foreign")
        os.makedirs(foreign)
        open(os.path.join(foreign, "keep"), "w").close()
        refused = subprocess.run([sys.executable, COMPARE, "run", "--dry-run", "--out", foreign,
                                  "--bin", args.bin], capture_output=True, text=True)
        assert refused.returncode != 0 and "not made by bench/compare" in refused.stderr, refused
        assert os.listdir(foreign) == ["keep"]
    print(f"bench_compare: ok ({len(runs)} runs, configurations {', '.join(configs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
