// Terminal, markdown and CSV printers of a Table (see table.h).
#include "tuner/results/table.h"

#include <algorithm>

namespace ulysses::report {
namespace {

std::string one_line(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;  // CRLF -> one space
    out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  }
  return out;
}

// Display width: UTF-8 continuation bytes take no column.
size_t width(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::string cut(const std::string& text, size_t max_chars) {
  if (max_chars == 0 || width(text) <= max_chars) return text;
  size_t chars = 0, end = 0;
  for (; end < text.size(); ++end) {
    if ((static_cast<unsigned char>(text[end]) & 0xC0) != 0x80 && ++chars > max_chars - 3) break;
  }
  return text.substr(0, end) + "...";
}

bool right(const Table& table, size_t column) {
  return column < table.right_align.size() && table.right_align[column];
}

}  // namespace

void Table::add_column(std::string name, bool right) {
  header.push_back(std::move(name));
  right_align.resize(header.size() - 1);
  right_align.push_back(right);
}

std::string render_terminal(const Table& table, size_t max_cell_chars) {
  std::vector<std::vector<std::string>> lines;
  lines.push_back(table.header);
  for (const auto& row : table.rows) {
    std::vector<std::string> cells;
    for (const auto& cell : row) cells.push_back(cut(one_line(cell), max_cell_chars));
    lines.push_back(std::move(cells));
  }
  std::vector<size_t> widths(table.header.size(), 0);
  for (const auto& line : lines) {
    for (size_t c = 0; c < line.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], width(line[c]));
    }
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& line) {
    std::string text;
    for (size_t c = 0; c < widths.size(); ++c) {
      const std::string cell = c < line.size() ? line[c] : "";
      const std::string pad(widths[c] - width(cell), ' ');
      text += (c == 0 ? "" : "  ") + (right(table, c) ? pad + cell : cell + pad);
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  };
  emit(lines[0]);
  std::vector<std::string> rule;
  for (size_t w : widths) rule.push_back(std::string(w, '-'));
  emit(rule);
  for (size_t i = 1; i < lines.size(); ++i) emit(lines[i]);
  return out;
}

std::string render_markdown(const Table& table) {
  std::string out = "|";
  // Appends " <cell> |": '|' escaped, line breaks as spaces, an empty cell as one space.
  auto add_cell = [&out](const std::string& text) {
    const std::string line = one_line(text);
    out += ' ';
    for (char c : line) {
      if (c == '|') out += '\\';
      out += c;
    }
    out += line.empty() ? "  |" : " |";
  };
  for (const auto& name : table.header) add_cell(name);
  out += "\n|";
  for (size_t c = 0; c < table.header.size(); ++c) out += right(table, c) ? "---:|" : "---|";
  out += "\n";
  for (const auto& row : table.rows) {
    out += "|";
    for (size_t c = 0; c < table.header.size(); ++c) {
      add_cell(c < row.size() ? row[c] : "");
    }
    out += "\n";
  }
  return out;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string render_csv(const Table& table) {
  std::string out;
  auto emit = [&](const std::vector<std::string>& record) {
    for (size_t c = 0; c < table.header.size(); ++c) {
      if (c > 0) out += ',';
      out += csv_field(c < record.size() ? record[c] : "");
    }
    out += "\r\n";
  };
  emit(table.header);
  for (const auto& row : table.rows) emit(row);
  return out;
}

}  // namespace ulysses::report
