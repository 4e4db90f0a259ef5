// RoPE frequencies, cos/sin tables and rotation (see rotary.h).
#include "model/rotary.h"

#include <cmath>

#include "common/error.h"

namespace ulysses::model {
namespace {

// HF `_compute_llama3_parameters`: long wavelengths are divided by `factor`, short ones kept, and
// the band between interpolated smoothly. All arithmetic on fp32 tensors, as HF.
at::Tensor llama3_scaled(const at::Tensor& inv_freq, const config::ModelOptions& o) {
  if (o.rope_scaling_factor <= 0) {
    throw UserError("model.rope_scaling_factor: must be > 0 for llama3 scaling");
  }
  if (o.rope_original_max_position <= 0) {
    throw UserError("model.rope_original_max_position: must be > 0 for llama3 scaling");
  }
  if (o.rope_high_freq_factor <= o.rope_low_freq_factor) {
    throw UserError("model.rope_high_freq_factor: must be greater than rope_low_freq_factor");
  }
  const double factor = o.rope_scaling_factor;
  const double old_context = static_cast<double>(o.rope_original_max_position);
  const double low_freq_wavelen = old_context / o.rope_low_freq_factor;
  const double high_freq_wavelen = old_context / o.rope_high_freq_factor;

  at::Tensor wavelen = 2 * M_PI / inv_freq;  // [hd/2]
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  at::Tensor smooth = (old_context / wavelen - o.rope_low_freq_factor) /
                      (o.rope_high_freq_factor - o.rope_low_freq_factor);  // [hd/2]
  at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const config::ModelOptions& o) {
  const int64_t hd =
      o.head_dim > 0 ? o.head_dim : (o.num_heads > 0 ? o.hidden_size / o.num_heads : 0);
  if (hd <= 0 || hd % 2 != 0) {
    throw UserError("model.head_dim: RoPE needs a positive even head dim, got " +
                    std::to_string(hd));
  }
  if (!(o.rope_theta > 0)) throw UserError("model.rope_theta: must be > 0");
  // HF: 1 / base ** (arange(0, dim, 2).float() / dim)
  at::Tensor exponent = at::arange(0, hd, 2, at::kLong).to(at::kFloat) / static_cast<double>(hd);
  inv_freq_ = 1.0 / at::pow(o.rope_theta, exponent);  // [hd/2] fp32
  if (o.rope_scaling_type == "llama3") {
    inv_freq_ = llama3_scaled(inv_freq_, o);
  } else if (!o.rope_scaling_type.empty()) {
    throw UserError("model.rope_scaling_type: unknown '" + o.rope_scaling_type +
                    "' (expected \"\" or llama3)");
  }
}

RotaryCosSin RotaryEmbedding::forward(const at::Tensor& position_ids) const {
  TORCH_CHECK(position_ids.dim() == 2, "RotaryEmbedding: position_ids must be [bs, T], got ",
              position_ids.sizes());
  at::Tensor inv_freq = inv_freq_.to(position_ids.device());                // [hd/2]
  at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [bs, T, hd/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                             // [bs, T, hd]
  return {emb.cos(), emb.sin()};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 3 && cos.size(-1) == x.size(-1), "apply_rotary: x ",
              x.sizes(), " and cos ", cos.sizes(), " do not fit");
  at::Tensor c = cos.to(x.scalar_type()).unsqueeze(2);  // [bs, T, 1, hd]
  at::Tensor s = sin.to(x.scalar_type()).unsqueeze(2);  // [bs, T, 1, hd]
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rotated * s;  // [bs, T, heads, hd]
}

}  // namespace ulysses::model
