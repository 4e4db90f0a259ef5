// The fused RMSNorm and SwiGLU kernels (src/kernels/) against the ATen path beside each
// (kernels/rms_norm.cpp, kernels/swiglu.cpp) and against fp64 references of plain at:: ops, forward
// and backward; a 2-layer Llama's training losses with model.fused_kernels on and off. The CUDA
// cases skip without a GPU or without the kernels; the CPU cases hold what every build promises.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/fused_kernels.h"
#include "kernels/rms_norm.h"
#include "kernels/swiglu.h"
#include "model/llama.h"
#include "model/llama_mlp.h"
#include "model/lm_loss.h"
#include "model/rms_norm.h"
#include "model_test_util.h"
#include "sp/tiled_mlp.h"

namespace ulysses::model {
namespace {

using kernels::RowPlan;

// The plan: 16-byte vectors where h allows, one block of at most 512 threads per row, at most 32
// elements per thread; a row too wide for that is not fusable.
TEST(FusedKernelsCpu, RowPlan) {
  const RowPlan llama_1b = kernels::rms_norm_row_plan(2048, 2, true);  // bf16
  EXPECT_EQ(llama_1b.vec, 8);
  EXPECT_EQ(llama_1b.threads, 256);
  EXPECT_EQ(llama_1b.iters, 1);
  const RowPlan wide = kernels::rms_norm_row_plan(8192, 2, true);
  EXPECT_EQ(wide.vec, 8);
  EXPECT_EQ(wide.threads, 512);
  EXPECT_EQ(wide.iters, 2);
  const RowPlan fp32 = kernels::rms_norm_row_plan(8192, 4, true);
  EXPECT_EQ(fp32.vec, 4);
  EXPECT_EQ(fp32.iters, 4);
  const RowPlan odd = kernels::rms_norm_row_plan(1001, 2, true);  // not a multiple of 8
  EXPECT_EQ(odd.vec, 1);
  EXPECT_EQ(odd.threads, 512);
  EXPECT_EQ(odd.iters, 2);
  EXPECT_EQ(kernels::rms_norm_row_plan(2048, 2, false).vec, 1);  // unaligned: scalar loads
  const RowPlan tiny = kernels::rms_norm_row_plan(7, 4, true);
  EXPECT_EQ(tiny.vec, 1);
  EXPECT_EQ(tiny.threads, 32);
  EXPECT_EQ(tiny.iters, 1);
  // Every supported plan covers the row: threads * iters * vec >= h.
  for (int64_t h : {1, 31, 1000, 1001, 2048, 4095, 4096, 8192, 16384}) {
    for (int64_t size : {2, 4}) {
      const RowPlan p = kernels::rms_norm_row_plan(h, size, true);
      if (!p.supported()) continue;
      EXPECT_GE(int64_t{p.threads} * p.iters * p.vec, h) << h << " " << size;
      EXPECT_LE(p.iters * p.vec, 32);
    }
  }
  EXPECT_TRUE(kernels::rms_norm_row_plan(16384, 2, true).supported());
  EXPECT_FALSE(kernels::rms_norm_row_plan(32768, 2, true).supported());
  EXPECT_FALSE(kernels::rms_norm_row_plan(4097, 2, true).supported());  // scalar, 8 per thread
}

// CPU tensors never take the kernels, so the option leaves CPU results bit for bit as they were.
TEST(FusedKernelsCpu, CpuTensorsKeepTheAtenPath) {
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({3, 5, 16});
  EXPECT_FALSE(kernels::rms_norm_fusable(x, torch::ones({16})));
  EXPECT_FALSE(kernels::swiglu_fusable(x, x));

  RMSNorm plain(16, 1e-5), fused(16, 1e-5, /*fused_kernels=*/true);
  fused->weight.data().copy_(torch::randn({16}));
  plain->weight.data().copy_(fused->weight.data());
  const at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  const at::Tensor ya = plain(xa), yb = fused(xb);
  EXPECT_TRUE(at::equal(ya, yb));
  ya.sum().backward();
  yb.sum().backward();
  EXPECT_TRUE(at::equal(xa.grad(), xb.grad()));
  EXPECT_TRUE(at::equal(plain->weight.grad(), fused->weight.grad()));

  config::ModelOptions o = testing::tiny_options();
  LlamaMLP mlp_plain(o);
  o.fused_kernels = true;
  LlamaMLP mlp_fused(o);
  auto plain_params = mlp_plain->named_parameters();
  for (auto& item : mlp_fused->named_parameters()) {
    torch::NoGradGuard no_grad;
    item.value().normal_();
    plain_params[item.key()].copy_(item.value());
  }
  const at::Tensor h = torch::randn({2, 4, 16});
  EXPECT_TRUE(at::equal(mlp_plain(h), mlp_fused(h)));
}

// A build without the kernels refuses the option in one line naming it, and its entry points
// throw; a build with them constructs the model.
TEST(FusedKernelsCpu, BuildWithoutKernelsRefusesTheOption) {
  config::ModelOptions o = testing::tiny_options();
  o.fused_kernels = true;
  if (kernels::fused_kernels_built()) {
    EXPECT_NO_THROW(LlamaForCausalLM{o});
    return;
  }
  try {
    LlamaForCausalLM model(o);
    ADD_FAILURE() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "model.fused_kernels: true needs a build with the fused CUDA kernels (a CUDA "
              "LibTorch and nvcc); this one has none");
  }
  const at::Tensor x = torch::ones({2, 8});
  EXPECT_THROW(kernels::rms_norm_forward(x, torch::ones({8}), 1e-5), c10::Error);
  EXPECT_THROW(kernels::swiglu_forward(x, x), c10::Error);
}

// --- CUDA ---

bool cuda_kernels_available() {
  return torch::cuda::is_available() && kernels::fused_kernels_built();
}

#define SKIP_WITHOUT_CUDA_KERNELS()                                              \
  if (!cuda_kernels_available()) {                                               \
    GTEST_SKIP() << "needs a CUDA device and a build with the fused kernels";    \
  }

struct Tolerance {
  double rtol, atol;
};

// Two ulps of the dtype's outputs: the fp32 sums run in another order than ATen's, so 1/rms may
// differ in its last bit, which can move a rounded normalized x by one ulp and the product with
// the weight by one more.
Tolerance tolerance(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return {2e-2, 1e-2};
  if (dtype == at::kHalf) return {2e-3, 1e-3};
  return {1e-5, 1e-5};
}

// EXPECTs |actual - expected| <= atol + rtol * |expected| everywhere, comparing in fp64.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol,
                  const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);  // on the device
  const at::Tensor excess = (a - e).abs() - (tol.atol + tol.rtol * e.abs());
  const double worst = excess.max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": the largest error exceeds rtol " << tol.rtol << " / atol "
                        << tol.atol << " by " << worst;
}

const std::vector<at::ScalarType> kDtypes = {at::kBFloat16, at::kHalf, at::kFloat};
const std::vector<int64_t> kWidths = {2048, 4096, 8192, 1000, 1001};  // h, and ffn for SwiGLU
const std::vector<int64_t> kRows = {1, 7, 8192};

// Calls body(what, dtype, rows, width, options) for every dtype, width and row count, each under
// a trace naming it (`what`) with the seed rows * seed_factor + width; options: CUDA, the dtype.
template <typename Body>
void for_each_shape(int64_t seed_factor, Body&& body) {
  for (at::ScalarType dtype : kDtypes) {
    for (int64_t width : kWidths) {
      for (int64_t rows : kRows) {
        const std::string what = std::string(c10::toString(dtype)) + " rows " +
                                 std::to_string(rows) + " width " + std::to_string(width);
        SCOPED_TRACE(what);
        torch::manual_seed(static_cast<uint64_t>(rows * seed_factor + width));
        body(what, dtype, rows, width, at::TensorOptions().device(at::kCUDA).dtype(dtype));
      }
    }
  }
}

// RMSNorm: the kernels against the module's ATen path (fused_kernels off) on the same inputs, and
// y and the weight gradient against fp64 (plain at:: ops in double).
TEST(FusedKernelsCuda, RmsNormMatchesAtenAndFp64) {
  SKIP_WITHOUT_CUDA_KERNELS();
  const double eps = 1e-5;
  for_each_shape(131, [&](const std::string& what, at::ScalarType dtype, int64_t rows,
                           int64_t h, const at::TensorOptions& options) {
    const at::Tensor x = torch::randn({rows, h}, options);
    const at::Tensor weight = (1 + 0.1 * torch::randn({h}, options)).to(dtype);
    const at::Tensor grad_y = torch::randn({rows, h}, options);
    ASSERT_TRUE(kernels::rms_norm_fusable(x, weight));

    RMSNorm aten(h, eps);
    aten->to(at::kCUDA, dtype);
    aten->weight.data().copy_(weight);
    const at::Tensor x_ref = x.clone().requires_grad_();
    const at::Tensor y_ref = aten(x_ref);
    y_ref.backward(grad_y);

    const kernels::RmsNormOutput out = kernels::rms_norm_forward(x, weight, eps);
    const kernels::RmsNormGrads grads =
        kernels::rms_norm_backward(grad_y, x, weight, out.inv_rms, true, true);
    const Tolerance tol = tolerance(dtype);
    expect_close(out.y, y_ref, tol, what + " y");
    expect_close(grads.grad_x, x_ref.grad(), tol, what + " grad_x");
    // A weight gradient sums `rows` terms of about 1, each rounded differently (ATen rounds
    // every product to the dtype, the kernels only the normalized x, fp64 neither): the
    // difference is a random walk of `rows` rounding errors, about sqrt(rows) ulps of 1.
    const double scale = 2 * std::sqrt(static_cast<double>(rows));
    expect_close(grads.grad_weight, aten->weight.grad(), {tol.rtol, tol.atol * scale},
                 what + " grad_weight vs ATen");

    const at::Tensor xd = x.to(at::kDouble), wd = weight.to(at::kDouble);
    const at::Tensor normed = xd * at::rsqrt(xd.pow(2).mean(-1, true) + eps);
    expect_close(out.y, wd * normed, tol, what + " y vs fp64");
    expect_close(out.inv_rms, at::rsqrt(xd.pow(2).mean(-1) + eps), {1e-5, 0}, what + " 1/rms");
    expect_close(grads.grad_weight, (grad_y.to(at::kDouble) * normed).sum(0),
                 {tol.rtol, tol.atol * scale}, what + " grad_weight vs fp64");

    // Only one gradient asked for: the same values, the other undefined.
    const kernels::RmsNormGrads only_w =
        kernels::rms_norm_backward(grad_y, x, weight, out.inv_rms, false, true);
    EXPECT_FALSE(only_w.grad_x.defined());
    EXPECT_TRUE(at::equal(only_w.grad_weight, grads.grad_weight));
    const kernels::RmsNormGrads only_x =
        kernels::rms_norm_backward(grad_y, x, weight, out.inv_rms, true, false);
    EXPECT_FALSE(only_x.grad_weight.defined());
    EXPECT_TRUE(at::equal(only_x.grad_x, grads.grad_x));
  });
}

// The module with fused_kernels on takes the kernels for bf16 (bit for bit their results), and
// keeps the ATen path for fp32 and for a non-contiguous x.
TEST(FusedKernelsCuda, RmsNormModuleTakesTheKernels) {
  SKIP_WITHOUT_CUDA_KERNELS();
  torch::manual_seed(5);
  const int64_t h = 2048;
  RMSNorm fused(h, 1e-5, /*fused_kernels=*/true), aten(h, 1e-5);
  for (RMSNorm* norm : {&fused, &aten}) (*norm)->to(at::kCUDA, at::kBFloat16);
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x = torch::randn({2, 9, h}, bf16);
  const kernels::RmsNormOutput direct = kernels::rms_norm_forward(x, fused->weight, 1e-5);
  EXPECT_TRUE(at::equal(fused(x), direct.y));

  const at::Tensor strided = torch::randn({h, 9}, bf16).t();  // [9, h], not contiguous
  EXPECT_TRUE(at::equal(fused(strided), aten(strided)));
  for (RMSNorm* norm : {&fused, &aten}) (*norm)->to(at::kFloat);
  const at::Tensor x32 = x.to(at::kFloat);
  EXPECT_TRUE(at::equal(fused(x32), aten(x32)));
}

// SwiGLU: the kernels against autograd through at::silu(gate) * up, and against fp64.
TEST(FusedKernelsCuda, SwigluMatchesAtenAndFp64) {
  SKIP_WITHOUT_CUDA_KERNELS();
  for_each_shape(17, [&](const std::string& what, at::ScalarType dtype, int64_t rows,
                           int64_t ffn, const at::TensorOptions& options) {
    const at::Tensor gate = 3 * torch::randn({rows, ffn}, options);
    const at::Tensor up = torch::randn({rows, ffn}, options);
    const at::Tensor grad_out = torch::randn({rows, ffn}, options);
    ASSERT_TRUE(kernels::swiglu_fusable(gate, up));

    const at::Tensor g_ref = gate.clone().requires_grad_(), u_ref = up.clone().requires_grad_();
    const at::Tensor out_ref = at::silu(g_ref) * u_ref;
    out_ref.backward(grad_out);

    const at::Tensor out = kernels::swiglu_forward(gate, up);
    const kernels::SwigluGrads grads = kernels::swiglu_backward(grad_out, gate, up);
    const Tolerance tol = tolerance(dtype);
    expect_close(out, out_ref, tol, what + " out");
    expect_close(grads.grad_gate, g_ref.grad(), tol, what + " grad_gate");
    expect_close(grads.grad_up, u_ref.grad(), tol, what + " grad_up");

    const at::Tensor gd = gate.to(at::kDouble), ud = up.to(at::kDouble);
    const at::Tensor dyd = grad_out.to(at::kDouble);
    const at::Tensor sig = at::sigmoid(gd);
    // Two roundings to the dtype (silu, then the product): twice the tolerance.
    const Tolerance twice{2 * tol.rtol, 2 * tol.atol};
    expect_close(out, gd * sig * ud, twice, what + " out vs fp64");
    expect_close(grads.grad_up, dyd * gd * sig, twice, what + " grad_up vs fp64");
    expect_close(grads.grad_gate, dyd * ud * sig * (1 + gd * (1 - sig)), twice,
                 what + " grad_gate vs fp64");
  });
}

// A bf16 SwiGLU MLP on CUDA (h 64, ffn 256) with weights N(0, 0.1) drawn from `seed`: the same
// weights for the same seed.
LlamaMLP cuda_mlp(bool fused_kernels, uint64_t seed) {
  config::ModelOptions o = testing::tiny_options();
  o.hidden_size = 64;
  o.intermediate_size = 256;
  o.fused_kernels = fused_kernels;
  LlamaMLP mlp(o);
  mlp->to(at::kCUDA, at::kBFloat16);
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (at::Tensor& p : mlp->parameters()) p.normal_(0.0, 0.1);
  return mlp;
}

// The MLP module with fused_kernels on equals the kernels' result in bf16.
TEST(FusedKernelsCuda, MlpModuleTakesTheKernels) {
  SKIP_WITHOUT_CUDA_KERNELS();
  LlamaMLP mlp = cuda_mlp(/*fused_kernels=*/true, 6);
  const at::Tensor x =
      torch::randn({3, 5, 64}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
  const at::Tensor expected =
      mlp->down_proj(kernels::swiglu_forward(mlp->gate_proj(x), mlp->up_proj(x)));
  EXPECT_TRUE(at::equal(mlp(x), expected));
}

// The tiled MLP (3 tiles, bf16) with fused_kernels on against off: output and every gradient.
TEST(FusedKernelsCuda, TiledMlpMatchesWithoutTheKernels) {
  SKIP_WITHOUT_CUDA_KERNELS();
  LlamaMLP plain = cuda_mlp(/*fused_kernels=*/false, 8), fused = cuda_mlp(true, 8);
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x = torch::randn({2, 48, 64}, bf16), grad_y = torch::randn({2, 48, 64}, bf16);
  std::vector<at::Tensor> results[2];  // y, d x, d gate, d up, d down
  int index = 0;
  for (LlamaMLP* mlp : {&plain, &fused}) {
    const at::Tensor xi = x.clone().requires_grad_();
    const at::Tensor y = sp::tiled_mlp(**mlp, xi, 3);
    y.backward(grad_y);
    results[index++] = {y, xi.grad(), (*mlp)->gate_proj->weight.grad(),
                        (*mlp)->up_proj->weight.grad(), (*mlp)->down_proj->weight.grad()};
  }
  const char* names[] = {"y", "grad_x", "grad_gate", "grad_up", "grad_down"};
  for (int i = 0; i < 5; ++i) {
    // Two ulps of bf16 relative to each tensor's largest value (sums over 96 rows of products).
    const double largest = results[0][i].abs().max().item<double>();
    expect_close(results[1][i], results[0][i], {2e-2, 2e-2 * largest}, names[i]);
  }
}

// A 2-layer Llama trained 3 steps in bf16 on CUDA with the option on and off: the losses agree.
TEST(FusedKernelsCuda, LlamaStepsMatchWithoutTheKernels) {
  SKIP_WITHOUT_CUDA_KERNELS();
  config::ModelOptions o = testing::tiny_options();
  o.hidden_size = 256;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.intermediate_size = 688;
  o.vocab_size = 512;
  o.init_std = 0.02;
  torch::manual_seed(7);
  const at::Tensor ids = torch::randint(0, o.vocab_size, {2, 65}, at::kLong).to(at::kCUDA);
  const at::Tensor inputs = ids.narrow(1, 0, 64).contiguous();  // [2, 64]
  const at::Tensor labels = ids.narrow(1, 1, 64).contiguous();  // [2, 64]
  const at::Tensor positions =
      at::arange(64, at::kLong).unsqueeze(0).repeat({2, 1}).to(at::kCUDA);  // [2, 64]
  std::vector<double> losses[2];
  for (int fused = 0; fused < 2; ++fused) {
    o.fused_kernels = fused == 1;
    LlamaForCausalLM model(o);
    model->to(at::kCUDA, at::kBFloat16);
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 3; ++step) {
      adamw.zero_grad();
      const at::Tensor hidden = model->forward_hidden(inputs, positions, {});  // [2, 64, h]
      const LossSum loss = lm_loss_sum(hidden, model->lm_head_weight(), labels);
      const at::Tensor mean = loss.sum / loss.count.to(at::kFloat);
      mean.backward();
      adamw.step();
      losses[fused].push_back(mean.item<double>());
    }
  }
  for (int step = 0; step < 3; ++step) {
    EXPECT_NEAR(losses[1][step], losses[0][step], 1e-3 * std::abs(losses[0][step]))
        << "step " << step;
  }
}

}  // namespace
}  // namespace ulysses::model
