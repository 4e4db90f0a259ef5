#!/usr/bin/env python3
"""Smart search vs exhaustive grid on the same space, from one results database.

Usage: compare.py RESULTS.db [SMART_SWEEP] [GRID_SWEEP]   (defaults: quickstart-cpu, ...-grid)
Prints a markdown table: trials each search ran, the configuration and length each recommends
(max-seqlen: longest length, then tokens/s per rank), and the grid's own measurement of the
smart search's pick next to the grid's best at that length, so that the 5 % criterion is judged
on measurements of one sweep (timings of two sweeps differ by machine noise too).
"""
import json
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1])
smart = sys.argv[2] if len(sys.argv) > 2 else "quickstart-cpu"
grid = sys.argv[3] if len(sys.argv) > 3 else smart + "-grid"


def trials(name):
    rows = db.execute(
        "SELECT t.id, t.point, t.seqlen, t.status, t.probe, t.tokens_per_s_per_rank, t.exit_code "
        "FROM trials t JOIN sweeps s ON s.id = t.sweep_id WHERE s.name = ?", (name,)).fetchall()
    return [dict(zip(("id", "point", "seqlen", "status", "probe", "tps", "exit_code"), r))
            for r in rows]


def best(rows):
    ok = [r for r in rows if r["status"] == "ok" and not r["probe"]]
    return max(ok, key=lambda r: (r["seqlen"], r["tps"], -r["id"]))


def point(p):
    return ", ".join(f"{k}={v}" for k, v in json.loads(p).items())


s_rows, g_rows = trials(smart), trials(grid)
s_best, g_best = best(s_rows), best(g_rows)
ran = lambda rows: sum(r["exit_code"] is not None for r in rows)
# The grid's measurement of the smart pick's configuration at the smart pick's length.
same = [r for r in g_rows if r["point"] == s_best["point"] and r["seqlen"] == s_best["seqlen"]
        and r["status"] == "ok"]
print(f"| | smart search (`{smart}`) | exhaustive grid (`{grid}`) |")
print("|---|---|---|")
print(f"| trials run (probes included) | {ran(s_rows)} | {ran(g_rows)} |")
print(f"| out of memory | {sum(r['status'] == 'oom' for r in s_rows)} | "
      f"{sum(r['status'] == 'oom' for r in g_rows)} |")
print(f"| pruned / skipped (not run) | {sum(r['status'] == 'pruned' for r in s_rows)} / "
      f"{sum(r['status'] == 'skipped' for r in s_rows)} | - |")
print(f"| recommended | #{s_best['id']} {point(s_best['point'])} | "
      f"#{g_best['id']} {point(g_best['point'])} |")
print(f"| longest length (objective) | {s_best['seqlen']} | {g_best['seqlen']} |")
print(f"| tokens/s per rank, own sweep | {s_best['tps']:.0f} | {g_best['tps']:.0f} |")
if same:
    ratio = same[0]["tps"] / g_best["tps"]
    print(f"| smart pick as the grid measured it | {same[0]['tps']:.0f} "
          f"(trial #{same[0]['id']}): {100 * ratio:.1f}% of the grid's best | |")
print()
print(f"Trial ratio: the smart search ran {ran(s_rows)} of the grid's {ran(g_rows)} trials "
      f"({100 * ran(s_rows) / ran(g_rows):.0f}%).")
