// Autograd function around comm::Group::all_to_all_single with equal splits.
#include "sp/all_to_all.h"

#include <torch/csrc/autograd/custom_function.h>

#include "profile/phase_timer.h"

namespace ulysses::sp {
namespace {

// The packing copy (.contiguous()) runs before the "a2a" scope, so that scope (comm) times the
// collective only.
at::Tensor exchange(const at::Tensor& x, comm::Group& group) {
  const at::Tensor packed = x.contiguous();
  profile::ScopedPhase phase("a2a");
  return group.all_to_all_single(packed);
}

struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t group_address) {
    ctx->saved_data["group"] = group_address;
    return exchange(input, *reinterpret_cast<comm::Group*>(group_address));
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto* group = reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
    return {exchange(grads[0], *group), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all(const at::Tensor& input, comm::Group& group) {
  TORCH_CHECK(input.size(0) == group.size(), "all_to_all: dim 0 is ", input.size(0),
              " but the group has ", group.size(), " ranks");
  if (group.size() == 1) return input;
  return AllToAllFunction::apply(input, reinterpret_cast<int64_t>(&group));
}

}  // namespace ulysses::sp
