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

// A mesh for people: "1x4" (dp x sp), and how its SP group splits when that is not the plain
// even all-to-all: "1x4 (2 a2a x 2 ring)" (mesh.sp_ring: the heads all-to-all over 2 ranks, ring
// attention over 2), "1x4 (1 a2a x 4 ring)" (the ring alone), "1x3 uneven" (mesh.uneven_heads with
// an all-to-all degree that does not divide the heads), or both. Every printer of a mesh (tables,
// plots, `list`, WHY.md, plan) says it this way.
std::string mesh_text(int64_t dp, int64_t sp, int64_t sp_ring, bool uneven);
// mesh_text of a trial: dp and sp as stored, the split as its run config (config_yaml) resolves
// it; "1x2" alone when the config cannot be read (an invalid trial's).
std::string mesh(const store::TrialRecord& trial);
// The part of mesh() after "dp x sp": " (2 a2a x 2 ring)", " uneven", both, or "".
std::string mesh_split(const store::TrialRecord& trial);

}  // namespace ulysses::report
