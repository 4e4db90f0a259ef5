"""The manifest of a prepared dataset (OUT/manifest.json): what went in (tokenizer files and their
hash, sources and sizes, mode and fields), what came out (counts, skipped records by reason, the
document-length histogram, the token type) and the run-config lines that read it."""
import hashlib
import os

TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges",
                           "chat_template", "spiece", "sentencepiece")


def tokenizer_files(tokenizer_dir):
    """The tokenizer's files in a model directory (not its weights), sorted."""
    names = [name for name in os.listdir(tokenizer_dir)
             if name.startswith(TOKENIZER_FILE_PREFIXES)
             and os.path.isfile(os.path.join(tokenizer_dir, name))]
    templates = os.path.join(tokenizer_dir, "additional_chat_templates")
    if os.path.isdir(templates):
        names += [os.path.join("additional_chat_templates", name)
                  for name in os.listdir(templates)]
    return sorted(names)


def tokenizer_sha256(tokenizer_dir, names):
    """sha256 over each file's name, size and bytes, in `names` order."""
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(tokenizer_dir, name), "rb") as token_file:
            content = token_file.read()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


class LengthHistogram:
    """Document lengths in power-of-two bins: bin k holds lengths in [2^k, 2^(k+1))."""

    def __init__(self):
        self.counts = {}

    def add(self, lengths):
        for length in lengths:
            bin_index = int(length).bit_length() - 1
            self.counts[bin_index] = self.counts.get(bin_index, 0) + 1

    def rows(self):
        return [{"min": 1 << k, "max": (2 << k) - 1, "documents": self.counts[k]}
                for k in sorted(self.counts)]


def build_manifest(*, tool, version, args, tokenizer, sources, counts, histogram, dtype, out,
                   has_masks):
    out_abs = os.path.abspath(out)
    outputs = {"train": "train", "eval": "eval"}
    if has_masks:
        outputs.update(train_loss_mask="train_loss_mask", eval_loss_mask="eval_loss_mask")
    fields = ({"text": args.text_field} if args.mode == "pretrain" else
              {"prompt": args.prompt_field, "completion": args.completion_field}
              if args.prompt_field else {"messages": args.messages_field})
    return {
        "tool": tool,
        "version": version,
        "mode": args.mode,
        "fields": fields,
        "tokenizer": tokenizer,
        "sources": [{"path": os.path.abspath(source.path), "format": source.kind,
                     "bytes": source.size} for source in sources],
        "eval_fraction": args.eval_fraction,
        "split_seed": args.seed,
        "dtype": dtype["name"],
        "dtype_code": dtype["code"],
        "counts": counts,
        "document_length_histogram": histogram.rows(),
        "outputs": outputs,
        "run_config": {"data.source": f"megatron:{os.path.join(out_abs, 'train')}",
                       **({"data.packing": "documents"} if args.mode == "sft" else {}),
                       "eval.source": f"megatron:{os.path.join(out_abs, 'eval')}"},
    }
