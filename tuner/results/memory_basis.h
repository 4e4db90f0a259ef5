// Peak memory against the per-rank limit, on one basis for every printer (tables, plots, `list`,
// `show`, recommend's head-room): a rank's peak ABOVE its start-up baseline, which is what
// memory.limit_gib caps (src/memory/memory_limit.h). What the trials store differs by device:
//   cuda  peak_mem_bytes is the device footprint (memory::DeviceMemory): the allocator's
//         reserved peak plus what lies outside it (CUDA context, NCCL); baseline 0, so the
//         context counts against the limit as it would on a device of that size.
//   cpu   peak_mem_bytes is the rank's whole peak resident set, which includes what the process
//         held before it built its model (LibTorch, Gloo, the OpenMP pool). Trials do not record
//         that baseline, so it is the cost model's runtime term (costmodel/memory_model.h,
//         default_memory_coefficients("cpu").runtime_bytes), the same bytes the model adds to its
//         predicted peaks. The limit there caps address space above the baseline and the kernel
//         enforces it: a trial that ran to the end fit, whatever its resident peak.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/store/trial_record.h"

namespace ulysses::report {

// "cpu" or "cuda": the train.device the trial ran on, from the "device" its summary.json names
// ("cuda:0") or else from its run config; "cpu" (the run config's default) when neither says.
std::string trial_device(const store::TrialRecord& trial);

// Bytes of a rank's start-up baseline that the stored peaks of `device` include (0 on cuda).
int64_t memory_baseline_bytes(const std::string& device);

// The baseline the trial's stored peak includes: the one its summary.json recorded
// ("memory_baseline_bytes": the deepspeed backend measures its process, Python and all, before
// it builds the model), else memory_baseline_bytes of its device.
int64_t trial_baseline_bytes(const store::TrialRecord& trial);

// `bytes` (a peak the trial stored or the model predicted) minus trial_baseline_bytes, at least
// 0; nullopt for nullopt.
std::optional<int64_t> above_baseline(const store::TrialRecord& trial,
                                      std::optional<int64_t> bytes);
// above_baseline(trial, trial.peak_mem_bytes): the peak that counts against limit_bytes.
std::optional<int64_t> peak_above_baseline(const store::TrialRecord& trial);

// One sentence for people stating the basis and the baseline of the devices `trials` ran on,
// e.g. "Peak memory is per rank and above the rank's start-up baseline, which memory.limit_gib
// caps: on CPU the peak resident set minus 0.12 GiB (...)".
std::string memory_basis_note(const std::vector<store::TrialRecord>& trials);
// The same in a few words, for a plot: "peak above the start-up baseline (CPU: resident peak
// minus 0.12 GiB, estimated)".
std::string memory_basis_caption(const std::vector<store::TrialRecord>& trials);

}  // namespace ulysses::report
