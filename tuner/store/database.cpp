// SQLite connection and statements with one-line errors (see database.h).
#include "tuner/store/database.h"

#include <sqlite3.h>

#include <filesystem>
#include <utility>

#include "common/error.h"

namespace ulysses::store {

Statement::Statement(sqlite3* db, sqlite3_stmt* stmt, const std::string* path)
    : db_(db), stmt_(stmt), path_(path) {}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), path_(other.path_) {}

Statement::~Statement() {
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

void Statement::check(int rc, const char* what) const {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  throw UserError(*path_ + ": " + what + " failed (" + sqlite3_errmsg(db_) + ")");
}

Statement& Statement::bind(int index, int64_t value) {
  check(sqlite3_bind_int64(stmt_, index, value), "bind");
  return *this;
}

Statement& Statement::bind(int index, double value) {
  check(sqlite3_bind_double(stmt_, index, value), "bind");
  return *this;
}

Statement& Statement::bind(int index, const std::string& value) {
  check(sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                          SQLITE_TRANSIENT),
        "bind");
  return *this;
}

Statement& Statement::bind_null(int index) {
  check(sqlite3_bind_null(stmt_, index), "bind");
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  check(rc, "query");
  return rc == SQLITE_ROW;
}

void Statement::run() {
  while (step()) {
  }
}

bool Statement::is_null(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

int64_t Statement::column_int(int column) const { return sqlite3_column_int64(stmt_, column); }

double Statement::column_double(int column) const { return sqlite3_column_double(stmt_, column); }

std::string Statement::column_text(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  return text == nullptr ? std::string()
                         : std::string(reinterpret_cast<const char*>(text),
                                       static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}

Database::Database(sqlite3* db, std::string path)
    : db_(db), path_(std::make_unique<std::string>(std::move(path))) {}

Database::Database(Database&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)) {}

Database::~Database() {
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

Database Database::open(const std::string& path, Mode mode) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (mode == Mode::kReadOnly && !fs::is_regular_file(path, ec)) {
    throw UserError(path + ": no such file");
  }
  if (mode == Mode::kReadWriteCreate) {
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
  }
  sqlite3* handle = nullptr;
  const int flags =
      mode == Mode::kReadOnly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  const int rc = sqlite3_open_v2(path.c_str(), &handle, flags, nullptr);
  Database db(handle, path);  // closes the handle on every path out
  if (rc != SQLITE_OK) {
    throw UserError(path + ": cannot open database (" +
                    (handle ? sqlite3_errmsg(handle) : sqlite3_errstr(rc)) + ")");
  }
  sqlite3_busy_timeout(handle, 10000);
  // Reading the schema is the first access to the file: a non-database fails here.
  db.check(sqlite3_exec(handle, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr),
           "not a valid SQLite database");
  if (mode == Mode::kReadWriteCreate) {
    db.exec("PRAGMA journal_mode=WAL");
    db.exec("PRAGMA foreign_keys=ON");
    db.exec("PRAGMA synchronous=NORMAL");
  }
  return db;
}

void Database::check(int rc, const std::string& what) const {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  throw UserError(*path_ + ": " + what + " (" + sqlite3_errmsg(db_) + ")");
}

void Database::exec(const std::string& sql) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message);
  if (rc != SQLITE_OK) {
    const std::string text = message ? message : sqlite3_errstr(rc);
    sqlite3_free(message);
    throw UserError(*path_ + ": " + text);
  }
}

Statement Database::prepare(const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  check(sqlite3_prepare_v2(db_, sql.c_str(), static_cast<int>(sql.size()), &stmt, nullptr),
        "bad query");
  return Statement(db_, stmt, path_.get());
}

int64_t Database::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }

bool Database::has_table(const std::string& name) {
  Statement s = prepare("SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?");
  s.bind(1, name);
  return s.step();
}

bool Database::has_column(const std::string& table, const std::string& column) {
  Statement s = prepare("SELECT 1 FROM pragma_table_info(?) WHERE name = ?");
  s.bind(1, table).bind(2, column);
  return s.step();
}

int Database::user_version() {
  Statement s = prepare("PRAGMA user_version");
  s.step();
  return static_cast<int>(s.column_int(0));
}

std::string Database::journal_mode() {
  Statement s = prepare("PRAGMA journal_mode");
  s.step();
  return s.column_text(0);
}

}  // namespace ulysses::store
