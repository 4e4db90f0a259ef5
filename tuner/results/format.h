// How numbers and records read in reports: fixed decimals for people, shortest round-trip text
// for machines (CSV), MiB or GiB for memory, "dp x sp" for meshes. One place, so every printer agrees.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "tuner/store/trial_record.h"

namespace ulysses::report {

// For people: `value` with `decimals` digits after the point; "" for nullopt or NaN.
std::string fixed(std::optional<double> value, int decimals);
// Bytes for people, with their unit, so that small peaks stay apart: under 1 GiB in MiB ("46 MiB";
// under 10 MiB with one decimal, "4.5 MiB"), else GiB with two decimals ("1.25 GiB"); "" for
// nullopt. Every printer of memory (terminal tables, markdown, progress lines) uses it.
std::string memory_size(std::optional<int64_t> bytes);

// For machines: the shortest text that parses back to exactly `value` ("" for nullopt).
std::string exact(std::optional<double> value);
std::string exact(std::optional<int64_t> value);
inline std::string exact(double value) { return exact(std::optional<double>(value)); }

// "1x2" (dp x sp).
std::string mesh(const store::TrialRecord& trial);

}  // namespace ulysses::report
