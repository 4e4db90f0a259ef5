"""Records to token ids and loss masks with the model's own tokenizer (runs in the worker
processes of prepare_data.py, one chunk of records per call). A record that cannot be used becomes
a failure (reason, message) in the chunk's result; it never raises."""
import itertools
import json
import re
from dataclasses import dataclass

import numpy as np

# transformers' own test for a chat template that marks the assistant's tokens.
GENERATION_MARKER = re.compile(r"\{\%-?\s*generation\s*-?\%\}")

# Why a record is not used: the keys of the manifest's "skipped" counts.
REASONS = ("invalid_json", "not_utf8", "not_an_object", "missing_field", "wrong_type",
           "empty_document", "template_error", "no_assistant_tokens", "mask_unavailable")


class RecordError(Exception):
    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class EncodeConfig:
    tokenizer_dir: str
    mode: str                    # pretrain | sft
    text_field: str = "text"
    messages_field: str = "messages"
    prompt_field: str = ""       # sft from prompt/completion pairs when both are set
    completion_field: str = ""
    token_dtype: str = "uint16"  # uint16 | int32
    use_markers: bool = True     # sft: the template has {% generation %} markers


@dataclass
class ChunkResult:
    lengths: np.ndarray   # [records] int32 tokens of each record's document, -1 where it failed
    tokens: np.ndarray    # [sum of lengths >= 0] the documents' ids, one after another
    masks: np.ndarray     # [same] uint8 loss mask (sft), or None (pretrain)
    failures: list        # [(position in chunk, reason, message)]


def load_tokenizer(tokenizer_dir):
    """The tokenizer of a local model directory (never downloads)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)


def one_line(error):
    return " ".join(str(error).split()) or type(error).__name__


class RecordEncoder:
    def __init__(self, config, tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.dtype = np.dtype(config.token_dtype)
        self.eos_id = tokenizer.eos_token_id

    def encode_chunk(self, chunk):
        """chunk: [(kind, payload)] as record_sources.iter_records yields them."""
        if self.config.mode == "pretrain":
            return self._pretrain(chunk)
        return self._sft(chunk)

    # --- pretraining: the tokenizer's own special tokens (BOS where the model has one), EOS after
    def _pretrain(self, chunk):
        texts, positions, failures = [], [], []
        for position, (kind, payload) in enumerate(chunk):
            try:
                texts.append(self._text(kind, payload))
                positions.append(position)
            except RecordError as error:
                failures.append((position, error.reason, error.message))
        documents = self.tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
        lengths = np.full(len(chunk), -1, np.int32)
        for position, ids in zip(positions, documents):
            if not ids or ids[-1] != self.eos_id:
                ids.append(self.eos_id)
            lengths[position] = len(ids)
        total = sum(len(ids) for ids in documents)
        tokens = np.fromiter(itertools.chain.from_iterable(documents), self.dtype, count=total)
        return ChunkResult(lengths, tokens, None, failures)

    def _text(self, kind, payload):
        if kind == "text":
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                raise RecordError("not_utf8", "not valid UTF-8 text") from None
        else:
            text = self._field(self._record(kind, payload), self.config.text_field, str)
        if not text.strip():
            raise RecordError("empty_document", f"empty document in field '{self.config.text_field}'"
                              if kind != "text" else "empty document")
        return text

    @staticmethod
    def _record(kind, payload):
        if kind == "json_line":
            try:
                payload = json.loads(payload)
            except UnicodeDecodeError:
                raise RecordError("not_utf8", "not valid UTF-8 text") from None
            except ValueError as error:
                raise RecordError("invalid_json", f"invalid JSON: {one_line(error)}") from None
        if not isinstance(payload, dict):
            raise RecordError("not_an_object", f"a record must be a JSON object, not "
                              f"{type(payload).__name__}")
        return payload

    @staticmethod
    def _field(record, name, expected):
        if name not in record or record[name] is None:
            raise RecordError("missing_field", f"missing field '{name}'")
        value = record[name]
        if not isinstance(value, expected):
            raise RecordError("wrong_type", f"field '{name}' is {type(value).__name__}, not "
                              f"{'text' if expected is str else 'a list of messages'}")
        return value

    # --- SFT: the tokenizer's chat template; the mask keeps the assistant's tokens
    def _sft(self, chunk):
        documents, masks, failures = [], [], []
        lengths = np.full(len(chunk), -1, np.int32)
        for position, (kind, payload) in enumerate(chunk):
            try:
                ids, mask = self._conversation(self._messages(kind, payload))
            except RecordError as error:
                failures.append((position, error.reason, error.message))
                continue
            documents.append(ids)
            masks.append(mask)
            lengths[position] = len(ids)
        total = int(lengths[lengths >= 0].sum())
        tokens = np.fromiter(itertools.chain.from_iterable(documents), self.dtype, count=total)
        mask_bytes = np.fromiter(itertools.chain.from_iterable(masks), np.uint8, count=total)
        return ChunkResult(lengths, tokens, mask_bytes, failures)

    def _messages(self, kind, payload):
        record = self._record(kind, payload)
        config = self.config
        if config.prompt_field:
            prompt = self._field(record, config.prompt_field, str)
            completion = self._field(record, config.completion_field, str)
            if not completion.strip():
                raise RecordError("empty_document", f"empty field '{config.completion_field}'")
            return [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": completion}]
        messages = self._field(record, config.messages_field, list)
        if not messages:
            raise RecordError("empty_document", f"empty field '{config.messages_field}'")
        for number, message in enumerate(messages, start=1):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RecordError("wrong_type", f"message {number} of '{config.messages_field}' "
                                  "is not an object with a 'role'")
        return messages

    def _conversation(self, messages):
        if self.config.use_markers:
            try:
                out = self.tokenizer.apply_chat_template(
                    messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            except Exception as error:  # the template's own raise_exception, jinja, bad values
                raise RecordError("template_error",
                                  f"the chat template refused it: {one_line(error)}") from None
            ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        else:
            ids, mask = self._masked_by_prefixes(messages)
        if not any(mask):
            raise RecordError("no_assistant_tokens", "no assistant tokens to learn")
        return ids, mask

    def _render(self, messages, add_generation_prompt):
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _masked_by_prefixes(self, messages):
        """For a template without generation markers: the characters of assistant turn i are those
        the conversation through turn i adds to the conversation before it (with the generation
        prompt), which must both be prefixes of the whole rendering. The characters become tokens
        as transformers maps the generation markers' spans."""
        try:
            full = self._render(messages, False)
        except Exception as error:
            raise RecordError("template_error",
                              f"the chat template refused it: {one_line(error)}") from None
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            if index == 0:
                raise RecordError("mask_unavailable", "the conversation opens with an assistant "
                                  "message, so the template gives no prefix to find its tokens")
            try:
                before = self._render(messages[:index], True)
                through = self._render(messages[:index + 1], False)
            except Exception as error:
                raise RecordError("mask_unavailable", "the chat template cannot render the "
                                  f"conversation before message {index + 1}: {one_line(error)}") \
                    from None
            if not (full.startswith(before) and full.startswith(through)
                    and len(before) <= len(through)):
                raise RecordError("mask_unavailable", "the chat template renders the conversation "
                                  f"up to message {index + 1} differently from the start of the "
                                  "whole one, so the assistant's tokens cannot be found; give the "
                                  "template {% generation %} markers")
            if len(through) > len(before):
                spans.append((len(before), len(through)))
        out = self.tokenizer(full, add_special_tokens=False)
        ids = list(out["input_ids"])
        mask = [0] * len(ids)
        for start_char, end_char in spans:
            start_token = out.char_to_token(0, start_char)
            end_token = out.char_to_token(0, end_char - 1)
            if start_token is None:
                break
            for token in range(start_token, end_token + 1 if end_token else len(ids)):
                mask[token] = 1
        return ids, mask


_worker_encoder = None


def init_worker(config, tokenizer=None):
    """Pool initializer (and the in-process path): loads the tokenizer unless one is given."""
    global _worker_encoder
    _worker_encoder = RecordEncoder(config, tokenizer or load_tokenizer(config.tokenizer_dir))


def encode_chunk(chunk):
    return _worker_encoder.encode_chunk(chunk)
