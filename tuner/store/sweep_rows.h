// How sweeps, trials and steps map to rows of the schema version 2 tables (migrations.cpp); used
// only by sweep_store.cpp. The SQL returned here and the binds/reads agree column for column.
#pragma once
#include <optional>
#include <string>

#include "tuner/store/database.h"
#include "tuner/store/trial_record.h"

namespace ulysses::store {

// with_slots: the table has the columns of schema version 6 (slot, remeasure_of); without them
// (an older database) the SQL leaves them out, selects them as NULL, and bind_trial skips them.

// "SELECT id, <every trials column> FROM trials " (append WHERE/ORDER BY); rows for read_trial.
std::string trial_select_sql(bool with_slots);
// INSERT of every column but id; a row of the same (sweep_id, key) is overwritten in place and
// keeps its id. Parameters as bind_trial.
std::string trial_upsert_sql(bool with_slots);
// UPDATE of every column but id; parameters as bind_trial, then the id.
std::string trial_update_sql(bool with_slots);

// Binds every column but id to parameters 1..N of s; returns N + 1 (the next parameter).
// Optional fields and "" timestamps (and slot) bind NULL.
int bind_trial(Statement& s, const TrialRecord& trial, bool with_slots);
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
