// Counter-based initial weights (see weight_init.h).
#include "model/weight_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>

#include <algorithm>

#include "model/llama.h"

#ifdef ULYSSES_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace ulysses::model {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The generator of chunk `chunk` of parameter `index`, on `device`.
at::Generator chunk_generator(uint64_t seed, size_t index, int64_t chunk, const at::Device& device) {
  const uint64_t chunk_seed =
      splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(index)) ^
                 static_cast<uint64_t>(chunk));
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) {
    at::Generator generator = at::cuda::detail::createCUDAGenerator(device.index());
    generator.set_current_seed(chunk_seed);
    return generator;
  }
#endif
  TORCH_CHECK(device.is_cpu(), "init_weight_range: no generator for ", device);
  return at::make_generator<at::CPUGeneratorImpl>(chunk_seed);
}

}  // namespace

void init_weight_range(size_t index, const std::string& name, at::IntArrayRef shape,
                       uint64_t seed, double std, int64_t begin, at::Tensor out) {
  const int64_t numel = c10::multiply_integers(shape);
  const int64_t count = out.numel();
  TORCH_CHECK(begin >= 0 && begin + count <= numel, "init_weight_range: ", name, " range [",
              begin, ", ", begin + count, ") outside its ", numel, " elements");
  at::NoGradGuard no_grad;
  if (shape.size() != 2) {
    out.fill_(is_bias(name) ? 0.0 : 1.0);
    return;
  }
  const at::TensorOptions fp32 = out.options().dtype(at::kFloat);
  for (int64_t chunk = begin / kInitChunkElements; chunk * kInitChunkElements < begin + count;
       ++chunk) {
    const int64_t chunk_begin = chunk * kInitChunkElements;
    const int64_t chunk_numel = std::min(kInitChunkElements, numel - chunk_begin);
    at::Tensor values = at::empty({chunk_numel}, fp32);  // [chunk] the whole chunk, always
    values.normal_(0.0, std, chunk_generator(seed, index, chunk, out.device()));
    const int64_t lo = std::max(begin, chunk_begin);
    const int64_t hi = std::min(begin + count, chunk_begin + chunk_numel);
    out.narrow(0, lo - begin, hi - lo).copy_(values.narrow(0, lo - chunk_begin, hi - lo));
  }
}

}  // namespace ulysses::model
