// Pairing the backends' trials (see backend_comparison.h).
#include "tuner/results/backend_comparison.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tuner/results/memory_basis.h"
#include "tuner/results/sweep_analysis.h"

namespace ulysses::report {
namespace {

nlohmann::json summary_of(const store::TrialRecord& trial) {
  nlohmann::json s = nlohmann::json::parse(trial.summary, nullptr, /*allow_exceptions=*/false);
  return s.is_object() ? s : nlohmann::json::object();
}

}  // namespace

std::optional<double> first_loss(const store::TrialRecord& trial) {
  const nlohmann::json s = summary_of(trial);
  if (s.contains("first_loss") && s["first_loss"].is_number()) {
    return s["first_loss"].get<double>();
  }
  return std::nullopt;
}

std::vector<std::string> workarounds(const store::TrialRecord& trial) {
  const nlohmann::json s = summary_of(trial);
  std::vector<std::string> out;
  if (s.contains("workarounds") && s["workarounds"].is_array()) {
    for (const nlohmann::json& w : s["workarounds"]) {
      if (w.is_string()) out.push_back(w.get<std::string>());
    }
  }
  return out;
}

std::vector<BackendPair> backend_pairs(const std::vector<store::TrialRecord>& trials) {
  bool native = false, deepspeed = false;
  for (const store::TrialRecord& t : trials) {
    (trial_backend(t) == "deepspeed" ? deepspeed : native) = true;
  }
  if (!native || !deepspeed) return {};
  std::vector<BackendPair> pairs;
  for (const std::string side : {"native", "deepspeed"}) {
    for (const store::TrialRecord& t : trials) {
      if (t.probe || t.config_yaml.empty() || trial_backend(t) != side) continue;
      const std::string config = configuration(t, "backend");
      auto it = std::find_if(pairs.begin(), pairs.end(), [&](const BackendPair& p) {
        return p.configuration == config && p.seqlen == t.seqlen;
      });
      if (it == pairs.end()) {
        BackendPair pair;
        pair.configuration = config, pair.seqlen = t.seqlen;
        it = pairs.insert(pairs.end(), pair);
      }
      const store::TrialRecord*& slot = side == "native" ? it->native : it->deepspeed;
      // A sweep runs a configuration at a length once; a curve point repeated keeps the first.
      if (slot == nullptr) slot = &t;
    }
  }
  for (BackendPair& p : pairs) {
    if (!p.native || !p.deepspeed) continue;
    const store::TrialRecord &n = *p.native, &d = *p.deepspeed;
    if (is_measured(n) && is_measured(d) && *n.tokens_per_s_per_rank > 0) {
      p.throughput_ratio = *d.tokens_per_s_per_rank / *n.tokens_per_s_per_rank;
    }
    const std::optional<int64_t> np = peak_above_baseline(n), dp = peak_above_baseline(d);
    if (n.status == "ok" && d.status == "ok" && np && dp && *np > 0) {
      p.peak_ratio = static_cast<double>(*dp) / static_cast<double>(*np);
    }
    const std::optional<double> nf = first_loss(n), df = first_loss(d);
    if (nf && df) p.first_loss_difference = std::fabs(*df - *nf);
    if (n.final_loss && d.final_loss) p.final_loss_difference = std::fabs(*d.final_loss - *n.final_loss);
  }
  return pairs;
}

}  // namespace ulysses::report
