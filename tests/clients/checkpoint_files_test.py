#!/usr/bin/env python3
"""Checkpoints of a model.load source keep its tokenizer, generation config and token ids.

A source directory as a model repository has it: a tiny Qwen2ForCausalLM (or Llama) saved by
transformers (save_pretrained), a tokenizer saved by transformers (PreTrainedTokenizerFast over a
byte-level BPE trained by `tokenizers`, with a chat template: tokenizer.json,
tokenizer_config.json, chat_template.jinja), a GenerationConfig (generation_config.json), and
files other repositories carry (special_tokens_map.json, added_tokens.json, tokenizer.model,
vocab.json, merges.txt, additional_chat_templates/tool_use.jinja) plus one that is not the
tokenizer's (README.md).
Its config.json's token ids are edited per case: bos_token_id null and eos_token_id a list
(qwen2: [5, 7]); bos absent, eos an integer and a pad_token_id (llama).

ulysses-train loads it (model.load), trains 1 step at sp 2 (`ulysses-tune launch`, two ranks)
and saves initial/ and step-1/. In each checkpoint:
  - every tokenizer / generation / chat template file of the source is there, byte for byte, and
    README.md is not; nothing is left under a temporary name next to the checkpoints;
  - transformers' AutoTokenizer loads it and encodes and applies the chat template as the
    source's does; GenerationConfig loads it equal to the source's;
  - config.json's bos_token_id, eos_token_id and pad_token_id are the source's JSON values
    (null stays null, a list stays a list, an absent key stays absent), and AutoConfig reads them
    as it reads the source's.
A run config that sets model.eos_token_id writes that id instead (and keeps bos null). A second
run that loads the first run's step-1/ checkpoint passes all of it on again.

  checkpoint_files_test.py --bin BUILD/bin --case qwen2_null_list [--keep]
Exit status 0 when every check holds; otherwise 1 naming each one that failed.
"""
import json
import os
import sys

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import hf_common
from hf_common import (log, make_hf_model, optim_section, run_trainer,
                       write_run_config, write_tokens)

SEQ_LEN = 32
VOCAB = 256

MODEL = dict(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
             intermediate_size=128, vocab_size=VOCAB, rope_theta=10000.0, rms_norm_eps=1.0e-6,
             init_std=0.1, tie_embeddings=False)

# case -> (family, config.json token ids: key -> value, or None to delete the key)
CASES = {
    "qwen2_null_list": ("qwen2", {"bos_token_id": None, "eos_token_id": [5, 7]}),
    "llama_absent_int_pad": ("llama", {"bos_token_id": "absent", "eos_token_id": 4,
                                       "pad_token_id": 3}),
}

# What a checkpoint must carry over, relative to the source directory.
CARRIED = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
           "generation_config.json", "special_tokens_map.json", "added_tokens.json",
           "tokenizer.model", "vocab.json", "merges.txt",
           os.path.join("additional_chat_templates", "tool_use.jinja")]
NOT_CARRIED = ["README.md"]
TOKEN_KEYS = ["bos_token_id", "eos_token_id", "pad_token_id"]
CHAT = [{"role": "user", "content": "w7 w8"}, {"role": "assistant", "content": "w9"}]
TEXT = "w5 w6 hello w42"
EXPECTED = {}  # "ids": TEXT encoded by the tokenizer the source was saved from

FAILURES = []


def check(ok, what):
    log(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILURES.append(what)


def make_source(work, case):
    family, ids = CASES[case]
    src = os.path.join(work, "source")
    make_hf_model(dict(MODEL, family=family), seed=1234).save_pretrained(
        src, safe_serialization=True)
    # The tokenizer, as transformers saves it: a byte-level BPE (as Qwen2's and Llama 3's)
    # trained on a few words.
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [" ".join(f"w{i}" for i in range(4, VOCAB))] * 10 + ["hello world, the quick fox"] * 10,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>")
    tokenizer.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}"
                               "</s>{% endfor %}")
    tokenizer.save_pretrained(src)
    EXPECTED["ids"] = tokenizer(TEXT).input_ids
    eos = ids.get("eos_token_id")
    transformers.GenerationConfig(bos_token_id=1, eos_token_id=eos, pad_token_id=3,
                                  max_new_tokens=17, do_sample=True,
                                  temperature=0.7).save_pretrained(src)
    # Files other repositories carry (contents arbitrary: they are copied, not read here).
    extra = {"special_tokens_map.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>"}),
             "added_tokens.json": json.dumps({}),
             "vocab.json": json.dumps({"<unk>": 0}), "merges.txt": "#version: 0.2\n",
             os.path.join("additional_chat_templates", "tool_use.jinja"): "{{ tools }}\n",
             "README.md": "# a model card\n"}
    os.makedirs(os.path.join(src, "additional_chat_templates"))
    for name, text in extra.items():
        with open(os.path.join(src, name), "w") as f:
            f.write(text)
    with open(os.path.join(src, "tokenizer.model"), "wb") as f:
        f.write(bytes(range(256)) * 3)  # binary, as a sentencepiece model is
    # The token ids of the case, in config.json.
    path = os.path.join(src, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key, value in ids.items():
        if value == "absent":
            config.pop(key, None)
        else:
            config[key] = value
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    log(f"source {src}: {sorted(os.listdir(src))}; token ids " +
        ", ".join(f"{k} {json.dumps(config[k]) if k in config else '(absent)'}"
                  for k in TOKEN_KEYS))
    return src


def sections(work, name, model_section, tokens, sp, ckpt):
    return {
        "model": model_section,
        "mesh": {"sp": sp, "dp": 1},
        "sequence": {"length": SEQ_LEN, "micro_batch": 1, "grad_accum": 1},
        "data": {"source": "tokens:" + tokens, "token_dtype": "uint16"},
        "optim": optim_section(),
        "train": {"steps": 1, "seed": 0, "device": "cpu"},
        "checkpoint": {"dir": ckpt, "save_initial": True},
        "comm": {"timeout_s": 120, "collective_timeout_s": 120},
        "output": {"dir": os.path.join(work, name, "out")},
    }


def train(args, work, name, model_section, tokens, sp):
    run_dir = os.path.join(work, name)
    os.makedirs(run_dir)
    ckpt = os.path.join(run_dir, "ckpt")
    config_path = os.path.join(run_dir, "run.yaml")
    log(write_run_config(config_path, sections(work, name, model_section, tokens, sp, ckpt),
                         "tests/clients/checkpoint_files_test.py"))
    run_trainer(args.bin, config_path, sp, run_dir, quiet=True)
    return ckpt


def raw_ids(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return {k: config.get(k, "(absent)") for k in TOKEN_KEYS}


def check_checkpoint(label, ckpt_dir, source, expect_ids):
    for name in CARRIED:
        ours, theirs = os.path.join(ckpt_dir, name), os.path.join(source, name)
        same = os.path.isfile(ours) and open(ours, "rb").read() == open(theirs, "rb").read()
        check(same, f"{label}: {name} is the source's, byte for byte")
    for name in NOT_CARRIED:
        check(not os.path.exists(os.path.join(ckpt_dir, name)), f"{label}: {name} not copied")
    leftovers = [n for n in os.listdir(os.path.dirname(ckpt_dir)) if n.startswith(".")]
    check(not leftovers, f"{label}: nothing left under a temporary name ({leftovers})")

    ours_tok = transformers.AutoTokenizer.from_pretrained(ckpt_dir)
    src_tok = transformers.AutoTokenizer.from_pretrained(source)
    ids = ours_tok(TEXT).input_ids
    check(ids and ids == src_tok(TEXT).input_ids == EXPECTED["ids"],
          f"{label}: AutoTokenizer ({type(ours_tok).__name__}) encodes {TEXT!r} as {ids} (source "
          f"{src_tok(TEXT).input_ids}, the saved tokenizer {EXPECTED['ids']})")
    ours_chat = ours_tok.apply_chat_template(CHAT, tokenize=False)
    check(ours_chat == src_tok.apply_chat_template(CHAT, tokenize=False),
          f"{label}: the chat template gives {ours_chat!r}")
    check(ours_tok.eos_token == src_tok.eos_token and ours_tok.bos_token == src_tok.bos_token,
          f"{label}: special tokens {ours_tok.bos_token!r}/{ours_tok.eos_token!r}")
    ours_gen = transformers.GenerationConfig.from_pretrained(ckpt_dir).to_dict()
    src_gen = transformers.GenerationConfig.from_pretrained(source).to_dict()
    check(ours_gen == src_gen, f"{label}: GenerationConfig equals the source's "
          f"(eos {ours_gen.get('eos_token_id')}, max_new_tokens {ours_gen.get('max_new_tokens')})")

    ids = raw_ids(ckpt_dir)  # config.json's token ids
    check(ids == expect_ids, f"{label}: config.json token ids {ids} (expected {expect_ids})")
    ours_config = transformers.AutoConfig.from_pretrained(ckpt_dir)
    src_config = transformers.AutoConfig.from_pretrained(source)
    for key in TOKEN_KEYS:
        if expect_ids[key] == raw_ids(source)[key]:
            check(getattr(ours_config, key) == getattr(src_config, key),
                  f"{label}: AutoConfig.{key} {getattr(ours_config, key)!r} (source "
                  f"{getattr(src_config, key)!r})")
    hf_common.load_hf_model(ckpt_dir)  # and the weights load as the family's class


def body(args, work, case):
    family, _ = CASES[case]
    tokens = os.path.join(work, "train.u16")
    write_tokens(tokens, 4 * SEQ_LEN, VOCAB, seed=5)
    source = make_source(work, case)
    source_ids = raw_ids(source)

    ckpt = train(args, work, "sp2", {"load": source}, tokens, 2)
    for step in ("initial", "step-1"):
        check_checkpoint(f"sp2 {step}", os.path.join(ckpt, step), source, source_ids)

    # The run config sets eos: that id is written; the others stay the source's.
    ckpt_set = train(args, work, "eos-set", {"load": source, "eos_token_id": 9}, tokens, 1)
    ids = raw_ids(os.path.join(ckpt_set, "step-1"))
    check(ids == dict(source_ids, eos_token_id=9),
          f"eos_token_id set in the run config: config.json token ids {ids}")

    # A checkpoint loaded as the next run's source passes everything on again.
    ckpt2 = train(args, work, "chained", {"load": os.path.join(ckpt, "step-1")}, tokens, 1)
    check_checkpoint("chained step-1", os.path.join(ckpt2, "step-1"), source, source_ids)


def main():
    args = hf_common.parse_case_args(__doc__, CASES)
    return hf_common.run_cases(args, "checkpoint_files", lambda work: body(args, work, args.case),
                               FAILURES)


if __name__ == "__main__":
    sys.exit(main())
