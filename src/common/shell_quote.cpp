// Quoting for the shell (see shell_quote.h).
#include "common/shell_quote.h"

namespace ulysses {

std::string shell_quote(const std::string& word) {
  const std::string safe =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%";
  if (!word.empty() && word.find_first_not_of(safe) == std::string::npos) return word;
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace ulysses
