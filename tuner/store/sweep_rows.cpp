// How trials, steps and sweeps map to rows (see sweep_rows.h): one column list for `trials`,
// shared by every INSERT, UPDATE and SELECT, so the record and the schema cannot drift apart.
#include "tuner/store/sweep_rows.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace ulysses::store {
namespace {

// Every column of `trials` but id, in the order of bind_trial() and read_trial().
constexpr const char* kTrialColumns[] = {"sweep_id",
                                         "key",
                                         "point",
                                         "config_yaml",
                                         "config_json",
                                         "seqlen",
                                         "probe",
                                         "world_size",
                                         "dp",
                                         "sp",
                                         "status",
                                         "exit_code",
                                         "error",
                                         "reason",
                                         "started_at",
                                         "finished_at",
                                         "wall_s",
                                         "run_dir",
                                         "step_ms",
                                         "tokens_per_s",
                                         "tokens_per_s_per_rank",
                                         "peak_mem_bytes",
                                         "peak_host_bytes",
                                         "final_loss",
                                         "limit_bytes",
                                         "predicted_peak_bytes",
                                         "predicted_step_ms",
                                         "summary",
                                         "slot",
                                         "remeasure_of"};
constexpr int kTrialColumnCount = static_cast<int>(std::size(kTrialColumns));
// The last columns, added by schema version 6: absent from older databases.
constexpr int kSlotColumnCount = 2;

int column_count(bool with_slots) {
  return with_slots ? kTrialColumnCount : kTrialColumnCount - kSlotColumnCount;
}

std::string join_columns(bool with_slots) {
  std::string out;
  for (int i = 0; i < column_count(with_slots); ++i) {
    out += (out.empty() ? "" : ", ") + std::string(kTrialColumns[i]);
  }
  return out;
}

std::string placeholders(bool with_slots) {
  std::string out;
  for (int i = 0; i < column_count(with_slots); ++i) out += i == 0 ? "?" : ", ?";
  return out;
}

void bind_optional(Statement& s, int index, const std::optional<int64_t>& value) {
  value ? s.bind(index, *value) : s.bind_null(index);
}
// NaN would be stored as NULL by SQLite anyway; binding NULL keeps that visible here.
void bind_optional(Statement& s, int index, const std::optional<double>& value) {
  (value && !std::isnan(*value)) ? s.bind(index, *value) : s.bind_null(index);
}

std::optional<int64_t> optional_int(const Statement& s, int c) {
  return s.is_null(c) ? std::nullopt : std::optional<int64_t>(s.column_int(c));
}
std::optional<double> optional_double(const Statement& s, int c) {
  return s.is_null(c) ? std::nullopt : std::optional<double>(s.column_double(c));
}
double double_or_nan(const Statement& s, int c) {
  return s.is_null(c) ? std::nan("") : s.column_double(c);
}

}  // namespace

std::string trial_select_sql(bool with_slots) {
  return "SELECT id, " + join_columns(with_slots) +
         (with_slots ? "" : ", NULL AS slot, NULL AS remeasure_of") + " FROM trials ";
}

std::string trial_upsert_sql(bool with_slots) {
  std::string set;
  for (int i = 0; i < column_count(with_slots); ++i) {
    const std::string column = kTrialColumns[i];
    if (column == "sweep_id" || column == "key") continue;
    set += (set.empty() ? "" : ", ") + column + " = excluded." + column;
  }
  return "INSERT INTO trials (" + join_columns(with_slots) + ") VALUES (" +
         placeholders(with_slots) + ") ON CONFLICT (sweep_id, key) DO UPDATE SET " + set;
}

std::string trial_update_sql(bool with_slots) {
  return "UPDATE trials SET (" + join_columns(with_slots) + ") = (" + placeholders(with_slots) +
         ") WHERE id = ?";
}

void bind_text_or_null(Statement& s, int index, const std::string& value) {
  value.empty() ? s.bind_null(index) : s.bind(index, value);
}

int bind_trial(Statement& s, const TrialRecord& t, bool with_slots) {
  int i = 1;
  s.bind(i++, t.sweep_id);
  for (const std::string* text : {&t.key, &t.point, &t.config_yaml, &t.config_json}) {
    s.bind(i++, *text);
  }
  for (int64_t value : {t.seqlen, int64_t{t.probe ? 1 : 0}, t.world_size, t.dp, t.sp}) {
    s.bind(i++, value);
  }
  s.bind(i++, t.status);
  bind_optional(s, i++, t.exit_code);
  s.bind(i++, t.error);
  s.bind(i++, t.reason);
  bind_text_or_null(s, i++, t.started_at);
  bind_text_or_null(s, i++, t.finished_at);
  bind_optional(s, i++, t.wall_s);
  s.bind(i++, t.run_dir);
  for (const auto* value : {&t.step_ms, &t.tokens_per_s, &t.tokens_per_s_per_rank}) {
    bind_optional(s, i++, *value);
  }
  bind_optional(s, i++, t.peak_mem_bytes);
  bind_optional(s, i++, t.peak_host_bytes);
  bind_optional(s, i++, t.final_loss);
  bind_optional(s, i++, t.limit_bytes);
  bind_optional(s, i++, t.predicted_peak_bytes);
  bind_optional(s, i++, t.predicted_step_ms);
  s.bind(i++, t.summary);
  if (with_slots) {
    bind_text_or_null(s, i++, t.slot);
    bind_optional(s, i++, t.remeasure_of);
  }
  TORCH_CHECK(i == column_count(with_slots) + 1, "bind_trial: ", i - 1, " binds for ",
              column_count(with_slots), " columns");
  return i;
}

TrialRecord read_trial(const Statement& s) {
  TrialRecord t;
  int c = 0;
  t.id = s.column_int(c++);
  t.sweep_id = s.column_int(c++);
  t.key = s.column_text(c++);
  t.point = s.column_text(c++);
  t.config_yaml = s.column_text(c++);
  t.config_json = s.column_text(c++);
  t.seqlen = s.column_int(c++);
  t.probe = s.column_int(c++) != 0;
  t.world_size = s.column_int(c++);
  t.dp = s.column_int(c++);
  t.sp = s.column_int(c++);
  t.status = s.column_text(c++);
  t.exit_code = optional_int(s, c++);
  t.error = s.column_text(c++);
  t.reason = s.column_text(c++);
  t.started_at = s.column_text(c++);
  t.finished_at = s.column_text(c++);
  t.wall_s = optional_double(s, c++);
  t.run_dir = s.column_text(c++);
  t.step_ms = optional_double(s, c++);
  t.tokens_per_s = optional_double(s, c++);
  t.tokens_per_s_per_rank = optional_double(s, c++);
  t.peak_mem_bytes = optional_int(s, c++);
  t.peak_host_bytes = optional_int(s, c++);
  t.final_loss = optional_double(s, c++);
  t.limit_bytes = optional_int(s, c++);
  t.predicted_peak_bytes = optional_int(s, c++);
  t.predicted_step_ms = optional_double(s, c++);
  t.summary = s.column_text(c++);
  t.slot = s.column_text(c++);
  t.remeasure_of = optional_int(s, c++);
  return t;
}

const char* const kSelectSweep =
    "SELECT id, name, created_at, finished_at, status, experiment_path, experiment_yaml, search, "
    "objective, environment, summary FROM sweeps ";

TrialStep read_trial_step(const Statement& s) {
  TrialStep step;
  step.step = s.column_int(0);
  step.loss = double_or_nan(s, 1);
  step.grad_norm = double_or_nan(s, 2);
  step.step_ms = double_or_nan(s, 3);
  step.tokens_per_s = double_or_nan(s, 4);
  step.peak_mem_bytes = s.column_int(5);
  return step;
}

SweepRecord read_sweep(const Statement& s) {
  SweepRecord r;
  r.id = s.column_int(0);
  r.name = s.column_text(1);
  r.created_at = s.column_text(2);
  r.finished_at = s.column_text(3);
  r.status = s.column_text(4);
  r.experiment_path = s.column_text(5);
  r.experiment_yaml = s.column_text(6);
  r.search = s.column_text(7);
  r.objective = s.column_text(8);
  r.environment = s.column_text(9);
  r.summary = s.column_text(10);
  return r;
}

}  // namespace ulysses::store
