// The learning rate of each step: linear warmup, then constant, linear or cosine decay to min_lr
// (optim.schedule, optim.warmup_steps, optim.lr, optim.min_lr).
#pragma once
#include <cstdint>

#include "config/options.h"

namespace ulysses::train {

// The learning rate for 1-based step `step` of a run of `total_steps` steps. With lr = optim.lr,
// min_lr = optim.min_lr, W = optim.warmup_steps:
//   step <= W:   lr * step / W                      (warmup; step W reaches lr; ignores min_lr)
//   step >  W:   p = clamp((step - W) / max(1, total_steps - W), 0, 1)
//     constant:  lr
//     linear:    min_lr + (lr - min_lr) * (1 - p)
//     cosine:    min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * p))
// So decay reaches min_lr exactly at step total_steps and stays there for later steps; when
// W >= total_steps there is no decay phase within the run. This is HF transformers'
// get_{constant,linear,cosine}_schedule_with_warmup (cosine with num_cycles = 0.5, and the min_lr
// floor of get_cosine_with_min_lr_schedule_with_warmup) evaluated at current_step = step, i.e.
// one step ahead of HF, so that the first step does not run at lr 0.
// Throws UserError "optim.<key>: ..." on an unknown schedule, warmup_steps < 0, lr < 0, or min_lr
// outside [0, lr] for linear/cosine.
// REQUIRES: step >= 1, total_steps >= 1.
double lr_at(const config::OptimOptions& options, int64_t step, int64_t total_steps);

}  // namespace ulysses::train
