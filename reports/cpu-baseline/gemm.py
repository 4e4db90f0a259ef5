#!/usr/bin/env python3
"""fp32 GEMM throughput of whichever torch this Python imports: median of --reps torch.mm(a, b)
with a, b [n, n] (one untimed warm-up call). Prints one JSON line."""
import argparse
import json
import statistics
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=2048)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
a, b = torch.randn(args.n, args.n), torch.randn(args.n, args.n)
torch.mm(a, b)
times = []
for _ in range(args.reps):
    t0 = time.perf_counter()
    torch.mm(a, b)
    times.append(time.perf_counter() - t0)
med = statistics.median(times)
blas = [s.strip() for s in torch.__config__.show().replace(",", "\n").splitlines()
        if "BLAS_INFO" in s]
print(json.dumps({"torch": torch.__version__, "n": args.n, "reps": args.reps,
                  "threads": torch.get_num_threads(), "median_s": med,
                  "gflops": 2 * args.n ** 3 / med / 1e9,
                  "times_s": [round(t, 4) for t in times],
                  "blas": blas[0] if blas else "?", "mkl": torch.backends.mkl.is_available()}))
