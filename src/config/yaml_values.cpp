// Typed YAML values of the run config: strict parsing with one-line errors, exact writing.
#include "config/yaml_values.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>

#include "common/error.h"

namespace ulysses::config {
namespace {

[[noreturn]] void wrong_type(const std::string& path, const std::string& expected,
                             const YAML::Node& node) {
  throw UserError(path + ": expected " + expected + ", got " + describe(node));
}

// The scalar text of `node`, or a wrong-type error naming `expected`.
std::string scalar_text(const YAML::Node& node, const std::string& path,
                        const std::string& expected) {
  if (!node.IsScalar()) wrong_type(path, expected, node);
  return node.Scalar();
}

// Parses all of `text` as a base-10 number of type T (one leading '+' allowed).
template <class T>
bool parse_number(std::string text, T& out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end;
}

}  // namespace

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  std::string text = node.Scalar();
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';  // messages are one line
  }
  return "'" + text + "'";
}

void read_value(const YAML::Node& node, const std::string& path, int64_t& out) {
  const char* expected = "an integer";
  if (!parse_number(scalar_text(node, path, expected), out)) wrong_type(path, expected, node);
}

void read_value(const YAML::Node& node, const std::string& path, uint64_t& out) {
  const char* expected = "a non-negative integer";
  const std::string text = scalar_text(node, path, expected);
  if (text.rfind('-', 0) == 0 || !parse_number(text, out)) wrong_type(path, expected, node);
}

void read_value(const YAML::Node& node, const std::string& path, double& out) {
  const char* expected = "a number";
  if (!parse_number(scalar_text(node, path, expected), out)) wrong_type(path, expected, node);
  if (!std::isfinite(out)) wrong_type(path, "a finite number", node);
}

void read_value(const YAML::Node& node, const std::string& path, bool& out) {
  const char* expected = "true or false";
  scalar_text(node, path, expected);
  if (!YAML::convert<bool>::decode(node, out)) wrong_type(path, expected, node);
}

void read_value(const YAML::Node& node, const std::string& path, std::string& out) {
  if (node.IsNull()) {
    out.clear();
    return;
  }
  out = scalar_text(node, path, "a string");
}

void read_value(const YAML::Node& node, const std::string& path, TileCount& out) {
  const char* expected = "an integer >= 1 or 'auto'";
  const std::string text = scalar_text(node, path, expected);
  if (text == "auto") {
    out.value = 0;
    return;
  }
  int64_t count = 0;
  if (!parse_number(text, count) || count < 1) wrong_type(path, expected, node);
  out.value = count;
}

void read_value(const YAML::Node& node, const std::string& path, std::array<double, 2>& out) {
  if (!node.IsSequence() || node.size() != 2) wrong_type(path, "a list of 2 numbers", node);
  for (size_t i = 0; i < 2; ++i) {
    read_value(node[i], path + "[" + std::to_string(i) + "]", out[i]);
  }
}

std::string format_double(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, end);
  if (!std::isfinite(value) || text.find('.') != std::string::npos) return text;
  const size_t exponent = text.find('e');
  if (exponent == std::string::npos) return text + ".0";
  return text.insert(exponent, ".0");
}

void emit_value(YAML::Emitter& out, int64_t value) { out << value; }
void emit_value(YAML::Emitter& out, uint64_t value) { out << value; }
void emit_value(YAML::Emitter& out, double value) { out << format_double(value); }
void emit_value(YAML::Emitter& out, bool value) { out << YAML::TrueFalseBool << value; }

void emit_value(YAML::Emitter& out, const std::string& value) {
  // Quoted when the plain form could read as another type elsewhere (empty, number, bool, null);
  // the emitter itself quotes whatever is not a valid plain scalar.
  bool as_bool = false;
  const bool ambiguous = value.empty() || std::isdigit(static_cast<unsigned char>(value[0])) ||
                         value[0] == '+' || value[0] == '-' || value[0] == '.' || value == "~" ||
                         value == "null" || value == "Null" || value == "NULL" ||
                         YAML::convert<bool>::decode(YAML::Node(value), as_bool);
  if (ambiguous) out << YAML::DoubleQuoted;
  out << value;
}

void emit_value(YAML::Emitter& out, const TileCount& value) {
  if (value.is_auto()) {
    out << "auto";
  } else {
    out << value.value;
  }
}

void emit_value(YAML::Emitter& out, const std::array<double, 2>& value) {
  out << YAML::Flow << YAML::BeginSeq << format_double(value[0]) << format_double(value[1])
      << YAML::EndSeq;
}

}  // namespace ulysses::config
