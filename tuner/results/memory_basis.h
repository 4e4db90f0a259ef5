// Peak memory against the per-rank limit, on one basis for every printer (tables, plots, `list`,
// `show`, recommend's head-room): a rank's peak ABOVE its start-up baseline. What the trials store
// differs by device:
//   cuda  peak_mem_bytes is the device footprint (memory::DeviceMemory): the allocator's
//         reserved peak plus what lies outside it (CUDA context, NCCL); baseline 0, so the
//         context counts against the limit as it would on a device of that size. memory.limit_gib
//         caps that footprint: the peak is what the limit caps.
//   cpu   peak_mem_bytes is the rank's whole peak resident set (RSS), which includes what the
//         process held before it built its model (LibTorch, Gloo, the OpenMP pool). ulysses-train
//         measures that baseline at start-up and records it in summary.json
//         ("memory_baseline_bytes"; the deepspeed backend measures its Python process the same
//         way), and that is what is subtracted. Trials that did not record it (an older
//         ulysses-train, or a run that ended before writing summary.json) use the cost model's
//         runtime term instead (costmodel/memory_model.h, default_memory_coefficients("cpu")
//         .runtime_bytes), and every printer says it is estimated.
//         memory.limit_gib does NOT cap that resident peak: it caps address space above the
//         rank's start-up address space (RLIMIT_AS, src/memory/memory_limit.h). Memory reserved
//         before the baseline (thread stacks, malloc arenas) becomes resident without growing the
//         address space, so an ok trial's RSS above its baseline can exceed the limit. The
//         quantity the limit caps is recorded apart (summary.json
//         "max_rank_peak_address_space_bytes", capped_peak()); printers compare the limit with
//         it and call the resident peak RSS.
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
// above_baseline(trial, trial.peak_mem_bytes): the peak (CPU: RSS) above the baseline, what the
// cost model predicts.
std::optional<int64_t> peak_above_baseline(const store::TrialRecord& trial);

// The trial's peak in the quantity memory.limit_gib caps, what limit_bytes is compared with: on
// CUDA peak_above_baseline (the footprint); on CPU the address space above the start-up address
// space its summary.json recorded ("max_rank_peak_address_space_bytes"), nullopt when it recorded
// none (an older ulysses-train, or a run that ended before writing summary.json).
std::optional<int64_t> capped_peak(const store::TrialRecord& trial);

// Whether the limit caps something other than the peak for some of `trials`: true when one ran on
// CPU under a limit (limit_bytes > 0). Tables then show capped_peak beside the peak.
bool limit_caps_address_space(const std::vector<store::TrialRecord>& trials);
// Column names for people: "RSS above baseline" when every trial with a peak (or a predicted
// peak) ran on CPU, "peak above baseline" otherwise; capped_label is "address space above
// baseline" when every such trial ran on CPU, "capped peak above baseline" otherwise.
std::string peak_label(const std::vector<store::TrialRecord>& trials);
std::string capped_label(const std::vector<store::TrialRecord>& trials);

// The trial's peak against its limit in one phrase, on the basis the limit caps, e.g.
// "peak 400 MiB of a per-rank limit of 415 MiB" (CUDA: the footprint), "address space 400 MiB
// (above its start-up size) of a per-rank limit of 415 MiB (RSS 496 MiB above its start-up RSS)",
// or for a CPU trial that did not record its address space "RSS 496 MiB above its start-up RSS;
// the per-rank limit of 415 MiB caps address space, which it did not record". Without a limit:
// the peak alone.
std::string peak_against_limit(const store::TrialRecord& trial);

// A few sentences for people stating the basis and the baseline of the devices `trials` ran on,
// e.g. "Peak memory is per rank and above the rank's start-up baseline; limits are per rank
// too. On CPU the peak is the resident set (RSS) ... memory.limit_gib caps address space there
// ...", naming how many trials had no recorded baseline, why (an older ulysses-train, ended
// before writing summary.json, or never ran), and the estimate used for them.
std::string memory_basis_note(const std::vector<store::TrialRecord>& trials);
// The same in a few words, for the caption of a plot of peak_above_baseline: "peak above the
// start-up baseline (RSS minus the measured baseline)", "(RSS minus 123 MiB, estimated)" when no
// CPU trial recorded one, "(RSS minus the measured baseline; 123 MiB, estimated, where none was
// recorded)" when some did not.
std::string memory_basis_caption(const std::vector<store::TrialRecord>& trials);

}  // namespace ulysses::report
