#!/usr/bin/env python3
"""Throughput of prepare_data.py against the tokenizer's batch encoding alone, on the same corpus
with the same number of cores, written to a markdown report.

  ours:      prepare_data.py CORPUS --workers N (pretrain): read JSON lines, tokenize, split,
             write .bin/.idx and the manifest; the tokens/s it reports over its work (after the
             tokenizer is loaded) and over the whole command (with interpreter start-up)
  baseline:  the same tokenizer's batch call, tokenizer(texts, add_special_tokens=True), over the
             same documents already in memory, in batches of 1000, its own Rust threads limited
             to N (RAYON_NUM_THREADS=N), plus one EOS per document so both count the same tokens

Without --tokenizer/--corpus it builds both: a byte-level BPE (8192 ids) trained on a generated
corpus of Zipf-distributed words (seeded; the same text on every machine).

  bench_prepare.py [--workers N] [--megabytes 24] [--tokenizer DIR --corpus FILE.jsonl]
                   [--report reports/prepare-throughput.md]"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

BASELINE = r"""
import json, sys, time
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
with open(sys.argv[2], "rb") as lines:
    texts = [json.loads(line)["text"] for line in lines if line.strip()]
start = time.perf_counter()
tokens = 0
for at in range(0, len(texts), 1000):
    tokens += sum(len(ids) + 1 for ids in tokenizer(texts[at:at + 1000],
                                                    add_special_tokens=True)["input_ids"])
print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}))
"""


def generated_corpus(path, megabytes, seed=0):
    """JSON lines of documents of 50-2000 words drawn from 20000 made-up words (Zipf)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    vocabulary = ["".join(rng.choices(letters, weights=range(26, 0, -1), k=rng.randint(1, 10)))
                  for _ in range(20000)]
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
    written = 0
    texts = []
    with open(path, "w", encoding="utf-8") as out:
        while written < megabytes * 2 ** 20:
            words = rng.choices(vocabulary, weights, k=rng.randint(50, 2000))
            sentences = [" ".join(words[i:i + 15]).capitalize() + "." for i in range(0, len(words),
                                                                                 15)]
            line = json.dumps({"text": " ".join(sentences)}) + "\n"
            out.write(line)
            written += len(line)
            if len(texts) < 400:
                texts.append(" ".join(sentences))
    return texts


def trained_tokenizer(directory, texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8192, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                            eos_token="</s>").save_pretrained(directory)


def measure_ours(corpus, tokenizer, out, workers):
    command = [sys.executable, os.path.join(HERE, "prepare_data.py"), corpus, "--tokenizer",
               tokenizer, "--out", out, "--workers", str(workers), "--force"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: prepare_data.py failed: {done.stderr.strip()}")
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as manifest_file:
        manifest = json.load(manifest_file)
    tokens = sum(manifest["counts"]["tokens"].values())
    work_seconds = float(re.search(r" in ([0-9.]+) s, ", done.stderr).group(1))
    return {"tokens": tokens, "work_seconds": work_seconds, "wall_seconds": wall}


def measure_baseline(corpus, tokenizer, workers):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true" if workers > 1 else "false",
               RAYON_NUM_THREADS=str(workers))
    done = subprocess.run([sys.executable, "-c", BASELINE, tokenizer, corpus],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"error: baseline failed: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--megabytes", type=float, default=24)
    parser.add_argument("--tokenizer", help="a local model directory (default: build one)")
    parser.add_argument("--corpus", help="JSON lines with a 'text' field (default: generate)")
    parser.add_argument("--report", default=os.path.join(ROOT, "reports",
                                                         "prepare-throughput.md"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_prepare.")
    corpus = args.corpus or os.path.join(work, "corpus.jsonl")
    tokenizer = args.tokenizer or os.path.join(work, "tokenizer")
    if not args.corpus:
        sample = generated_corpus(corpus, args.megabytes)
    if not args.tokenizer:
        trained_tokenizer(tokenizer, sample)
    baseline = measure_baseline(corpus, tokenizer, args.workers)
    ours = measure_ours(corpus, tokenizer, os.path.join(work, "out"), args.workers)
    if ours["tokens"] != baseline["tokens"]:
        sys.exit(f"error: token counts differ: ours {ours['tokens']}, baseline "
                 f"{baseline['tokens']}")
    baseline_rate = baseline["tokens"] / baseline["seconds"]
    work_rate = ours["tokens"] / ours["work_seconds"]
    wall_rate = ours["tokens"] / ours["wall_seconds"]
    command = " ".join(["prepare/bench_prepare.py"] + sys.argv[1:])
    size_mb = os.path.getsize(corpus) / 2 ** 20
    lines = [
        "# prepare_data.py throughput",
        "",
        "Tokens per second of `prepare/prepare_data.py` (pretrain mode: read JSON lines, tokenize,",
        "split off the held-out records, write the Megatron `.bin`/`.idx` files and the manifest)",
        "against the tokenizer's own batch call alone (`tokenizer(texts, add_special_tokens=True)`",
        "over the same documents already in memory, batches of 1000, its Rust threads limited to",
        "the same count), on the same corpus with the same number of cores. Both count the same",
        "tokens (the documents' ids plus one EOS each).",
        "",
        f"Command: `.venv/bin/python {command}`",
        "",
        f"Machine: {len(os.sched_getaffinity(0))} CPU cores available to the process "
        f"({os.cpu_count()} in the machine), shared with other work while it ran; "
        f"--workers {args.workers}.",
        "",
        f"Corpus: {size_mb:.1f} MB of JSON lines "
        f"({'generated: Zipf-distributed made-up words, seed 0' if not args.corpus else 'given'}),"
        f" {ours['tokens']:,} tokens; tokenizer: "
        f"{'a byte-level BPE with 8192 ids trained on it' if not args.tokenizer else 'given'}.",
        "",
        "| measured | seconds | tokens/s | ratio to the tokenizer alone |",
        "|---|---:|---:|---:|",
        f"| tokenizer batch call alone | {baseline['seconds']:.2f} | {baseline_rate:,.0f} | 1.00 |",
        f"| prepare_data.py, its work (after loading the tokenizer) | {ours['work_seconds']:.2f} "
        f"| {work_rate:,.0f} | {work_rate / baseline_rate:.2f} |",
        f"| prepare_data.py, whole command (with Python start-up and imports) | "
        f"{ours['wall_seconds']:.2f} | {wall_rate:,.0f} | {wall_rate / baseline_rate:.2f} |",
        "",
        "Raw numbers:",
        "",
        "```json",
        json.dumps({"baseline": baseline, "ours": ours, "workers": args.workers}),
        "```",
        "",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(args.report, "w", encoding="utf-8") as report:
        report.write("\n".join(lines))
    print("\n".join(lines[16:21]))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
