#!/usr/bin/env python3
"""The comparison's model and data: a seeded random-init transformers LlamaForCausalLM written with
save_pretrained (ulysses-train loads it with model.load, transformers with from_pretrained, so both
train the same weights) and a flat file of seeded random tokens (uint16 when the vocabulary fits,
else uint32). Prints one JSON line: parameters, tokens, token dtype, the LlamaConfig fields.

  make_model.py --shape SHAPE.json|- --out DIR --tokens FILE --num-tokens N [--device cuda]
                [--make model,tokens]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", required=True, help="JSON file of LlamaConfig fields (- = stdin)")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--tokens", required=True, help="token file to write")
    p.add_argument("--num-tokens", type=int, required=True)
    p.add_argument("--device", default="cpu", help="where to initialize (cuda is faster for 1B+)")
    p.add_argument("--make", default="model,tokens", help="model, tokens or both")
    args = p.parse_args()

    if args.shape == "-":
        shape = json.load(sys.stdin)
    else:
        with open(args.shape) as f:
            shape = json.load(f)
    make = args.make.split(",")
    parameters = None
    if "model" in make:
        torch.manual_seed(1234)
        config = LlamaConfig(**shape)
        with torch.device(args.device):
            model = LlamaForCausalLM(config)
        model.save_pretrained(args.out, safe_serialization=True)
        parameters = sum(t.numel() for t in model.parameters())

    token_dtype = "uint16" if shape["vocab_size"] <= 65536 else "uint32"
    if "tokens" in make:
        rng = np.random.default_rng(7)
        tokens = rng.integers(0, shape["vocab_size"], size=args.num_tokens, dtype=np.int64)
        tokens.astype("<u2" if token_dtype == "uint16" else "<u4").tofile(args.tokens + ".tmp")
        os.replace(args.tokens + ".tmp", args.tokens)
    print(json.dumps({"parameters": parameters, "tokens": args.num_tokens,
                      "token_dtype": token_dtype, **shape}))


if __name__ == "__main__":
    main()
