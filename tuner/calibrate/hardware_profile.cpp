// profiles/hardware/*.yaml -> HardwareProfile, with one-line errors (see hardware_profile.h).
#include "tuner/calibrate/hardware_profile.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"

namespace ulysses::calibrate {
namespace {

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(path_ + ": " + key + ": " + what);
  }

  // Rejects keys of `map` outside `known`. REQUIRES: map is a mapping.
  void only(const YAML::Node& map, const std::string& prefix, const std::set<std::string>& known) {
    for (const auto& item : map) {
      const std::string key = item.first.as<std::string>();
      if (!known.count(key)) fail(prefix + key, "unknown key");
    }
  }

  YAML::Node mapping(const YAML::Node& parent, const std::string& key) {
    const YAML::Node node = parent[key];
    if (node && !node.IsMap()) fail(key, "expected a mapping");
    return node;
  }

  template <typename T>
  void read(const YAML::Node& parent, const std::string& key, const std::string& path, T* out) {
    if (!parent) return;
    const YAML::Node node = parent[key];
    if (!node) return;
    try {
      *out = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(path, std::string("expected ") +
                     (std::is_same_v<T, std::string> ? "a string"
                      : std::is_integral_v<T>        ? "an integer"
                                                     : "a number") +
                     ", got '" + YAML::Dump(node) + "'");
    }
  }

  void non_negative(double value, const std::string& key) const {
    if (value < 0.0) fail(key, "must be >= 0");
  }

 private:
  std::string path_;
};

}  // namespace

double HardwareProfile::peak_tflops(const std::string& precision) const {
  // bf16 and bf16-states compute in bf16 alike.
  return precision == "bf16" || precision == "bf16-states" ? peak_tflops_bf16 : peak_tflops_fp32;
}

double HardwareProfile::host_memory_bandwidth_gbps() const {
  return host_memory_gbps > 0 ? host_memory_gbps : kDefaultHostMemoryGBps;
}

HardwareProfile load_hardware_profile(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw UserError(path + ": no such file");
  YAML::Node root;
  try {
    root = YAML::Load(read_input_file(path, "a YAML document"));
  } catch (const YAML::Exception& e) {
    throw UserError(path + ": not valid YAML (line " + std::to_string(e.mark.line + 1) + ": " +
                    e.msg + ")");
  }
  if (!root.IsMap()) throw UserError(path + ": expected a mapping of profile keys");
  Reader r(path);
  r.only(root, "",
         {"name", "description", "device", "nodes", "devices_per_node", "host_memory_gib",
          "host_cores", "host_memory_GBps", "peak_tflops", "links", "launcher", "runner"});
  HardwareProfile p;
  p.name = std::filesystem::path(path).stem().string();
  r.read(root, "name", "name", &p.name);
  r.read(root, "description", "description", &p.description);
  r.read(root, "nodes", "nodes", &p.nodes);
  r.read(root, "devices_per_node", "devices_per_node", &p.devices_per_node);
  r.read(root, "host_memory_gib", "host_memory_gib", &p.host_memory_gib);
  r.read(root, "host_cores", "host_cores", &p.host_cores);
  r.read(root, "host_memory_GBps", "host_memory_GBps", &p.host_memory_gbps);
  r.read(root, "launcher", "launcher", &p.launcher);
  p.runner = p.launcher == "srun" ? "srun" : "local";
  r.read(root, "runner", "runner", &p.runner);

  const YAML::Node device = r.mapping(root, "device");
  if (device) r.only(device, "device.", {"type", "name", "memory_gib"});
  r.read(device, "type", "device.type", &p.device_type);
  r.read(device, "name", "device.name", &p.device_name);
  r.read(device, "memory_gib", "device.memory_gib", &p.device_memory_gib);

  const YAML::Node peak = r.mapping(root, "peak_tflops");
  if (peak) r.only(peak, "peak_tflops.", {"bf16", "fp32"});
  r.read(peak, "bf16", "peak_tflops.bf16", &p.peak_tflops_bf16);
  r.read(peak, "fp32", "peak_tflops.fp32", &p.peak_tflops_fp32);

  const YAML::Node links = r.mapping(root, "links");
  if (links) r.only(links, "links.", {"intra_node_GBps", "inter_node_GBps", "host_to_device_GBps"});
  r.read(links, "intra_node_GBps", "links.intra_node_GBps", &p.intra_node_gbps);
  r.read(links, "inter_node_GBps", "links.inter_node_GBps", &p.inter_node_gbps);
  r.read(links, "host_to_device_GBps", "links.host_to_device_GBps", &p.host_to_device_gbps);

  if (p.device_type != "cpu" && p.device_type != "cuda") {
    r.fail("device.type", "expected cpu or cuda, got '" + p.device_type + "'");
  }
  if (p.launcher != "local" && p.launcher != "torchrun" && p.launcher != "srun") {
    r.fail("launcher", "expected local, torchrun or srun, got '" + p.launcher + "'");
  }
  if (p.runner != "local" && p.runner != "srun") {
    r.fail("runner", "expected local or srun, got '" + p.runner + "'");
  }
  if (p.nodes < 1) r.fail("nodes", "must be >= 1");
  if (p.devices_per_node < 1) r.fail("devices_per_node", "must be >= 1");
  r.non_negative(p.device_memory_gib, "device.memory_gib");
  r.non_negative(p.host_memory_gib, "host_memory_gib");
  if (p.host_cores < 0) r.fail("host_cores", "must be >= 0 (0 = not given)");
  if (!(std::isfinite(p.host_memory_gbps) && p.host_memory_gbps >= 0)) {
    std::ostringstream got;
    got << p.host_memory_gbps;
    r.fail("host_memory_GBps", "must be a number >= 0 (0 = not given), got " + got.str());
  }
  r.non_negative(p.peak_tflops_bf16, "peak_tflops.bf16");
  r.non_negative(p.peak_tflops_fp32, "peak_tflops.fp32");
  r.non_negative(p.intra_node_gbps, "links.intra_node_GBps");
  r.non_negative(p.inter_node_gbps, "links.inter_node_GBps");
  r.non_negative(p.host_to_device_gbps, "links.host_to_device_GBps");
  return p;
}

}  // namespace ulysses::calibrate
