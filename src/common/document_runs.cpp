// Runs of equal document ids (see document_runs.h).
#include "common/document_runs.h"

#include <unordered_set>

namespace ulysses {

DocumentRuns document_runs(const at::Tensor& doc_ids) {
  TORCH_CHECK(doc_ids.dim() == 2, "document_runs: doc_ids must be [bs, sl], got ", doc_ids.sizes());
  at::Tensor ids = doc_ids.to(at::kCPU, at::kLong).contiguous();  // [bs, sl]
  const int64_t batch = ids.size(0), sl = ids.size(1);
  const int64_t* data = ids.data_ptr<int64_t>();
  DocumentRuns runs(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = data + b * sl;
    std::unordered_set<int64_t> seen;
    int64_t start = 0;
    for (int64_t i = 1; i <= sl; ++i) {
      if (i < sl && row[i] == row[start]) continue;
      if (!seen.insert(row[start]).second) return {};  // this id had an earlier run
      runs[b].emplace_back(start, i - start);
      start = i;
    }
  }
  return runs;
}

}  // namespace ulysses
