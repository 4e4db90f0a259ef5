// Typed reading and writing of one value of the run config. One overload per field type of
// options.h, so that the field table can be walked generically by the reader and the writer.
#pragma once
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdint>
#include <string>

#include "config/options.h"

namespace ulysses::config {

// Reads `node` into `out`. `path` is the key path named in errors ("sequence.length").
// Throws UserError "<path>: expected <type>, got <what>" when the node is not of the field's type:
//   int64_t    a decimal integer ("4096", "-1")
//   uint64_t   a non-negative decimal integer
//   double     a finite number ("1.0e-3", "10000")
//   bool       true/false (also yes/no, on/off)
//   string     any scalar; an empty node reads as ""
//   TileCount  an integer >= 1 or `auto` (value 0)
//   betas      a list of two numbers ([0.9, 0.95])
void read_value(const YAML::Node& node, const std::string& path, int64_t& out);
void read_value(const YAML::Node& node, const std::string& path, uint64_t& out);
void read_value(const YAML::Node& node, const std::string& path, double& out);
void read_value(const YAML::Node& node, const std::string& path, bool& out);
void read_value(const YAML::Node& node, const std::string& path, std::string& out);
void read_value(const YAML::Node& node, const std::string& path, TileCount& out);
void read_value(const YAML::Node& node, const std::string& path, std::array<double, 2>& out);

// Writes `value` so that read_value reads back exactly the same value.
void emit_value(YAML::Emitter& out, int64_t value);
void emit_value(YAML::Emitter& out, uint64_t value);
void emit_value(YAML::Emitter& out, double value);
void emit_value(YAML::Emitter& out, bool value);
void emit_value(YAML::Emitter& out, const std::string& value);
void emit_value(YAML::Emitter& out, const TileCount& value);
void emit_value(YAML::Emitter& out, const std::array<double, 2>& value);

// The shortest text that parses back to exactly `value`, with a '.' before any exponent so that
// YAML 1.1 readers (PyYAML) also see a float: "0.001", "1.0e-05", "500000.0".
std::string format_double(double value);

// How a node reads in an error message: 'abc' for a scalar, "nothing" for an empty value,
// "a list", "a mapping".
std::string describe(const YAML::Node& node);

}  // namespace ulysses::config
