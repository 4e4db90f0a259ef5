#!/usr/bin/env python3
"""prepare/prepare_data.py against the tokenizer's own encodings: a tiny byte-level BPE trained on
the fixture text (the `tokenizers` library, nothing downloaded), wrapped by transformers and saved
with a chat template that has {% generation %} markers (and a copy without them).

  pretrain     every document of train/eval == tokenizer(text) + EOS, read back from .bin/.idx
  formats      JSON, JSON lines, Parquet, a text directory, a datasets directory: the same bytes
  determinism  two runs, and --workers 1 vs 2: the same bytes
  sft          tokens and loss masks == apply_chat_template(..., return_assistant_tokens_mask=True)
               for every conversation; prompt/completion pairs == their user/assistant chat
  fallback     a template without markers that renders the same: the same tokens and masks;
               one whose prefixes render differently is refused
  bad input    each kind: exit 2, one line 'error: FILE:RECORD: ...', nothing written
  skip-bad     the same records skipped and counted by reason
  out dir      a user's directory is refused and left untouched; a previous output needs --force
  cli          the script as users run it: --help, exit status 2 without a traceback
  memory       in each input format, peak RSS of a corpus 4x larger grows by less than a small
               margin; a broken JSON list element stops the read; a .idx written in blocks
  int32        a tokenizer with more than 65536 ids writes int32
  trainer      with --bin (the build's bin folder holding ulysses-train): one training step reads
               the pretrain and SFT token datasets as data.source / eval.source (skipped without)

  prepare_test.py [--bin BUILD/bin] [--keep]      (exit 0 when every check holds)"""
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "prepare", "prepare_data.py")
sys.path.insert(0, os.path.dirname(SCRIPT))

import numpy as np  # noqa: E402

import prepare_data  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
TURNS = """{% for m in messages %}{% if m['role'] == 'user' %}<|user|>
{{ m['content'] }}<|end|>
{% elif m['role'] == 'system' %}<|system|>
{{ m['content'] }}<|end|>
{% elif m['role'] == 'assistant' %}<|assistant|>
{% generation %}{{ m['content'] }}<|end|>
{% endgeneration %}{% else %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}\
{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}"""
MARKED_TEMPLATE = TURNS
PLAIN_TEMPLATE = TURNS.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# The last assistant turn renders differently from the same turn inside a longer conversation.
UNPREFIXED_TEMPLATE = PLAIN_TEMPLATE.replace("<|end|>\n{% elif m['role'] == 'system'",
                                             "{% if loop.last %}!{% endif %}<|end|>\n"
                                             "{% elif m['role'] == 'system'")
# ChatML as Qwen-style templates write it: whitespace control, a default system message, the
# generation block opened inside the turn's header line.
CHATML_TEMPLATE = """\
{%- if messages[0]['role'] != 'system' %}{{ '<|system|>\\nYou are helpful.<|end|>\\n' }}{% endif %}
{%- for m in messages %}
  {%- if m['role'] == 'assistant' %}
    {{- '<|assistant|>\\n' }}
    {%- generation %}
      {{- (m['content'] | trim) + '<|end|>\\n' }}
    {%- endgeneration %}
  {%- else %}
    {{- '<|' + m['role'] + '|>\\n' + (m['content'] | trim) + '<|end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"""
WORDS = ("the a model learns long context attention sequence token shard rank gradient loss "
         "über naïve 数据 données 🙂 step batch").split()


def sentence(rng, low, high):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def make_fixture(root):
    """Writes the model directories and returns (texts, chats)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    rng = random.Random(7)
    texts = [sentence(rng, 1, 80) for _ in range(48)]
    texts[3] = "line one\nline two\n\n  indented\t tab"
    chats = []
    for index in range(32):
        messages = [{"role": "system", "content": sentence(rng, 1, 6)}] if index % 3 == 0 else []
        for _ in range(1 + index % 3):
            messages.append({"role": "user", "content": sentence(rng, 1, 12)})
            messages.append({"role": "assistant", "content": sentence(rng, 1, 20)})
        chats.append(messages)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=500, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    chatml_plain = (CHATML_TEMPLATE.replace("{%- generation %}", "")
                    .replace("{%- endgeneration %}", ""))
    for name, template in (("marked", MARKED_TEMPLATE), ("plain", PLAIN_TEMPLATE),
                           ("unprefixed", UNPREFIXED_TEMPLATE), ("chatml", CHATML_TEMPLATE),
                           ("chatml_plain", chatml_plain)):
        wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                                          eos_token="</s>", unk_token="<unk>")
        wrapped.chat_template = template
        wrapped.save_pretrained(os.path.join(root, name))
    return texts, chats


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def read_indexed(prefix):
    """[documents] arrays of a Megatron indexed dataset, read with numpy."""
    with open(prefix + ".idx", "rb") as idx_file:
        raw = idx_file.read()
    assert raw[:9] == b"MMIDIDX\x00\x00", prefix
    version, code, count, doc_count = np.frombuffer(raw[9:9 + 8], "<u8")[0], raw[17], \
        *np.frombuffer(raw[18:34], "<u8")
    assert version == 1 and doc_count == count + 1, (prefix, version, count, doc_count)
    at = 34
    lengths = np.frombuffer(raw, "<i4", count, at)
    pointers = np.frombuffer(raw, "<i8", count, at + 4 * count)
    documents = np.frombuffer(raw, "<i8", doc_count, at + 12 * count)
    assert at + 12 * count + 8 * doc_count == len(raw), prefix
    assert list(documents) == list(range(count + 1)), prefix
    dtype = {1: np.uint8, 4: np.int32, 8: np.uint16}[code]
    data = np.fromfile(prefix + ".bin", dtype)
    itemsize = np.dtype(dtype).itemsize
    assert data.nbytes == int(lengths.sum()) * itemsize, prefix
    return code, [data[p // itemsize:p // itemsize + n].tolist() for p, n in zip(pointers, lengths)]


def run_tool(*args):
    """prepare_data.main in this process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = prepare_data.main([str(arg) for arg in args])
    return status, err.getvalue()


def output_bytes(out):
    names = sorted(name for name in os.listdir(out) if name != "manifest.json")
    return {name: open(os.path.join(out, name), "rb").read() for name in names}


def manifest_of(out):
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as manifest_file:
        return json.load(manifest_file)


def split_of(count, fraction):
    return [prepare_data.is_eval(index, 0, fraction) for index in range(count)]


class Suite:
    def __init__(self, work):
        self.work = work
        self.texts, self.chats = make_fixture(work)
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(os.path.join(work, "marked"),
                                                       local_files_only=True)
        self.marked = os.path.join(work, "marked")
        self.jsonl = write_jsonl(os.path.join(work, "corpus.jsonl"),
                                 [{"text": text, "id": i} for i, text in enumerate(self.texts)])
        self.chat_jsonl = write_jsonl(os.path.join(work, "chats.jsonl"),
                                      [{"messages": chat} for chat in self.chats])
        self.start_memory_run()

    def out(self, name):
        return os.path.join(self.work, "out", name)

    def prepare(self, name, *args, tokenizer=None, expect=0):
        out = self.out(name)
        status, err = run_tool(*args, "--tokenizer", tokenizer or self.marked, "--out", out,
                               "--workers", "1" if "--workers" not in args else args[-1])
        assert status == expect, f"{name}: exit {status}, expected {expect}: {err}"
        return out, err

    # --- the cases
    def case_pretrain(self):
        out, _ = self.prepare("pretrain", self.jsonl, "--eval-fraction", "0.2")
        held_out = split_of(len(self.texts), 0.2)
        assert 0 < sum(held_out) < len(self.texts)
        eos = self.tokenizer.eos_token_id
        expected = {"train": [], "eval": []}
        for text, is_eval in zip(self.texts, held_out):
            ids = self.tokenizer(text)["input_ids"]
            assert ids[0] == self.tokenizer.bos_token_id
            expected["eval" if is_eval else "train"].append(ids + [eos])
        for split in ("train", "eval"):
            code, documents = read_indexed(os.path.join(out, split))
            assert code == 8, code
            assert documents == expected[split], split
        manifest = manifest_of(out)
        counts = manifest["counts"]
        assert counts["records"] == len(self.texts)
        assert counts["documents"] == {"train": len(expected["train"]),
                                       "eval": len(expected["eval"])}
        assert sum(h["documents"] for h in manifest["document_length_histogram"]) == len(
            self.texts)
        assert manifest["run_config"] == {"data.source": "megatron:" + os.path.join(out, "train"),
                                          "eval.source": "megatron:" + os.path.join(out, "eval")}
        assert manifest["dtype"] == "uint16" and manifest["dtype_code"] == 8
        assert len(manifest["tokenizer"]["sha256"]) == 64

    def case_formats(self):
        import datasets
        import pyarrow
        import pyarrow.parquet
        datasets.disable_progress_bars()
        reference, _ = self.prepare("jsonl", self.jsonl, "--eval-fraction", "0.2")
        records = [{"text": text, "id": i} for i, text in enumerate(self.texts)]
        json_path = os.path.join(self.work, "corpus.json")
        with open(json_path, "w", encoding="utf-8") as json_file:
            json.dump(records, json_file, indent=1, ensure_ascii=False)
        parquet_path = os.path.join(self.work, "corpus.parquet")
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), parquet_path,
                                    row_group_size=10)
        text_dir = os.path.join(self.work, "texts")
        os.makedirs(os.path.join(text_dir, "sub"))
        for i, text in enumerate(self.texts):  # sorted order: 00..39 then sub/40..47
            folder = text_dir if i < 40 else os.path.join(text_dir, "sub")
            with open(os.path.join(folder, f"{i:02d}.txt"), "w", encoding="utf-8") as text_file:
                text_file.write(text)
        with open(os.path.join(text_dir, ".hidden.txt"), "w") as hidden:
            hidden.write("not read")
        hf_dir = os.path.join(self.work, "hf")
        datasets.Dataset.from_list(records).save_to_disk(hf_dir)
        split_dir = os.path.join(self.work, "split")
        os.makedirs(split_dir)
        write_jsonl(os.path.join(split_dir, "a.jsonl"), records[:20])
        write_jsonl(os.path.join(split_dir, "b.jsonl"), records[20:])
        for name, path in (("json", json_path), ("parquet", parquet_path), ("text_dir", text_dir),
                           ("datasets", hf_dir), ("jsonl_dir", split_dir)):
            out, _ = self.prepare(name, path, "--eval-fraction", "0.2")
            assert output_bytes(out) == output_bytes(reference), name
            assert manifest_of(out)["counts"] == manifest_of(reference)["counts"], name

    def case_determinism(self):
        first, _ = self.prepare("det1", self.chat_jsonl, "--mode", "sft", "--eval-fraction",
                                "0.2")
        again, _ = self.prepare("det2", self.chat_jsonl, "--mode", "sft", "--eval-fraction",
                                "0.2")
        two, _ = self.prepare("det3", self.chat_jsonl, "--mode", "sft", "--eval-fraction",
                              "0.2", "--workers", "2")
        assert output_bytes(first) == output_bytes(again), "two runs differ"
        assert output_bytes(first) == output_bytes(two), "--workers 2 differs from 1"
        strip = lambda manifest: {k: v for k, v in manifest.items() if k != "run_config"}
        assert strip(manifest_of(first)) == strip(manifest_of(two))
        pretrain_two, _ = self.prepare("det4", self.jsonl, "--eval-fraction", "0.2",
                                       "--workers", "2")
        pretrain_one, _ = self.prepare("det5", self.jsonl, "--eval-fraction", "0.2")
        assert output_bytes(pretrain_two) == output_bytes(pretrain_one)

    def expected_chats(self, chats, fraction, tokenizer=None):
        expected = {"train": ([], []), "eval": ([], [])}
        for chat, is_eval in zip(chats, split_of(len(chats), fraction)):
            out = (tokenizer or self.tokenizer).apply_chat_template(
                chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            assert any(out["assistant_masks"]) and not all(out["assistant_masks"])
            tokens, masks = expected["eval" if is_eval else "train"]
            tokens.append(list(out["input_ids"]))
            masks.append(list(out["assistant_masks"]))
        return expected

    def check_sft(self, out, expected):
        for split in ("train", "eval"):
            code, tokens = read_indexed(os.path.join(out, split))
            mask_code, masks = read_indexed(os.path.join(out, f"{split}_loss_mask"))
            assert code == 8 and mask_code == 1, (code, mask_code)
            assert tokens == expected[split][0], f"{split} tokens"
            assert masks == expected[split][1], f"{split} masks"
        counts = manifest_of(out)["counts"]
        assert counts["masked_in_tokens"]["train"] == sum(map(sum, expected["train"][1]))

    def case_int32(self):
        """A tokenizer with more than 65536 ids writes int32 (code 4)."""
        from tokenizers import Tokenizer, models, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast
        vocabulary = {"<unk>": 0, "<s>": 1, "</s>": 2}
        vocabulary.update((f"w{i}", i + 3) for i in range(70000))
        tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 1)])
        wide = os.path.join(self.work, "wide")
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                unk_token="<unk>").save_pretrained(wide)
        texts = ["w69999 w1 w65536", "w5", "w70000 w65535 w0"]
        path = write_jsonl(os.path.join(self.work, "wide.jsonl"), [{"text": t} for t in texts])
        out, _ = self.prepare("int32", path, "--eval-fraction", "0", tokenizer=wide)
        code, documents = read_indexed(os.path.join(out, "train"))
        assert code == 4, code
        assert documents == [[1, 70002, 4, 65539, 2], [1, 8, 2], [1, 0, 65538, 3, 2]], documents
        assert read_indexed(os.path.join(out, "eval")) == (4, [])
        assert manifest_of(out)["dtype"] == "int32"

    def case_sft(self):
        out, _ = self.prepare("sft", self.chat_jsonl, "--mode", "sft", "--eval-fraction", "0.2")
        expected = self.expected_chats(self.chats, 0.2)
        assert expected["eval"][0], "no eval conversation"
        self.check_sft(out, expected)
        assert manifest_of(out)["tokenizer"]["assistant_mask"] == "generation markers"
        assert manifest_of(out)["run_config"] == {
            "data.source": "megatron:" + os.path.join(out, "train"), "data.packing": "documents",
            "eval.source": "megatron:" + os.path.join(out, "eval")}
        pairs = [{"q": chat[-2]["content"], "a": chat[-1]["content"]} for chat in self.chats]
        pairs_path = write_jsonl(os.path.join(self.work, "pairs.jsonl"), pairs)
        out, _ = self.prepare("pairs", pairs_path, "--mode", "sft", "--prompt-field", "q",
                              "--completion-field", "a", "--eval-fraction", "0.2")
        as_chats = [[{"role": "user", "content": pair["q"]},
                     {"role": "assistant", "content": pair["a"]}] for pair in pairs]
        self.check_sft(out, self.expected_chats(as_chats, 0.2))

    def case_fallback(self):
        marked, _ = self.prepare("fb_marked", self.chat_jsonl, "--mode", "sft")
        plain, _ = self.prepare("fb_plain", self.chat_jsonl, "--mode", "sft",
                                tokenizer=os.path.join(self.work, "plain"))
        assert output_bytes(plain) == output_bytes(marked), "fallback mask differs"
        assert manifest_of(plain)["tokenizer"]["assistant_mask"] == "rendered prefixes"
        self.check_sft(plain, self.expected_chats(self.chats, 0.01))
        self.expect_error("unprefixed", self.chat_jsonl, 1, "differently", "--mode", "sft",
                          tokenizer=os.path.join(self.work, "unprefixed"))
        chatml, _ = self.prepare("chatml", self.chat_jsonl, "--mode", "sft",
                                 tokenizer=os.path.join(self.work, "chatml"))
        chatml_plain, _ = self.prepare("chatml_plain", self.chat_jsonl, "--mode", "sft",
                                       tokenizer=os.path.join(self.work, "chatml_plain"))
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(self.work, "chatml"),
                                                  local_files_only=True)
        self.check_sft(chatml, self.expected_chats(self.chats, 0.01, tokenizer))
        assert output_bytes(chatml_plain) == output_bytes(chatml), "ChatML fallback differs"

    def expect_error(self, name, path, record, words, *args, tokenizer=None):
        """The run exits 2 with one line naming the file and record, and writes nothing."""
        out, err = self.prepare(name, path, *args, tokenizer=tokenizer, expect=2)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}:{record}: "), (name, err)
        assert words in lines[0], (name, words, err)
        assert not os.path.exists(out), f"{name}: output written"
        leftovers = [n for n in os.listdir(os.path.dirname(out)) if n.startswith(".")]
        assert not leftovers, f"{name}: staging left: {leftovers}"

    def bad_inputs(self):
        """(name, records as JSON lines text, mode args, record number, words in the error)."""
        good = json.dumps({"text": "the model"})
        chat = {"messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "the model"}]}
        robot = {"messages": [{"role": "robot", "content": "hi"}]}
        return [
            ("broken_json", f"{good}\n{good}\n{{\"text\": \"the\n", (), 3, "invalid JSON"),
            ("missing_field", f"{good}\n{json.dumps({'body': 'x'})}\n", (), 2, "'text'"),
            ("empty_document", f"{good}\n{good}\n{good}\n{json.dumps({'text': ' '})}\n", (), 4,
             "empty"),
            ("refused_role", f"{json.dumps(chat)}\n{json.dumps(robot)}\n", ("--mode", "sft"), 2,
             "unknown role robot"),
        ]

    def case_bad_input(self):
        for name, text, mode, record, words in self.bad_inputs():
            path = os.path.join(self.work, f"{name}.jsonl")
            with open(path, "w", encoding="utf-8") as bad_file:
                bad_file.write(text)
            self.expect_error(name, path, record, words, *mode)
        broken_list = os.path.join(self.work, "broken.json")
        with open(broken_list, "w") as json_file:
            json_file.write('[{"text": "a"}, {"text": "b"}, {"text": ]')
        self.expect_error("broken_list", broken_list, 3, "invalid JSON")
        many = [{"text": text} for text in self.texts * 20]  # several chunks in flight
        many[700] = {"text": ""}
        path = write_jsonl(os.path.join(self.work, "late_bad.jsonl"), many)
        self.expect_error("late_bad", path, 701, "empty", "--workers", "2")

    def case_skip_bad(self):
        lines = "".join(text for _, text, mode, _, _ in self.bad_inputs() if not mode)
        path = os.path.join(self.work, "mixed.jsonl")
        with open(path, "w", encoding="utf-8") as mixed:
            mixed.write(lines)
        out, err = self.prepare("skip_bad", path, "--skip-bad")
        counts = manifest_of(out)["counts"]
        assert counts["skipped"] == {"empty_document": 1, "invalid_json": 1,
                                     "missing_field": 1}, counts
        assert sum(counts["documents"].values()) == 6 and counts["records"] == 9, counts
        assert "skipped 3 of 9 records" in err, err
        chats = [{"messages": chat} for chat in self.chats[:6]]
        chats[1]["messages"] = chats[1]["messages"] + [{"role": "robot", "content": "x"}]
        chats[2] = {"messages": [{"role": "user", "content": "no reply"}]}
        chats[4] = {"messages": "not a list"}
        path = write_jsonl(os.path.join(self.work, "mixed_chats.jsonl"), chats)
        for name, template, refused in (("skip_marked", "marked", "template_error"),
                                        ("skip_plain", "plain", "template_error"),
                                        ("skip_unprefixed", "unprefixed", "mask_unavailable")):
            if refused == "mask_unavailable":  # every conversation with a reply, then
                _, err = self.prepare(name, path, "--mode", "sft", "--skip-bad",
                                      tokenizer=os.path.join(self.work, template), expect=2)
                assert err == (f"error: {path}: no usable record (6 read, mask_unavailable 3, "
                               "no_assistant_tokens 1, template_error 1, wrong_type 1)\n"), err
                assert not os.path.exists(self.out(name))
                continue
            out, _ = self.prepare(name, path, "--mode", "sft", "--skip-bad",
                                  tokenizer=os.path.join(self.work, template))
            counts = manifest_of(out)["counts"]
            assert counts["skipped"] == {"no_assistant_tokens": 1, refused: 1,
                                         "wrong_type": 1}, (name, counts)
            assert sum(counts["documents"].values()) == 3, (name, counts)

    def case_trainer(self):
        binary = os.path.join(self.bin_dir or "", "ulysses-train")
        if not self.bin_dir or not os.path.exists(binary):
            print("  trainer: skipped (no --bin folder with ulysses-train)")
            return
        runs = []
        for name, args in (("trainer_pretrain", (self.jsonl, "--eval-fraction", "0.2")),
                           ("trainer_sft", (self.chat_jsonl, "--mode", "sft",
                                            "--eval-fraction", "0.2"))):
            out, _ = self.prepare(name, *args)
            runs.append((name, subprocess.Popen(
                [binary, "--config", os.path.join(ROOT, "profiles", "models", "tiny.yaml"),
                 "--set", "sequence.length=32", "--set", "train.steps=1",
                 "--set", f"data.source=megatron:{os.path.join(out, 'train')}",
                 "--set", f"eval.source=megatron:{os.path.join(out, 'eval')}",
                 "--set", f"output.dir={os.path.join(self.work, name + '_run')}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for name, run in runs:
            output, _ = run.communicate(timeout=120)
            assert run.returncode == 0, f"{name}: ulysses-train: {output[-2000:]}"
            assert "eval after step 1" in output, f"{name}: {output[-2000:]}"

    def case_sweep(self):
        """A quickstart-sized sweep on prepared SFT data (the README's experiment): the trials
        run ulysses-train on the packed conversations, and recommend names the data, passes its
        numerics check on it and keeps it in the configuration it recommends."""
        tune = os.path.abspath(os.path.join(self.bin_dir or "", "ulysses-tune"))
        if not self.bin_dir or not os.path.exists(tune):
            print("  sweep: skipped (no --bin folder with ulysses-tune)")
            return
        out, _ = self.prepare("sweep_sft", self.chat_jsonl, "--mode", "sft",
                              "--eval-fraction", "0.2")
        experiment = os.path.join(self.work, "sft-sweep.yaml")
        with open(experiment, "w") as text:  # a path relative to the experiment, as a user writes
            text.write("name: sft-sweep\nhardware: cpu-local\nmodel: tiny\nworld_size: 2\n"
                       "base:\n  data: {source: megatron:out/sweep_sft/train, packing: documents}\n"
                       "  train: {device: cpu}\n"
                       "space:\n  mesh.sp: [1, 2]\n  sequence.length: [64]\n"
                       "objective: throughput\ntrial: {warmup_steps: 1, steps: 2}\n"
                       "search: {probe: false}\n")
        db = os.path.join(self.work, "sft-sweep.db")
        rec = os.path.join(self.work, "sft-rec")
        for args in (("sweep", experiment, "--db", db), ("recommend", "--db", db, "--out", rec)):
            done = subprocess.run([tune, *args], cwd="/", capture_output=True, text=True,
                                  timeout=240)
            assert done.returncode == 0, f"{args[0]}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
        train = os.path.join(out, "train")
        counts = manifest_of(out)["counts"]
        why = open(os.path.join(rec, "WHY.md")).read()
        expected = (f"Data: `megatron:{train}`: {counts['tokens']['train']:,} tokens in "
                    f"{counts['documents']['train']:,} documents, with a loss mask; prepared by "
                    f"{manifest_of(out)['tool']} in sft mode with the tokenizer ")
        assert expected in why, (expected, why)
        # recommend's numerics check ran the winner on the packed, masked conversations
        assert "## Numerics check" in why and "**passed**" in why, why
        recommended = open(os.path.join(rec, "recommended.yaml")).read()
        assert f"megatron:{train}" in recommended and "packing: documents" in recommended, \
            recommended

    def case_out_dir(self):
        user_dir = self.out("user")
        os.makedirs(user_dir)
        with open(os.path.join(user_dir, "notes.txt"), "w") as notes:
            notes.write("mine")
        for force in ((), ("--force",)):
            _, err = self.prepare("user", self.jsonl, *force, expect=2)
            assert err.startswith("error: ") and "not a previous output" in err, err
            assert os.listdir(user_dir) == ["notes.txt"]
            assert open(os.path.join(user_dir, "notes.txt")).read() == "mine"
        previous, _ = self.prepare("previous", self.jsonl)
        _, err = self.prepare("previous", self.jsonl, "--eval-fraction", "0.5", expect=2)
        assert "--force" in err, err
        assert manifest_of(previous)["eval_fraction"] == 0.01
        self.prepare("previous", self.jsonl, "--eval-fraction", "0.5", "--force")
        assert manifest_of(previous)["eval_fraction"] == 0.5
        empty = self.out("empty")
        os.makedirs(empty)
        self.prepare("empty", self.jsonl)
        assert os.path.exists(os.path.join(empty, "train.idx"))

    def case_cli(self):
        python = sys.executable
        shown = subprocess.run([python, SCRIPT, "--help"], capture_output=True, text=True)
        assert shown.returncode == 0 and "--skip-bad" in shown.stdout, shown.stderr
        missing = os.path.join(self.work, "no-such.jsonl")
        out = self.out("cli")
        failed = subprocess.run([python, SCRIPT, missing, "--tokenizer", self.marked, "--out", out],
                                capture_output=True, text=True)
        assert failed.returncode == 2, failed
        assert failed.stderr == f"error: {missing}: no such file or directory\n", failed.stderr
        assert not os.path.exists(out)

    def start_memory_run(self):
        """Starts, beside the other cases, one process that prepares a corpus of N and of 4N
        documents in each input format (JSON lines, a JSON list, a one-row-group Parquet file,
        a directory of text files; 3 and 12 MB of text) with --workers 2 and prints the peak RSS
        of each run. Each run is a child forked from that process after its imports, so the
        runs start alike and differ only in the corpus; their chunks hold 64 KB of text, so
        what is in flight (a few chunks, however the workers keep pace) stays under 1 MB. The
        text is long made-up words through a WordLevel tokenizer: few tokens per byte, so the
        runs take little time."""
        import pyarrow as pa
        import pyarrow.parquet as parquet
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        rng = random.Random(5)
        letters = "abcdefghijklmnopqrstuvwxyz"
        words = ["".join(rng.choices(letters, k=rng.randint(16, 24))) for _ in range(64)]
        vocabulary = {word: index for index, word in enumerate(["<unk>", "</s>"] + words)}
        word_level = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
        word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        memory = os.path.join(self.work, "memory")
        PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>",
                                eos_token="</s>").save_pretrained(os.path.join(memory, "words"))
        documents = [" ".join(rng.choices(words, k=800)) for _ in range(192)]  # ~16 KB each
        self.memory_corpus_bytes = {}
        runs = []
        for size, copies in (("small", 1), ("large", 4)):
            texts = documents * copies
            corpora = {"jsonl": write_jsonl(os.path.join(memory, f"{size}.jsonl"),
                                            ({"text": text} for text in texts)),
                       "json": os.path.join(memory, f"{size}.json"),
                       "parquet": os.path.join(memory, f"{size}.parquet"),
                       "text": os.path.join(memory, f"{size}_text")}
            with open(corpora["json"], "w", encoding="utf-8") as json_file:
                json.dump([{"text": text} for text in texts], json_file)
            parquet.write_table(pa.table({"text": texts}), corpora["parquet"],
                                row_group_size=len(texts), compression="none")
            os.makedirs(corpora["text"])
            for number, text in enumerate(texts):
                with open(os.path.join(corpora["text"], f"{number:04d}.txt"), "w") as text_file:
                    text_file.write(text)
            for kind, corpus in corpora.items():
                runs.append([kind, size, corpus, os.path.join(memory, f"out_{kind}_{size}")])
            self.memory_corpus_bytes[size] = sum(len(text) for text in texts)
        driver = (
            "import json, os, resource, sys; sys.path.insert(0, sys.argv[1]); import prepare_data\n"
            "prepare_data.CHUNK_BYTES = 64 << 10\n"
            "prepare_data.record_encoder.load_tokenizer(sys.argv[2])  # the imports, once\n"
            "peaks = {}\n"
            "for kind, size, corpus, out in json.loads(sys.argv[3]):\n"
            "    read_end, write_end = os.pipe()\n"
            "    if os.fork() == 0:\n"
            "        null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2)\n"
            "        try:\n"
            "            status = prepare_data.main([corpus, '--tokenizer', sys.argv[2],\n"
            "                                        '--out', out, '--workers', '2'])\n"
            "        except BaseException:\n"
            "            status = 99\n"
            "        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "        os.write(write_end, f'{status} {peak}'.encode()); os._exit(0)\n"
            "    os.close(write_end)\n"
            "    status, peak = map(int, os.read(read_end, 100).split()); os.wait()\n"
            "    assert status == 0, (kind, size, status)\n"
            "    peaks.setdefault(kind, {})[size] = peak\n"
            "print('peaks', json.dumps(peaks))\n")
        self.memory_run = subprocess.Popen(
            [sys.executable, "-c", driver, os.path.dirname(SCRIPT), os.path.join(memory, "words"),
             json.dumps(runs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def case_memory(self):
        """In every input format, the peak RSS of the main process with 4N documents may exceed
        N's by 3 MB at most: what it keeps per document is 4 bytes (and per text file a few
        hundred), under 0.3 MB here, while a reader holding the corpus (or a Parquet row group),
        or chunks that do not count a record's text, would add about the 9 MB the text grows by
        or more. The runs are alike processes forked after the imports and differ only in the
        corpus and in what is in flight (under 1 MB), so the margin stays well above their
        difference without a growth (under 0.5 MB here)."""
        stdout, stderr = self.memory_run.communicate()
        assert self.memory_run.returncode == 0, stderr
        peaks = json.loads(stdout.split("peaks", 1)[1])
        small_mb, large_mb = (self.memory_corpus_bytes[size] / 2 ** 20
                              for size in ("small", "large"))
        assert large_mb - small_mb > 8.5, (small_mb, large_mb)
        assert sorted(peaks) == ["json", "jsonl", "parquet", "text"], sorted(peaks)
        grown = []
        for kind, peak in peaks.items():
            grown_mb = (peak["large"] - peak["small"]) / 1024
            print(f"  memory, {kind}: peak RSS {peak['small'] / 1024:.1f} MB for "
                  f"{small_mb:.0f} MB of text, {peak['large'] / 1024:.1f} MB for {large_mb:.0f} MB")
            if grown_mb >= 3:
                grown.append(f"{kind}: peak RSS grew by {grown_mb:.1f} MB")
        assert not grown, "; ".join(grown)

    def case_streaming_reads(self):
        """A broken element early in a JSON list stops the read there: the reader's peak Python
        memory stays near its 256 KB read, not the 16 MB that follow. And a .idx written a block
        of documents at a time (blocks of 3 here) reads back as the documents written."""
        import tracemalloc
        import indexed_dataset
        import record_sources
        path = os.path.join(self.work, "broken_early.json")
        with open(path, "w", encoding="utf-8") as json_file:
            json_file.write('[{"text": "fine"}, {"text": "broken" "here"}')
            filler = json.dumps({"text": "word " * 200})
            for _ in range(16 * 2 ** 20 // len(filler)):
                json_file.write(", " + filler)
            json_file.write("]")
        tracemalloc.start()
        try:
            read = []
            try:
                for number, value in record_sources._iter_json_list(path):
                    read.append(number)
            except record_sources.BrokenSource as error:
                found = (error.record_number, error.message)
                assert found == (2, "invalid JSON: Expecting ',' delimiter"), found
            else:
                raise AssertionError("the broken element was not reported")
            peak_mb = tracemalloc.get_traced_memory()[1] / 2 ** 20
        finally:
            tracemalloc.stop()
        assert read == [1], read
        assert peak_mb < 3, f"reading up to the broken element took {peak_mb:.1f} MB"

        saved = indexed_dataset.IDX_BLOCK
        indexed_dataset.IDX_BLOCK = 3
        try:
            documents = [[index] * (1 + index % 4) for index in range(10)]
            prefix = os.path.join(self.work, "blocks")
            writer = indexed_dataset.IndexedDatasetWriter(prefix, "uint16")
            for batch in (documents[:4], documents[4:]):
                writer.add(np.concatenate(batch), np.array([len(d) for d in batch], np.int32))
            writer.finish()
        finally:
            indexed_dataset.IDX_BLOCK = saved
        assert read_indexed(prefix) == (8, documents)


def main():
    keep = "--keep" in sys.argv
    bin_dir = sys.argv[sys.argv.index("--bin") + 1] if "--bin" in sys.argv else None
    work = tempfile.mkdtemp(prefix="prepare_test.")
    os.makedirs(os.path.join(work, "out"))
    failures = 0
    try:
        start = time.monotonic()
        suite = Suite(work)
        suite.bin_dir = bin_dir
        print(f"  fixture: {time.monotonic() - start:.1f} s")
        for name in [n for n in dir(Suite) if n.startswith("case_")]:
            start = time.monotonic()
            try:
                getattr(suite, name)()
                print(f"PASS {name[5:]} ({time.monotonic() - start:.1f} s)")
            except AssertionError as error:
                failures += 1
                print(f"FAIL {name[5:]}: {error}")
            except Exception:  # a crash in one case still lets the others run
                failures += 1
                print(f"FAIL {name[5:]}: {traceback.format_exc()}")
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
