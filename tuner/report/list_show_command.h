// `ulysses-tune list` and `ulysses-tune show`: the results database's sweeps and trials on the
// terminal, read-only (the database is never created or changed).
#pragma once
#include <cstdint>
#include <iostream>
#include <string>

namespace CLI {
class App;
}

namespace ulysses::report {

// The options of `ulysses-tune list` (CLI names in the comments).
struct ListOptions {
  std::string db_path = "results.db";  // --db
  std::string sweep;                   // --sweep NAME: list its trials; "" = list the sweeps
};

// The options of `ulysses-tune show`: exactly one of --trial and --sweep.
struct ShowOptions {
  std::string db_path = "results.db";  // --db
  int64_t trial_id = 0;                // --trial ID; 0 = not given
  std::string sweep;                   // --sweep NAME
};

// Add the subcommands; parsing writes into *options, which must outlive the parse.
CLI::App* add_list_command(CLI::App& app, ListOptions* options);
CLI::App* add_show_command(CLI::App& app, ShowOptions* options);

// Without --sweep: a table of the sweeps (id, name, created, status, trials, a count per status
// that occurs, the objective and the best trial under it: objective.h), or "<db>: no sweeps".
// With --sweep: the sweep's trials as a table (trial_table.h) and the basis of its peaks
// (memory_basis.h). Writes to `out`; returns 0.
// Throws UserError "<db>: no such file" for a missing database (never creates one), naming the
// file for a corrupt one, "--sweep NAME: no such sweep in <db> ..." for an unknown sweep.
int run_list(const ListOptions& options, std::ostream& out = std::cout);

// --trial: every field of the trial (trial_table.h trial_fields()), its peak above the start-up
// baseline against its limit (memory_basis.h), its sweep, steps, phases and run dir. --sweep:
// the sweep's record, trial counts, environment, search summary and experiment file. Writes to
// `out`; returns 0. Throws UserError for a missing or corrupt database, "--trial ID: no such
// trial in <db>", an unknown sweep, or both / neither option.
int run_show(const ShowOptions& options, std::ostream& out = std::cout);

}  // namespace ulysses::report
