// Meshes x feature sets through the cost model (see planner.h).
#include "tuner/plan/planner.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "config/mesh_factors.h"
#include "config/run_config.h"
#include "sp/head_split.h"

namespace ulysses::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Whether a length fits, and if not, what is over.
std::string check(const PlanRequest& r, const config::RunConfig& c, PlanRow* row) {
  const costmodel::MemoryPrediction m = costmodel::predict_memory(c, r.memory);
  const int64_t per_node = std::min(r.world, r.hardware.devices_per_node);
  if (row) {
    row->peak_bytes = m.peak_bytes;
    row->host_bytes_per_node = m.host_bytes * per_node;
  }
  if (m.peak_bytes > usable_device_bytes(r.hardware)) return "device memory";
  if (r.hardware.device_type == "cuda" &&
      static_cast<double>(m.host_bytes * per_node) > r.hardware.host_memory_gib * kGiB) {
    return "host memory";
  }
  return "fits";
}

// The most layers of r.model's shapes that fit `c` (at its mesh, features and length), by
// doubling and bisection (memory grows with the layers); 0 when one does not fit.
int64_t max_layers_that_fit(const PlanRequest& r, config::RunConfig c) {
  constexpr int64_t kMaxLayers = int64_t{1} << 20;
  auto fits = [&](int64_t layers) {
    c.model.num_layers = layers;
    return check(r, c, nullptr) == "fits";
  };
  if (!fits(1)) return 0;
  int64_t good = 1, bad = 2;
  while (bad <= kMaxLayers && fits(bad)) good = bad, bad *= 2;
  if (bad > kMaxLayers) return good;
  while (bad - good > 1) {
    const int64_t mid = (good + bad) / 2;
    if (fits(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return good;
}

void fill_time(const PlanRequest& r, const config::RunConfig& c, PlanRow* row) {
  const costmodel::StepWork w = costmodel::step_work(c);
  const costmodel::TimePrediction t = costmodel::predict_time(w, r.time);
  row->step_ms = t.step_ms;
  row->tokens_per_s_per_device = t.step_ms > 0 ? w.tokens / (t.step_ms / 1000.0) : 0;
  const double peak = r.hardware.peak_tflops(c.memory.precision);
  row->mfu = peak > 0 && t.step_ms > 0 ? w.model_flops / (t.step_ms / 1000.0) / (peak * 1e12) : 0;
}

}  // namespace

std::vector<FeatureSet> default_feature_sets() {
  return {{"base", false, false, false, false, false},
          {"tiled", true, true, false, false, false},
          {"tiled+ckpt", true, true, true, false, false},
          {"tiled+ckpt-offload", true, true, true, true, false},
          {"alst", true, true, true, true, true}};
}

FeatureSet parse_features(const std::string& text) {
  for (const FeatureSet& named : default_feature_sets()) {
    if (named.name == text) return named;
  }
  FeatureSet f;
  f.name = text;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item == "tiled-mlp") {
      f.tiled_mlp = true;
    } else if (item == "tiled-loss") {
      f.tiled_loss = true;
    } else if (item == "checkpoint") {
      f.checkpointing = true;
    } else if (item == "offload-checkpoints") {
      f.checkpointing = f.offload_checkpoints = true;
    } else if (item == "offload-optimizer") {
      f.offload_optimizer = true;
    } else if (item == "device-gradients") {
      f.device_gradients = true;
    } else if (item == "alst") {
      f = {text, true, true, true, true, true, f.zero_stage, f.device_gradients};
    } else if (item.size() == 5 && item.starts_with("zero") && item[4] >= '0' && item[4] <= '3') {
      f.zero_stage = item[4] - '0';
    } else if (item != "none" && item != "ulysses" && item != "bf16" && !item.empty()) {
      throw UserError("--features: unknown feature '" + item +
                      "' (tiled-mlp, tiled-loss, checkpoint, offload-checkpoints, "
                      "offload-optimizer, device-gradients, zero0-zero3, alst, none)");
    }
  }
  return f;
}


int64_t usable_device_bytes(const calibrate::HardwareProfile& hw) {
  const double context = hw.device_type == "cuda" ? 0.6 : 0.0;
  return static_cast<int64_t>((hw.device_memory_gib - context) * kGiB);
}

config::RunConfig row_config(const PlanRequest& r, int64_t sp, const FeatureSet& f,
                             int64_t seqlen, int64_t sp_ring) {
  config::RunConfig c;
  c.model = r.model;
  c.mesh.sp = sp;
  c.mesh.sp_ring.value = sp_ring;
  c.mesh.dp = r.world / sp;
  c.mesh.uneven_heads = r.uneven_heads;
  c.sequence.length = seqlen;
  c.sequence.micro_batch = r.micro_batch;
  c.train.device = r.hardware.device_type;
  c.memory.precision = r.precision.empty() ? default_precision(r.hardware) : r.precision;
  c.memory.tiled_mlp.value = f.tiled_mlp ? 0 : 1;
  c.memory.tiled_loss.value = f.tiled_loss ? 0 : 1;
  c.memory.checkpointing = f.checkpointing;
  c.memory.offload_activations = f.offload_checkpoints;
  c.memory.offload_optimizer = f.offload_optimizer;
  c.memory.offload_gradients = !f.device_gradients;
  c.attention.backend = "auto";
  config::validate(c, static_cast<int>(r.world));
  c.zero.stage = f.zero_stage >= 0 ? f.zero_stage : r.zero_stage;
  return c;
}

std::vector<PlanRow> make_plan(const PlanRequest& r) {
  if (r.world < 1) throw UserError("--world: must be >= 1");
  if (r.micro_batch < 1) throw UserError("--micro-batch: must be >= 1");
  if (r.zero_stage < 0 || r.zero_stage > 3) {
    throw UserError("--zero: must be 0, 1, 2 or 3, got " + std::to_string(r.zero_stage));
  }
  std::vector<PlanRow> rows;
  for (int64_t sp = 1; sp <= r.world; ++sp) {
    if (r.world % sp != 0) continue;
    // The factorizations of this sp: the all-to-all alone, and with --ring every ring degree
    // whose all-to-all degree the heads allow.
    std::vector<int64_t> rings = {1};
    for (int64_t ring = 2; r.ring && ring <= sp; ++ring) {
      if (sp % ring == 0 && config::heads_allow_a2a(r.model.num_heads, r.model.num_kv_heads,
                                                    sp / ring, r.uneven_heads)) {
        rings.push_back(ring);
      }
    }
    for (const int64_t sp_ring : rings) {
      for (const FeatureSet& f : r.features) {
        PlanRow row;
        row.sp = sp, row.dp = r.world / sp, row.features = f.name, row.sp_ring = sp_ring;
        row.zero_stage = f.zero_stage >= 0 ? f.zero_stage : r.zero_stage;
        row.uneven_heads = r.uneven_heads && !sp::heads_split_evenly(r.model.num_heads,
                                                                     r.model.num_kv_heads,
                                                                     sp / sp_ring);
        PlanRequest req = r;
        if (!r.time_calibrated) {
          req.time = time_coefficients(r.hardware, r.precision, sp, r.world, sp_ring);
        }
        try {
          row_config(req, sp, f, sp, sp_ring);
        } catch (const UserError& e) {
          row.valid = false;
          row.limit = row.max_limit = std::string("heads vs sp: ") + e.what();
          rows.push_back(row);
          continue;
        }
        // Longest fitting length: doubling, then bisection, in units of sp x 1024 tokens (2 sp x
        // 1024 with a ring, whose blocks are two chunks). A model with a sliding window runs only
        // lengths within it (config validation), so the window bounds the search as memory does.
        const int64_t unit = config::sequence_multiple(sp, sp_ring) * 1024;
        const int64_t window = r.model.sliding_window;
        auto status = [&](int64_t len) {
          if (window > 0 && len > window) {
            return "model.sliding_window " + std::to_string(window);
          }
          return check(req, row_config(req, sp, f, len, sp_ring), nullptr);
        };
        int64_t good = 0, bad = 0;
        std::string over;
        for (int64_t len = unit; len <= req.max_search_tokens; len *= 2) {
          const std::string s = status(len);
          if (s != "fits") {
            bad = len, over = s;
            break;
          }
          good = len;
        }
        if (bad == 0) {
          over = "search cap " + std::to_string(req.max_search_tokens) + " tokens";
        } else {
          while (bad - good > unit) {
            const int64_t mid = (good + bad) / 2 / unit * unit;
            const std::string s = status(mid);
            if (s == "fits") {
              good = mid;
            } else {
              bad = mid, over = s;
            }
          }
        }
        row.max_seqlen = good;
        row.max_limit = over;
        // The figures at --seqlen, else at the longest fitting length, else at the shortest
        // length tried (showing how far over it is).
        row.seqlen = r.seqlen > 0 ? r.seqlen : (good > 0 ? good : unit);
        if (window > 0 && row.seqlen > window) {  // --seqlen beyond the window, or no unit fits in it
          row.valid = false;
          row.limit = "model.sliding_window " + std::to_string(window) +
                      ": longer sequences need sliding-window attention (not implemented)";
          rows.push_back(row);
          continue;
        }
        const config::RunConfig c = row_config(req, sp, f, row.seqlen, sp_ring);
        row.limit = check(req, c, &row);
        fill_time(req, c, &row);
        row.max_layers = max_layers_that_fit(req, c);
        if (row.max_layers > 0) {
          config::ModelOptions largest = r.model;
          largest.num_layers = row.max_layers;
          row.max_parameters = costmodel::parameter_count(largest);
        }
        rows.push_back(row);
      }
    }
  }
  return rows;
}

}  // namespace ulysses::plan
