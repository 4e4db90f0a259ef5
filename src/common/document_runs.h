// The documents of a packed batch as runs of equal ids, found on the host once per micro-batch
// (by the data loader) so that attention never copies document ids back from the device.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ulysses {

// Per sample, its documents as (start, length) runs of equal doc ids, in order. Empty (no samples
// at all) when some id repeats after another id: then only a mask expresses the attention
// pattern.
using DocumentRuns = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

// The runs of doc_ids [bs, sl] int64 (any device; read on the host, so a device tensor costs one
// device-to-host copy and sync).
DocumentRuns document_runs(const at::Tensor& doc_ids);

}  // namespace ulysses
