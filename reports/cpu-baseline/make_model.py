#!/usr/bin/env python3
"""The baseline's model and data: a seeded random-init transformers LlamaForCausalLM written with
save_pretrained (ulysses-train loads it with model.load, transformers with from_pretrained, so
both train the same weights) and a flat uint16 token file of seeded random tokens."""
import argparse
import json

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--out", required=True, help="model directory to write")
p.add_argument("--tokens", required=True, help="token file to write")
p.add_argument("--num-tokens", type=int, required=True)
p.add_argument("--shape", required=True, help="JSON object of LlamaConfig fields")
args = p.parse_args()

shape = json.loads(args.shape)
torch.manual_seed(1234)
config = LlamaConfig(**shape)
model = LlamaForCausalLM(config)
model.save_pretrained(args.out, safe_serialization=True)
n = sum(t.numel() for t in model.parameters())
rng = np.random.default_rng(7)
rng.integers(0, shape["vocab_size"], size=args.num_tokens, dtype=np.uint16).astype("<u2").tofile(
    args.tokens)
print(json.dumps({"parameters": n, "tokens": args.num_tokens, **shape}))
