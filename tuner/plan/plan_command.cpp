// `ulysses-tune plan` (see plan_command.h): options -> PlanRequest -> table or JSON; --fit reads
// a sweep's ok trials, fits the free coefficients and prints predicted vs measured.
#include "tuner/plan/plan_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/input_file.h"
#include "common/output_dir.h"
#include "common/paths.h"
#include "config/model_family.h"
#include "config/presets.h"
#include "config/run_config.h"
#include "tuner/calibrate/machine_check.h"
#include "tuner/costmodel/calibration.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/results/calibrated_model.h"
#include "tuner/results/format.h"
#include "tuner/plan/planner.h"
#include "tuner/store/store.h"
#include "tuner/results/sweep_source.h"
#include "tuner/results/table.h"

namespace ulysses::plan {
namespace {

using nlohmann::json;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fmt(const char* f, double v) {
  char text[64];
  std::snprintf(text, sizeof text, f, v);
  return text;
}

std::string tokens_text(int64_t n) {
  if (n >= 1000000) return fmt("%.2fM", n / 1e6);
  if (n >= 1000) return fmt("%.0fK", n / 1e3);
  return std::to_string(n);
}

std::string hardware_path(const std::string& name) {
  if (name.find('/') != std::string::npos || name.ends_with(".yaml")) return name;
  return project_home() + "/profiles/hardware/" + name + ".yaml";
}

void apply_calibration(const std::string& path, PlanRequest* r) {
  std::string text;
  try {
    text = read_input_file(path, "a JSON file");
  } catch (const UserError& e) {
    throw UserError(std::string("--calibration: ") + e.what());
  }
  json j;
  try {
    j = json::parse(text);
    const json m = j.at("memory");  // copies: small, and no reference into a call with a temporary key
    r->memory.runtime_bytes = m.at("runtime_bytes").get<double>();
    r->memory.allocator_fraction = m.at("allocator_fraction").get<double>();
    const json t = j.at("time");
    r->time.ms_per_tflop = t.at("ms_per_tflop").get<double>();
    r->time.ms_per_tflop_attention = t.at("ms_per_tflop_attention").get<double>();
    r->time.ms_per_gb_a2a = r->time.ms_per_gb_allreduce = t.at("ms_per_gb_comm").get<double>();
    r->time.overhead_ms = t.at("overhead_ms").get<double>();
    // The offloaded optimizer's terms (absent from older files: the profile's estimates stay).
    r->time.ms_per_gb_host = t.value("ms_per_gb_host", r->time.ms_per_gb_host);
    r->time.host_threads = t.value("host_threads", r->time.host_threads);
    r->time.ms_per_gb_upload = t.value("ms_per_gb_upload", r->time.ms_per_gb_upload);
    r->time.optimizer_overlap = t.value("optimizer_overlap", r->time.optimizer_overlap);
    r->time_calibrated = true;
  } catch (const json::exception& e) {
    throw UserError("--calibration: " + path + ": " + e.what());
  }
}

// r's coefficients: the hardware profile's defaults, or those of --calibration FILE or of the
// newest fit in --db DB (which it names on stdout). REQUIRES: r->hardware loaded.
void apply_coefficients(const PlanOptions& o, PlanRequest* r) {
  r->memory = memory_coefficients(r->hardware);
  if (!o.calibration.empty() && !o.db.empty()) {
    throw UserError("--db: give either --db or --calibration");
  }
  if (!o.calibration.empty()) apply_calibration(o.calibration, r);
  if (o.db.empty()) return;
  store::Store results = store::Store::open(o.db);
  const std::optional<store::CalibrationRun> run =
      results.latest_model_fit(r->hardware.device_type);
  if (!run) {
    throw UserError("--db: " + o.db + " holds no cost-model fit for " +
                    r->hardware.device_type + " (write one with plan --fit " + o.db + ")");
  }
  const CalibratedModel m =
      model_from_rows(results.calibrations(run->id), r->hardware.device_type, o.db);
  r->memory.runtime_bytes = m.memory.runtime_bytes;
  r->memory.allocator_fraction = m.memory.allocator_fraction;
  r->time = m.time;
  r->time_calibrated = true;
  std::cout << "calibration: " << o.db << ", run " << run->id << " (" << run->command << ")\n";
}

std::string device_of(const config::RunConfig& c) { return c.train.device; }

// The experiment's hardware profile name, from the sweep's stored experiment file.
std::string hardware_of(const report::SweepData& data) {
  const std::string key = "hardware:";
  const size_t at = data.sweep.experiment_yaml.find("\n" + key);
  if (at == std::string::npos) return "";
  const size_t start = at + 1 + key.size();
  std::string value = data.sweep.experiment_yaml.substr(
      start, data.sweep.experiment_yaml.find_first_of("\n#", start) - start);
  value.erase(0, value.find_first_not_of(' '));
  value.erase(value.find_last_not_of(' ') + 1);
  return value;
}

std::string pct(double predicted, double measured) {
  return fmt("%+.1f%%", 100.0 * (predicted - measured) / measured);
}

OutputOwner out_owner(const PlanOptions& o) {
  return OutputOwner{"--out", "ulysses-tune plan", {o.fit_db}};
}

// The sweep's hardware profile against the device this command sees, as the sweep checks it
// (calibrate/machine_check.h): a profile that overstates it is refused unless the trials ran
// under a limit the device has. Nothing is checked where the profile cannot be read (a path of
// another machine) or no device is visible.
void check_fitted_profile(const report::SweepData& data, const std::string& device) {
  const std::string name = hardware_of(data);
  if (name.empty()) return;
  const std::string path = hardware_path(name);
  calibrate::HardwareProfile hw;
  try {
    hw = calibrate::load_hardware_profile(path);
  } catch (const UserError&) {
    return;
  }
  const calibrate::MachineCapacity machine = calibrate::query_machine(device);
  int64_t limit_bytes = 0;
  for (const store::TrialRecord& t : data.trials) {
    if (t.limit_bytes) limit_bytes = std::max(limit_bytes, *t.limit_bytes);
  }
  calibrate::checked_memory_limit_gib(hw, path, machine, limit_bytes / kGiB, limit_bytes > 0);
}

// What the time fit takes as known: the offloaded optimizer's upload at the sweep's profile's
// host link (as the planner assumes it: 0.8 of host_to_device_GBps). Without a readable profile
// or link the upload is a column of the fit. The profile's host pass rate (time_coefficients)
// stands where no trial offloaded its optimizer.
costmodel::TimeCoefficients fit_base(const report::SweepData& data) {
  costmodel::TimeCoefficients base;
  const std::string name = hardware_of(data);
  if (name.empty()) return base;
  try {
    const calibrate::HardwareProfile hw = calibrate::load_hardware_profile(hardware_path(name));
    const costmodel::TimeCoefficients profile = time_coefficients(hw, "", 1, 1);
    base.ms_per_gb_host = profile.ms_per_gb_host;
    base.host_threads = profile.host_threads;
    if (hw.host_to_device_gbps > 0) base.ms_per_gb_upload = 1000.0 / (0.8 * hw.host_to_device_gbps);
  } catch (const UserError&) {  // a path of another machine: fit the upload too
  }
  return base;
}

int run_fit(const PlanOptions& o) {
  if (!o.out.empty()) check_output_file(o.out, out_owner(o), o.force);  // before the store changes
  store::Database db = report::open_results(o.fit_db);
  const report::SweepData data = report::load_sweep(db, o.sweep);
  std::vector<costmodel::Measured> mem, time;
  std::vector<const store::TrialRecord*> mem_rows, time_rows;
  for (const store::TrialRecord& t : data.trials) {
    if (t.status != "ok" || !t.peak_mem_bytes) continue;
    const config::RunConfig c = config::parse_run_config_yaml(t.config_yaml);
    mem.push_back({c, static_cast<double>(*t.peak_mem_bytes)});
    mem_rows.push_back(&t);
    // Probes skip attention in all but the last layer: their time is not a step's.
    if (!t.probe && t.step_ms) {
      time.push_back({c, *t.step_ms});
      time_rows.push_back(&t);
    }
  }
  if (mem.size() < 2) throw UserError("--fit: " + o.fit_db + ": fewer than 2 ok trials to fit");
  check_fitted_profile(data, device_of(mem.front().config));
  if (time.empty()) {
    throw UserError("--fit: " + o.fit_db + ": no ok trial ran whole steps (probes only) to fit time");
  }
  costmodel::LinearFit mfit, tfit;
  std::vector<std::string> inseparable;
  const costmodel::MemoryCoefficients mk = costmodel::fit_memory(mem, &mfit);
  const costmodel::TimeCoefficients tk =
      costmodel::fit_time(time, fit_base(data), &tfit, &inseparable);

  report::Table table;
  for (const char* h : {"trial", "sp", "seqlen", "probe", "point", "peak MiB", "predicted",
                        "error", "step ms", "predicted ", "error "}) {
    table.add_column(h, std::string(h) != "point");
  }
  json rows = json::array();
  double worst_mem = 0, worst_time = 0;
  for (size_t i = 0; i < mem.size(); ++i) {
    const store::TrialRecord& t = *mem_rows[i];
    const double measured = mem[i].value;
    const double predicted = static_cast<double>(costmodel::predict_memory(mem[i].config, mk).peak_bytes);
    worst_mem = std::max(worst_mem, std::fabs(predicted - measured) / measured);
    std::vector<std::string> cells = {std::to_string(t.id), std::to_string(t.sp),
                                      std::to_string(t.seqlen), t.probe ? "yes" : "no", t.point,
                                      fmt("%.1f", measured / (1 << 20)),
                                      fmt("%.1f", predicted / (1 << 20)), pct(predicted, measured)};
    json row = {{"trial", t.id}, {"peak_bytes", measured}, {"predicted_peak_bytes", predicted}};
    if (!t.probe && t.step_ms) {
      const double p = costmodel::predict_time(costmodel::step_work(mem[i].config), tk).step_ms;
      worst_time = std::max(worst_time, std::fabs(p - *t.step_ms) / *t.step_ms);
      cells.insert(cells.end(), {fmt("%.0f", *t.step_ms), fmt("%.0f", p), pct(p, *t.step_ms)});
      row["step_ms"] = *t.step_ms;
      row["predicted_step_ms"] = p;
      const costmodel::StepWork w = costmodel::step_work(mem[i].config);
      row["work"] = {{"matmul_tflop", w.matmul_flops / 1e12},
                     {"attention_tflop", w.attention_flops / 1e12},
                     {"comm_gb", costmodel::comm_bytes(w) / 1e9},
                     {"host_optimizer_gb", (w.optimizer_norm_bytes + w.optimizer_host_bytes) / 1e9},
                     {"upload_gb", w.optimizer_upload_bytes / 1e9}};
    } else {
      cells.insert(cells.end(), {"-", "-", "-"});
    }
    table.rows.push_back(cells);
    rows.push_back(row);
  }
  std::cout << "sweep " << data.sweep.name << ": " << mem.size() << " ok trials (memory), "
            << time.size() << " (time)\n"
            << report::render_terminal(table)
            << fmt("memory: runtime %.1f MiB", mk.runtime_bytes / (1 << 20))
            << fmt(", allocator overhead %.1f %%", 100 * mk.allocator_fraction)
            << fmt("; worst error %.1f %%", 100 * worst_mem) << "\n"
            << fmt("time: %.1f ms/GEMM-TFLOP", tk.ms_per_tflop)
            << fmt(", %.1f ms/attention-TFLOP", tk.ms_per_tflop_attention)
            << fmt(", %.1f ms/GB comm", tk.ms_per_gb_a2a)
            << fmt(", overhead %.1f ms", tk.overhead_ms)
            << fmt("; worst error %.1f %%", 100 * worst_time) << "\n";
  bool host_measured = false;  // some trial offloaded its optimizer
  for (const costmodel::Measured& m : time) {
    host_measured = host_measured || costmodel::step_work(m.config).optimizer_host_bytes > 0;
  }
  if (tk.ms_per_gb_host > 0) {
    const std::string threads =
        tk.host_threads > 0 ? " at " + std::to_string(tk.host_threads) + " threads"
                            : std::string(host_measured ? " at the trials' host threads" : "");
    std::cout << "time: offloaded optimizer: host passes (norm, AdamW) "
              << fmt("%.1f ms/GB", tk.ms_per_gb_host)
              << fmt(" (%.0f GB/s", 1000 / tk.ms_per_gb_host) << threads
              << (host_measured ? "" : ", the profile's host memory: no trial offloaded it")
              << fmt("), upload %.1f ms/GB", tk.ms_per_gb_upload)
              << (fit_base(data).ms_per_gb_upload >= 0 ? " (the profile's host link)" : "")
              << fmt(", %.0f %% overlapping backward", 100 * tk.optimizer_overlap) << "\n";
  }
  if (!inseparable.empty()) {
    std::string names;
    for (size_t i = 0; i < inseparable.size(); ++i) {
      names += (i == 0 ? "" : i + 1 == inseparable.size() ? " and " : ", ") + inseparable[i];
    }
    std::cout << "time: " << names << " cannot be told apart from the terms before them on these"
              << " trials (all of one shape), so they are folded into those and set to 0; trials"
              << " at more lengths or meshes separate them\n";
  }
  {  // the calibrations table of the store it was fitted on, with those trials
    CalibratedModel fitted;
    fitted.memory = mk, fitted.time = tk;
    std::vector<store::FitTrial> fit_trials;
    for (const json& row : rows) {
      const int64_t id = row.at("trial").get<int64_t>();
      fit_trials.push_back({id, "memory", row.at("peak_bytes").get<double>(),
                            row.at("predicted_peak_bytes").get<double>()});
      if (row.contains("step_ms")) {
        fit_trials.push_back({id, "time", row.at("step_ms").get<double>(),
                              row.at("predicted_step_ms").get<double>()});
      }
    }
    const json params = {{"sweep", data.sweep.name},
                         {"memory_rms_relative_error", mfit.rms_relative_error},
                         {"time_rms_relative_error", tfit.rms_relative_error}};
    store::CalibrationRun run;
    run.hardware = data.trials.empty() ? "" : hardware_of(data);
    run.host = "";
    run.device = device_of(mem.front().config);
    run.world_size = data.trials.empty() ? 1 : data.trials.front().world_size;
    run.command = "ulysses-tune plan --fit " + o.fit_db + " --sweep " + data.sweep.name;
    store::Store results = store::Store::open(o.fit_db);
    const int64_t id = results.add_model_fit(run, fit_rows(fitted, params.dump()), fit_trials);
    std::cout << "calibration stored in " << o.fit_db << " (calibration run " << id << ", "
              << fit_trials.size() << " trial rows; `plan --db " << o.fit_db << "` uses it)\n";
  }
  if (!o.out.empty()) {
    const json out = {
        {"fitted_on", {{"db", o.fit_db}, {"sweep", data.sweep.name}, {"rows", rows}}},
        {"memory",
         {{"runtime_bytes", mk.runtime_bytes},
          {"allocator_fraction", mk.allocator_fraction},
          {"rms_relative_error", mfit.rms_relative_error}}},
        {"time",
         {{"ms_per_tflop", tk.ms_per_tflop},
          {"ms_per_tflop_attention", tk.ms_per_tflop_attention},
          {"ms_per_gb_comm", tk.ms_per_gb_a2a},
          {"overhead_ms", tk.overhead_ms},
          {"ms_per_gb_host", tk.ms_per_gb_host},
          {"host_threads", tk.host_threads},
          {"ms_per_gb_upload", tk.ms_per_gb_upload},
          {"optimizer_overlap", tk.optimizer_overlap},
          {"inseparable", inseparable},
          {"rms_relative_error", tfit.rms_relative_error}}}};
    write_output_file(o.out, out.dump(2) + "\n", out_owner(o), o.force);
    std::cout << "calibration written to " << o.out << "\n";
  }
  return kExitOk;
}

// "model: family qwen3 (Qwen3ForCausalLM), 8.19 B parameters, h 4096, 36 layers, 32 x 128 query
// heads over 8 KV heads\n", and the sliding window when there is one.
std::string model_line(const config::ModelOptions& m) {
  const config::ModelFamily family = config::model_family(m.family);
  const int64_t hd = m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_heads;
  std::string line = "model: family " + m.family + " (" + family.hf_architecture + "), " +
                     fmt("%.2f B parameters", costmodel::parameter_count(m) / 1e9) + ", h " +
                     std::to_string(m.hidden_size) + ", " + std::to_string(m.num_layers) +
                     " layers, " + std::to_string(m.num_heads) + " x " + std::to_string(hd) +
                     " query heads over " + std::to_string(m.num_kv_heads) + " KV heads";
  if (m.sliding_window > 0) line += ", sliding window " + std::to_string(m.sliding_window);
  return line + "\n";
}

const char* lifetime_name(costmodel::Lifetime l) {
  switch (l) {
    case costmodel::Lifetime::kStatic: return "static";
    case costmodel::Lifetime::kSaved: return "saved";
    case costmodel::Lifetime::kTransient: return "transient";
    case costmodel::Lifetime::kStep: return "optimizer step";
    case costmodel::Lifetime::kOverhead: return "overhead";
  }
  return "";
}

// "peak X GiB per rank (...), host Y GiB per rank" and, with `terms`, the prediction's terms as
// a table.
void print_memory_terms(const costmodel::MemoryPrediction& m, bool terms = true) {
  report::Table t;
  for (const char* h : {"component", "GiB", "lifetime", "where", "formula"}) {
    t.add_column(h, std::string(h) == "GiB");
  }
  bool cached = false;  // the layers' blocks kept beside the loss's (CUDA)
  for (const costmodel::MemoryTerm& term : m.terms) {
    t.rows.push_back({term.name, fmt("%.2f", term.bytes / kGiB), lifetime_name(term.lifetime),
                      term.location == costmodel::Location::kHost ? "host" : "device",
                      term.formula});
    cached = cached || term.name == "cached layer blocks";
  }
  std::cout << "peak " << fmt("%.2f", m.peak_bytes / kGiB)
            << " GiB per rank (static + saved + largest transient, or the optimizer step: '"
            << m.largest_transient << "'" << (cached ? " + cached layer blocks" : "")
            << " + overhead), host " << fmt("%.2f", m.host_bytes / kGiB) << " GiB per rank\n"
            << (terms ? report::render_terminal(t) : std::string());
}

void print_components(const PlanRequest& r, const std::vector<PlanRow>& rows) {
  for (const PlanRow& row : rows) {
    if (!row.valid) continue;
    FeatureSet f;
    for (const FeatureSet& candidate : r.features) {
      if (candidate.name == row.features) f = candidate;
    }
    const config::RunConfig c = row_config(r, row.sp, f, row.seqlen, row.sp_ring);
    std::cout << "\n" << report::mesh_text(row.dp, row.sp, row.sp_ring, row.uneven_heads) << " "
              << row.features << " at " << row.seqlen << " tokens: ";
    print_memory_terms(costmodel::predict_memory(c, r.memory));
  }
  std::cout << "\n";
}

// The ZeRO stage the plan assumed, for its header: "ZeRO stage 0", plus the stages of feature
// sets that name their own ("; zero3 rows: stage 3") and the DeepSpeed what-if.
std::string zero_assumed(const PlanRequest& r, const std::vector<PlanRow>& rows,
                         bool what_if_deepspeed) {
  std::string text = "ZeRO stage " + std::to_string(r.zero_stage);
  std::vector<int64_t> others;
  for (const PlanRow& row : rows) {
    if (row.zero_stage != r.zero_stage &&
        std::find(others.begin(), others.end(), row.zero_stage) == others.end()) {
      others.push_back(row.zero_stage);
    }
  }
  for (int64_t stage : others) {
    text += "; zero" + std::to_string(stage) + " rows: stage " + std::to_string(stage);
  }
  if (what_if_deepspeed) text += "; what-if DeepSpeed: states sharded over the world as ZeRO-3";
  return text;
}

// plan --config: the cost model's prediction for one run config as written (its mesh, length,
// precision and memory features): peak and host memory per rank and step time.
int run_config_plan(const PlanOptions& o) {
  const config::RunConfig c = config::load_run_config(o.config);
  PlanRequest r;
  r.hardware = calibrate::load_hardware_profile(hardware_path(o.hardware));
  if (r.hardware.device_type != c.train.device) {
    throw UserError("--hardware: " + r.hardware.name + " is a " + r.hardware.device_type +
                    " profile; " + o.config + " trains on train.device " + c.train.device);
  }
  apply_coefficients(o, &r);
  const CalibratedModel model{r.memory, r.time, r.time_calibrated, 0};
  const costmodel::MemoryPrediction m = costmodel::predict_memory(c, r.memory);
  const double step_ms = predict_step_ms(model, r.hardware, c);
  const int64_t ring = costmodel::ring_ranks(c);  // mesh.sp_ring resolved (auto included)
  const std::string mesh = report::mesh_text(c.mesh.dp, c.mesh.sp, ring, c.mesh.uneven_heads);
  if (o.json) {
    const json out = {{"config", o.config},
                      {"hardware", r.hardware.name},
                      {"dp", c.mesh.dp},
                      {"sp", c.mesh.sp},
                      {"sp_ring", ring},
                      {"seqlen", c.sequence.length},
                      {"peak_bytes", m.peak_bytes},
                      {"host_bytes", m.host_bytes},
                      {"largest_transient", m.largest_transient},
                      {"step_ms", step_ms},
                      {"time_calibrated", r.time_calibrated}};
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "plan: " << o.config << " on " << r.hardware.name << ": " << mesh << ", "
            << c.sequence.length << " tokens, " << c.memory.precision << "\n"
            << model_line(c.model) << "step " << fmt("%.3f", step_ms / 1000) << " s"
            << (r.time_calibrated ? "" : "*") << ", ";
  print_memory_terms(m, o.components);
  if (!r.time_calibrated) {
    std::cout << "* uncalibrated: the step time is an estimate from the hardware profile's "
                 "peaks (give a fit with --db DB or --calibration FILE)\n";
  }
  return kExitOk;
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanOptions* o) {
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Predict peak memory per rank, step time, tokens/s, MFU and the longest sequence that fits "
      "for meshes x memory features from the cost model (no run); --fit DB calibrates it on a "
      "sweep's trials and stores the fit in DB's calibrations table");
  cmd->add_option("--model", o->model, "model preset (profiles/models) or YAML path")
      ->capture_default_str();
  cmd->add_option("--hardware", o->hardware, "hardware profile (profiles/hardware) or YAML path")
      ->capture_default_str();
  cmd->add_option("--world", o->world, "ranks (devices); default: the profile's nodes x devices");
  cmd->add_option("--nodes", o->nodes, "nodes of the profile's kind (world = nodes x devices)");
  cmd->add_option("--seqlen", o->seqlen, "predict at this sequence length");
  cmd->add_flag("--max-seqlen", o->max_seqlen, "predict at each row's longest fitting length "
                                                "(the default without --seqlen)");
  cmd->add_option("--features", o->features,
                  "memory features of one row set, comma-separated: tiled-mlp, tiled-loss, "
                  "checkpoint, offload-checkpoints, offload-optimizer, device-gradients (the "
                  "gradients stay on the device under optimizer offload), alst, none; repeatable "
                  "(default: base, tiled, tiled+ckpt, tiled+ckpt-offload, alst)");
  cmd->add_option("--micro-batch", o->micro_batch, "sequences per rank and micro-step")
      ->capture_default_str();
  cmd->add_option("--zero", o->zero,
                  "ZeRO stage 0-3 over the world (dp x sp) for every row whose --features name "
                  "none (stage 3 as the trainer builds it)")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision, "bf16 | fp32 (default bf16 on cuda, fp32 on cpu)");
  cmd->add_option("--calibration", o->calibration, "coefficients written by plan --fit --out");
  cmd->add_option("--db", o->db,
                  "results database: use its newest cost-model fit (plan --fit stores one)");
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->add_flag("--what-if-deepspeed", o->what_if_deepspeed,
                "what-if, not this trainer: gradients in the model dtype; weights, gradients and "
                "optimizer states sharded over the world (DeepSpeed ZeRO-3), for comparing with "
                "published results");
  cmd->add_flag("--uneven-heads", o->uneven_heads,
                "also meshes whose sp does not divide the heads (mesh.uneven_heads: each rank "
                "takes ceil or floor(heads/sp) of them; the rank with the most sets the time)");
  cmd->add_flag("--ring", o->ring,
                "also meshes with ring attention (mesh.sp_ring): each sp factored as an all-to-all "
                "over the heads times a ring over the sequence, for every ring degree the heads "
                "allow; sp may then exceed the head count");
  cmd->add_flag("--components", o->components,
                "also print each row's memory components (bytes, formula, lifetime, location)");
  cmd->add_option("--fit", o->fit_db, "calibrate on this results database's ok trials");
  cmd->add_option("--sweep", o->sweep, "with --fit: the sweep (default: the latest)");
  cmd->add_option("--out", o->out,
                  "with --fit: write the calibration JSON here (an existing file only with --force)");
  cmd->add_flag("--force", o->force, "with --out: replace the file if it exists");
  CLI::Option* config = cmd->add_option(
      "--config", o->config,
      "predict one ulysses-train run config as written (its mesh, length, precision and memory "
      "features) on --hardware: peak and host memory per rank, step time; with --components "
      "its memory terms");
  for (const char* other : {"--model", "--world", "--nodes", "--seqlen", "--max-seqlen",
                            "--features", "--micro-batch", "--zero", "--precision",
                            "--what-if-deepspeed", "--uneven-heads", "--ring", "--fit"}) {
    config->excludes(cmd->get_option(other));
  }
  return cmd;
}

int run_plan(const PlanOptions& o) {
  if (!o.fit_db.empty()) return run_fit(o);
  if (!o.config.empty()) return run_config_plan(o);
  if (o.seqlen > 0 && o.max_seqlen) throw UserError("--seqlen: give either --seqlen or --max-seqlen");
  if (o.seqlen < 0) throw UserError("--seqlen: must be >= 1");
  if (o.world > 0 && o.nodes > 0) throw UserError("--world: give either --world or --nodes");
  if (o.world < 0 || o.nodes < 0) throw UserError("--world/--nodes: must be >= 1");
  if (o.precision != "" && o.precision != "bf16" && o.precision != "fp32") {
    throw UserError("--precision: expected bf16 or fp32, got '" + o.precision + "'");
  }
  PlanRequest r;
  r.model = config::load_model_preset(o.model);
  r.hardware = calibrate::load_hardware_profile(hardware_path(o.hardware));
  if (o.nodes > 0) r.hardware.nodes = o.nodes;
  r.world = o.world > 0 ? o.world : r.hardware.world_size();
  r.seqlen = o.seqlen;
  r.micro_batch = o.micro_batch;
  r.zero_stage = o.zero;
  r.precision = o.precision;
  r.uneven_heads = o.uneven_heads;
  r.ring = o.ring;
  for (const std::string& f : o.features) r.features.push_back(parse_features(f));
  if (r.features.empty()) r.features = default_feature_sets();
  apply_coefficients(o, &r);
  if (o.what_if_deepspeed) {
    r.memory.gradient_bytes = r.precision == "fp32" ? 4 : 2;
    r.memory.state_shards = r.world;
  }
  const std::vector<PlanRow> rows = make_plan(r);

  if (o.json) {
    json out = {{"model", o.model}, {"family", r.model.family},
                {"parameters", costmodel::parameter_count(r.model)},
                {"hardware", r.hardware.name}, {"world", r.world},
                {"zero_stage", r.zero_stage},
                {"zero_assumed", zero_assumed(r, rows, o.what_if_deepspeed)},
                {"usable_device_bytes", usable_device_bytes(r.hardware)},
                {"time_calibrated", r.time_calibrated}, {"rows", json::array()}};
    for (const PlanRow& row : rows) {
      out["rows"].push_back({{"dp", row.dp}, {"sp", row.sp}, {"sp_ring", row.sp_ring},
                             {"uneven_heads", row.uneven_heads},
                             {"features", row.features},
                             {"zero_stage", row.zero_stage},
                             {"valid", row.valid}, {"limit", row.limit}, {"seqlen", row.seqlen},
                             {"peak_bytes", row.peak_bytes},
                             {"host_bytes_per_node", row.host_bytes_per_node},
                             {"step_ms", row.step_ms},
                             {"tokens_per_s_per_device", row.tokens_per_s_per_device},
                             {"mfu", row.mfu}, {"max_seqlen", row.max_seqlen},
                             {"max_limit", row.max_limit}, {"max_layers", row.max_layers},
                             {"max_parameters", row.max_parameters}});
    }
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  report::Table table;
  for (const char* h : {"dp x sp", "features", "seqlen", "peak GiB/rank", "host GiB/node",
                        "step s", "tok/s/dev", "MFU", "at seqlen", "max seqlen", "limited by",
                        "largest model"}) {
    const std::string name = h;
    const bool time = name == "step s" || name == "tok/s/dev" || name == "MFU";
    table.add_column(name + (time && !r.time_calibrated ? "*" : ""),  // uncalibrated: see below
                     name != "features" && name != "at seqlen" && name != "limited by" &&
                         name != "largest model");
  }
  for (const PlanRow& row : rows) {
    const std::string mesh = report::mesh_text(row.dp, row.sp, row.sp_ring, row.uneven_heads);
    if (!row.valid) {
      table.rows.push_back(
          {mesh, row.features, "-", "-", "-", "-", "-", "-", "-", "-", row.limit, "-"});
      continue;
    }
    const std::string largest =
        row.max_layers > 0 ? fmt("%.1fB", row.max_parameters / 1e9) + " (" +
                                 std::to_string(row.max_layers) + " layers)"
                           : "none";
    table.rows.push_back({mesh, row.features, tokens_text(row.seqlen),
                          fmt("%.1f", row.peak_bytes / kGiB),
                          fmt("%.1f", row.host_bytes_per_node / kGiB),
                          fmt("%.2f", row.step_ms / 1000), fmt("%.0f", row.tokens_per_s_per_device),
                          fmt("%.1f%%", 100 * row.mfu), row.limit,
                          tokens_text(row.max_seqlen), row.max_limit, largest});
  }
  std::cout << "plan: " << o.model << " on " << r.hardware.name << ", world " << r.world << " ("
            << r.hardware.nodes << " x " << r.hardware.devices_per_node << "), "
            << fmt("%.1f GiB usable per device", usable_device_bytes(r.hardware) / kGiB)
            << ", micro-batch " << r.micro_batch << ", "
            << zero_assumed(r, rows, o.what_if_deepspeed) << "\n"
            << model_line(r.model) << report::render_terminal(table)
            << "largest model: the most layers of this model's shapes each row holds at its "
               "seqlen, and their parameters\n";
  if (o.components) print_components(r, rows);
  if (!r.time_calibrated) {
    std::cout << "* uncalibrated: step s, tok/s/dev and MFU are estimates from the hardware "
                 "profile's peaks, which can be far off (on a CPU, steps several times too "
                 "short): give a fit with --db DB after `plan --fit DB`, or --calibration FILE\n";
  }
  return kExitOk;
}

}  // namespace ulysses::plan
