// Differentiable all-to-all over an SP group: the building block of Ulysses attention.
#pragma once
#include <ATen/ATen.h>

#include "comm/group.h"

namespace ulysses::sp {

// Exchanges equal chunks along dim 0: input [sp, ...] where chunk j goes to group rank j; returns
// [sp, ...] where chunk i came from group rank i. Backward applies the same exchange to the
// gradient (the all-to-all permutation is its own adjoint). Every rank of `group` must call it
// with the same shape. Blocking; throws comm::CommError when a peer fails.
// REQUIRES: input.size(0) == group.size(); `group` outlives the autograd graph.
at::Tensor all_to_all(const at::Tensor& input, comm::Group& group);

}  // namespace ulysses::sp
