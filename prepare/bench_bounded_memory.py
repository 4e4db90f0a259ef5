#!/usr/bin/env python3
"""Peak memory of prepare_data.py on corpora several times larger than a memory limit, written to a
markdown report: each run is a separate prepare_data.py process (and its workers) in a memory
cgroup of its own with the limit set (cgroup v2 memory.max, or v1 memory.limit_in_bytes; root may
create one), or, where no cgroup can be made, under RLIMIT_AS (virtual memory, a much cruder bound).

Runs: JSON lines corpora of the sizes given (the largest several times the limit, a small one to
show the peak does not grow with the corpus), a Parquet file written as one row group (bigger than
the limit), and a directory of plain text files (one document each). Every corpus is generated
(seeded: Zipf-distributed made-up words, as bench_prepare.py), and every output is checked: the
.idx document counts equal the records, the token counts equal the manifest's and the .bin's size,
and a sample of records (every 997th) equals the tokenizer's own encoding plus EOS.

Measured per run: the cgroup's peak (page cache included: the corpus read and the .bin written go
through it, and the kernel reclaims it at the limit, so on a large corpus this peak is the limit
itself), the largest anonymous memory of the cgroup and the largest sum of the processes' RSS
(both sampled every 0.2 s), each process's own peak RSS (VmHWM), the times the limit was hit and
the OOM kills (none, or the run fails).

  bench_bounded_memory.py [--limit-mib 384] [--parquet-limit-mib MIB] [--workers 2]
                          [--jsonl-mb 1280 128] [--parquet-mb 600] [--text-mb 64] [--work DIR]
                          [--keep] [--merge] [--report reports/prepare-bounded-memory.md]
The report's runs: --jsonl-mb 1280 128 --parquet-mb 300 --text-mb 64 (384 MiB), then --merge
--jsonl-mb --parquet-mb 600 --parquet-limit-mib 512 --text-mb 64."""
import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_prepare  # noqa: E402
import prepare_data  # noqa: E402
import record_sources  # noqa: E402

SAMPLE_EVERY = 997  # records compared with the tokenizer's own encoding
MIB = 1 << 20


# --- corpora ---------------------------------------------------------------------------------
class Documents:
    """Seeded documents of 50-2000 words drawn from 20000 made-up words (Zipf), as
    bench_prepare.py generates them, written in batches."""

    def __init__(self, seed):
        rng = random.Random(seed)
        letters = "etaoinshrdlcumwfgypbvkjxqz"
        self.words = np.array(
            ["".join(rng.choices(letters, weights=range(26, 0, -1), k=rng.randint(1, 10)))
             for _ in range(20000)], dtype=object)
        weights = 1.0 / np.arange(1, 20001)
        self.probabilities = weights / weights.sum()
        self.rng = np.random.default_rng(seed)

    def batch(self, count=256):
        lengths = self.rng.integers(50, 2001, count)
        ids = self.rng.choice(len(self.words), int(lengths.sum()), p=self.probabilities)
        ends = np.cumsum(lengths)
        return [" ".join(self.words[ids[end - length:end]]) + "."
                for end, length in zip(ends, lengths)]


def write_corpus(kind, path, megabytes, seed):
    """Writes a corpus of about `megabytes` of text; returns (records, {index: text}) with the
    texts of every SAMPLE_EVERY-th record."""
    documents = Documents(seed)
    target = megabytes * MIB
    written = records = 0
    samples = {}
    table_texts = []
    if kind == "text":
        os.makedirs(path)
    with open(path if kind == "jsonl" else os.devnull, "w", encoding="utf-8") as out:
        while written < target:
            for text in documents.batch():
                if records % SAMPLE_EVERY == 0:
                    samples[records] = text
                if kind == "jsonl":
                    out.write(json.dumps({"text": text}) + "\n")
                elif kind == "parquet":
                    table_texts.append(text)
                else:  # one file per document, names in the order written
                    with open(os.path.join(path, f"{records:08d}.txt"), "w",
                              encoding="utf-8") as text_file:
                        text_file.write(text)
                written += len(text) + (12 if kind == "jsonl" else 0)
                records += 1
    if kind == "parquet":  # one row group for the whole file, as a writer's default may make
        import pyarrow as pa
        import pyarrow.parquet as parquet
        table = pa.table({"text": table_texts})
        del table_texts
        parquet.write_table(table, path, row_group_size=table.num_rows)
    return records, samples


def corpus_bytes(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))
    return os.path.getsize(path)


# --- the memory limit ------------------------------------------------------------------------
class MemoryLimit:
    """A memory cgroup (v2, else v1) of its own for one process tree, or RLIMIT_AS."""

    def __init__(self, limit_bytes, name):
        self.limit = limit_bytes
        self.path = None
        self.version = None
        for version, make in ((2, self._make_v2), (1, self._make_v1)):
            try:
                self.path = make(name)
                self.version = version
                break
            except OSError:
                continue
        self.kind = (f"cgroup v{self.version} memory controller, in a cgroup of its own below "
                     "this process's" if self.path
                     else "RLIMIT_AS (no memory cgroup could be created: a bound on virtual "
                          "memory only)")

    @staticmethod
    def _own_path(controller):
        with open("/proc/self/cgroup", encoding="utf-8") as cgroups:
            for line in cgroups:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
        raise OSError("not in a cgroup of that controller")

    def _make_v2(self, name):
        root = "/sys/fs/cgroup"
        with open(os.path.join(root, "cgroup.controllers"), encoding="utf-8") as controllers:
            if "memory" not in controllers.read().split():
                raise OSError("no memory controller in cgroup v2")
        parents = [os.path.join(root, self._own_path("").lstrip("/")), root]
        for parent in parents:  # below this process's cgroup where it may, else below the root
            try:
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as control:
                    control.write("+memory")
                path = os.path.join(parent, name)
                os.mkdir(path)
            except OSError:
                continue
            try:
                self._write(path, "memory.max", self.limit)
                self._write(path, "memory.swap.max", 0)
            except OSError:
                os.rmdir(path)
                raise
            return path
        raise OSError("no cgroup v2 parent takes a child with the memory controller")

    def _make_v1(self, name):
        root = "/sys/fs/cgroup/memory"
        path = os.path.join(root, self._own_path("memory").lstrip("/"), name)
        os.mkdir(path)
        try:
            self._write(path, "memory.limit_in_bytes", self.limit)
            if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                self._write(path, "memory.memsw.limit_in_bytes", self.limit)  # no swap either
        except OSError:
            os.rmdir(path)
            raise
        return path

    @staticmethod
    def _write(path, name, value):
        with open(os.path.join(path, name), "w") as control:
            control.write(str(value))

    def _read(self, name):
        with open(os.path.join(self.path, name), encoding="utf-8") as control:
            return control.read()

    def _keyed(self, name):
        return {key: int(value) for key, value in
                (line.split() for line in self._read(name).splitlines() if line.strip())}

    def enter(self):
        """In the child between fork and exec: puts it under the limit."""
        if self.path:
            self._write(self.path, "cgroup.procs", os.getpid())
        else:
            resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def pids(self):
        if not self.path:
            return []
        return [int(pid) for pid in self._read("cgroup.procs").split()]

    def anon_and_cache(self):
        """(anonymous bytes, page cache bytes) of the cgroup now."""
        if not self.path:
            return 0, 0
        stat = self._keyed("memory.stat")
        if self.version == 2:
            return stat["anon"], stat["file"]
        return stat["rss"], stat["cache"]

    def totals(self):
        """{peak, limit hits, oom kills} at the end of a run."""
        if not self.path:
            return {}
        if self.version == 2:
            events = self._keyed("memory.events")
            peak = (int(self._read("memory.peak")) if os.path.exists(
                os.path.join(self.path, "memory.peak")) else None)
            return {"peak": peak, "limit_hits": events.get("max", 0),
                    "oom_kills": events.get("oom_kill", 0)}
        return {"peak": int(self._read("memory.max_usage_in_bytes")),
                "limit_hits": int(self._read("memory.failcnt")),
                "oom_kills": self._keyed("memory.oom_control").get("oom_kill", 0)}

    def remove(self):
        if self.path:
            for _ in range(50):  # the processes' exit may still be under way
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.1)


# Runs prepare_data.py as its child and writes its exit status and the largest RSS of it and its
# workers (getrusage of the children: not of a process forked from this big one before exec).
LAUNCHER = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump({"exit": done.returncode,
               "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}, out)
"""


class Sampler(threading.Thread):
    """Every 0.2 s: the cgroup's anonymous memory and page cache, each process's peak RSS
    (VmHWM) and parent, and the sum of the processes' RSS; keeps the largest of each."""

    def __init__(self, limit, root_pid):
        super().__init__(daemon=True)
        self.limit = limit
        self.root_pid = root_pid
        self.stop = threading.Event()
        self.max_anon = self.max_cache = self.max_rss_sum = 0
        self.hwm = {}     # pid -> peak RSS bytes
        self.parent = {}  # pid -> parent pid

    @staticmethod
    def _status(pid):
        values = {}
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8") as status:
                for line in status:
                    if line.startswith(("VmHWM:", "VmRSS:", "PPid:")):
                        key, value = line.split()[:2]
                        values[key[:-1]] = int(value)
        except OSError:
            pass
        return values

    def sample(self):
        anon, cache = self.limit.anon_and_cache()
        self.max_anon = max(self.max_anon, anon)
        self.max_cache = max(self.max_cache, cache)
        rss_sum = 0
        for pid in self.limit.pids() or [self.root_pid]:
            values = self._status(pid)
            if "VmHWM" in values:
                self.hwm[pid] = max(self.hwm.get(pid, 0), values["VmHWM"] * 1024)
                self.parent[pid] = values["PPid"]
                rss_sum += values["VmRSS"] * 1024
        self.max_rss_sum = max(self.max_rss_sum, rss_sum)

    def peaks(self):
        """(the main process's peak RSS, the largest worker's) among the processes seen."""
        main = [pid for pid, parent in self.parent.items() if parent == self.root_pid]
        workers = [pid for pid, parent in self.parent.items() if parent in main]
        return (max((self.hwm[pid] for pid in main), default=0),
                max((self.hwm[pid] for pid in workers), default=0), len(workers))

    def run(self):
        while not self.stop.wait(0.2):
            self.sample()


# --- one run ---------------------------------------------------------------------------------
def run_prepare(corpus, tokenizer, out, workers, limit_bytes, log_path, name):
    limit = MemoryLimit(limit_bytes, name)
    result_path = log_path + ".json"
    command = [sys.executable, "-c", LAUNCHER, result_path, sys.executable,
               os.path.join(HERE, "prepare_data.py"), corpus, "--tokenizer", tokenizer, "--out",
               out, "--workers", str(workers)]
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            start = time.perf_counter()
            process = subprocess.Popen(command, stdout=log, stderr=log, preexec_fn=limit.enter)
            sampler = Sampler(limit, process.pid)
            sampler.start()
            process.wait()
            wall = time.perf_counter() - start
            sampler.stop.set()
            sampler.join()
        totals = limit.totals()
    finally:
        limit.remove()
    try:
        with open(result_path, encoding="utf-8") as result_file:
            launched = json.load(result_file)
    except (OSError, ValueError):  # the launcher itself was stopped
        launched = {"exit": process.returncode, "maxrss": None}
    main_hwm, worker_hwm, workers_seen = sampler.peaks()
    return {"exit": launched["exit"], "seconds": wall, "limit_kind": limit.kind,
            "cgroup_peak": totals.get("peak"), "limit_hits": totals.get("limit_hits"),
            "oom_kills": totals.get("oom_kills"), "max_anon": sampler.max_anon,
            "max_cache": sampler.max_cache, "max_rss_sum": sampler.max_rss_sum,
            "main_hwm": main_hwm, "worker_hwm": worker_hwm, "workers_seen": workers_seen,
            "max_rss_any_process": launched["maxrss"],
            "launcher_hwm": sampler.hwm.get(process.pid, 0)}


def read_index(prefix):
    """(lengths [documents] int32, pointers [documents] int64) of a Megatron .idx."""
    raw = np.fromfile(prefix + ".idx", np.uint8)
    assert bytes(raw[:9]) == b"MMIDIDX\x00\x00", prefix
    count, documents = np.frombuffer(raw[18:34].tobytes(), "<u8")
    assert documents == count + 1, prefix
    lengths = np.frombuffer(raw[34:34 + 4 * int(count)].tobytes(), "<i4")
    pointers = np.frombuffer(raw[34 + 4 * int(count):34 + 12 * int(count)].tobytes(), "<i8")
    return lengths, pointers


def check_output(out, records, samples, tokenizer):
    """Raises AssertionError unless the output holds every record, with the tokenizer's ids."""
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as manifest_file:
        manifest = json.load(manifest_file)
    counts = manifest["counts"]
    assert counts["records"] == records, (counts["records"], records)
    indexes = {}
    for split in ("train", "eval"):
        lengths, pointers = read_index(os.path.join(out, split))
        assert len(lengths) == counts["documents"][split], split
        assert int(lengths.sum()) == counts["tokens"][split], split
        assert os.path.getsize(os.path.join(out, split) + ".bin") == 2 * int(lengths.sum())
        indexes[split] = (lengths, pointers)
    assert counts["documents"]["train"] + counts["documents"]["eval"] == records
    position = {"train": 0, "eval": 0}
    checked = 0
    eos = tokenizer.eos_token_id
    for index in range(records):
        split = "eval" if prepare_data.is_eval(index, 0, 0.01) else "train"
        if index in samples:
            lengths, pointers = indexes[split]
            at = position[split]
            ids = np.fromfile(os.path.join(out, split) + ".bin", "<u2", int(lengths[at]),
                              offset=int(pointers[at]))
            expected = tokenizer(samples[index], add_special_tokens=True)["input_ids"] + [eos]
            assert ids.tolist() == expected, f"record {index + 1} differs from the tokenizer's"
            checked += 1
        position[split] += 1
    return {"documents": records, "tokens": counts["tokens"]["train"] + counts["tokens"]["eval"],
            "sampled": checked}


def per_file_bytes(directory):
    """Python heap bytes per input file that discovery keeps (and the manifest lists)."""
    tracemalloc.start()
    sources = record_sources.discover([directory])
    entries = [{"path": os.path.abspath(source.path), "format": source.kind,
                "bytes": source.size} for source in sources]
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return used / max(len(entries), 1)


# --- report ----------------------------------------------------------------------------------
def mib(value):
    return "n/a" if value is None else f"{value / MIB:,.0f}"


def previous_runs(path):
    """The runs in the raw numbers of an earlier report (each with its command and limit)."""
    try:
        with open(path, encoding="utf-8") as report:
            text = report.read()
    except OSError:
        return []
    raw = text.split("```json\n", 1)[1].split("```", 1)[0] if "```json\n" in text else "[]"
    return json.loads(raw)


def verdict(run):
    if run["exit"] == 0:
        return run["check"]["verdict"]
    return "no output: " + ("killed by the OOM killer" if run["oom_kills"] else
                            f"exit status {run['exit']}")


def growth_lines(runs):
    """How the peaks of the largest and the smallest JSON lines corpus under one limit compare."""
    lines = []
    jsonl = sorted((run for run in runs if run["kind"] == "jsonl" and run["exit"] == 0),
                   key=lambda run: run["bytes"])
    if len(jsonl) >= 2:
        small, large = jsonl[0], jsonl[-1]
        lines += [
            f"JSON lines, {large['bytes'] / small['bytes']:.0f}x the corpus "
            f"({small['bytes'] / MIB:,.0f} -> {large['bytes'] / MIB:,.0f} MiB, "
            f"{small['records']:,} -> {large['records']:,} "
            f"records): the anonymous peak moves by "
            f"{(large['max_anon'] - small['max_anon']) / MIB:+.0f} MiB, the main process's peak "
            f"RSS by {(large['main_hwm'] - small['main_hwm']) / MIB:+.0f} MiB, the largest "
            f"worker's by {(large['worker_hwm'] - small['worker_hwm']) / MIB:+.0f} MiB.",
            ""]
    jsonl_limit = min((run["limit_mib"] for run in jsonl), default=None)
    parquet_limits = [run["limit_mib"] for run in runs if run["kind"] == "parquet"]
    if jsonl_limit and parquet_limits and min(parquet_limits) > jsonl_limit:
        lines += [
            "Parquet runs under a larger limit: `pyarrow` and its reader (about 50 MB of buffers in"
            " the main process that do not grow with the row group or the file: the"
            " `prepare_data` test holds a Parquet corpus 4x larger to the same peak) come on top of"
            f" the same floor, and with two workers {jsonl_limit} MiB leaves too little room for"
            " them (the OOM killer stops the run; nothing is written).",
            ""]
    killed = [run for run in runs if run["kind"] == "parquet" and run["oom_kills"]]
    if killed:
        lines += [
            "Parquet needs more than JSON lines whatever the file's size: `pyarrow` and its reader"
            " (about 50 MB of buffers in the main process that do not grow with the row group or"
            " the file: the `prepare_data` test holds a Parquet corpus 4x larger to the same peak)"
            " come on top of the same floor, so with two workers a"
            f" {killed[0]['limit_mib']} MiB limit was too small for it (killed by the OOM killer,"
            " nothing written) and the larger Parquet run had a larger limit.",
            ""]
    return lines


def write_report(path, args, runs):
    commands = list(dict.fromkeys(run["command"] for run in runs))
    limit_kinds = sorted({run["limit_kind"] for run in runs})
    text_runs = [run for run in runs if "bytes_per_file" in run]
    file_bytes = text_runs[-1]["bytes_per_file"] if text_runs else float("nan")
    lines = [
        "# prepare_data.py under a memory limit",
        "",
        "Whether `prepare/prepare_data.py` prepares corpora several times larger than the memory",
        "it may use: each run below is one `prepare_data.py` process and its tokenizing workers",
        "in a memory cgroup of their own, limited as the table says "
        f"({'; '.join(limit_kinds)}).",
        "The cgroup counts the page cache of the files read and written too, and the kernel",
        "reclaims it at the limit, so on a large corpus the cgroup's peak is the limit itself,",
        "while the anonymous memory (what the processes hold) is what must stay bounded. The",
        "floor is the imports: `transformers` brings in `torch`, about 180 MB of anonymous memory",
        "in the main process (shared by the workers it forks) and 80 MB of mapped libraries.",
        "",
        "Commands (a later one replaces the runs it names and keeps the others, with --merge):",
        "",
        *[f"    .venv/bin/python {command}" for command in commands],
        "",
        f"Machine: {len(os.sched_getaffinity(0))} CPU cores available ({os.cpu_count()} in the "
        "machine), shared with other jobs while it ran (the times are not a throughput claim: "
        "`reports/prepare-throughput.md` is); "
        f"--workers {args.workers}; the tokenizer: a byte-level BPE with 8192 ids (uint16 ids), "
        "pretrain mode, --eval-fraction 0.01.",
        "",
        "Corpora: generated, seeded (documents of 50-2000 Zipf-distributed made-up words, about "
        "7 KB each); the Parquet file is one row group, as pyarrow's default (about a million "
        "rows) makes it for a file this size; "
        "the text directory holds one file per document.",
        "",
        "| input | corpus MiB | limit MiB | corpus / limit | records | tokens | exit | seconds | "
        "cgroup peak "
        "MiB (page cache included) | max anonymous MiB (sampled) | max page cache MiB (sampled) "
        "| max sum of RSS MiB (sampled) | main process peak RSS MiB | largest worker peak RSS MiB "
        "| largest RSS of any process MiB (getrusage) | OOM kills | output checked |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in runs:
        check = run["check"]
        lines.append(
            f"| {run['label']} | {run['bytes'] / MIB:,.0f} | {run['limit_mib']} | "
            f"{run['bytes'] / (run['limit_mib'] * MIB):.1f}x | {run['records']:,} | "
            f"{check.get('tokens', 0):,} | {run['exit']} | {run['seconds']:.0f} | "
            f"{mib(run['cgroup_peak'])} | {mib(run['max_anon'])} | {mib(run['max_cache'])} | "
            f"{mib(run['max_rss_sum'])} | {mib(run['main_hwm'])} | {mib(run['worker_hwm'])} | "
            f"{mib(run['max_rss_any_process'])} | "
            f"{run['oom_kills']} | {verdict(run)} |")
    lines += [
        "",
        *growth_lines(runs),
        "Corpus MiB is the size on disk (the Parquet file is compressed with snappy; the label",
        "gives its text). Output checked: the manifest counts every record; the train and eval",
        "`.idx` document counts add up to the records; their lengths add up to the manifest's",
        f"token counts and to the `.bin` sizes; every {SAMPLE_EVERY}th record's document equals",
        "the tokenizer's",
        "own encoding (`tokenizer(text, add_special_tokens=True)`) plus EOS, at its place in its",
        "split.",
        "The RSS columns count shared pages (the interpreter, the libraries, the tokenizer the",
        "workers inherit) in every process, so their sum overstates what the processes use",
        "together; the anonymous column counts each page once. The peak RSS of each process",
        "(VmHWM) is read every 0.2 s while it runs; the getrusage column is exact (the largest",
        "of `prepare_data.py` and its workers, as a small launcher in the same cgroup that",
        "started it reads it; the launcher's own RSS, about "
        f"{max(run['launcher_hwm'] for run in runs) / MIB:.0f} MiB, counts in the cgroup too).",
        "",
        "## What stays in memory",
        "",
        "- Per document: 4 bytes (its length, in each split's `.idx` writer; 8 bytes in sft mode,",
        "  where the loss-mask writer keeps the lengths too), until the `.idx` is written at the",
        "  end, a block of 65,536 documents at a time. Nothing else grows with the records: the",
        "  document-length histogram has one counter per power of two, the held-out choice is a",
        "  hash of each record's position, the counts are numbers.",
        f"- Per input file: about {file_bytes:,.0f} bytes (its path, format and size, measured",
        "  with tracemalloc over the text directory above), for the order of the files and the",
        "  manifest's `sources` list. A corpus of a few large files costs nothing here; one of",
        "  millions of small text files costs this much per file.",
        "- Per chunk in flight: at most 2 x workers + 2 chunks of 256 records or 512 KB of text,",
        "  and a worker holds 30-60 bytes per byte of its chunk's text while it encodes it (1 MB",
        "  chunks took each worker's peak from 223 to 256 MiB and the JSON lines runs past",
        "  384 MiB; they were 9 % faster).",
        "- Per record: one record (one JSON line, one JSON list element, one Parquet batch of",
        "  64 rows read through a 1 MB buffer, one whole plain text file) is held whole and",
        "  tokenized whole, so the largest single document does set a floor: a 1 GB text file is",
        "  one 1 GB document.",
        "- The inputs are read as streams: JSON lines a line at a time, a JSON list an element",
        "  at a time (a broken element stops the read there), Parquet by batches through a",
        "  buffered reader, `datasets` directories memory-mapped by batches of 64 rows.",
        "",
        "Raw numbers:",
        "",
        "```json",
        json.dumps([{key: value for key, value in run.items()} for run in runs]),
        "```",
        "",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as report:
        report.write("\n".join(lines))
    print("\n".join(line for line in lines if line.startswith("|")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit-mib", type=int, default=384)
    parser.add_argument("--parquet-limit-mib", type=int,
                        help="the Parquet run's limit (default: --limit-mib)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jsonl-mb", type=float, nargs="*", default=[1280, 128])
    parser.add_argument("--parquet-mb", type=float, default=600, help="0: no Parquet run")
    parser.add_argument("--text-mb", type=float, default=64, help="0: no text directory run")
    parser.add_argument("--merge", action="store_true",
                        help="keep the runs of the existing report that this one does not make")
    parser.add_argument("--work", help="directory for the corpora and outputs (default: a "
                                       "temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and outputs")
    parser.add_argument("--report", default=os.path.join(ROOT, "reports",
                                                         "prepare-bounded-memory.md"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_bounded_memory.", dir=args.work)
    try:
        tokenizer_dir = os.path.join(work, "tokenizer")
        bench_prepare.trained_tokenizer(tokenizer_dir, Documents(99).batch(400))
        tokenizer = prepare_data.record_encoder.load_tokenizer(tokenizer_dir)
        plan = [("jsonl", f"{size:g} MB JSON lines", size) for size in args.jsonl_mb]
        if args.parquet_mb:
            plan.append(("parquet", f"{args.parquet_mb:g} MB Parquet, one row group",
                         args.parquet_mb))
        if args.text_mb:
            plan.append(("text", f"{args.text_mb:g} MB of text files", args.text_mb))
        # --work's directory is this machine's: the report shows it as DIR.
        argv = ["DIR" if args.work and a == args.work else a for a in sys.argv[1:]]
        command = " ".join(["prepare/bench_bounded_memory.py"] + argv)
        runs = []
        for number, (kind, label, size) in enumerate(plan):
            corpus = os.path.join(work, f"corpus{number}" + {"jsonl": ".jsonl", "parquet":
                                                             ".parquet", "text": ""}[kind])
            start = time.perf_counter()
            records, samples = write_corpus(kind, corpus, size, seed=number)
            print(f"{label}: {records} records written in {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
            limit_mib = (args.parquet_limit_mib or args.limit_mib if kind == "parquet"
                         else args.limit_mib)
            out = os.path.join(work, f"out{number}")
            run = run_prepare(corpus, tokenizer_dir, out, args.workers, limit_mib * MIB,
                              os.path.join(work, f"prepare{number}.log"),
                              f"bench-bounded-memory-{os.getpid()}-{number}")
            run.update(label=label, kind=kind, bytes=corpus_bytes(corpus), records=records,
                       limit_mib=limit_mib, command=command)
            if kind == "text":
                run["bytes_per_file"] = per_file_bytes(corpus)
            if run["exit"] == 0:
                try:
                    run["check"] = dict(check_output(out, records, samples, tokenizer),
                                        verdict="yes")
                except AssertionError as error:
                    run["check"] = {"verdict": f"FAILED: {error}"}
            else:
                with open(os.path.join(work, f"prepare{number}.log"), encoding="utf-8") as log:
                    # File paths cut to their names: the report says nothing of this machine.
                    tail = re.sub(r"(?:/[^/\s\"',]+)+/", "", log.read()[-300:])
                    run["check"] = {"verdict": "no output: " + tail.replace("\n", " ")}
            print(f"{label}: {json.dumps(run)}", file=sys.stderr, flush=True)
            runs.append(run)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(corpus, ignore_errors=True) if kind == "text" else os.remove(corpus)
        ok = all(run["exit"] == 0 and run["check"]["verdict"] == "yes" for run in runs)
        if args.merge:
            labels = {run["label"] for run in runs}
            runs = [run for run in previous_runs(args.report) if run["label"] not in labels] + runs
        write_report(args.report, args, runs)
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
