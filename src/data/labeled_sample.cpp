// Label shifting, per-document positions and padding of one sample (see labeled_sample.h).
#include "data/labeled_sample.h"

#include <c10/util/Exception.h>

#include "data/batch.h"

namespace ulysses::data {

int64_t padded_length(int64_t length, int64_t sp) {
  TORCH_CHECK(length >= 1 && sp >= 1, "padded_length: length ", length, ", sp ", sp);
  return (length + sp - 1) / sp * sp;
}

LabeledSample label_sample(const std::vector<int64_t>& tokens,
                           const std::vector<int64_t>& document_starts, int64_t padded_len,
                           const std::vector<uint8_t>& loss_mask) {
  const auto length = static_cast<int64_t>(tokens.size());
  TORCH_CHECK(length >= 1 && padded_len >= length, "label_sample: L=", length, ", P=", padded_len);
  TORCH_CHECK(loss_mask.empty() || static_cast<int64_t>(loss_mask.size()) == length,
              "label_sample: loss mask of ", loss_mask.size(), " values for ", length, " tokens");
  // begins[j]: position j begins a document (j in [1, L)); begins[L] stays false.
  std::vector<bool> begins(length + 1, false);
  int64_t previous = 0;
  for (const int64_t start : document_starts) {
    TORCH_CHECK(start > previous && start < length, "label_sample: document start ", start,
                " not ascending within [1, ", length, ")");
    begins[start] = true;
    previous = start;
  }

  const auto options = at::TensorOptions().dtype(at::kLong);
  LabeledSample row;
  row.input_ids = at::empty({padded_len}, options);     // [sl]
  row.labels = at::empty({padded_len}, options);        // [sl]
  row.position_ids = at::empty({padded_len}, options);  // [sl]
  row.doc_ids = at::empty({padded_len}, options);       // [sl]
  int64_t* inputs = row.input_ids.data_ptr<int64_t>();
  int64_t* labels = row.labels.data_ptr<int64_t>();
  int64_t* positions = row.position_ids.data_ptr<int64_t>();
  int64_t* docs = row.doc_ids.data_ptr<int64_t>();

  int64_t position = 0;
  int64_t document = 0;
  for (int64_t j = 0; j < length; ++j) {
    if (begins[j]) {
      position = 0;
      ++document;
    }
    inputs[j] = tokens[j];
    const bool learned = j + 1 < length && !begins[j + 1] &&
                         (loss_mask.empty() || loss_mask[j + 1] != 0);
    labels[j] = learned ? tokens[j + 1] : kIgnoreIndex;
    row.valid_tokens += learned ? 1 : 0;
    positions[j] = position++;
    docs[j] = document;
  }
  for (int64_t j = length; j < padded_len; ++j) {
    inputs[j] = 0;
    labels[j] = kIgnoreIndex;
    positions[j] = position++;
    docs[j] = document + 1;
  }
  return row;
}

int64_t count_valid_labels(int64_t length, const std::vector<int64_t>& document_starts,
                           const std::vector<uint8_t>& loss_mask) {
  TORCH_CHECK(loss_mask.empty() || static_cast<int64_t>(loss_mask.size()) == length,
              "count_valid_labels: loss mask of ", loss_mask.size(), " values for ", length,
              " tokens");
  int64_t valid = length - 1 - static_cast<int64_t>(document_starts.size());
  if (loss_mask.empty()) return valid;
  // Targets j in [1, L) that do not begin a document but are masked out.
  size_t next_start = 0;
  for (int64_t j = 1; j < length; ++j) {
    const bool begins = next_start < document_starts.size() && document_starts[next_start] == j;
    if (begins) {
      ++next_start;
    } else if (loss_mask[j] == 0) {
      --valid;
    }
  }
  return valid;
}

}  // namespace ulysses::data
