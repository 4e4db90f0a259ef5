// CLI11 checks with messages that name a real bound: CLI11's own PositiveNumber and
// NonNegativeNumber report a range up to 1.8e308 ("Value 0 not in range 0 to 1.79769e+308").
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace ulysses::launch {

// Accepts an integer >= min; otherwise CLI11 reports "OPTION: must be an integer >= MIN, got
// 'TEXT'" (exit 2 through the mains' ParseError handling).
inline CLI::Validator integer_at_least(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const long long value = std::stoll(text, &used);
          if (used == text.size() && value >= min) return "";
        } catch (const std::exception&) {
        }
        return "must be an integer >= " + std::to_string(min) + ", got '" + text + "'";
      },
      "INT >= " + std::to_string(min));
}

// Accepts a number > 0; otherwise "OPTION: must be a number > 0, got 'TEXT'".
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const double value = std::stod(text, &used);
          if (used == text.size() && value > 0) return "";
        } catch (const std::exception&) {
        }
        return "must be a number > 0, got '" + text + "'";
      },
      "NUMBER > 0");
}

}  // namespace ulysses::launch
