// Turns one sample's tokens into a training row: next-token labels within the sample (ignored
// where the loss mask says the target is not learned), computed BEFORE any SP sharding;
// per-document positions and ids when packing; padding to P.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace ulysses::data {

// One sample over the full padded length P (P = sl in the shape vocabulary).
struct LabeledSample {
  at::Tensor input_ids;      // [sl] int64: tokens, then 0 on padding
  at::Tensor labels;         // [sl] int64: next token within the document, else -100
  at::Tensor position_ids;   // [sl] int64: restart at 0 at each document start; padding continues
  at::Tensor doc_ids;        // [sl] int64: 0, 1, ... per document; padding is one more document
  int64_t valid_tokens = 0;  // labels != -100
};

// P = ceil(length / multiple) * multiple (config::sequence_multiple). REQUIRES: length >= 1,
// multiple >= 1.
int64_t padded_length(int64_t length, int64_t multiple);

// Builds the row of an L-token sample: input_ids[j] = tokens[j]; labels[j] = tokens[j+1] for
// j < L-1 unless j+1 begins a document or loss_mask[j+1] is 0 (the target is not learned),
// labels[L-1] = -100; position_ids count from 0 and restart at each of `document_starts` (pass {}
// for an unpacked sample: positions 0..P-1); padding positions [L, P) get input 0, label -100,
// positions continuing from the last one, and the doc id after the last document's. The whole
// sample is labeled here, before any SP sharding. REQUIRES: P >= L >= 1; document_starts
// ascending within [1, L); loss_mask empty (learn every token) or of L values.
LabeledSample label_sample(const std::vector<int64_t>& tokens,           // [L]
                           const std::vector<int64_t>& document_starts,  // ascending, in [1, L)
                           int64_t padded_len,
                           const std::vector<uint8_t>& loss_mask = {});  // [L] or []

// The valid_tokens label_sample would report, without the tokens: L - 1 - |document_starts|
// less the remaining labels whose target has loss_mask 0. REQUIRES: as label_sample's.
int64_t count_valid_labels(int64_t length, const std::vector<int64_t>& document_starts,
                           const std::vector<uint8_t>& loss_mask = {});  // [L] or []

}  // namespace ulysses::data
