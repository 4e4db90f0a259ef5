"""The reference a memory.precision bf16-states training run is held to: transformers'
LlamaForCausalLM loaded in bf16 from the run's initial checkpoint, trained on the same samples with
torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW(fused=True) (what bench/compare/train_hf.py
runs with --dtype bf16). Sample i of the flat uint16 token file is tokens [i*L, (i+1)*L); step s
(1-based) trains on samples [(s-1)*G, s*G) with labels=input_ids. Prints one JSON line:
{"losses": [...], "grad_norms": [...]} (grad_norm before clipping)."""
import argparse
import json

import numpy as np
import torch
import transformers


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="a checkpoint directory transformers loads")
    p.add_argument("--tokens", required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="samples per step")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--betas", type=float, nargs=2, required=True)
    p.add_argument("--eps", type=float, required=True)
    p.add_argument("--weight-decay", type=float, required=True)
    p.add_argument("--grad-clip", type=float, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16, attn_implementation="eager")
    model.train()  # no dropout in these models; train() only for autograd
    params = [q for q in model.parameters() if q.requires_grad]
    if any(q.dtype != torch.bfloat16 for q in params):
        raise SystemExit("bf16_states_reference: transformers did not load every weight in bf16")
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                                  weight_decay=args.weight_decay, fused=True)
    tokens = np.fromfile(args.tokens, dtype="<u2").astype(np.int64)
    losses, norms = [], []
    for step in range(args.steps):
        first = step * args.batch
        batch = torch.from_numpy(np.stack(
            [tokens[i * args.length:(i + 1) * args.length]
             for i in range(first, first + args.batch)]))
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, args.grad_clip).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print(json.dumps({"losses": losses, "grad_norms": norms}), flush=True)


if __name__ == "__main__":
    main()
