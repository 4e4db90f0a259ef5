// A thin RAII layer over one SQLite connection: open with WAL and a busy
// timeout, run SQL, prepared statements with typed binds and columns, transactions.
//
// Every SQLite failure throws UserError("<db path>: <what> (<sqlite message>)"), so a missing,
// unreadable or corrupt file reaches the user as one line naming it. Not thread-safe: one
// Database per thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

struct sqlite3;
struct sqlite3_stmt;

namespace ulysses::store {

// One prepared statement. Columns are 0-based, bind indices 1-based (as in SQLite).
// Invariants: stmt_ != nullptr until moved from.
class Statement {
 public:
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  ~Statement();

  Statement& bind(int index, int64_t value);
  Statement& bind(int index, int value) { return bind(index, static_cast<int64_t>(value)); }
  Statement& bind(int index, double value);
  Statement& bind(int index, const std::string& value);
  Statement& bind_null(int index);

  // Runs to the next row: true when a row is available, false when done.
  bool step();
  // step() expecting no row (INSERT, UPDATE, DDL).
  void run();

  bool is_null(int column) const;
  int64_t column_int(int column) const;
  double column_double(int column) const;
  std::string column_text(int column) const;  // "" for NULL

 private:
  friend class Database;
  Statement(sqlite3* db, sqlite3_stmt* stmt, const std::string* path);
  void check(int rc, const char* what) const;

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  const std::string* path_;  // owned by the Database
};

class Database {
 public:
  enum class Mode { kReadWriteCreate, kReadOnly };

  // Opens (kReadWriteCreate: creating it and its parent directory as needed) and checks that
  // the file is an SQLite database. Read-write connections switch to WAL journaling, enable
  // foreign keys and wait up to 10 s for a lock. Throws UserError naming `path`.
  static Database open(const std::string& path, Mode mode = Mode::kReadWriteCreate);

  Database(Database&& other) noexcept;
  Database& operator=(Database&&) = delete;
  Database(const Database&) = delete;
  ~Database();

  // Runs one or more statements without results.
  void exec(const std::string& sql);
  // REQUIRES: one statement.
  Statement prepare(const std::string& sql);
  int64_t last_insert_rowid() const;
  // True when a table (or view) of that name exists.
  bool has_table(const std::string& name);
  // True when `table` has a column named `column`.
  bool has_column(const std::string& table, const std::string& column);
  // PRAGMA user_version.
  int user_version();
  // The journal mode in effect ("wal", "delete", ...).
  std::string journal_mode();

  // Runs fn() inside BEGIN IMMEDIATE ... COMMIT; rolls back and rethrows when fn throws.
  template <typename Fn>
  void transaction(Fn&& fn) {
    exec("BEGIN IMMEDIATE");
    try {
      fn();
    } catch (...) {
      exec("ROLLBACK");
      throw;
    }
    exec("COMMIT");
  }

  const std::string& path() const { return *path_; }

 private:
  Database(sqlite3* db, std::string path);
  void check(int rc, const std::string& what) const;

  sqlite3* db_;
  std::unique_ptr<std::string> path_;  // stable address for statements
};

}  // namespace ulysses::store
