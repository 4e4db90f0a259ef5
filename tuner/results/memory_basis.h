// Peak memory against the per-rank limit, on one basis for every printer (tables, plots, `list`,
// `show`, recommend's head-room): a rank's peak ABOVE its start-up baseline, which is what
// memory.limit_gib caps (src/memory/memory_limit.h). What the trials store differs by device:
//   cuda  peak_mem_bytes is the device footprint (memory::DeviceMemory): the allocator's
//         reserved peak plus what lies outside it (CUDA context, NCCL); baseline 0, so the
//         context counts against the limit as it would on a device of that size.
//   cpu   peak_mem_bytes is the rank's whole peak resident set, which includes what the process
//         held before it built its model (LibTorch, Gloo, the OpenMP pool). ulysses-train
//         measures that baseline at start-up and records it in summary.json
//         ("memory_baseline_bytes"; the deepspeed backend measures its Python process the same
//         way), and that is what is subtracted. Trials of an older ulysses-train did not record
//         it: for them the cost model's runtime term stands in (costmodel/memory_model.h,
//         default_memory_coefficients("cpu").runtime_bytes), and every printer says it is
//         estimated. The limit there caps address space above the baseline and the kernel
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

// The baseline its summary.json recorded ("memory_baseline_bytes", measured by the rank at
// start-up), or nullopt when it recorded none (an older ulysses-train).
std::optional<int64_t> recorded_baseline_bytes(const store::TrialRecord& trial);

// The baseline the trial's stored peak includes: recorded_baseline_bytes, else
// memory_baseline_bytes of its device (the estimate on CPU, 0 on CUDA).
int64_t trial_baseline_bytes(const store::TrialRecord& trial);

// Whether trial_baseline_bytes is the cost model's estimate: a CPU trial that recorded none.
bool baseline_estimated(const store::TrialRecord& trial);

// The basis of the trial's peaks in a few words, for a line that prints one:
// "above the start-up baseline 124 MiB", "... 123 MiB (estimated)", or on CUDA (baseline 0)
// "above the start-up baseline (CUDA: device footprint, baseline 0)".
std::string trial_basis(const store::TrialRecord& trial);

// `bytes` (a peak the trial stored or the model predicted) minus trial_baseline_bytes, at least
// 0; nullopt for nullopt.
std::optional<int64_t> above_baseline(const store::TrialRecord& trial,
                                      std::optional<int64_t> bytes);
// above_baseline(trial, trial.peak_mem_bytes): the peak that counts against limit_bytes.
std::optional<int64_t> peak_above_baseline(const store::TrialRecord& trial);

// A few sentences for people stating the basis and the baseline of the devices `trials` ran on,
// e.g. "Peak memory is per rank and above the rank's start-up baseline, the part that
// memory.limit_gib caps; ... On CPU it is the peak resident set minus the rank's resident set
// before it built its model (...), as each trial measured and recorded it (...)", naming how
// many trials had no recorded baseline and the estimate used for them.
std::string memory_basis_note(const std::vector<store::TrialRecord>& trials);
// The same in a few words, for a plot: "peak above the start-up baseline (resident peak minus
// the measured baseline)", or "(resident peak minus 123 MiB, estimated)" when some CPU trials
// recorded none.
std::string memory_basis_caption(const std::vector<store::TrialRecord>& trials);

}  // namespace ulysses::report
