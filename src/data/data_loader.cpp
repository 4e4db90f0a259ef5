// Sample selection, labeling and SP sharding of micro-batches (see data_loader.h).
#include "data/data_loader.h"

#include <c10/util/Exception.h>

#include <vector>

#include "common/error.h"
#include "config/mesh_factors.h"
#include "data/labeled_sample.h"
#include "data/sequence_layout.h"

namespace ulysses::data {
namespace {

void require_positive(int64_t value, const char* key) {
  if (value < 1) {
    throw UserError(std::string(key) + ": must be >= 1, got " + std::to_string(value));
  }
}

}  // namespace

DataLoader::DataLoader(const config::DataOptions& data, const config::SequenceOptions& seq,
                       int64_t vocab_size, int64_t dp_size, int64_t dp_rank, int64_t sp_size,
                       int64_t sp_rank, const std::string& source_key, int64_t sp_ring)
    : pack_(data.pack || data.packing == "documents"),
      whole_documents_(data.packing == "documents"),
      length_(seq.length),
      micro_batch_(seq.micro_batch),
      grad_accum_(seq.grad_accum),
      dp_rank_(dp_rank),
      sp_size_(sp_size),
      sp_rank_(sp_rank) {
  require_positive(seq.length, "sequence.length");
  require_positive(seq.micro_batch, "sequence.micro_batch");
  require_positive(seq.grad_accum, "sequence.grad_accum");
  require_positive(vocab_size, "model.vocab_size");
  TORCH_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "DataLoader: dp rank ", dp_rank,
              " of ", dp_size);
  TORCH_CHECK(sp_size >= 1 && sp_rank >= 0 && sp_rank < sp_size, "DataLoader: sp rank ", sp_rank,
              " of ", sp_size);
  TORCH_CHECK(sp_ring >= 1 && sp_size % sp_ring == 0, "DataLoader: sp_ring ", sp_ring, " of sp ",
              sp_size);
  padded_length_ = data::padded_length(length_, config::sequence_multiple(sp_size, sp_ring));
  shard_positions_ = data::shard_positions(padded_length_, sp_size, sp_ring, sp_rank);
  contiguous_shard_ = sp_ring == 1;
  global_batch_ = dp_size * micro_batch_ * grad_accum_;
  source_ = open_token_source(data, length_, vocab_size, source_key);
}

void DataLoader::continue_from(int64_t first_step, int64_t samples_before) {
  TORCH_CHECK(first_step >= 1 && samples_before >= 0, "DataLoader: continue_from(", first_step,
              ", ", samples_before, ")");
  first_step_ = first_step;
  samples_before_ = samples_before;
}

int64_t DataLoader::first_sample(int64_t step) const {
  TORCH_CHECK(step >= first_step_, "DataLoader: step ", step, " is before the first step ",
              first_step_);
  return samples_before_ + (step - first_step_) * global_batch_;
}

int64_t DataLoader::sample_index(int64_t step, int64_t micro, int64_t row) const {
  TORCH_CHECK(micro >= 0 && micro < grad_accum_, "DataLoader: micro-step ", micro, " of ",
              grad_accum_);
  TORCH_CHECK(row >= 0 && row < micro_batch_, "DataLoader: row ", row, " of ", micro_batch_);
  return first_sample(step) + dp_rank_ * micro_batch_ * grad_accum_ + micro * micro_batch_ +
         row;
}

Batch DataLoader::micro_batch(int64_t step, int64_t micro) const {
  const int64_t local = local_length();  // sl/sp
  const int64_t begin = sp_rank_ * local;
  // This rank's positions of a full [P] row: a slice, or a gather for a zig-zag shard.
  const auto shard = [&](const at::Tensor& row) {
    return contiguous_shard_ ? row.narrow(0, begin, local) : row.index_select(0, shard_positions_);
  };
  const auto options = at::TensorOptions().dtype(at::kLong);
  Batch batch;
  batch.input_ids = at::empty({micro_batch_, local}, options);                    // [bs, sl/sp]
  batch.labels = at::empty({micro_batch_, local}, options);                       // [bs, sl/sp]
  batch.position_ids = at::empty({micro_batch_, local}, options);                 // [bs, sl/sp]
  if (pack_) batch.doc_ids = at::empty({micro_batch_, padded_length_}, options);  // [bs, sl]

  const std::vector<int64_t> no_documents;
  for (int64_t row = 0; row < micro_batch_; ++row) {
    const int64_t index = sample_index(step, micro, row);
    const LabeledSample sample =
        label_sample(source_->tokens(index), pack_ ? source_->document_starts(index) : no_documents,
                     padded_length_, source_->loss_mask(index));
    batch.input_ids[row].copy_(shard(sample.input_ids));
    batch.labels[row].copy_(shard(sample.labels));
    batch.position_ids[row].copy_(shard(sample.position_ids));
    if (pack_) batch.doc_ids[row].copy_(sample.doc_ids);
  }
  if (pack_) batch.documents = std::make_shared<const DocumentRuns>(document_runs(batch.doc_ids));
  batch.valid_tokens = batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
  return batch;
}

int64_t DataLoader::global_valid_tokens(int64_t step) const {
  const int64_t first = first_sample(step);
  const bool masked = !source_->loss_mask_prefix().empty();
  if (!pack_ && !masked) return global_batch_ * (length_ - 1);
  const std::vector<int64_t> no_documents;
  int64_t total = 0;
  for (int64_t index = first; index < first + global_batch_; ++index) {
    const int64_t length = whole_documents_ ? source_->token_count(index) : length_;
    total += count_valid_labels(length, pack_ ? source_->document_starts(index) : no_documents,
                                source_->loss_mask(index));
  }
  return total;
}

config::DataOptions eval_data_options(const config::DataOptions& train,
                                      const config::EvalOptions& eval) {
  config::DataOptions options = train;
  options.source = eval.source;
  options.seed = eval.seed;
  return options;
}

}  // namespace ulysses::data
