// AdamW vs LibTorch's torch::optim::AdamW, state save/load, lr_at against hand-computed values,
// clip_grad_norm vs torch::nn::utils::clip_grad_norm_ and an fp64 reference.
#include <ATen/Dispatch.h>
#include <ATen/Version.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "optim/adamw.h"
#include "optim/adamw_aten.h"
#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"

namespace ulysses::train {
namespace {

// ||actual - expected||_inf / ||expected||_inf, computed in fp64.
double max_rel_diff(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(at::kDouble);
  const double scale = e.abs().max().item<double>();
  return (a - e).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// sqrt(sum of squares of every defined grad), accumulated in fp64: the norm clipping must return.
double reference_norm(const std::vector<at::Tensor>& params) {
  double sum_sq = 0.0;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) sum_sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sum_sq);
}

config::OptimOptions adamw_options() {
  config::OptimOptions options;
  options.lr = 2e-3;
  options.betas = {0.9, 0.95};
  options.eps = 1e-8;
  options.weight_decay = 0.1;
  return options;
}

// Three fp32 leaf parameters with a fixed random init: [16, 8], [8], [3, 4, 5].
NamedTensors make_params(uint64_t seed = 7) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  NamedTensors params;
  params.emplace_back("w1", at::randn({16, 8}, gen).set_requires_grad(true));
  params.emplace_back("b1", at::randn({8}, gen).set_requires_grad(true));
  params.emplace_back("w2", at::randn({3, 4, 5}, gen).set_requires_grad(true));
  return params;
}

std::vector<at::Tensor> tensors_of(const NamedTensors& named) {
  std::vector<at::Tensor> out;
  for (const auto& entry : named) out.push_back(entry.second);
  return out;
}

// Gives every parameter the gradient of 1-based step `step` (same values on every call). "b1"
// gets no gradient on even steps, so per-parameter step counting and skipping are exercised.
void set_grads(const std::vector<at::Tensor>& params, int64_t step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor grad = at::randn(params[i].sizes(), gen) * (0.5 + static_cast<double>(i));
    if (i == 1 && step % 2 == 0) grad = at::Tensor();
    params[i].mutable_grad() = grad;
  }
}

NamedTensors clone_state(const NamedTensors& state) {
  NamedTensors out;
  for (const auto& [name, tensor] : state) out.emplace_back(name, tensor.clone());
  return out;
}

double lr_of_step(int64_t step) { return 2e-3 * (1.0 + 0.1 * static_cast<double>(step)); }

// ---------------------------------------------------------------------------------------------
// AdamW

// The gradients set_grads(params, step) gives, as a vector (undefined where it gives none).
std::vector<at::Tensor> grads_of_step(const std::vector<at::Tensor>& params, int64_t step) {
  std::vector<at::Tensor> holders;
  for (const at::Tensor& p : params) {
    holders.push_back(at::empty(p.sizes()).set_requires_grad(true));
  }
  set_grads(holders, step);
  std::vector<at::Tensor> grads;
  for (const at::Tensor& h : holders) grads.push_back(h.grad());
  return grads;
}

// kDevice runs the ATen ops, kHost the fused CPU pass (cpu_adam.h): both match torch.
void expect_matches_torch_adamw(OptimizerPlacement placement) {
  const config::OptimOptions options = adamw_options();
  const NamedTensors ours_named = make_params();
  const std::vector<at::Tensor> ours = tensors_of(ours_named);
  const std::vector<at::Tensor> theirs = tensors_of(make_params());
  AdamW adamw(ours_named, options, placement);
  torch::optim::AdamW reference(theirs,
                                torch::optim::AdamWOptions(options.lr)
                                    .betas(std::make_tuple(options.betas[0], options.betas[1]))
                                    .eps(options.eps)
                                    .weight_decay(options.weight_decay)
                                    .amsgrad(false));
  // A different lr per step, as a schedule gives.
  for (int64_t step = 1; step <= 10; ++step) {
    set_grads(ours, step);
    set_grads(theirs, step);
    adamw.step(lr_of_step(step));
    static_cast<torch::optim::AdamWOptions&>(reference.param_groups()[0].options())
        .lr(lr_of_step(step));
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_LE(max_rel_diff(ours[i], theirs[i]), 1e-6) << "param " << i << " step " << step;
    }
  }
  EXPECT_EQ(adamw.step_count(), 10);
  // The comparison is sensitive: Adam with coupled (L2) weight decay ends far from it.
  const std::vector<at::Tensor> coupled = tensors_of(make_params());
  torch::optim::Adam adam(coupled, torch::optim::AdamOptions(options.lr)
                                       .betas(std::make_tuple(options.betas[0], options.betas[1]))
                                       .weight_decay(options.weight_decay));
  for (int64_t step = 1; step <= 10; ++step) {
    set_grads(coupled, step);
    static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).lr(lr_of_step(step));
    adam.step();
  }
  EXPECT_GT(max_rel_diff(coupled[0], ours[0]), 1e-5);
}

TEST(AdamW, MatchesTorchAdamWOverTenSteps) { expect_matches_torch_adamw(OptimizerPlacement::kDevice); }

TEST(AdamW, OffloadedMatchesTorchAdamWOverTenSteps) {
  expect_matches_torch_adamw(OptimizerPlacement::kHost);
}

// bf16 parameters: kHost (fused pass, bf16 gradients read inline, the parameter written by the
// pass) against kDevice (ATen ops on an fp32 master): same masters within 1e-6, and every
// parameter is its master rounded to bf16.
TEST(AdamW, OffloadedBf16MatchesOnDevice) {
  NamedTensors host;
  NamedTensors device;
  for (const auto& [name, p] : make_params()) {
    host.emplace_back(name, p.detach().to(at::kBFloat16).set_requires_grad(true));
    device.emplace_back(name, p.detach().to(at::kBFloat16).set_requires_grad(true));
  }
  AdamW on_host(host, adamw_options(), OptimizerPlacement::kHost);
  AdamW on_device(device, adamw_options(), OptimizerPlacement::kDevice);
  for (int64_t step = 1; step <= 10; ++step) {
    std::vector<at::Tensor> grads = grads_of_step(tensors_of(host), step);
    for (at::Tensor& g : grads) {
      if (g.defined()) g = g.to(at::kBFloat16);
    }
    on_host.step(lr_of_step(step), grads);
    on_device.step(lr_of_step(step), grads);
  }
  const NamedTensors host_state = on_host.state_tensors();
  const NamedTensors device_state = on_device.state_tensors();
  for (size_t i = 0; i < host.size(); ++i) {
    const at::Tensor& master = host_state[4 * i + 3].second;
    EXPECT_LE(max_rel_diff(master, device_state[4 * i + 3].second), 1e-6) << host[i].first;
    EXPECT_TRUE(torch::equal(host[i].second, master.to(at::kBFloat16))) << host[i].first;
  }
}

TEST(AdamW, TwoStepsMatchHandComputedFp64) {
  config::OptimOptions options;
  options.betas = {0.9, 0.95};
  options.eps = 1e-8;
  options.weight_decay = 0.1;
  const double lr = 0.1;
  at::Tensor p = at::ones({1}, at::kDouble).set_requires_grad(true);
  AdamW adamw({{"p", p}}, options);

  p.mutable_grad() = at::full({1}, 0.5, at::kDouble);
  adamw.step(lr);
  // m = 0.05, v = 0.0125, bc1 = 0.1, bc2 = 0.05: update = (0.1 / 0.1) * 0.05 / (0.5 + 1e-8).
  const double p1 = 1.0 * (1 - 0.01) - 1.0 * 0.05 / (std::sqrt(0.0125) / std::sqrt(0.05) + 1e-8);
  EXPECT_NEAR(p.item<double>(), p1, 1e-12);

  p.mutable_grad() = at::full({1}, -0.25, at::kDouble);
  adamw.step(lr);
  // m = 0.9*0.05 - 0.1*0.25 = 0.02, v = 0.95*0.0125 + 0.05*0.0625 = 0.015,
  // bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.9025 = 0.0975.
  const double p2 =
      p1 * (1 - 0.01) - (0.1 / 0.19) * 0.02 / (std::sqrt(0.015) / std::sqrt(0.0975) + 1e-8);
  EXPECT_NEAR(p.item<double>(), p2, 1e-12);
}

TEST(AdamW, SkipsParametersWithoutGradient) {
  const NamedTensors named = make_params();
  const at::Tensor before = named[1].second.detach().clone();
  AdamW adamw(named, adamw_options());
  set_grads(tensors_of(named), 2);  // step 2: "b1" has no grad
  adamw.step(1e-2);
  EXPECT_TRUE(torch::equal(named[1].second, before));  // not even weight decay
  const NamedTensors state = adamw.state_tensors();
  ASSERT_EQ(state.size(), 9u);
  EXPECT_EQ(state[5].first, "b1.step");
  EXPECT_EQ(state[5].second.item<int64_t>(), 0);
  EXPECT_EQ(state[2].first, "w1.step");
  EXPECT_EQ(state[2].second.item<int64_t>(), 1);
}

TEST(AdamW, SaveLoadContinuesBitForBit) {
  const config::OptimOptions options = adamw_options();
  // Run A: ten uninterrupted steps.
  const NamedTensors run_a = make_params();
  AdamW adamw_a(run_a, options);
  for (int64_t step = 1; step <= 10; ++step) {
    set_grads(tensors_of(run_a), step);
    adamw_a.step(lr_of_step(step));
  }
  // Run B: five steps, then "checkpoint" parameters, optimizer state and step count.
  const NamedTensors run_b = make_params();
  AdamW adamw_b(run_b, options);
  for (int64_t step = 1; step <= 5; ++step) {
    set_grads(tensors_of(run_b), step);
    adamw_b.step(lr_of_step(step));
  }
  const NamedTensors saved_params = clone_state(run_b);
  const NamedTensors saved_state = clone_state(adamw_b.state_tensors());
  const int64_t saved_count = adamw_b.step_count();

  // Run C: a fresh optimizer on the restored parameters, steps 6..10.
  NamedTensors run_c;
  for (const auto& [name, tensor] : saved_params) {
    run_c.emplace_back(name, tensor.detach().clone().set_requires_grad(true));
  }
  AdamW adamw_c(run_c, options);
  adamw_c.load_state(saved_state, saved_count);
  EXPECT_EQ(adamw_c.step_count(), 5);
  for (int64_t step = 6; step <= 10; ++step) {
    set_grads(tensors_of(run_c), step);
    adamw_c.step(lr_of_step(step));
  }
  EXPECT_EQ(adamw_c.step_count(), 10);
  for (size_t i = 0; i < run_a.size(); ++i) {
    EXPECT_TRUE(torch::equal(run_c[i].second, run_a[i].second)) << run_a[i].first;
  }
  const NamedTensors state_a = adamw_a.state_tensors();
  const NamedTensors state_c = adamw_c.state_tensors();
  ASSERT_EQ(state_a.size(), state_c.size());
  for (size_t i = 0; i < state_a.size(); ++i) {
    EXPECT_EQ(state_c[i].first, state_a[i].first);
    EXPECT_TRUE(torch::equal(state_c[i].second, state_a[i].second)) << state_a[i].first;
  }
}

// Expects load_state(state) to throw a UserError whose message contains `needle`, and to leave
// the optimizer's state as it was.
void expect_load_error(const NamedTensors& state, const std::string& needle) {
  const NamedTensors named = make_params();
  AdamW adamw(named, adamw_options());
  set_grads(tensors_of(named), 1);
  adamw.step(1e-3);
  const NamedTensors before = clone_state(adamw.state_tensors());
  try {
    adamw.load_state(state, 3, "ckpt/step-3/optimizer.safetensors");
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_EQ(message.rfind("ckpt/step-3/optimizer.safetensors: ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(adamw.step_count(), 1);
  const NamedTensors after = adamw.state_tensors();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << before[i].first;
  }
}

TEST(AdamW, LoadStateRejectsMismatchedStateAndChangesNothing) {
  const NamedTensors named = make_params();
  AdamW source(named, adamw_options());
  set_grads(tensors_of(named), 1);
  source.step(1e-3);
  source.step(1e-3);
  const NamedTensors good = clone_state(source.state_tensors());
  // The entries are valid for the first parameters and bad for a later one: nothing may be copied.

  NamedTensors missing = good;
  missing.erase(missing.begin() + 7);  // w2.exp_avg_sq
  expect_load_error(missing, "missing entry 'w2.exp_avg_sq'");

  NamedTensors extra = good;
  extra.emplace_back("w3.exp_avg", at::zeros({2}));
  expect_load_error(extra, "unexpected entry 'w3.exp_avg'");

  NamedTensors duplicate = good;
  duplicate.push_back(good[0]);
  expect_load_error(duplicate, "entry 'w1.exp_avg' appears twice");

  NamedTensors wrong_shape = good;
  wrong_shape[6].second = at::zeros({4, 3, 5});  // w2.exp_avg
  expect_load_error(wrong_shape,
                    "'w2.exp_avg' has shape [4, 3, 5], the parameter has shape [3, 4, 5]");

  NamedTensors wrong_dtype = good;
  wrong_dtype[7].second = good[7].second.to(at::kDouble);  // w2.exp_avg_sq
  expect_load_error(wrong_dtype, "'w2.exp_avg_sq' has dtype Double");

  NamedTensors negative_step = good;
  negative_step[8].second = at::scalar_tensor(-1, at::kLong);  // w2.step
  expect_load_error(negative_step, "'w2.step' is negative");

  NamedTensors float_step = good;
  float_step[8].second = at::scalar_tensor(2.0);
  expect_load_error(float_step, "'w2.step' must be a one-element integer tensor");
}

TEST(AdamW, RejectsBadOptionsNamingTheKey) {
  config::OptimOptions bad_beta = adamw_options();
  bad_beta.betas = {1.0, 0.95};
  EXPECT_THROW(
      {
        try {
          AdamW adamw(make_params(), bad_beta);
        } catch (const UserError& error) {
          EXPECT_EQ(std::string(error.what()).rfind("optim.betas: ", 0), 0u) << error.what();
          throw;
        }
      },
      UserError);
  config::OptimOptions bad_decay = adamw_options();
  bad_decay.weight_decay = -0.1;
  EXPECT_THROW(AdamW(make_params(), bad_decay), UserError);
  config::OptimOptions bad_eps = adamw_options();
  bad_eps.eps = -1.0;
  EXPECT_THROW(AdamW(make_params(), bad_eps), UserError);
}

// step(lr, grads) is step(lr) with grads[i] in place of parameters()[i].grad(), on both
// placements: same parameters and state bit for bit, undefined entries skipped.
TEST(AdamW, ExplicitGradientsMatchDotGrad) {
  for (OptimizerPlacement placement : {OptimizerPlacement::kDevice, OptimizerPlacement::kHost}) {
    const NamedTensors by_grad = make_params();
    const NamedTensors explicit_named = make_params();
    AdamW a(by_grad, adamw_options(), placement);
    AdamW b(explicit_named, adamw_options(), placement);
    for (int64_t step = 1; step <= 4; ++step) {
      set_grads(tensors_of(by_grad), step);
      a.step(lr_of_step(step));
      b.step(lr_of_step(step), grads_of_step(tensors_of(explicit_named), step));
    }
    for (const at::Tensor& p : tensors_of(explicit_named)) EXPECT_FALSE(p.grad().defined());
    EXPECT_EQ(b.step_count(), 4);
    const NamedTensors state_a = a.state_tensors();
    const NamedTensors state_b = b.state_tensors();
    ASSERT_EQ(state_a.size(), state_b.size());
    for (size_t i = 0; i < state_a.size(); ++i) {
      EXPECT_TRUE(torch::equal(state_a[i].second, state_b[i].second)) << state_a[i].first;
    }
    for (size_t i = 0; i < by_grad.size(); ++i) {
      EXPECT_TRUE(torch::equal(by_grad[i].second, explicit_named[i].second)) << by_grad[i].first;
    }
    EXPECT_EQ(state_b[5].first, "b1.step");
    EXPECT_EQ(state_b[5].second.item<int64_t>(), 2);  // b1 had no gradient on steps 2 and 4
  }
}

// A bf16 parameter given fp32 gradients updates its fp32 master with the unrounded gradient:
// the master equals that of an fp32 parameter starting from the same (bf16) values with the same
// gradients, exactly, and the parameter is the master rounded to bf16.
TEST(AdamW, Fp32GradientsOfBf16ParametersReachTheMasterUnrounded) {
  for (OptimizerPlacement placement : {OptimizerPlacement::kDevice, OptimizerPlacement::kHost}) {
    NamedTensors bf16;
    NamedTensors fp32;
    for (const auto& [name, p] : make_params()) {
      const at::Tensor rounded = p.detach().to(at::kBFloat16);
      bf16.emplace_back(name, rounded.clone().set_requires_grad(true));
      fp32.emplace_back(name, rounded.to(at::kFloat).set_requires_grad(true));
    }
    AdamW ours(bf16, adamw_options(), placement);
    AdamW reference(fp32, adamw_options(), placement);
    for (int64_t step = 1; step <= 4; ++step) {
      const std::vector<at::Tensor> grads = grads_of_step(tensors_of(fp32), step);
      ours.step(lr_of_step(step), grads);
      reference.step(lr_of_step(step), grads);
    }
    const NamedTensors state = ours.state_tensors();  // per param: exp_avg, exp_avg_sq, step, master
    ASSERT_EQ(state.size(), 12u);
    for (size_t i = 0; i < fp32.size(); ++i) {
      const at::Tensor& master = state[4 * i + 3].second;
      ASSERT_EQ(state[4 * i + 3].first, fp32[i].first + ".master");
      EXPECT_TRUE(torch::equal(master, fp32[i].second)) << fp32[i].first;
      EXPECT_TRUE(torch::equal(bf16[i].second, master.to(at::kBFloat16))) << fp32[i].first;
    }
    // Sensitive: rounding the gradients to bf16 first gives another master.
    NamedTensors start;
    for (const auto& [name, p] : make_params()) {
      start.emplace_back(name, p.detach().to(at::kBFloat16).set_requires_grad(true));
    }
    AdamW rounded(start, adamw_options(), placement);
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<at::Tensor> grads = grads_of_step(tensors_of(fp32), step);
      for (at::Tensor& g : grads) {
        if (g.defined()) g = g.to(at::kBFloat16);
      }
      rounded.step(lr_of_step(step), grads);
    }
    EXPECT_FALSE(torch::equal(rounded.state_tensors()[3].second, state[3].second));
  }
}

TEST(AdamW, ExplicitGradientsOfTheWrongCountOrDtypeAreRejected) {
  const NamedTensors named = make_params();
  AdamW adamw(named, adamw_options());
  std::vector<at::Tensor> grads = grads_of_step(tensors_of(named), 1);
  grads.pop_back();
  EXPECT_THROW(adamw.step(1e-3, grads), c10::Error);
  grads = grads_of_step(tensors_of(named), 1);
  grads[0] = grads[0].to(at::kBFloat16);  // fp32 parameter: only fp32 gradients
  EXPECT_THROW(adamw.step(1e-3, grads), c10::Error);
  grads = grads_of_step(tensors_of(named), 1);
  grads[2] = grads[2].view({12, 5});  // checked before anything is updated
  const at::Tensor before = named[0].second.detach().clone();
  EXPECT_THROW(adamw.step(1e-3, grads), c10::Error);
  EXPECT_TRUE(torch::equal(named[0].second, before));
  EXPECT_EQ(adamw.step_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// The device updates: the ATen ops in pieces, and ATen's fused kernel (CUDA's; its CPU twin here)

// Five steps from equal random state (weight decay on; a size of two whole pieces and a tail).
// The pieces are the whole-tensor ops element for element: tolerance 0.
TEST(AdamW, UpdateInPiecesEqualsTheWholeTensorUpdateBitForBit) {
  const config::OptimOptions options = adamw_options();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t n = 2 * kDevicePiece + 1000;
  at::Tensor w = at::randn({n}, gen), m = at::zeros({n}), v = at::zeros({n});
  at::Tensor w2 = w.clone(), m2 = m.clone(), v2 = v.clone();
  for (int step = 1; step <= 5; ++step) {
    const at::Tensor grad = at::randn({n}, gen);
    adamw_aten_update(w, grad, m, v, lr_of_step(step), step, options);
    adamw_aten_update_in_pieces(w2, grad, m2, v2, lr_of_step(step), step, options);
  }
  EXPECT_TRUE(torch::equal(w, w2));
  EXPECT_TRUE(torch::equal(m, m2));
  EXPECT_TRUE(torch::equal(v, v2));
}

// The fused kernel implements the same AdamW (decoupled weight decay, bias corrections, eps after
// the square root, the incremented step): after 5 steps from equal state, weights within 1e-6
// relative (it rounds in another order: a few fp32 ulps per step), moments within 1e-6 of their
// largest value.
TEST(AdamW, FusedKernelMatchesTheAtenOps) {
  config::OptimOptions options = adamw_options();
  options.weight_decay = 0.1;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const int64_t n = 4097;
  at::Tensor w = at::randn({n}, gen), m = at::zeros({n}), v = at::zeros({n});
  at::Tensor w2 = w.clone(), m2 = m.clone(), v2 = v.clone();
  ASSERT_TRUE(fused_adamw_applies(w2, w2, m2, v2));
  EXPECT_FALSE(fused_adamw_applies(w2, w2.to(at::kDouble), m2, v2));
  for (int step = 1; step <= 5; ++step) {
    const at::Tensor grad = at::randn({n}, gen);
    adamw_aten_update(w, grad, m, v, lr_of_step(step), step, options);
    adamw_fused_update(w2, grad, m2, v2, lr_of_step(step), step, options);
  }
  const double weight_error = ((w2 - w).abs() / w.abs().clamp_min(1e-3)).max().item<double>();
  EXPECT_LT(weight_error, 1e-6);
  // Moments near zero differ by rounding of the running sum: relative to their largest value.
  EXPECT_LT(((m2 - m).abs().max() / m.abs().max()).item<double>(), 1e-6);
  EXPECT_LT(((v2 - v).abs().max() / v.abs().max()).item<double>(), 1e-6);
}

// The multi-tensor form (what AdamW runs on CUDA: one call per device and dtype group) equals
// the per-parameter fused call bit for bit (an elementwise kernel): fp32 and bf16 groups
// interleaved, each parameter at its own step, over 3 updates.
TEST(AdamW, FusedUpdateOfManyEqualsOneCallPerParameter) {
  const config::OptimOptions options = adamw_options();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const std::vector<std::pair<int64_t, at::ScalarType>> shapes = {
      {4097, at::kFloat}, {33, at::kBFloat16}, {1000, at::kFloat}, {7, at::kBFloat16}};
  std::vector<std::array<at::Tensor, 3>> one, many;  // w, m, v per parameter
  for (const auto& [n, dtype] : shapes) {
    const at::Tensor w = at::randn({n}, gen).to(dtype);
    one.push_back({w.clone(), at::zeros({n}, dtype), at::zeros({n}, dtype)});
    many.push_back({w.clone(), at::zeros({n}, dtype), at::zeros({n}, dtype)});
  }
  const std::vector<int64_t> first_step = {1, 4, 2, 9};
  for (int64_t k = 0; k < 3; ++k) {
    std::vector<FusedAdamWEntry> entries;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const at::Tensor grad = at::randn({shapes[i].first}, gen).to(shapes[i].second);
      const int64_t step = first_step[i] + k;
      adamw_fused_update(one[i][0], grad, one[i][1], one[i][2], 1e-2, step, options);
      entries.push_back({many[i][0], grad, many[i][1], many[i][2], step});
    }
    adamw_fused_update_many(entries, 1e-2, options);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (size_t t = 0; t < 3; ++t) EXPECT_TRUE(torch::equal(one[i][t], many[i][t])) << i << " " << t;
  }
  const FusedAdamWEntry mixed{at::zeros({4}), at::zeros({4}, at::kDouble), at::zeros({4}),
                              at::zeros({4}), 1};
  EXPECT_THROW(adamw_fused_update_many({mixed}, 1e-2, options), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// fused_adamw_cpu (the kHost kernel) against the ATen-op update

// fused_adamw_cpu rounds like torch's AdamW op sequence evaluated with a correctly rounded sqrt
// (reference_update below: the ATen ops of adamw_aten_update, with sqrt taken element by element
// by std::sqrt, since ATen's CPU sqrt is not correctly rounded): from the same state, w, m and v
// are equal bit for bit (tolerance: 0). The returned ratio |dw| / (eps_T * (|w| + 2 |u|)) (u the
// update; eps_T = 2^-23 fp32, 2^-52 fp64) says by how much a mismatch missed.

// sqrt of every element, correctly rounded (IEEE 754's sqrt, as std::sqrt computes it).
at::Tensor exact_sqrt(const at::Tensor& t) {
  at::Tensor out = t.contiguous().clone();
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "exact_sqrt", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = std::sqrt(p[i]);
  });
  return out;
}

// Whether ATen's CPU kernels in this process fuse multiply-adds (Tensor.add_ with alpha and
// addcmul_ each round once): its vectorized kernels (AVX2, AVX-512) do; its DEFAULT kernels (a CPU
// without AVX2, or ATEN_CPU_CAPABILITY=default) round the product first.
bool aten_fuses_multiply_add() { return at::get_cpu_capability() != "DEFAULT"; }

// torch.optim.AdamW's op sequence (as adamw_aten_update runs it) with exact_sqrt for sqrt, where
// ATen's kernels fuse multiply-adds; elsewhere the same formula element by element in the master
// dtype with std::fma where the vectorized kernels fuse (what cpu_adam.h documents), so that the
// fused pass is held bit for bit to the formula on every instruction set.
void reference_update(at::Tensor w, const at::Tensor& grad, at::Tensor m, at::Tensor v, double lr,
                      int64_t step, const config::OptimOptions& o) {
  const double bias_correction1 = 1.0 - std::pow(o.betas[0], static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(o.betas[1], static_cast<double>(step));
  if (aten_fuses_multiply_add()) {
    if (o.weight_decay != 0.0) w.mul_(1.0 - lr * o.weight_decay);
    m.mul_(o.betas[0]).add_(grad, 1.0 - o.betas[0]);
    v.mul_(o.betas[1]).addcmul_(grad, grad, 1.0 - o.betas[1]);
    const at::Tensor denom = (exact_sqrt(v) / std::sqrt(bias_correction2)).add_(o.eps);
    w.addcdiv_(m, denom, -(lr / bias_correction1));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "reference_update", [&] {
    using T = scalar_t;  // every scalar rounded to the master dtype, as ATen rounds a Scalar
    const T decay = static_cast<T>(1.0 - lr * o.weight_decay);
    const T beta1 = static_cast<T>(o.betas[0]), one_minus_beta1 = static_cast<T>(1.0 - o.betas[0]);
    const T beta2 = static_cast<T>(o.betas[1]), one_minus_beta2 = static_cast<T>(1.0 - o.betas[1]);
    const T sqrt_bc2 = static_cast<T>(std::sqrt(bias_correction2));
    const T eps = static_cast<T>(o.eps);
    const T neg_step = static_cast<T>(-(lr / bias_correction1));
    T* pw = w.data_ptr<T>();
    T* pm = m.data_ptr<T>();
    T* pv = v.data_ptr<T>();
    const T* pg = grad.data_ptr<T>();
    for (int64_t i = 0; i < w.numel(); ++i) {
      const T weight = o.weight_decay != 0.0 ? pw[i] * decay : pw[i];
      pm[i] = std::fma(pg[i], one_minus_beta1, pm[i] * beta1);
      const T scaled = one_minus_beta2 * pg[i];
      pv[i] = std::fma(scaled, pg[i], pv[i] * beta2);
      const T denom = std::sqrt(pv[i]) / sqrt_bc2 + eps;
      const T update = neg_step * pm[i];
      pw[i] = weight + update / denom;
    }
  });
}

struct FusedCase {
  int64_t n;
  at::ScalarType master = at::kFloat;
  at::ScalarType grad = at::kFloat;
  at::ScalarType param_out = at::ScalarType::Undefined;  // undefined: no param_out
  double weight_decay = 0.1;
};

// Runs 5 steps of both updates from equal state (the fused state re-synced to ATen's after each
// step, so that differences do not compound) and checks the tolerance above; returns the largest
// |dw| / tolerance seen (<= 1 passes) after EXPECTing equality of the moments.
double check_fused_against_aten(const FusedCase& c) {
  config::OptimOptions options = adamw_options();
  options.weight_decay = c.weight_decay;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11 + c.n);
  const at::TensorOptions master_opts = at::TensorOptions(c.master);
  at::Tensor w = at::randn({c.n}, gen).to(c.master);
  at::Tensor m = at::zeros({c.n}, master_opts);
  at::Tensor v = at::zeros({c.n}, master_opts);
  FusedAdamWBuffer fused{w.clone(), m.clone(), v.clone(), at::Tensor(), at::Tensor(), 0};
  if (c.param_out != at::ScalarType::Undefined) fused.param_out = at::empty({c.n}, c.param_out);
  const double unit = c.master == at::kDouble ? std::ldexp(1.0, -52) : std::ldexp(1.0, -23);
  double worst = 0.0;
  for (int step = 1; step <= 5; ++step) {
    // Gradients over several magnitudes, so that m, v and the update cover many exponents
    // (within fp16's range).
    const at::Tensor grad =
        (at::randn({c.n}, gen) * at::exp(at::randn({c.n}, gen) * 3)).clamp(-6e4, 6e4).to(c.grad);
    fused.grad = grad;
    fused.step = step;
    const at::Tensor w_before = w.clone();
    fused_adamw_cpu({fused}, lr_of_step(step), options);
    reference_update(w, grad.to(c.master), m, v, lr_of_step(step), step, options);
    EXPECT_TRUE(torch::equal(fused.master, w)) << "n " << c.n << " step " << step;
    EXPECT_TRUE(torch::equal(fused.exp_avg, m)) << "n " << c.n << " step " << step;
    EXPECT_TRUE(torch::equal(fused.exp_avg_sq, v)) << "n " << c.n << " step " << step;
    if (fused.param_out.defined()) {
      const at::Tensor expected = fused.master.to(c.param_out);
      const at::Tensor differ = fused.param_out.ne(expected);
      EXPECT_EQ(differ.sum().item<int64_t>(), 0)
          << "n " << c.n << " " << c.param_out << " master " << fused.master.masked_select(differ).slice(0, 0, 3)
          << " ours " << fused.param_out.masked_select(differ).slice(0, 0, 3).to(at::kFloat);
    }
    const at::Tensor w64 = w.to(at::kDouble);
    const at::Tensor update = w64 - w_before.to(at::kDouble) * (1.0 - lr_of_step(step) * c.weight_decay);
    const at::Tensor tolerance = unit * (w64.abs() + 2 * update.abs());
    const at::Tensor dw = (fused.master.to(at::kDouble) - w64).abs();
    worst = std::max(worst, (dw / tolerance).nan_to_num(0.0).max().item<double>());
    fused.master.copy_(w);  // re-sync
  }
  return worst;
}

// Sizes around the vector widths (8, 16), 64 and the kernel's 64K-element chunks.
const std::vector<int64_t> kFusedSizes = {1, 7, 17, 64, 65, 1000, 65535, 3 * 65536 + 77};

TEST(FusedAdamW, Fp32EqualsTheAtenOpsWithAnExactSqrtBitForBit) {
  for (int64_t n : kFusedSizes) {
    for (double weight_decay : {0.1, 0.0}) {
      EXPECT_LE(check_fused_against_aten({n, at::kFloat, at::kFloat, at::ScalarType::Undefined, weight_decay}), 1.0)
          << "n " << n << " weight_decay " << weight_decay << " isa " << fused_adamw_isa();
    }
  }
}

TEST(FusedAdamW, Bf16AndFp16GradientsAndParamOut) {
  for (int64_t n : kFusedSizes) {
    for (at::ScalarType low : {at::kBFloat16, at::kHalf}) {
      EXPECT_LE(check_fused_against_aten({n, at::kFloat, low, low}), 1.0) << "n " << n << " " << low;
      EXPECT_LE(check_fused_against_aten({n, at::kFloat, at::kFloat, low}), 1.0) << "n " << n;
    }
    EXPECT_LE(check_fused_against_aten({n, at::kFloat, at::kFloat, at::kFloat}), 1.0) << "n " << n;
  }
}

TEST(FusedAdamW, Fp64) {
  for (int64_t n : {int64_t{7}, int64_t{1000}, int64_t{65536 + 77}}) {
    EXPECT_LE(check_fused_against_aten({n, at::kDouble, at::kDouble, at::ScalarType::Undefined}), 1.0) << n;
    EXPECT_LE(check_fused_against_aten({n, at::kDouble, at::kDouble, at::kDouble}), 1.0) << n;
  }
}

// Threads split the chunk list (here 8 chunks of two buffers); the result does not depend on
// their number. (Each buffer once per call: the same buffer twice in one call would be two
// threads updating the same memory.)
TEST(FusedAdamW, SameResultOnOneAndTwoThreads) {
  const int threads = at::get_num_threads();
  std::vector<std::vector<at::Tensor>> results;
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
    const int64_t n = 3 * 65536 + 5;
    std::vector<FusedAdamWBuffer> buffers;
    for (int i = 0; i < 2; ++i) {
      buffers.push_back({at::randn({n}, gen), at::zeros({n}), at::zeros({n}),
                         at::randn({n}, gen), at::Tensor(), 1});
    }
    fused_adamw_cpu(buffers, 1e-3, adamw_options());
    fused_adamw_cpu(buffers, 1e-3, adamw_options());  // a second step: moments non-zero
    results.push_back({buffers[0].master, buffers[1].master});
  }
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(results[0][0], results[1][0]));
  EXPECT_TRUE(torch::equal(results[0][1], results[1][1]));
}

// optim.host_threads, when set, is the pass's thread count whatever at::get_num_threads() says;
// the result is the same on any count (3 threads: shares of unequal chunk counts).
TEST(FusedAdamW, HostThreadsOptionGivesTheSameResult) {
  std::vector<std::vector<at::Tensor>> results;
  for (int64_t t : {int64_t{1}, int64_t{3}}) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
    const int64_t n = 5 * 65536 + 11;
    std::vector<FusedAdamWBuffer> buffers;  // distinct buffers (threads update them at once)
    for (int i = 0; i < 2; ++i) {
      buffers.push_back({at::randn({n}, gen), at::zeros({n}), at::zeros({n}),
                         at::randn({n}, gen), at::Tensor(), 1});
    }
    config::OptimOptions options = adamw_options();
    options.host_threads = t;
    fused_adamw_cpu(buffers, 1e-3, options, 0.5);
    fused_adamw_cpu(buffers, 1e-3, options, 0.5);
    results.push_back({buffers[0].master, buffers[1].master});
  }
  EXPECT_TRUE(torch::equal(results[0][0], results[1][0]));
  EXPECT_TRUE(torch::equal(results[0][1], results[1][1]));
}

// The host passes keep their worker threads: 20 passes on 4 threads (and norms on 2 and 3) start
// at most 3 OS threads in all, not 3 per pass, and give the one-thread result.
TEST(FusedAdamW, HostPassesReuseTheirThreads) {
  const int64_t n = 6 * 65536 + 5;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor grad = at::randn({n}, gen);
  const at::Tensor start = at::randn({n}, gen);
  std::vector<at::Tensor> masters;
  const int64_t before = host_threads_started();
  for (int64_t threads : {int64_t{1}, int64_t{4}}) {
    std::vector<FusedAdamWBuffer> buffers = {
        {start.clone(), at::zeros({n}), at::zeros({n}), grad, at::Tensor(), 1}};
    config::OptimOptions options = adamw_options();
    options.host_threads = threads;
    for (int pass = 0; pass < 20; ++pass) fused_adamw_cpu(buffers, 1e-3, options, 1.0);
    masters.push_back(buffers[0].master);
  }
  EXPECT_EQ(host_gradient_norm({grad}, 2), host_gradient_norm({grad}, 3));
  EXPECT_LE(host_threads_started() - before, 3);
  EXPECT_TRUE(torch::equal(masters[0], masters[1]));
}

// The host gradient norm (optimizer offload's clipping): each element squared in fp64, the
// chunks' sums added in order. Against an fp64 reference that uses none of it (ATen's norm of the
// tensors converted to fp64): rel 1e-12 (fp64 sums of ~400K terms); the same bits on 1, 2 and 3
// threads; inf and NaN reach the result; undefined entries are skipped.
TEST(HostGradientNorm, EqualsTheFp64NormOnAnyThreadCount) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  std::vector<at::Tensor> grads = {
      at::randn({3 * 65536 + 5}, gen),                         // fp32, several chunks
      at::randn({1000}, gen).to(at::kBFloat16),                // bf16
      at::Tensor(),                                            // no gradient
      at::randn({77}, gen).to(at::kHalf),                      // fp16
      at::randn({2, 65536 + 3}, gen).to(at::kDouble) * 1e-3};  // fp64, 2-D
  double sum_sq = 0.0;
  for (const at::Tensor& g : grads) {
    if (g.defined()) sum_sq += g.to(at::kDouble).norm().pow(2).item<double>();
  }
  const double reference = std::sqrt(sum_sq);
  std::vector<double> norms;
  for (int64_t threads : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    norms.push_back(host_gradient_norm(grads, threads));
    EXPECT_NEAR(norms.back(), reference, 1e-12 * reference) << threads << " threads";
  }
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_EQ(norms[0], norms[2]);
  EXPECT_EQ(host_gradient_norm({}, 2), 0.0);
  // In parts, each gradient's chunk sums taken in any order (as they become final during
  // backward, in reverse) and added up at the end: the same bits.
  std::vector<std::vector<double>> sums(grads.size());
  for (size_t i = grads.size(); i-- > 0;) sums[i] = host_gradient_square_sums(grads[i], 2);
  EXPECT_EQ(host_gradient_norm_of_sums(sums), norms[0]);
  EXPECT_EQ(sums[0].size(), 4u);  // 3 * 64K + 5 elements
  EXPECT_TRUE(sums[2].empty());

  at::Tensor bad = grads[0].clone();
  bad[65536 + 17] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(host_gradient_norm({bad}, 2)));
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(host_gradient_norm({bad}, 2)));
  EXPECT_THROW(host_gradient_norm({at::randn({4, 3}).t()}, 1), c10::Error);  // not contiguous
  EXPECT_THROW(host_gradient_norm({at::ones({4}, at::kInt)}, 1), c10::Error);
  EXPECT_GE(available_host_cpus(), 1);
}

// optim.host_threads = 0 on a GPU: the CPUs are shared among the ranks of this node, not of the
// world. Two nodes of 8 ranks (world 16) with 64 CPUs each get 8 threads per rank, not 4.
TEST(HostThreads, AutoSharesTheNodesCpusAmongTheNodesRanks) {
  EXPECT_EQ(resolve_host_threads(/*configured=*/6, false, 1, 64, 8), 6);
  EXPECT_EQ(resolve_host_threads(0, /*host_is_device=*/true, /*intra_op_threads=*/3, 64, 8), 3);
  EXPECT_EQ(resolve_host_threads(0, false, 1, /*cpus=*/64, /*ranks_on_node=*/8), 8);
  EXPECT_EQ(resolve_host_threads(0, false, 1, /*cpus=*/64, /*ranks_on_node=*/1), 64);
  EXPECT_EQ(resolve_host_threads(0, false, 1, /*cpus=*/4, /*ranks_on_node=*/8), 1);
}

TEST(FusedAdamW, RejectsMismatchedBuffers) {
  FusedAdamWBuffer b{at::zeros({8}), at::zeros({8}), at::zeros({8}), at::zeros({7}), at::Tensor(), 1};
  EXPECT_THROW(fused_adamw_cpu({b}, 1e-3, adamw_options()), c10::Error);
  b.grad = at::zeros({8}, at::kDouble);
  EXPECT_THROW(fused_adamw_cpu({b}, 1e-3, adamw_options()), c10::Error);
  b.grad = at::zeros({8});
  b.param_out = b.master;
  EXPECT_THROW(fused_adamw_cpu({b}, 1e-3, adamw_options()), c10::Error);
  b.param_out = at::Tensor();
  b.exp_avg = at::zeros({16}).slice(0, 0, 16, 2);  // not contiguous
  EXPECT_THROW(fused_adamw_cpu({b}, 1e-3, adamw_options()), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// lr_at: lr 1e-3, min_lr 1e-4, warmup 10, total 110 (so decay progress = (step - 10) / 100).

config::OptimOptions schedule_options(const std::string& schedule) {
  config::OptimOptions options;
  options.lr = 1e-3;
  options.min_lr = 1e-4;
  options.warmup_steps = 10;
  options.schedule = schedule;
  return options;
}

constexpr double kLrTolerance = 1e-15;  // absolute, about 1e-12 relative

TEST(LrSchedule, WarmupIsLinearFromLrOverWarmupToLr) {
  for (const char* schedule : {"constant", "linear", "cosine"}) {
    const config::OptimOptions options = schedule_options(schedule);
    EXPECT_NEAR(lr_at(options, 1, 110), 1e-4, kLrTolerance) << schedule;
    EXPECT_NEAR(lr_at(options, 5, 110), 5e-4, kLrTolerance) << schedule;
    EXPECT_NEAR(lr_at(options, 10, 110), 1e-3, kLrTolerance) << schedule;
  }
}

TEST(LrSchedule, Constant) {
  const config::OptimOptions options = schedule_options("constant");
  EXPECT_DOUBLE_EQ(lr_at(options, 11, 110), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(options, 110, 110), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(options, 500, 110), 1e-3);
}

TEST(LrSchedule, LinearDecaysToMinLrAtTotalSteps) {
  const config::OptimOptions options = schedule_options("linear");
  EXPECT_NEAR(lr_at(options, 11, 110), 1e-4 + 9e-4 * 0.99, kLrTolerance);
  EXPECT_NEAR(lr_at(options, 35, 110), 7.75e-4, kLrTolerance);  // progress 0.25
  EXPECT_NEAR(lr_at(options, 60, 110), 5.5e-4, kLrTolerance);   // progress 0.5
  EXPECT_NEAR(lr_at(options, 110, 110), 1e-4, kLrTolerance);
  EXPECT_NEAR(lr_at(options, 200, 110), 1e-4, kLrTolerance);  // past the end: min_lr
}

TEST(LrSchedule, CosineDecaysToMinLrAtTotalSteps) {
  const config::OptimOptions options = schedule_options("cosine");
  // 1e-4 + 9e-4 * 0.5 * (1 + cos(pi * p)), with cos(pi/4) = 0.70710678118654752.
  EXPECT_NEAR(lr_at(options, 35, 110), 8.6819805153394638e-4, kLrTolerance);  // p = 0.25
  EXPECT_NEAR(lr_at(options, 60, 110), 5.5e-4, kLrTolerance);                 // p = 0.5
  EXPECT_NEAR(lr_at(options, 85, 110), 2.3180194846605362e-4, kLrTolerance);  // p = 0.75
  EXPECT_NEAR(lr_at(options, 110, 110), 1e-4, kLrTolerance);
  EXPECT_NEAR(lr_at(options, 111, 110), 1e-4, kLrTolerance);
}

TEST(LrSchedule, NoWarmupAndWarmupLongerThanRun) {
  config::OptimOptions options = schedule_options("linear");
  options.warmup_steps = 0;
  options.min_lr = 0.0;
  EXPECT_NEAR(lr_at(options, 1, 10), 9e-4, kLrTolerance);  // step 1 already has progress 1/10
  EXPECT_NEAR(lr_at(options, 10, 10), 0.0, kLrTolerance);
  options.schedule = "constant";
  EXPECT_DOUBLE_EQ(lr_at(options, 1, 10), 1e-3);
  options.schedule = "cosine";
  options.warmup_steps = 20;
  options.min_lr = 1e-4;
  EXPECT_NEAR(lr_at(options, 10, 10), 5e-4, kLrTolerance);  // still warming up
  EXPECT_NEAR(lr_at(options, 21, 10), 1e-4, kLrTolerance);  // after warmup, past total: min_lr
}

TEST(LrSchedule, RejectsBadOptionsNamingTheKey) {
  config::OptimOptions options = schedule_options("step");
  try {
    lr_at(options, 1, 10);
    ADD_FAILURE() << "unknown schedule accepted";
  } catch (const UserError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("optim.schedule: unknown schedule 'step'", 0), 0u)
        << error.what();
  }
  options = schedule_options("cosine");
  options.warmup_steps = -1;
  EXPECT_THROW(lr_at(options, 1, 10), UserError);
  options = schedule_options("cosine");
  options.min_lr = 2e-3;
  EXPECT_THROW(lr_at(options, 1, 10), UserError);
}

// ---------------------------------------------------------------------------------------------
// clip_grad_norm

// Four fp32 parameters with random grads of global norm about 10; the third has no grad.
std::vector<at::Tensor> params_with_grads(uint64_t seed = 3) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> params;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{32, 16}, {16}, {8, 8}, {5, 7, 3}}) {
    params.push_back(at::zeros(shape).set_requires_grad(true));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (i != 2) params[i].mutable_grad() = at::randn(params[i].sizes(), gen) * 0.4;
  }
  return params;
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }
  return grads;
}

TEST(ClipGradNorm, MatchesTorchClipGradNorm) {
  const std::vector<at::Tensor> ours = params_with_grads();
  const std::vector<at::Tensor> theirs = params_with_grads();
  const double expected_norm = reference_norm(ours);
  ASSERT_GT(expected_norm, 5.0);  // so that max_norm 1 clips

  const double our_norm = clip_grad_norm(ours, 1.0);
  const double their_norm = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
  EXPECT_NEAR(our_norm, their_norm, 1e-6 * their_norm);
  EXPECT_NEAR(our_norm, expected_norm, 1e-6 * expected_norm);
  for (size_t i = 0; i < ours.size(); ++i) {
    if (i == 2) {
      EXPECT_FALSE(ours[i].grad().defined());
      continue;
    }
    EXPECT_LE(max_rel_diff(ours[i].grad(), theirs[i].grad()), 1e-6) << "param " << i;
  }
  EXPECT_NEAR(reference_norm(ours), 1.0, 1e-5);  // 1 / (1 + 1e-6 / norm)
}

TEST(ClipGradNorm, LeavesGradsAloneWhenBelowMaxNormOrDisabled) {
  const std::vector<at::Tensor> params = params_with_grads();
  const std::vector<at::Tensor> before = grads_of(params);
  const double expected_norm = reference_norm(params);
  for (double max_norm : {2.0 * expected_norm, 0.0, -1.0}) {
    EXPECT_NEAR(clip_grad_norm(params, max_norm), expected_norm, 1e-6 * expected_norm) << max_norm;
    for (size_t i = 0; i < params.size(); ++i) {
      if (i != 2) {
        EXPECT_TRUE(torch::equal(params[i].grad(), before[i])) << max_norm << " " << i;
      }
    }
  }
}

TEST(ClipGradNorm, NonFiniteNormIsReturnedAndNothingIsScaled) {
  std::vector<at::Tensor> params = params_with_grads();
  params[0].grad()[3][4] = std::numeric_limits<float>::infinity();
  const std::vector<at::Tensor> before = grads_of(params);
  EXPECT_TRUE(std::isinf(clip_grad_norm(params, 1.0)));
  for (size_t i = 0; i < params.size(); ++i) {
    if (i != 2) {
      EXPECT_TRUE(torch::equal(params[i].grad(), before[i])) << i;
    }
  }
  params[1].grad()[0] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor last_before = params[3].grad().clone();
  EXPECT_TRUE(std::isnan(clip_grad_norm(params, 1.0)));
  EXPECT_TRUE(torch::equal(params[3].grad(), last_before));
}

TEST(ClipGradNorm, AccumulatesLowPrecisionInFp32AndFp64InFp64) {
  std::vector<at::Tensor> bf16 = params_with_grads();
  for (at::Tensor& p : bf16) {
    if (p.grad().defined()) p.mutable_grad() = p.grad().to(at::kBFloat16);
  }
  const double bf16_norm = reference_norm(bf16);
  EXPECT_NEAR(clip_grad_norm(bf16, 0.0), bf16_norm, 1e-5 * bf16_norm);

  std::vector<at::Tensor> fp64 = params_with_grads();
  for (at::Tensor& p : fp64) {
    if (p.grad().defined()) p.mutable_grad() = p.grad().to(at::kDouble);
  }
  const double fp64_norm = reference_norm(fp64);
  EXPECT_NEAR(clip_grad_norm(fp64, 0.0), fp64_norm, 1e-12 * fp64_norm);
  EXPECT_EQ(clip_grad_norm({at::zeros({3})}, 1.0), 0.0);  // no grads at all
}


// Clipping folded into the update (optimizer offload): gradient_norm + clip_coefficient give
// clip_gradients' norm and factor, and AdamW::step(lr, grads, coefficient) leaves the gradients
// alone yet gives, bit for bit, what clip_gradients (in place) followed by step(lr, grads) gives,
// on both placements and for fp32 and bf16 parameters (fp32 gradients: the accumulation buffers).
TEST(ClipGradNorm, FoldedCoefficientEqualsClippingInPlace) {
  const std::vector<at::Tensor> params = params_with_grads();
  const std::vector<at::Tensor> grads = grads_of(params);
  const double norm = gradient_norm(grads);
  EXPECT_NEAR(norm, reference_norm(params), 1e-6 * norm);
  EXPECT_TRUE(torch::equal(grads[0], params[0].grad())) << "gradient_norm wrote a gradient";
  const double coef = clip_coefficient(norm, 1.0);
  EXPECT_NEAR(coef, 1.0 / (norm + 1e-6), 1e-15);
  EXPECT_EQ(clip_coefficient(norm, 2.0 * norm), 1.0);
  EXPECT_EQ(clip_coefficient(norm, 0.0), 1.0);
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 1.0);
  EXPECT_EQ(clip_gradients(grads, 1.0), norm);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (i != 2) {
      EXPECT_TRUE(torch::equal(grads[i], params[i].grad().mul(coef))) << i;
    }
  }
}

TEST(AdamW, GradScaleEqualsClippingTheGradientsFirstBitForBit) {
  for (OptimizerPlacement placement : {OptimizerPlacement::kDevice, OptimizerPlacement::kHost}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      NamedTensors folded_params, clipped_params;
      for (const auto& [name, p] : make_params()) {
        folded_params.emplace_back(name, p.detach().to(dtype).set_requires_grad(true));
        clipped_params.emplace_back(name, p.detach().to(dtype).set_requires_grad(true));
      }
      AdamW folded(folded_params, adamw_options(), placement);
      AdamW clipped(clipped_params, adamw_options(), placement);
      for (int64_t step = 1; step <= 4; ++step) {
        const std::vector<at::Tensor> grads = grads_of_step(tensors_of(folded_params), step);
        std::vector<at::Tensor> copies;
        for (const at::Tensor& g : grads) copies.push_back(g.defined() ? g.clone() : g);
        const double norm = gradient_norm(grads);
        const double coef = clip_coefficient(norm, 0.5 * norm);  // clips by about 2
        ASSERT_LT(coef, 0.6);
        folded.step(lr_of_step(step), grads, coef);
        for (size_t i = 0; i < grads.size(); ++i) {
          if (grads[i].defined()) {
            EXPECT_TRUE(torch::equal(grads[i], copies[i])) << "written";
          }
        }
        EXPECT_EQ(clip_gradients(copies, 0.5 * norm), norm);
        clipped.step(lr_of_step(step), copies);
      }
      const NamedTensors a = folded.state_tensors();
      const NamedTensors b = clipped.state_tensors();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::equal(a[i].second, b[i].second))
            << a[i].first << " placement " << static_cast<int>(placement) << " " << dtype;
      }
      for (size_t i = 0; i < folded_params.size(); ++i) {
        EXPECT_TRUE(torch::equal(folded_params[i].second, clipped_params[i].second))
            << folded_params[i].first;
      }
    }
  }
}

TEST(AdamW, GradScaleMustBeFiniteAndPositive) {
  NamedTensors named = make_params();
  AdamW adamw(named, adamw_options(), OptimizerPlacement::kHost);
  const std::vector<at::Tensor> grads = grads_of_step(tensors_of(named), 1);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_THROW(adamw.step(1e-3, grads, bad), c10::Error) << bad;
  }
  EXPECT_EQ(adamw.step_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// memory.precision bf16-states: bf16 moments, no masters, torch's fused AdamW and clip_grad_norm_

NamedTensors make_bf16_params() {
  NamedTensors params;
  for (const auto& [name, p] : make_params()) {
    params.emplace_back(name, p.detach().to(at::kBFloat16).set_requires_grad(true));
  }
  return params;
}

// torch.nn.utils.clip_grad_norm_(params, max_norm) as torch 2.x runs it (foreach=None takes the
// foreach path on CPU and CUDA), transcribed op for op from torch/nn/utils/clip_grad.py:
//   norms = torch._foreach_norm(grads, 2)
//   total_norm = torch.linalg.vector_norm(torch.stack(norms), 2)
//   clip_coef = max_norm / (total_norm + 1e-6)       # Tensor.__rtruediv__: reciprocal() * max_norm
//   torch._foreach_mul_(grads, torch.clamp(clip_coef, max=1.0))
double torch_clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm) {
  const at::Tensor total_norm = at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)), 2);
  const at::Tensor clip_coef = (total_norm + 1e-6).reciprocal() * max_norm;
  at::_foreach_mul_(grads, at::clamp(clip_coef, std::nullopt, 1.0));
  return total_norm.item<double>();
}

// Five steps of clipping and AdamW on bf16 parameters with weight decay and a per-step lr, "b1"
// without a gradient on even steps: ours (clip_gradients_as_torch, AdamW with kParameterDtype)
// against torch.optim.AdamW(fused=True)'s step written out with ATen's kernel (one float step
// tensor per parameter, incremented before the call; parameters without a gradient left out, so
// their step does not advance) and the clip above. Bit for bit: weights, moments and norms.
TEST(AdamW, Bf16StatesEqualTorchFusedAdamWAndClipGradNormBitForBit) {
  const config::OptimOptions options = adamw_options();
  const NamedTensors ours_named = make_bf16_params();
  const std::vector<at::Tensor> ours = tensors_of(ours_named);
  const std::vector<at::Tensor> theirs = tensors_of(make_bf16_params());
  AdamW adamw(ours_named, options, OptimizerPlacement::kDevice, {}, AdamWStates::kParameterDtype);
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs, steps;
  for (const at::Tensor& p : theirs) {
    exp_avgs.push_back(at::zeros_like(p));
    exp_avg_sqs.push_back(at::zeros_like(p));
    steps.push_back(at::zeros({}, at::kFloat));
  }
  // Norms of these gradients grow from ~23 to ~31: max_norm 27 clips some steps and not others.
  constexpr double kMaxNorm = 27.0;
  int clipped = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<at::Tensor> our_grads, their_grads;
    for (const at::Tensor& g : grads_of_step(ours, step)) {
      const at::Tensor scaled = g.defined() ? (g * (1.0 + 0.1 * step)).to(at::kBFloat16) : g;
      our_grads.push_back(scaled);
      their_grads.push_back(g.defined() ? scaled.clone() : g);
    }
    const double our_norm = clip_gradients_as_torch(our_grads, kMaxNorm);
    adamw.step(lr_of_step(step), our_grads);

    std::vector<at::Tensor> p, g, m, v, t, defined_grads;
    for (size_t i = 0; i < theirs.size(); ++i) {
      if (!their_grads[i].defined()) continue;
      defined_grads.push_back(their_grads[i]);
    }
    const double their_norm = torch_clip_grad_norm(defined_grads, kMaxNorm);
    clipped += their_norm > kMaxNorm;
    for (size_t i = 0; i < theirs.size(); ++i) {
      if (!their_grads[i].defined()) continue;
      p.push_back(theirs[i]);
      g.push_back(their_grads[i]);
      m.push_back(exp_avgs[i]);
      v.push_back(exp_avg_sqs[i]);
      t.push_back(steps[i]);
    }
    at::_foreach_add_(t, 1);
    at::NoGradGuard no_grad;
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, t, lr_of_step(step), options.betas[0],
                      options.betas[1], options.weight_decay, options.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
    EXPECT_EQ(our_norm, their_norm) << "step " << step;
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << ours_named[i].first << " step " << step;
    }
  }
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, 5);
  EXPECT_EQ(adamw.step_count(), 5);
  const NamedTensors state = adamw.state_tensors();
  ASSERT_EQ(state.size(), 3 * ours.size());  // no ".master" entries
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(state[3 * i].second.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(torch::equal(state[3 * i].second, exp_avgs[i])) << state[3 * i].first;
    EXPECT_TRUE(torch::equal(state[3 * i + 1].second, exp_avg_sqs[i])) << state[3 * i + 1].first;
    EXPECT_EQ(state[3 * i + 2].second.item<int64_t>(), steps[i].item<int64_t>());
  }
  // Sensitive: the fp32-master update of the same steps ends elsewhere in bf16.
  const NamedTensors masters_named = make_bf16_params();
  AdamW with_masters(masters_named, options);
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& g : grads_of_step(ours, step)) {
      grads.push_back(g.defined() ? (g * (1.0 + 0.1 * step)).to(at::kBFloat16) : g);
    }
    clip_gradients_as_torch(grads, kMaxNorm);
    with_masters.step(lr_of_step(step), grads);
  }
  EXPECT_FALSE(torch::equal(masters_named[0].second, ours[0]));
}

// torch's bf16 arithmetic differs from clip_gradients' fp32/fp64 one: the norm is rounded to bf16.
TEST(ClipGradNorm, AsTorchRoundsTheNormToTheGradientsDtype) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& g : grads_of_step(tensors_of(make_params()), 1)) {
    grads.push_back(g.to(at::kBFloat16));
  }
  const double fp32_norm = gradient_norm(grads);
  const double torch_norm = clip_gradients_as_torch(grads, 0.0);  // 0: no clipping
  EXPECT_EQ(torch_norm, static_cast<double>(static_cast<float>(c10::BFloat16(
                            static_cast<float>(torch_norm)))));  // a bf16 value
  EXPECT_NEAR(torch_norm, fp32_norm, 8e-3 * fp32_norm);  // within bf16's rounding of 2^-8
  EXPECT_EQ(clip_gradients_as_torch({}, 1.0), 0.0);
  grads[0].view(-1)[0] = std::numeric_limits<float>::infinity();
  const at::Tensor before = grads[1].clone();
  EXPECT_FALSE(std::isfinite(clip_gradients_as_torch(grads, 1.0)));
  EXPECT_TRUE(torch::equal(grads[1], before));  // nothing scaled
}

TEST(AdamW, Bf16StatesSaveLoadContinuesBitForBitAndRefusesMasterStates) {
  const config::OptimOptions options = adamw_options();
  auto make = [&](const NamedTensors& named) {
    return std::make_unique<AdamW>(named, options, OptimizerPlacement::kDevice,
                                   std::vector<at::Tensor>{}, AdamWStates::kParameterDtype);
  };
  auto bf16_grads = [](const NamedTensors& named, int64_t step) {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& g : grads_of_step(tensors_of(named), step)) {
      grads.push_back(g.defined() ? g.to(at::kBFloat16) : g);
    }
    return grads;
  };
  const NamedTensors run_a = make_bf16_params();
  auto adamw_a = make(run_a);
  for (int64_t step = 1; step <= 6; ++step) adamw_a->step(lr_of_step(step), bf16_grads(run_a, step));
  const NamedTensors run_b = make_bf16_params();
  auto adamw_b = make(run_b);
  for (int64_t step = 1; step <= 3; ++step) adamw_b->step(lr_of_step(step), bf16_grads(run_b, step));
  const NamedTensors saved = clone_state(adamw_b->state_tensors());
  NamedTensors run_c;
  for (const auto& [name, tensor] : run_b) {
    run_c.emplace_back(name, tensor.detach().clone().set_requires_grad(true));
  }
  auto adamw_c = make(run_c);
  adamw_c->load_state(saved, adamw_b->step_count());
  for (int64_t step = 4; step <= 6; ++step) adamw_c->step(lr_of_step(step), bf16_grads(run_c, step));
  for (size_t i = 0; i < run_a.size(); ++i) {
    EXPECT_TRUE(torch::equal(run_c[i].second, run_a[i].second)) << run_a[i].first;
  }
  // The fp32-master mode's state (fp32 moments, ".master") does not load here, and nothing moves.
  const NamedTensors masters_named = make_bf16_params();
  AdamW with_masters(masters_named, options);
  const NamedTensors before = clone_state(adamw_c->state_tensors());
  try {
    adamw_c->load_state(with_masters.state_tensors(), 0, "ckpt/optimizer.safetensors");
    ADD_FAILURE() << "fp32-master state loaded into bf16 states";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("dtype Float"), std::string::npos) << error.what();
  }
  const NamedTensors after = adamw_c->state_tensors();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << before[i].first;
  }
}

TEST(AdamW, Bf16StatesRejectFp32GradientsGradScaleAndOffload) {
  const NamedTensors named = make_bf16_params();
  AdamW adamw(named, adamw_options(), OptimizerPlacement::kDevice, {},
              AdamWStates::kParameterDtype);
  const std::vector<at::Tensor> fp32_grads = grads_of_step(tensors_of(named), 1);
  EXPECT_THROW(adamw.step(1e-3, fp32_grads), c10::Error);
  std::vector<at::Tensor> bf16_grads;
  for (const at::Tensor& g : fp32_grads) bf16_grads.push_back(g.to(at::kBFloat16));
  EXPECT_THROW(adamw.step(1e-3, bf16_grads, 0.5), c10::Error);
  EXPECT_EQ(adamw.step_count(), 0);
  EXPECT_THROW(AdamW(make_bf16_params(), adamw_options(), OptimizerPlacement::kHost, {},
                     AdamWStates::kParameterDtype),
               c10::Error);
}

}  // namespace
}  // namespace ulysses::train
