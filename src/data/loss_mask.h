// The loss mask of a Megatron token dataset: the uint8 dataset PREFIX_loss_mask (.bin + .idx)
// beside PREFIX, as prepare/prepare_data.py writes it in SFT mode, holding for every token 1 when
// it is a target the loss learns (its label, at the position before it, counts) and 0 when not.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/megatron_stream.h"

namespace ulysses::data {

// "<prefix>_loss_mask": where a token dataset's mask lies.
std::string loss_mask_prefix_of(const std::string& token_prefix);

// The mask prefix a megatron:PREFIX source reads under data.loss_mask `policy`: "auto" takes
// PREFIX_loss_mask when its .bin or .idx exists (a half-written pair is then refused when it is
// opened), "require" the same but throws UserError("<key>: ...") naming the missing files when
// neither exists, "ignore" never reads one. Returns "" for no mask.
// REQUIRES: policy is auto, require or ignore.
std::string find_loss_mask(const std::string& token_prefix, const std::string& policy,
                           const std::string& key);

// Throws UserError("<key>: <mask .idx>: ...") unless `mask` holds exactly the sequences of
// `tokens`: as many, each as long.
void check_loss_mask_matches(const MegatronStream& tokens, const MegatronStream& mask,
                             const std::string& key);

// Mask values [first, first + count) of `mask`, each 1 (learn: any non-zero value) or 0.
// REQUIRES: the range lies within the stream.
std::vector<uint8_t> read_loss_mask(const MegatronStream& mask, int64_t first, int64_t count);

}  // namespace ulysses::data
