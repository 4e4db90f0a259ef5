// Deferred weights put on their device (see materialize.h).
#include "model/materialize.h"

#include "model/hf_weights.h"

#ifdef ULYSSES_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace ulysses::model {
namespace {

#ifdef ULYSSES_WITH_CUDA
// Every parameter replaced by an uninitialized tensor on `device` in `dtype`; drawn there unless
// the values come from a checkpoint. The host tensors they replace were never touched.
void allocate_on_cuda(LlamaForCausalLM& model, const at::Device& device, at::ScalarType dtype,
                      bool draw) {
  at::Generator generator = at::cuda::detail::createCUDAGenerator(device.index());
  generator.set_current_seed(model->options().init_seed);
  const double std = model->options().init_std;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    at::Tensor& p = item.value();
    at::Tensor on_device = at::empty(p.sizes(), at::TensorOptions(dtype).device(device));
    if (draw) {
      if (p.dim() == 2) {
        on_device.normal_(0.0, std, generator);
      } else if (is_bias(item.key())) {
        on_device.zero_();
      } else {
        on_device.fill_(1.0);
      }
    }
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
