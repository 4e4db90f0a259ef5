// The training (and evaluation) data of one rank. Step s (1-based) uses global samples
// [(s-1)*G, s*G), G = dp * micro_batch * grad_accum (a resumed run continues the stream where the
// checkpoint left it: continue_from). DP rank d takes the d-th block of mb*ga of
// them, micro-step m the m-th block of mb within that; SP rank r takes the positions
// shard_positions(P, sp, sp_ring, r) of each sample (sequence_layout.h: [r*P/sp, (r+1)*P/sp)
// without a ring), P = L padded to a multiple of sp, or of 2 sp with a ring. Labels are shifted
// before sharding, so every shard keeps its true labels; a loss mask turns the labels of targets
// it leaves out into -100 on the whole sample, before sharding too. A sample is a window of L
// tokens, or with data.packing: documents whole documents (packed_documents.h) padded to P.
// Batches are a pure function of (config, step, micro, ranks): no state to save for resume.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "config/options.h"
#include "data/batch.h"
#include "data/token_source.h"

namespace ulysses::data {

class DataLoader {
 public:
  // Opens the source `data.source` names (see open_token_source). For an evaluation loader pass
  // eval_data_options(...) and source_key "eval.source". Throws UserError naming the field or file
  // on bad input: unknown source, missing/short/corrupt file, sequence.length, micro_batch or
  // grad_accum < 1, vocab_size < 1, bad token_dtype or eod_token, a loss mask that does not fit
  // the tokens, documents packing without document boundaries (open_token_source).
  // `sp_ring` is the resolved mesh.sp_ring (config/mesh_factors.h).
  // REQUIRES: 1 <= dp_size, 0 <= dp_rank < dp_size, 1 <= sp_size, 0 <= sp_rank < sp_size,
  // sp_size % sp_ring == 0.
  DataLoader(const config::DataOptions& data, const config::SequenceOptions& seq,
             int64_t vocab_size, int64_t dp_size, int64_t dp_rank, int64_t sp_size, int64_t sp_rank,
             const std::string& source_key = "data.source", int64_t sp_ring = 1);

  // This rank's micro-batch `micro` of step `step`: bs = micro_batch samples, each cut to this SP
  // rank's sl/sp positions; doc_ids (full [bs, sl]) and their documents (document_runs, found
  // here on the host) only when data.pack or data.packing: documents. Tensors on CPU. Throws
  // UserError naming the file when a file token is outside the vocabulary.
  // REQUIRES: step >= 1, 0 <= micro < grad_accum.
  Batch micro_batch(int64_t step /*1-based*/, int64_t micro /*0..grad_accum-1*/) const;

  // P: the sequence length padded to a multiple of sp, or 2 sp with a ring (sl in the shape
  // vocabulary).
  int64_t padded_length() const { return padded_length_; }
  int64_t sequence_length() const { return length_; }                 // L, before padding
  int64_t global_batch_size() const { return global_batch_; }         // G samples per step
  int64_t local_length() const { return padded_length_ / sp_size_; }  // sl/sp
  // The global positions this rank's shard holds, in shard order: [sl/sp] int64 on CPU.
  const at::Tensor& shard_positions() const { return shard_positions_; }

  // Count of valid labels over the whole global batch of `step` (all dp ranks, micro-steps,
  // shards): the loss denominator. Equal on every rank. REQUIRES: step >= 1.
  int64_t global_valid_tokens(int64_t step) const;

  // Index of the global sample that row `row` of micro_batch(step, micro) holds on this rank.
  int64_t sample_index(int64_t step, int64_t micro, int64_t row) const;

  // How data.packing: documents laid the source's documents into samples; nullopt for windows.
  std::optional<PackingCounts> packing_counts() const { return source_->packing_counts(); }
  // The loss-mask dataset the source reads (data.loss_mask), "" when none.
  std::string loss_mask_prefix() const { return source_->loss_mask_prefix(); }

  // Continues the sample stream of a resumed run: step `first_step` begins at global sample
  // `samples_before` (the samples the checkpoint had seen), later steps follow G apart, so a
  // resume with another mesh or batch size neither replays nor skips samples. Without this call
  // step s begins at (s-1)*G. REQUIRES: first_step >= 1, samples_before >= 0.
  void continue_from(int64_t first_step, int64_t samples_before);

  // The first global sample of `step`. REQUIRES: step >= the first step (1, or continue_from's).
  int64_t first_sample(int64_t step) const;

 private:
  std::shared_ptr<const TokenSource> source_;  // immutable, shared by copies of the loader
  bool pack_;             // doc_ids and per-document positions (data.pack, or whole documents)
  bool whole_documents_;  // data.packing: documents (samples of at most L tokens)
  int64_t length_;         // L
  int64_t padded_length_;  // P
  int64_t micro_batch_;    // bs
  int64_t grad_accum_;
  int64_t global_batch_;  // G = dp * bs * grad_accum
  int64_t dp_rank_;
  int64_t sp_size_;
  int64_t sp_rank_;
  at::Tensor shard_positions_;  // [sl/sp] int64
  bool contiguous_shard_;       // shard_positions_ is one run (no ring)
  int64_t first_step_ = 1;      // step whose first sample is samples_before_
  int64_t samples_before_ = 0;  // global samples consumed before first_step_
};

// The data options of the evaluation loader: `train` with source and seed taken from `eval`
// (packing, token_dtype and eod_token are shared with training).
config::DataOptions eval_data_options(const config::DataOptions& train,
                                      const config::EvalOptions& eval);

}  // namespace ulysses::data
