#!/usr/bin/env python3
"""prepare_data.py: turns a text corpus into the Megatron indexed datasets that ulysses-train reads
(megatron:OUT/train, megatron:OUT/eval), with the model's own tokenizer from a local directory.
Records are streamed in order to worker processes a chunk at a time and written as they come back,
so memory stays bounded whatever the corpus size and the output does not depend on --workers."""
import argparse
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # each worker process uses one core

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifest as manifest_lib  # noqa: E402
import record_encoder  # noqa: E402
import record_sources  # noqa: E402
from indexed_dataset import DTYPE_CODES, IndexedDatasetWriter  # noqa: E402
from staged_output import TOOL, OutputError, StagedOutput  # noqa: E402

VERSION = "1.0"
CHUNK_RECORDS = 256       # records per task handed to a worker
CHUNK_BYTES = 512 << 10   # ... or fewer, when their text passes this size (a worker's tokenizer
                          # holds 30-60 bytes per byte of a chunk's text while it encodes it)
UINT16_IDS = 1 << 16      # ids below this fit uint16

DESCRIPTION = """\
Tokenize a text corpus with a model's own tokenizer into the Megatron indexed datasets that
ulysses-train reads: OUT/train.bin + OUT/train.idx and a held-out OUT/eval.bin + OUT/eval.idx,
one sequence per document (pretrain) or per conversation (sft), with OUT/manifest.json describing
them. In sft mode OUT/train_loss_mask and OUT/eval_loss_mask hold, for every token, 1 where the
loss learns it (the assistant's tokens) and 0 elsewhere.

Inputs: JSON lines (.jsonl), JSON lists of records (.json), Parquet (.parquet), plain text files
(.txt, .text, .md: one document per file), directories of such files (read in sorted order) and
Hugging Face datasets directories written by save_to_disk. The tokenizer is read from local files
only (a model directory with tokenizer.json / tokenizer_config.json); nothing is downloaded."""

EPILOG = """\
examples:
  prepare_data.py corpus.jsonl --tokenizer models/llama --out data/corpus
  prepare_data.py chats.parquet --mode sft --tokenizer models/qwen --out data/chats
  prepare_data.py pairs.json --mode sft --prompt-field question --completion-field answer \\
      --tokenizer models/qwen --out data/pairs

then, in the run config:  data: {source: megatron:data/corpus/train}
                          eval: {source: megatron:data/corpus/eval}

A record that cannot be used (broken JSON, a missing or empty field, a conversation the chat
template refuses) stops the run with one line 'error: FILE:RECORD: what' and exit status 2, and
nothing is written; --skip-bad skips such records instead and counts them in the manifest.
Records are numbered from 1 in each file (in JSON lines files: the line number)."""


def usable_cpus():
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="prepare_data.py", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="files or directories to read, in this order")
    parser.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="local model directory holding the tokenizer files")
    parser.add_argument("--out", required=True, metavar="OUT",
                        help="output directory (must not exist or be empty, or be a previous "
                             "output of this command with --force)")
    parser.add_argument("--mode", choices=("pretrain", "sft"), default="pretrain",
                        help="pretrain: one document per record, the tokenizer's own special "
                             "tokens and EOS after each; sft: chat records through the "
                             "tokenizer's chat template with a loss mask (default: pretrain)")
    parser.add_argument("--text-field", default="text", metavar="NAME",
                        help="pretrain: the record field holding the document (default: text)")
    parser.add_argument("--messages-field", default="messages", metavar="NAME",
                        help="sft: the field holding the conversation, a list of {role, content} "
                             "messages (default: messages)")
    parser.add_argument("--prompt-field", default="", metavar="NAME",
                        help="sft: read prompt/completion pairs instead of conversations: the "
                             "prompt becomes the user's message")
    parser.add_argument("--completion-field", default="", metavar="NAME",
                        help="sft: with --prompt-field, the field that becomes the assistant's "
                             "message")
    parser.add_argument("--format", choices=("jsonl", "json", "parquet", "text"),
                        help="read every input file as this format (default: by file suffix)")
    parser.add_argument("--hf-split", metavar="NAME",
                        help="the split of a datasets directory holding several (default: train)")
    parser.add_argument("--eval-fraction", type=float, default=0.01, metavar="F",
                        help="share of the records held out for evaluation, chosen by a hash of "
                             "each record's position (default: 0.01)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the held-out choice (default: 0)")
    parser.add_argument("--workers", type=int, default=usable_cpus(),
                        metavar="N", help="tokenizing processes (default: the CPUs this process "
                                          "may use)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip records that cannot be used and count them, instead of "
                             "stopping")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT when it holds a previous output of this command")
    args = parser.parse_args(argv)
    if not 0.0 <= args.eval_fraction < 1.0:
        parser.error("--eval-fraction must be in [0, 1)")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if bool(args.prompt_field) != bool(args.completion_field):
        parser.error("--prompt-field and --completion-field go together")
    if args.prompt_field and args.mode != "sft":
        parser.error("--prompt-field and --completion-field need --mode sft")
    return args


def is_eval(index, seed, fraction):
    """Whether record `index` (0-based over all inputs) is held out: a hash, so the choice does not
    depend on the worker count or on which other records are bad."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2.0 ** 64


class Progress:
    """A line on stderr at most once a second: records read, tokens written, tokens/s."""

    def __init__(self):
        self.start = self.last = time.monotonic()

    def update(self, records, tokens):
        now = time.monotonic()
        if now - self.last >= 1.0:
            self.last = now
            rate = tokens / max(now - self.start, 1e-9)
            print(f"prepare: {records} records, {tokens} tokens, {rate:,.0f} tokens/s",
                  file=sys.stderr, flush=True)


def load_tokenizer(args):
    directory = args.tokenizer
    if not os.path.isdir(directory):
        raise record_sources.InputError(f"{directory}: no such tokenizer directory")
    if not any(os.path.isfile(os.path.join(directory, name))
               for name in ("tokenizer.json", "tokenizer_config.json")):
        raise record_sources.InputError(
            f"{directory}: no tokenizer.json or tokenizer_config.json in the tokenizer directory")
    try:
        tokenizer = record_encoder.load_tokenizer(directory)
    except Exception as error:  # transformers raises many types for files it cannot use
        raise record_sources.InputError(
            f"{directory}: cannot load the tokenizer: {record_encoder.one_line(error)}") from None
    if args.mode == "pretrain" and tokenizer.eos_token_id is None:
        raise record_sources.InputError(f"{directory}: the tokenizer has no EOS token")
    return tokenizer


def chat_template_of(tokenizer, directory):
    try:
        return tokenizer.get_chat_template()
    except Exception as error:
        raise record_sources.InputError(
            f"{directory}: no usable chat template: {record_encoder.one_line(error)}") from None


def id_count(tokenizer):
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=0) + 1)


def text_size(payload):
    """The characters (or bytes) of text a record's payload carries, however nested."""
    size, pending = 0, [payload]
    while pending:
        value = pending.pop()
        if isinstance(value, (bytes, str)):
            size += len(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        else:
            size += 8
    return size


def chunked(sources, fields, hf_split):
    """Yields ([(source path, record number)], [(kind, payload)]) chunks over all sources."""
    metas, payloads, size = [], [], 0
    for source in sources:
        try:
            for number, kind, payload in record_sources.iter_records(source, fields, hf_split):
                metas.append((source.path, number))
                payloads.append((kind, payload))
                size += text_size(payload)
                if len(payloads) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
                    yield metas, payloads
                    metas, payloads, size = [], [], 0
        except record_sources.BrokenSource as error:
            raise record_sources.InputError(
                f"{source.path}:{error.record_number}: {error.message}") from None
    if payloads:
        yield metas, payloads


def ordered_results(chunks, workers, config, tokenizer):
    """Yields (metas, ChunkResult) in input order, with at most 2 * workers + 2 chunks in flight
    (Pool.imap would read the whole corpus ahead into its task queue)."""
    record_encoder.init_worker(config, tokenizer)
    if workers == 1:
        for metas, payloads in chunks:
            yield metas, record_encoder.encode_chunk(payloads)
        return
    # The workers start with SIGTERM's default action (the pool stops them so) and ignore
    # SIGINT (Ctrl-C reaches the parent, which stops them).
    in_main_thread = threading.current_thread() is threading.main_thread()
    saved = {signum: signal.signal(signum, action) if in_main_thread else None
             for signum, action in ((signal.SIGTERM, signal.SIG_DFL),
                                    (signal.SIGINT, signal.SIG_IGN))}
    try:
        if "fork" in multiprocessing.get_all_start_methods():  # children inherit the tokenizer
            pool = multiprocessing.get_context("fork").Pool(workers)
        else:
            pool = multiprocessing.get_context().Pool(
                workers, initializer=record_encoder.init_worker, initargs=(config,))
    finally:
        for signum, action in saved.items():
            if action is not None:
                signal.signal(signum, action)
    pending = deque()
    try:
        for metas, payloads in chunks:
            pending.append((metas, pool.apply_async(record_encoder.encode_chunk, (payloads,))))
            if len(pending) >= 2 * workers + 2:
                metas_done, result = pending.popleft()
                yield metas_done, result.get()
        while pending:
            metas_done, result = pending.popleft()
            yield metas_done, result.get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the staging directory is removed


def prepare(args, tokenizer, sources, staged):
    """Writes the datasets and the manifest into the staging directory; returns the manifest."""
    sft = args.mode == "sft"
    ids = id_count(tokenizer)
    dtype_name = "uint16" if ids <= UINT16_IDS else "int32"
    use_markers = True
    template = None
    if sft:
        template = chat_template_of(tokenizer, args.tokenizer)
        use_markers = bool(record_encoder.GENERATION_MARKER.search(template))
    config = record_encoder.EncodeConfig(
        tokenizer_dir=os.path.abspath(args.tokenizer), mode=args.mode, text_field=args.text_field,
        messages_field=args.messages_field, prompt_field=args.prompt_field,
        completion_field=args.completion_field, token_dtype=dtype_name, use_markers=use_markers)
    fields = ([args.text_field] if not sft else [args.prompt_field, args.completion_field]
              if args.prompt_field else [args.messages_field])

    splits = ("train", "eval")
    tokens = {split: IndexedDatasetWriter(staged.path(split), dtype_name) for split in splits}
    masks = ({split: IndexedDatasetWriter(staged.path(f"{split}_loss_mask"), "uint8")
              for split in splits} if sft else {})
    counts = {"records": 0, "documents": dict.fromkeys(splits, 0),
              "tokens": dict.fromkeys(splits, 0)}
    if sft:
        counts["masked_in_tokens"] = dict.fromkeys(splits, 0)
    skipped = {}
    histogram = manifest_lib.LengthHistogram()
    progress = Progress()
    results = None
    try:
        results = ordered_results(chunked(sources, fields, args.hf_split), args.workers, config,
                                  tokenizer)
        for metas, result in results:
            first_index = counts["records"]
            counts["records"] += len(metas)
            for position, reason, message in result.failures:
                if not args.skip_bad:
                    path, number = metas[position]
                    raise record_sources.InputError(f"{path}:{number}: {message}")
                skipped[reason] = skipped.get(reason, 0) + 1
            used = result.lengths >= 0
            held_out = np.array([is_eval(first_index + position, args.seed, args.eval_fraction)
                                 for position in range(len(metas))], dtype=bool)
            lengths = result.lengths[used]
            token_held_out = np.repeat(held_out[used], lengths)
            for split, in_split, token_in_split in (
                    ("train", ~held_out[used], ~token_held_out),
                    ("eval", held_out[used], token_held_out)):
                tokens[split].add(result.tokens[token_in_split], lengths[in_split])
                counts["documents"][split] += int(in_split.sum())
                counts["tokens"][split] += int(lengths[in_split].sum())
                if sft:
                    split_masks = result.masks[token_in_split]
                    masks[split].add(split_masks, lengths[in_split])
                    counts["masked_in_tokens"][split] += int(split_masks.sum())
            histogram.add(lengths)
            progress.update(counts["records"], sum(counts["tokens"].values()))
        for writer in list(tokens.values()) + list(masks.values()):
            writer.finish()
    finally:
        if results is not None:
            results.close()  # stops the worker processes
        for writer in list(tokens.values()) + list(masks.values()):
            writer.close()
    counts["skipped"] = dict(sorted(skipped.items()))
    if not sum(counts["documents"].values()):
        reasons = "".join(f", {reason} {count}" for reason, count in counts["skipped"].items())
        raise record_sources.InputError(
            f"{' '.join(args.inputs)}: no usable record ({counts['records']} read{reasons})")
    return write_manifest(args, tokenizer, ids, sources, staged, counts, histogram, dtype_name,
                          template, use_markers)


def write_manifest(args, tokenizer, ids, sources, staged, counts, histogram, dtype_name, template,
                   use_markers):
    """OUT/manifest.json (in the staging directory); returns it."""
    sft = args.mode == "sft"
    names = manifest_lib.tokenizer_files(args.tokenizer)
    tokenizer_entry = {
        "path": os.path.abspath(args.tokenizer),
        "sha256": manifest_lib.tokenizer_sha256(args.tokenizer, names),
        "files": names,
        "class": type(tokenizer).__name__,
        "ids": ids,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if sft:
        tokenizer_entry["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()
        tokenizer_entry["assistant_mask"] = ("generation markers" if use_markers
                                             else "rendered prefixes")
    manifest = manifest_lib.build_manifest(
        tool=TOOL, version=VERSION, args=args, tokenizer=tokenizer_entry, sources=sources,
        counts=counts, histogram=histogram,
        dtype={"name": dtype_name, "code": DTYPE_CODES[dtype_name]}, out=args.out, has_masks=sft)
    with open(staged.path("manifest.json"), "w", encoding="utf-8") as manifest_file:
        json.dump(manifest, manifest_file, indent=2)
        manifest_file.write("\n")
    return manifest


def run(args):
    sources = record_sources.discover(args.inputs, args.format)
    if args.mode == "sft":
        text_sources = [source.path for source in sources if source.kind == "text"]
        if text_sources:
            raise record_sources.InputError(
                f"{text_sources[0]}: a plain text file holds no chat records (--mode sft reads "
                "JSON lines, JSON, Parquet or datasets directories)")
    tokenizer = load_tokenizer(args)
    start = time.monotonic()
    staged = StagedOutput(args.out, args.force)
    try:
        manifest = prepare(args, tokenizer, sources, staged)
        staged.commit()
    finally:
        staged.discard()
    counts = manifest["counts"]
    if counts["skipped"]:
        reasons = ", ".join(f"{reason} {count}" for reason, count in counts["skipped"].items())
        print(f"prepare: skipped {sum(counts['skipped'].values())} of {counts['records']} "
              f"records ({reasons})", file=sys.stderr)
    documents, tokens = counts["documents"], counts["tokens"]
    seconds = time.monotonic() - start
    rate = (tokens["train"] + tokens["eval"]) / max(seconds, 1e-9)
    print(f"prepare: wrote {args.out}: {documents['train']} train and {documents['eval']} eval "
          f"documents, {tokens['train']} and {tokens['eval']} tokens ({manifest['dtype']}) in "
          f"{seconds:.2f} s, {rate:,.0f} tokens/s", file=sys.stderr)
    for key, value in manifest["run_config"].items():
        print(f"{key}: {value}")
    return 0


def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except (record_sources.InputError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {error.filename or args.out}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    sys.exit(main())
