"""Input discovery and record streaming for prepare_data.py: JSON lines, JSON lists, Parquet, plain
text files, directories of those, and `datasets` directories (save_to_disk), read a batch at a time
so that memory stays bounded whatever the corpus size."""
import json
import os
from dataclasses import dataclass

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet",)
TEXT_SUFFIXES = (".txt", ".text", ".md")
KNOWN_SUFFIXES = JSON_LINES_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES + TEXT_SUFFIXES
ROW_BATCH = 64  # rows per Parquet / datasets read (held at once, as Python objects)
PARQUET_READ_BUFFER = 1 << 20  # a Parquet column chunk is read through a buffer of this size,
# not whole and not all of a row group's ahead (pre_buffer): a row group's column can be gigabytes
JSON_READ = 256 << 10  # characters of a JSON list read at a time (more for a longer element)
JSON_CUT_MARGIN = 16  # a JSON error this close to the end of what has been read may be the cut


class InputError(Exception):
    """Bad input that stops the whole run: one line, already naming the file."""


class BrokenSource(Exception):
    """A source that cannot be read past record `record_number` (a broken JSON list)."""

    def __init__(self, record_number, message):
        super().__init__(message)
        self.record_number = record_number
        self.message = message


# Record kinds handed to the encoders: "json_line" (the raw bytes of one JSON line, parsed by a
# worker), "record" (a parsed object: dict or anything else, which the encoder refuses) and
# "text" (the raw bytes of a whole plain-text document).
@dataclass
class Source:
    path: str    # as the user named it (or as found under a named directory)
    kind: str    # jsonl | json | parquet | text | datasets
    size: int    # bytes on disk (all files of a datasets directory)


def is_datasets_dir(path):
    names = set(os.listdir(path))
    return "dataset_dict.json" in names or {"dataset_info.json", "state.json"} <= names


def _file_kind(path):
    lower = path.lower()
    for suffixes, kind in ((JSON_LINES_SUFFIXES, "jsonl"), (JSON_SUFFIXES, "json"),
                           (PARQUET_SUFFIXES, "parquet"), (TEXT_SUFFIXES, "text")):
        if lower.endswith(suffixes):
            return kind
    return None


def _tree_size(path):
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total


def discover(inputs, forced_kind=None):
    """The sources named by `inputs` (files and directories), in order; a directory's files sorted
    by path, hidden ones and unknown suffixes left out. Raises InputError for a missing path, an
    unknown suffix named directly, or no input file at all."""
    sources = []
    for path in inputs:
        if not os.path.exists(path):
            raise InputError(f"{path}: no such file or directory")
        if os.path.isdir(path):
            if is_datasets_dir(path):
                sources.append(Source(path, "datasets", _tree_size(path)))
                continue
            found = []
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in files:
                    full = os.path.join(root, name)
                    kind = forced_kind or _file_kind(name)
                    if not name.startswith(".") and kind:
                        found.append(Source(full, kind, os.path.getsize(full)))
            if not found:
                raise InputError(f"{path}: no input files (known suffixes: "
                                 f"{' '.join(KNOWN_SUFFIXES)})")
            sources.extend(sorted(found, key=lambda source: source.path))
            continue
        kind = forced_kind or _file_kind(path)
        if kind is None:
            raise InputError(f"{path}: unknown input format (use --format, or name it "
                             f"{' '.join(KNOWN_SUFFIXES)})")
        sources.append(Source(path, kind, os.path.getsize(path)))
    return sources


def iter_records(source, fields, hf_split=None):
    """Yields (record_number, kind, payload) for each record of `source`, numbered from 1 (JSON
    lines: the line number; blank lines are skipped). `fields` are the record fields the encoder
    reads (the rest are dropped before records travel to the workers)."""
    if source.kind == "jsonl":
        yield from _iter_json_lines(source.path)
    elif source.kind == "json":
        for number, value in _iter_json_list(source.path):
            yield number, "record", _select(value, fields)
    elif source.kind == "text":
        with open(source.path, "rb") as text_file:
            yield 1, "text", text_file.read()
    elif source.kind == "parquet":
        yield from _iter_parquet(source.path, fields)
    elif source.kind == "datasets":
        yield from _iter_datasets(source.path, fields, hf_split)
    else:
        raise AssertionError(source.kind)


def _select(value, fields):
    if isinstance(value, dict):
        return {name: value[name] for name in fields if name in value}
    return value


def _iter_json_lines(path):
    with open(path, "rb") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, "json_line", line


def _iter_json_list(path):
    """Streams the elements of a JSON list without reading the whole file at once."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as json_file:
        buffer, at, eof = "", 0, False

        def fill():
            nonlocal buffer, at, eof
            try:
                chunk = json_file.read(max(JSON_READ, len(buffer) - at))
            except UnicodeDecodeError:
                raise BrokenSource(number + 1, "not valid UTF-8 text") from None
            eof = not chunk
            buffer, at = buffer[at:] + chunk, 0

        def next_char():
            nonlocal at
            while True:
                while at < len(buffer) and buffer[at].isspace():
                    at += 1
                if at < len(buffer) or eof:
                    return buffer[at] if at < len(buffer) else ""
                fill()

        number = 0
        if next_char() != "[":
            raise BrokenSource(1, "not a JSON list of records")
        at += 1
        while True:
            char = next_char()
            if char == "]":
                break
            if number > 0:
                if char != ",":
                    raise BrokenSource(number + 1, "invalid JSON: expected ',' or ']'")
                at += 1
                next_char()
            number += 1
            while True:
                try:
                    value, end = decoder.raw_decode(buffer, at)
                    if end < len(buffer) or eof:
                        break
                except json.JSONDecodeError as error:
                    if eof or not _may_be_cut(error, len(buffer)):
                        raise BrokenSource(number, f"invalid JSON: {error.msg}") from None
                fill()
            yield number, value
            at = end
        at += 1
        if next_char() != "":
            raise BrokenSource(number + 1, "invalid JSON: text after the list")


def _may_be_cut(error, read):
    """Whether a JSON error in a buffer of `read` characters may come from the buffer ending in
    the middle of the record (read more and decode again) rather than from the record itself (stop
    now, without reading the rest of the file)."""
    return error.msg.startswith("Unterminated string") or error.pos >= read - JSON_CUT_MARGIN


def _iter_parquet(path, fields):
    import pyarrow.parquet as parquet
    try:
        parquet_file = parquet.ParquetFile(path, buffer_size=PARQUET_READ_BUFFER,
                                           pre_buffer=False)
    except Exception as error:  # pyarrow raises several types for a file it cannot read
        raise InputError(f"{path}: not a readable Parquet file: {error}") from None
    present = [name for name in fields if name in parquet_file.schema_arrow.names]
    number = 0
    for batch in parquet_file.iter_batches(batch_size=ROW_BATCH, columns=present):
        for row in batch.to_pylist():
            number += 1
            yield number, "record", row
    if number == 0 and parquet_file.metadata.num_rows > 0:  # no column asked for is present
        for _ in range(parquet_file.metadata.num_rows):
            number += 1
            yield number, "record", {}


def _iter_datasets(path, fields, hf_split):
    import datasets
    loaded = datasets.load_from_disk(path)
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded.keys())
        if hf_split is None:
            hf_split = "train" if "train" in splits else (splits[0] if len(splits) == 1 else None)
        if hf_split not in loaded:
            raise InputError(f"{path}: choose a split with --hf-split ({', '.join(splits)})")
        loaded = loaded[hf_split]
    present = [name for name in fields if name in loaded.column_names]
    number = 0
    if not present:
        for _ in range(loaded.num_rows):
            number += 1
            yield number, "record", {}
        return
    for batch in loaded.select_columns(present).iter(batch_size=ROW_BATCH):
        for row in zip(*(batch[name] for name in present)):
            number += 1
            yield number, "record", dict(zip(present, row))
