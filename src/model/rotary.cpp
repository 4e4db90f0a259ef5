// RoPE frequencies, cos/sin tables and rotation (see rotary.h).
//
// The frequencies follow transformers' modeling_rope_utils.py operation for operation, so that they
// are the same fp32 numbers: tensor arithmetic in fp32 where it uses tensors (Python scalars enter
// a tensor op as fp32), Python float arithmetic in double. `s / tensor` in Python is
// `tensor.reciprocal() * s` (torch's __rtruediv__), which can differ from a division by an ulp, so
// it is written that way here too (rdiv).
#include "model/rotary.h"

#include <cmath>

#include "common/error.h"

namespace ulysses::model {
namespace {

using config::ModelOptions;

// Python's `s / t` for a float s and a tensor t.
at::Tensor rdiv(double s, const at::Tensor& t) { return t.reciprocal() * s; }

// HF: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
at::Tensor default_inv_freq(double base, int64_t dim) {
  at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim;  // [dim/2]
  return rdiv(1.0, at::pow(base, exponent));                                    // [dim/2] fp32
}

void require_factor(const ModelOptions& o) {
  if (!(o.rope_scaling_factor > 0)) {
    throw UserError("model.rope_scaling_factor: must be > 0 for " + o.rope_scaling_type +
                    " scaling");
  }
}

// HF `_compute_llama3_parameters`: long wavelengths are divided by `factor`, short ones kept, and
// the band between interpolated smoothly.
at::Tensor llama3_scaled(const at::Tensor& inv_freq, const ModelOptions& o) {
  require_factor(o);
  if (o.rope_original_max_position <= 0) {
    throw UserError("model.rope_original_max_position: must be > 0 for llama3 scaling");
  }
  if (o.rope_high_freq_factor <= o.rope_low_freq_factor) {
    throw UserError("model.rope_high_freq_factor: must be greater than rope_low_freq_factor");
  }
  const double factor = o.rope_scaling_factor;
  const double low = o.rope_low_freq_factor, high = o.rope_high_freq_factor;
  const double old_context = static_cast<double>(o.rope_original_max_position);
  const double low_freq_wavelen = old_context / low;
  const double high_freq_wavelen = old_context / high;

  at::Tensor wavelen = rdiv(2 * M_PI, inv_freq);  // [hd/2]
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  at::Tensor smooth = (rdiv(old_context, wavelen) - low) / (high - low);  // [hd/2]
  at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

// HF `_compute_dynamic_ntk_parameters` with seq_len = max_position_embeddings, the frequencies
// transformers starts from and keeps while no position reaches max_position_embeddings.
at::Tensor dynamic_ntk(int64_t dim, const ModelOptions& o) {
  require_factor(o);
  if (dim <= 2) throw UserError("model.head_dim: dynamic RoPE scaling needs a head dim > 2");
  if (o.max_position_embeddings <= 0) {
    throw UserError("model.max_position_embeddings: must be > 0 for dynamic RoPE scaling");
  }
  const double factor = o.rope_scaling_factor;
  const double seq_len = static_cast<double>(o.max_position_embeddings);
  const double base =
      o.rope_theta * std::pow(factor * seq_len / static_cast<double>(o.max_position_embeddings) -
                                  (factor - 1),
                              static_cast<double>(dim) / static_cast<double>(dim - 2));
  return default_inv_freq(base, dim);
}

// HF `_compute_yarn_parameters`: frequencies whose wavelength fits beta_fast times or more into
// the original context are kept (extrapolation), those fitting beta_slow times or fewer divided by
// the factor (interpolation), a linear ramp over the dims between; and the attention factor.
at::Tensor yarn(int64_t dim, const ModelOptions& o, double& attention_factor) {
  require_factor(o);
  if (o.rope_original_max_position <= 0) {
    throw UserError("model.rope_original_max_position: must be > 0 for yarn scaling");
  }
  if (!(o.rope_beta_fast > 0) || !(o.rope_beta_slow > 0)) {
    throw UserError(std::string("model.") +
                    (o.rope_beta_fast > 0 ? "rope_beta_slow" : "rope_beta_fast") +
                    ": must be > 0 for yarn scaling");
  }
  const double base = o.rope_theta;
  const double factor = o.rope_scaling_factor;
  const double original = static_cast<double>(o.rope_original_max_position);

  auto get_mscale = [](double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
  };
  if (o.rope_attention_factor > 0) {
    attention_factor = o.rope_attention_factor;
  } else if (o.rope_mscale != 0 && o.rope_mscale_all_dim != 0) {
    attention_factor =
        get_mscale(factor, o.rope_mscale) / get_mscale(factor, o.rope_mscale_all_dim);
  } else {
    attention_factor = get_mscale(factor, 1.0);
  }

  // The dim (of `dim`) at which a frequency turns num_rotations times over the original context.
  auto correction_dim = [&](double num_rotations) {
    return (static_cast<double>(dim) * std::log(original / (num_rotations * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(o.rope_beta_fast);
  double high = correction_dim(o.rope_beta_slow);
  if (o.rope_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevent a singularity

  at::Tensor ramp =
      ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);  // [dim/2]
  at::Tensor pos_freqs = at::pow(base, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim);
  at::Tensor extrapolation = rdiv(1.0, pos_freqs);
  at::Tensor interpolation = rdiv(1.0, pos_freqs * factor);
  at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const ModelOptions& o) {
  const int64_t hd =
      o.head_dim > 0 ? o.head_dim : (o.num_heads > 0 ? o.hidden_size / o.num_heads : 0);
  if (hd <= 0 || hd % 2 != 0) {
    throw UserError("model.head_dim: RoPE needs a positive even head dim, got " +
                    std::to_string(hd));
  }
  if (!(o.rope_theta > 0)) throw UserError("model.rope_theta: must be > 0");
  const std::string& type = o.rope_scaling_type;
  if (type.empty()) {
    inv_freq_ = default_inv_freq(o.rope_theta, hd);
  } else if (type == "linear") {
    require_factor(o);
    inv_freq_ = default_inv_freq(o.rope_theta, hd) / o.rope_scaling_factor;
  } else if (type == "dynamic") {
    inv_freq_ = dynamic_ntk(hd, o);
  } else if (type == "yarn") {
    inv_freq_ = yarn(hd, o, attention_scaling_);
  } else if (type == "llama3") {
    inv_freq_ = llama3_scaled(default_inv_freq(o.rope_theta, hd), o);
  } else {
    throw UserError("model.rope_scaling_type: unknown '" + type +
                    "' (expected \"\", linear, dynamic, yarn or llama3)");
  }
}

RotaryCosSin RotaryEmbedding::forward(const at::Tensor& position_ids) const {
  TORCH_CHECK(position_ids.dim() == 2, "RotaryEmbedding: position_ids must be [bs, T], got ",
              position_ids.sizes());
  const at::Device device = position_ids.device();
  if (device != inv_freq_.device() &&
      (!device_inv_freq_.defined() || device_inv_freq_.device() != device)) {
    device_inv_freq_ = inv_freq_.to(device);  // once per device
  }
  const at::Tensor& inv_freq =
      device == inv_freq_.device() ? inv_freq_ : device_inv_freq_;  // [hd/2]
  at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [bs, T, hd/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                             // [bs, T, hd]
  if (attention_scaling_ == 1.0) return {emb.cos(), emb.sin()};  // HF's `* 1.0` is exact
  return {emb.cos() * attention_scaling_, emb.sin() * attention_scaling_};
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
