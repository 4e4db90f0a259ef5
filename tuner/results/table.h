// One table, three printers: a Table of text cells rendered as an aligned terminal
// table, a GitHub markdown table or RFC 4180 CSV. Builders in trial_table.h fill Tables from the
// store's records; nothing here knows about trials.
#pragma once
#include <string>
#include <vector>

namespace ulysses::report {

struct Table {
  std::vector<std::string> header;
  std::vector<bool> right_align;               // per column; missing entries = left
  std::vector<std::vector<std::string>> rows;  // each row: header.size() cells

  // Appends a column (header + alignment); rows added later must have a cell for it.
  void add_column(std::string name, bool right = false);
};

// Columns padded to their widest cell, two spaces apart, a dashed line under the header, one line
// per row. Cells are shown on one line: line breaks become spaces, and cells longer than
// max_cell_chars (0 = no limit) are cut with "...". Ends with a newline.
std::string render_terminal(const Table& table, size_t max_cell_chars = 0);

// A GitHub-flavoured markdown table: '|' escaped, line breaks as spaces; ends with a newline.
std::string render_markdown(const Table& table);

// RFC 4180: CRLF line ends, a field quoted when it holds a comma, quote, CR or LF, quotes doubled.
// The header is the first record.
std::string render_csv(const Table& table);

// The text of one CSV field (quoted as render_csv does).
std::string csv_field(const std::string& text);

}  // namespace ulysses::report
