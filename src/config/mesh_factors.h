// How an SP group of mesh.sp ranks factors into the all-to-all of the heads (sp_a2a ranks) and
// ring attention over the sequence (sp_ring ranks), and what that asks of the sequence length.
// Pure functions shared by validation, the trainer and the tuner.
#pragma once
#include <cstdint>

#include "config/options.h"

namespace ulysses::config {

// True when the even head exchange applies at degree sp: hq % sp == 0 and (hkv % sp == 0 or
// sp % hkv == 0).
bool heads_split_evenly(int64_t hq, int64_t hkv, int64_t sp);

// True when Ulysses' all-to-all can give hq query / hkv KV heads to sp_a2a ranks: evenly, or, with
// `uneven_heads`, any sp_a2a <= hq.
bool heads_allow_a2a(int64_t hq, int64_t hkv, int64_t sp_a2a, bool uneven_heads);

// mesh.sp_ring as it runs: the configured value, or for auto sp / (the largest divisor of sp that
// heads_allow_a2a accepts). REQUIRES: mesh.sp >= 1, hq >= 1, hkv >= 1.
int64_t resolved_sp_ring(const MeshOptions& mesh, int64_t hq, int64_t hkv);

// What the padded sequence length must be a multiple of: sp, or 2 sp with a ring (each of the
// sp_ring ring blocks is two zig-zag chunks).
int64_t sequence_multiple(int64_t sp, int64_t sp_ring);

}  // namespace ulysses::config
