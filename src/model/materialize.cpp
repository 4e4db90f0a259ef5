// Deferred weights put on their device (see materialize.h).
#include "model/materialize.h"

#include "model/hf_weights.h"
#include "model/weight_init.h"

namespace ulysses::model {
namespace {

#ifdef ULYSSES_WITH_CUDA
// Every parameter replaced by an uninitialized tensor on `device` in `dtype`; drawn there unless
// the values come from a checkpoint. The host tensors they replace were never touched.
void allocate_on_cuda(LlamaForCausalLM& model, const at::Device& device, at::ScalarType dtype,
                      bool draw) {
  torch::NoGradGuard no_grad;
  size_t index = 0;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    at::Tensor& p = item.value();
    at::Tensor on_device = at::empty(p.sizes(), at::TensorOptions(dtype).device(device));
    if (draw) {
      init_weight_range(index, item.key(), p.sizes(), model->options().init_seed,
                        model->options().init_std, 0, on_device.view({-1}));
    }
    ++index;
    p.set_data(on_device);
  }
}
#endif

}  // namespace

void materialize_weights(LlamaForCausalLM& model, const at::Device& device, at::ScalarType dtype,
                         const std::string& load_dir) {
  const bool load = !load_dir.empty();
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) {
    allocate_on_cuda(model, device, dtype, /*draw=*/!load);
    model->to(device, dtype);  // anything that is not a parameter
    if (load) load_hf_weights(model, load_dir);
    return;
  }
#endif
  if (!load) init_llama_weights(*model, model->options().init_seed, model->options().init_std);
  if (load) load_hf_weights(model, load_dir);  // into the fp32 host weights, exactly
  model->to(device, dtype);
}

}  // namespace ulysses::model
