// Splitting what a sweep has into trial slots, and asking the machine what it has (see slots.h).
#include "tuner/trial/slots.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/error.h"

namespace ulysses::trial {
namespace {

// Output of `command` (run through /bin/sh, stderr dropped), "" when it cannot run.
std::string output_of(const std::string& command) {
  FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

std::string plural(int64_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

int64_t resolve_slot_count(int64_t requested, const SlotNeeds& needs, const SlotResources& have) {
  if (requested > 0) return requested;
  if (needs.runner == "srun") {
    return std::max<int64_t>(1, static_cast<int64_t>(have.nodes.size()) / needs.nodes);
  }
  if (needs.device == "cuda") {
    return std::max<int64_t>(1,
                             static_cast<int64_t>(have.cuda_devices.size()) / needs.world_size);
  }
  return 1;
}

std::string cores_label(const std::vector<int>& cores) {
  if (cores.empty()) return "cores";
  bool consecutive = true;
  for (size_t i = 1; i < cores.size(); ++i) {
    consecutive = consecutive && cores[i] == cores[i - 1] + 1;
  }
  if (consecutive) {
    return "cores " + std::to_string(cores.front()) + "-" + std::to_string(cores.back());
  }
  std::string out = "cores ";
  for (size_t i = 0; i < cores.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(cores[i]);
  }
  return out;
}

std::vector<Slot> split_slots(int64_t count, const SlotNeeds& needs, const SlotResources& have) {
  if (count < 1) throw UserError("slots: expected a whole number >= 1 or auto");
  if (count == 1) return {Slot{}};
  std::vector<Slot> slots(static_cast<size_t>(count));
  if (needs.runner == "srun") {
    const int64_t needed = count * needs.nodes;
    if (static_cast<int64_t>(have.nodes.size()) < needed) {
      throw UserError("slots: " + plural(count, "slot") + " of " +
                      plural(needs.nodes, "node") + " (nodes) need " + plural(needed, "node") +
                      "; the allocation has " +
                      plural(static_cast<int64_t>(have.nodes.size()), "node"));
    }
    for (int64_t i = 0; i < count; ++i) {
      Slot& slot = slots[static_cast<size_t>(i)];
      slot.nodes.assign(have.nodes.begin() + i * needs.nodes,
                        have.nodes.begin() + (i + 1) * needs.nodes);
      slot.label = "nodes " + joined(slot.nodes);
    }
    return slots;
  }
  // Cores, as even as they go (the larger sets first), consecutive in affinity order.
  const int64_t cores = static_cast<int64_t>(have.cores.size());
  const int64_t smallest = cores / count;
  const int64_t cores_needed = needs.device == "cuda" ? 1 : needs.world_size;
  if (smallest < cores_needed) {
    throw UserError("slots: " + plural(count, "slot") + " of the " + plural(cores, "core") +
                    " this sweep may use leave " + plural(smallest, "core") +
                    " to some slot; a trial of " + plural(needs.world_size, "rank") + " needs " +
                    (needs.device == "cuda" ? std::string("1 core")
                                            : "one core per rank (" +
                                                  plural(cores_needed, "core") + ")"));
  }
  if (needs.device == "cuda") {
    const int64_t needed = count * needs.world_size;
    if (static_cast<int64_t>(have.cuda_devices.size()) < needed) {
      throw UserError("slots: " + plural(count, "slot") + " of " +
                      plural(needs.world_size, "device") + " (world_size) need " +
                      plural(needed, "device") + "; this node has " +
                      plural(static_cast<int64_t>(have.cuda_devices.size()), "device"));
    }
  }
  int64_t next = 0;
  for (int64_t i = 0; i < count; ++i) {
    Slot& slot = slots[static_cast<size_t>(i)];
    const int64_t size = smallest + (i < cores % count ? 1 : 0);
    slot.cores.assign(have.cores.begin() + next, have.cores.begin() + next + size);
    next += size;
    slot.threads_per_rank = std::max<int64_t>(1, size / needs.world_size);
    if (needs.device == "cuda") {
      const auto first = have.cuda_devices.begin() + i * needs.world_size;
      const std::vector<std::string> devices(first, first + needs.world_size);
      slot.cuda_devices = joined(devices);
      slot.label = "cuda " + slot.cuda_devices;
    } else {
      slot.label = cores_label(slot.cores);
    }
  }
  return slots;
}

std::vector<std::string> parse_hostnames(const std::string& scontrol_output) {
  std::vector<std::string> hosts;
  std::stringstream words(scontrol_output);
  std::string word;
  while (words >> word) hosts.push_back(word);
  return hosts;
}

std::vector<int> affinity_cores() {
  std::vector<int> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
    }
  }
  if (cores.empty()) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (int cpu = 0; cpu < std::max(1L, online); ++cpu) cores.push_back(cpu);
  }
  return cores;
}

std::vector<std::string> local_cuda_devices() {
  std::vector<std::string> devices;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr && *visible) {
    std::stringstream items(visible);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (!item.empty()) devices.push_back(item);
    }
    return devices;
  }
  std::stringstream lines(output_of("nvidia-smi -L"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("GPU ", 0) == 0) devices.push_back(std::to_string(devices.size()));
  }
  return devices;
}

std::vector<std::string> allocation_nodes() {
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (list == nullptr || *list == '\0') return {};
  std::string quoted = "'";
  for (const char* c = list; *c; ++c) {
    quoted += *c == '\'' ? std::string("'\\''") : std::string(1, *c);
  }
  quoted += "'";
  return parse_hostnames(output_of("scontrol show hostnames " + quoted));
}

}  // namespace ulysses::trial
