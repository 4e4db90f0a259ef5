// Fused RMSNorm and SwiGLU kernels against the ATen path beside each, forward and backward, on one
// CUDA device: one JSON line per op and pass with the median of CUDA-event times. Each pair is
// checked (largest difference printed) before it is timed. See bench/kernels/README.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/fused_kernels.h"
#include "kernels/swiglu.h"
#include "model/rms_norm.h"

#ifdef ULYSSES_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace {

using ulysses::model::RMSNorm;
namespace kernels = ulysses::kernels;

struct Settings {
  int64_t rows = 8192;    // tokens
  int64_t hidden = 2048;  // h (RMSNorm)
  int64_t ffn = 8192;     // SwiGLU width
  std::string dtype = "bf16";
  int warmup = 5;
  int reps = 20;
};

#ifdef ULYSSES_WITH_CUDA
// The median over settings.reps runs of fn (after settings.warmup), each timed by CUDA events on
// the current stream, in milliseconds.
double median_ms(const Settings& settings, const std::function<void()>& fn) {
  for (int i = 0; i < settings.warmup; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < settings.reps; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    times.push_back(start.elapsed_time(stop));
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

void print(const Settings& s, const std::string& op, const std::string& pass,
           std::vector<int64_t> shape, double aten_ms, double fused_ms, double diff) {
  nlohmann::json line = {{"op", op},
                         {"pass", pass},
                         {"shape", shape},
                         {"dtype", s.dtype},
                         {"aten_ms", aten_ms},
                         {"fused_ms", fused_ms},
                         {"speedup", aten_ms / fused_ms},
                         {"max_abs_diff", diff},
                         {"warmup", s.warmup},
                         {"reps", s.reps},
                         {"gpu", at::cuda::getCurrentDeviceProperties()->name}};
  std::cout << line.dump() << std::endl;
}

// RMSNorm [rows, hidden]: the model's module with fused_kernels off and on; backward through
// autograd on one graph (retained), x's and the weight's gradients.
void bench_rms_norm(const Settings& s, at::ScalarType dtype) {
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  const at::Tensor x = torch::randn({s.rows, s.hidden}, options).requires_grad_();
  const at::Tensor grad_y = torch::randn({s.rows, s.hidden}, options);
  RMSNorm aten(s.hidden, 1e-5), fused(s.hidden, 1e-5, /*fused_kernels=*/true);
  for (RMSNorm* norm : {&aten, &fused}) (*norm)->to(at::kCUDA, dtype);
  const at::Tensor y_aten = aten(x), y_fused = fused(x);
  const double forward_diff = max_abs_diff(y_aten, y_fused);
  auto grads = [&](const at::Tensor& y, RMSNorm& norm) {
    return torch::autograd::grad({y}, {x, norm->weight}, {grad_y}, /*retain_graph=*/true);
  };
  const auto ga = grads(y_aten, aten), gf = grads(y_fused, fused);
  const double backward_diff = std::max(max_abs_diff(ga[0], gf[0]), max_abs_diff(ga[1], gf[1]));
  const std::vector<int64_t> shape = {s.rows, s.hidden};
  print(s, "rms_norm", "forward", shape, median_ms(s, [&] { aten(x); }),
        median_ms(s, [&] { fused(x); }), forward_diff);
  print(s, "rms_norm", "backward", shape, median_ms(s, [&] { grads(y_aten, aten); }),
        median_ms(s, [&] { grads(y_fused, fused); }), backward_diff);
}

// SwiGLU [rows, ffn]: at::silu(gate) * up and the ops autograd runs for its backward (mul's, with
// silu's output saved, and silu_backward) against the kernels.
void bench_swiglu(const Settings& s, at::ScalarType dtype) {
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  const at::Tensor gate = torch::randn({s.rows, s.ffn}, options);
  const at::Tensor up = torch::randn({s.rows, s.ffn}, options);
  const at::Tensor grad_out = torch::randn({s.rows, s.ffn}, options);
  const at::Tensor act = at::silu(gate);  // saved by the ATen forward
  auto aten_forward = [&] { return at::silu(gate) * up; };
  auto aten_backward = [&] {
    return std::vector<at::Tensor>{at::silu_backward(grad_out * up, gate), grad_out * act};
  };
  const kernels::SwigluGrads fused_grads = kernels::swiglu_backward(grad_out, gate, up);
  const std::vector<at::Tensor> aten_grads = aten_backward();
  const double forward_diff = max_abs_diff(aten_forward(), kernels::swiglu_forward(gate, up));
  const double backward_diff = std::max(max_abs_diff(aten_grads[0], fused_grads.grad_gate),
                                        max_abs_diff(aten_grads[1], fused_grads.grad_up));
  const std::vector<int64_t> shape = {s.rows, s.ffn};
  print(s, "swiglu", "forward", shape, median_ms(s, aten_forward),
        median_ms(s, [&] { kernels::swiglu_forward(gate, up); }), forward_diff);
  print(s, "swiglu", "backward", shape, median_ms(s, aten_backward),
        median_ms(s, [&] { kernels::swiglu_backward(grad_out, gate, up); }), backward_diff);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"Fused RMSNorm/SwiGLU kernels vs ATen: one JSON line per op and pass"};
  app.add_option("--rows", s.rows, "tokens (rows)")->check(CLI::PositiveNumber);
  app.add_option("--hidden", s.hidden, "RMSNorm width h")->check(CLI::PositiveNumber);
  app.add_option("--ffn", s.ffn, "SwiGLU width")->check(CLI::PositiveNumber);
  app.add_option("--dtype", s.dtype, "bf16 | fp16 (the model takes the kernels for these)")
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--warmup", s.warmup, "untimed runs first")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", s.reps, "timed runs (the median is printed)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
#ifdef ULYSSES_WITH_CUDA
  if (!kernels::fused_kernels_built()) {
    std::cerr << "kernels_bench: this build has no fused CUDA kernels (needs nvcc)\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "kernels_bench: no CUDA device\n";
    return 2;
  }
  const at::ScalarType dtype = s.dtype == "bf16" ? at::kBFloat16 : at::kHalf;
  torch::manual_seed(0);
  bench_rms_norm(s, dtype);
  bench_swiglu(s, dtype);
  return 0;
#else
  std::cerr << "kernels_bench: this build has no CUDA (the fused kernels need a CUDA LibTorch)\n";
  return 2;
#endif
}
