// The store's schema as an ordered list of migrations. PRAGMA user_version
// holds the number of migrations applied; opening a store applies the missing ones in order,
// each in its own transaction, so a killed migration leaves the previous version intact.
// New tables and columns are added by appending a migration, never by editing an old one.
#pragma once
#include <vector>

#include "tuner/store/database.h"

namespace ulysses::store {

struct Migration {
  int version;              // 1, 2, ...: the user_version after it ran
  const char* description;  // one line
  const char* sql;          // one or more statements
};

// Every migration, in version order (versions 1..N without gaps).
const std::vector<Migration>& migrations();

// The version after every migration: migrations().back().version.
int latest_schema_version();

// Applies the migrations db does not have yet. Returns the number applied.
// Throws UserError("<db path>: schema version V is newer than this ulysses-tune (N)") for a
// database written by a newer build, UserError naming the file for SQL failures.
int migrate(Database& db);

}  // namespace ulysses::store
