// Per-layer gradient all-reduce during backward (see layer_all_reduce.h).
#include "zero/layer_all_reduce.h"

#include <regex>
#include <string>

namespace ulysses::train {

std::vector<std::pair<size_t, size_t>> layer_parameter_ranges(model::LlamaForCausalLM& model,
                                                              const std::vector<at::Tensor>& params,
                                                              const char* who) {
  static const std::regex layer_name("model\\.layers\\.([0-9]+)\\..*");
  const auto named = model->named_parameters();
  TORCH_CHECK(named.size() == params.size(), who, ": not over the model's parameters");
  std::vector<std::pair<size_t, size_t>> ranges(static_cast<size_t>(model->model->num_layers()),
                                                {0, 0});
  std::vector<bool> seen(ranges.size(), false);
  for (size_t i = 0; i < named.size(); ++i) {
    TORCH_CHECK(named[i].value().is_same(params[i]), who,
                ": the parameters are not in the model's order");
    std::smatch match;
    const std::string& name = named[i].key();
    if (!std::regex_match(name, match, layer_name)) continue;
    const size_t layer = std::stoul(match[1]);
    auto& range = ranges.at(layer);
    if (!seen[layer]) range = {i, i};
    TORCH_CHECK(range.second == i, who, ": layer ", layer, "'s parameters are not adjacent");
    range.second = i + 1;
    seen[layer] = true;
  }
  return ranges;
}

LayerAllReduce::LayerAllReduce(model::LlamaForCausalLM& model, GradientBuffers& buffers,
                               comm::Group& group, int64_t bucket_bytes)
    : buffers_(buffers),
      group_(group),
      bucket_bytes_(bucket_bytes),
      layer_params_(layer_parameter_ranges(model, buffers.params(), "LayerAllReduce")) {}

void LayerAllReduce::reduce_layer(int64_t layer) {
  if (!armed_) return;
  const auto [first, last] = layer_params_.at(static_cast<size_t>(layer));
  buffers_.all_reduce_start(group_, first, last, bucket_bytes_);
}

}  // namespace ulysses::train
