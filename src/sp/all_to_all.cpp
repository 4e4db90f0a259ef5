// Autograd functions around comm::Group::all_to_all_single: equal chunks, and uneven splits.
#include "sp/all_to_all.h"

#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "profile/phase_timer.h"

namespace ulysses::sp {
namespace {

// The packing copy (.contiguous()) runs before the "a2a" scope, so that scope (comm) times the
// collective only. Empty splits mean equal chunks.
at::Tensor exchange(const at::Tensor& x, comm::Group& group,
                    const std::vector<int64_t>& output_splits = {},
                    const std::vector<int64_t>& input_splits = {}) {
  const at::Tensor packed = x.contiguous();
  profile::ScopedPhase phase("a2a");
  return group.all_to_all_single(packed, output_splits, input_splits);
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

// What rank j sent forward comes back to it: the gradient goes with output and input swapped.
struct UnevenAllToAllFunction : public torch::autograd::Function<UnevenAllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t group_address, std::vector<int64_t> output_splits,
                            std::vector<int64_t> input_splits) {
    ctx->saved_data["group"] = group_address;
    ctx->saved_data["output_splits"] = output_splits;
    ctx->saved_data["input_splits"] = input_splits;
    return exchange(input, *reinterpret_cast<comm::Group*>(group_address), output_splits,
                    input_splits);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto* group = reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
    const std::vector<int64_t> output_splits = ctx->saved_data["output_splits"].toIntVector();
    const std::vector<int64_t> input_splits = ctx->saved_data["input_splits"].toIntVector();
    return {exchange(grads[0], *group, input_splits, output_splits), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all(const at::Tensor& input, comm::Group& group) {
  TORCH_CHECK(input.size(0) == group.size(), "all_to_all: dim 0 is ", input.size(0),
              " but the group has ", group.size(), " ranks");
  if (group.size() == 1) return input;
  return AllToAllFunction::apply(input, reinterpret_cast<int64_t>(&group));
}

at::Tensor all_to_all(const at::Tensor& input, comm::Group& group,
                      const std::vector<int64_t>& output_splits,
                      const std::vector<int64_t>& input_splits) {
  const auto size = static_cast<size_t>(group.size());
  TORCH_CHECK(input.dim() == 1 && output_splits.size() == size && input_splits.size() == size,
              "all_to_all: uneven splits take a flat input and one split per rank of ",
              group.size());
  TORCH_CHECK(std::accumulate(input_splits.begin(), input_splits.end(), int64_t{0}) ==
                  input.size(0),
              "all_to_all: input splits do not sum to the input's ", input.size(0), " elements");
  if (group.size() == 1) return input;
  return UnevenAllToAllFunction::apply(input, reinterpret_cast<int64_t>(&group), output_splits,
                                       input_splits);
}

}  // namespace ulysses::sp
