// Quoting for the shell scripts and command lines the tools write (launch lines, sbatch scripts,
// the report's command line).
#pragma once
#include <string>

namespace ulysses {

// `word` as one shell word: unchanged when it holds only safe characters, else single-quoted
// (an embedded ' becomes '\''). "" becomes ''.
std::string shell_quote(const std::string& word);

}  // namespace ulysses
