// The random initial weights, drawn so that any range of a parameter can be drawn on its own:
// ZeRO-3 ranks draw only their shards and get exactly the values of the whole model's init.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace ulysses::model {

// Elements a chunk of a parameter's initial values holds; each chunk is drawn from a generator of
// its own (seeded from the run's seed, the parameter's index and the chunk's index), so a range
// costs at most two chunks more than its length.
constexpr int64_t kInitChunkElements = int64_t{1} << 16;

// Writes elements [begin, begin + out.numel()) of parameter `index`'s flattened initial value into
// `out` ([n], contiguous; any device, any floating dtype). The parameter is the index-th of
// named_parameters() (HF order), named `name`, of `shape`: 2-D parameters (Linear and Embedding
// weights) are N(0, std), biases 0, other 1-D parameters (norm weights) 1. The values are drawn
// in fp32 on out's device from that device's generator (the CPU's and a GPU's differ) and cast
// into out's dtype; the same on every rank, for every mesh and for any split into ranges.
// REQUIRES: 0 <= begin, begin + out.numel() <= numel(shape).
void init_weight_range(size_t index, const std::string& name, at::IntArrayRef shape,
                       uint64_t seed, double std, int64_t begin, at::Tensor out);

}  // namespace ulysses::model
