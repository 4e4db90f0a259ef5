// How sweeps, trials and steps map to rows of the schema version 2 tables (migrations.cpp); used
// only by sweep_store.cpp. The SQL returned here and the binds/reads agree column for column.
#pragma once
#include <optional>
#include <string>

#include "tuner/store/database.h"
#include "tuner/store/trial_record.h"

namespace ulysses::store {

// "SELECT id, <every trials column> FROM trials " (append WHERE/ORDER BY); rows for read_trial.
const std::string& trial_select_sql();
// INSERT of every column but id; a row of the same (sweep_id, key) is overwritten in place and
// keeps its id. Parameters as bind_trial.
const std::string& trial_upsert_sql();
// UPDATE of every column but id; parameters as bind_trial, then the id.
const std::string& trial_update_sql();

// Binds every column but id to parameters 1..N of s; returns N + 1 (the next parameter).
// Optional fields and "" timestamps bind NULL.
int bind_trial(Statement& s, const TrialRecord& trial);
// Reads a row of trial_select_sql(); NULL columns read back as nullopt / "".
TrialRecord read_trial(const Statement& s);

// Binds NULL for "" (timestamps), the text otherwise.
void bind_text_or_null(Statement& s, int index, const std::string& value);

// "SELECT <every sweeps column> FROM sweeps " (append WHERE/ORDER BY); rows for read_sweep.
extern const char* const kSelectSweep;
SweepRecord read_sweep(const Statement& s);

// Reads "SELECT step, loss, grad_norm, step_ms, tokens_per_s, peak_mem_bytes"; NULL -> NaN / 0.
TrialStep read_trial_step(const Statement& s);

}  // namespace ulysses::store
