// Where a model's weights are born: on the device that trains them, in the dtype it trains them
// in, with no full copy of the model in host memory on the way.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "model/llama.h"

namespace ulysses::model {

// Gives every weight of `model` (built with WeightInit::kDeferred) its value on `device` in
// `dtype` (floating parameters; the model's other tensors move with it):
//   - with `load_dir` (an HF model directory, load_hf_weights): the checkpoint's values, read file
//     by file and copied straight into the weights; nothing is drawn;
//   - on CPU: init_llama_weights in fp32, then cast: bit-identical to a model initialised at
//     construction;
//   - on CUDA: each weight is allocated on the device in `dtype` and drawn there by
//     init_weight_range (weight_init.h) from the device's generators: the same on every rank and
//     in every run on the same kind of device, but not the CPU's values. Nothing of size of the
//     model touches host memory, and drawing takes milliseconds where the CPU takes about a
//     minute for 8B weights.
// A ZeRO-3 run does not call this: each rank draws or loads its shards only (zero_partition.h).
void materialize_weights(LlamaForCausalLM& model, const at::Device& device, at::ScalarType dtype,
                         const std::string& load_dir);

}  // namespace ulysses::model
