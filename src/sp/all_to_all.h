// Differentiable all-to-all over an SP group: the building block of Ulysses attention.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "comm/group.h"

namespace ulysses::sp {

// Exchanges equal chunks along dim 0: input [sp, ...] where chunk j goes to group rank j; returns
// [sp, ...] where chunk i came from group rank i. Backward applies the same exchange to the
// gradient (the all-to-all permutation is its own adjoint). Every rank of `group` must call it
// with the same shape. Blocking; throws comm::CommError when a peer fails.
// REQUIRES: input.size(0) == group.size(); `group` outlives the autograd graph.
at::Tensor all_to_all(const at::Tensor& input, comm::Group& group);

// Exchanges uneven chunks of a flat tensor: input [sum(input_splits)] where the next
// input_splits[j] elements go to group rank j; returns [sum(output_splits)] holding
// output_splits[i] elements from group rank i, in rank order. Backward exchanges the gradient
// with the splits swapped. Blocking; throws comm::CommError when a peer fails.
// REQUIRES: input.dim() == 1; both splits of length group.size(); output_splits[i] equals what
// rank i sends here; `group` outlives the autograd graph.
at::Tensor all_to_all(const at::Tensor& input, comm::Group& group,  // [sum(input_splits)]
                      const std::vector<int64_t>& output_splits,
                      const std::vector<int64_t>& input_splits);  // -> [sum(output_splits)]

}  // namespace ulysses::sp
