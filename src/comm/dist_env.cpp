// Launcher environment detection (see dist_env.h).
#include "comm/dist_env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <vector>

#include "common/error.h"

namespace ulysses::comm {
namespace {

// Parses all of `text` as a base-10 integer, else UserError naming `name`.
long long parse_integer(const std::string& name, const std::string& text) {
  long long value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw UserError(name + ": '" + text + "' is not an integer");
  }
  return value;
}

class EnvReader {
 public:
  explicit EnvReader(const EnvLookup& lookup) : lookup_(lookup) {}

  bool has(const std::string& name) const { return lookup_(name).has_value(); }
  std::optional<std::string> text(const std::string& name) const { return lookup_(name); }

  // The value of `name` as an int, or nullopt when unset; UserError when not an int.
  std::optional<long long> integer(const std::string& name) const {
    const auto value = lookup_(name);
    if (!value) return std::nullopt;
    const long long parsed = parse_integer(name, *value);
    if (parsed < INT_MIN || parsed > INT_MAX) {
      throw UserError(name + ": '" + *value + "' is out of range");
    }
    return parsed;
  }

  long long required_integer(const std::string& name, const std::string& because) const {
    const auto value = integer(name);
    if (!value) throw UserError(name + ": not set (required when " + because + " is set)");
    return *value;
  }

 private:
  const EnvLookup& lookup_;
};

// Expands a SLURM task count list ("2(x3),1") into one count per node.
std::vector<int> expand_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> counts;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    const size_t paren = item.find('(');
    long long count = 0;
    long long repeat = 1;
    if (paren == std::string::npos) {
      count = parse_integer(name, item);
    } else {
      count = parse_integer(name, item.substr(0, paren));
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') {
        throw UserError(name + ": '" + text + "' is not a task list like 4 or 2(x3),1");
      }
      repeat = parse_integer(name, item.substr(paren + 2, item.size() - paren - 3));
    }
    if (count < 1 || repeat < 1) throw UserError(name + ": '" + text + "' has a count < 1");
    for (long long i = 0; i < repeat; ++i) counts.push_back(static_cast<int>(count));
    pos = comma + 1;
  }
  return counts;
}

// The first host of a SLURM node list: "a[07-10,12],b3" -> "a07"; "node1,node2" -> "node1".
std::string first_slurm_host(const std::string& name, const std::string& list) {
  const size_t bracket = list.find('[');
  const size_t comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    std::string host = list.substr(0, comma);
    if (host.empty()) throw UserError(name + ": '" + list + "' has an empty first host");
    return host;
  }
  const size_t close = list.find(']', bracket);
  if (close == std::string::npos) throw UserError(name + ": '" + list + "' has an unclosed '['");
  const std::string prefix = list.substr(0, bracket);
  const std::string ranges = list.substr(bracket + 1, close - bracket - 1);
  const std::string first = ranges.substr(0, std::min(ranges.find(','), ranges.find('-')));
  if (first.empty() ||
      !std::all_of(first.begin(), first.end(), [](unsigned char c) { return std::isdigit(c); })) {
    throw UserError(name + ": '" + list + "' is not a node list like node[01-04]");
  }
  // Text after ']' up to the next top-level comma belongs to the host name ("r[1-2]-gpu").
  size_t suffix_end = list.find(',', close);
  if (suffix_end == std::string::npos) suffix_end = list.size();
  return prefix + first + list.substr(close + 1, suffix_end - close - 1);
}

void apply_master_overrides(const EnvReader& env, DistEnv& out) {
  if (const auto addr = env.text("MASTER_ADDR")) {
    if (addr->empty()) throw UserError("MASTER_ADDR: is set but empty");
    out.master_addr = *addr;
  }
  if (const auto port = env.integer("MASTER_PORT")) {
    out.master_port = static_cast<int>(*port);
    if (*port < 1 || *port > 65535) {
      throw UserError("MASTER_PORT: " + std::to_string(*port) + " is outside 1..65535");
    }
  }
}

void check_ranks(DistEnv& env, const std::string& rank_var, const std::string& world_var,
                 const std::string& local_rank_var, const std::string& local_world_var) {
  if (env.world_size < 1) {
    throw UserError(world_var + ": " + std::to_string(env.world_size) + " must be >= 1");
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    throw UserError(rank_var + ": " + std::to_string(env.rank) + " is outside 0.." +
                    std::to_string(env.world_size - 1) + " (" + world_var + "=" +
                    std::to_string(env.world_size) + ")");
  }
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    throw UserError(local_world_var + ": " + std::to_string(env.local_world_size) +
                    " must be in 1.." + std::to_string(env.world_size));
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    throw UserError(local_rank_var + ": " + std::to_string(env.local_rank) + " is outside 0.." +
                    std::to_string(env.local_world_size - 1));
  }
}

// Fills local_world_size / local_rank when the launcher did not give them.
void default_locals(DistEnv& out, std::optional<long long> local_rank,
                    std::optional<long long> local_world) {
  out.local_world_size = local_world ? static_cast<int>(*local_world) : out.world_size;
  if (local_rank) {
    out.local_rank = static_cast<int>(*local_rank);
  } else {
    out.local_rank = out.local_world_size > 0 ? out.rank % out.local_world_size : 0;
  }
}

DistEnv from_torchrun(const EnvReader& env) {
  DistEnv out;
  out.source = "torchrun";
  const std::string because = env.has("RANK") ? "RANK" : "WORLD_SIZE";
  out.rank = static_cast<int>(env.required_integer("RANK", because));
  out.world_size = static_cast<int>(env.required_integer("WORLD_SIZE", because));
  default_locals(out, env.integer("LOCAL_RANK"), env.integer("LOCAL_WORLD_SIZE"));
  apply_master_overrides(env, out);
  out.agent_store = env.text("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  const long long restarts = env.integer("TORCHELASTIC_RESTART_COUNT").value_or(0);
  if (restarts < 0) {
    throw UserError("TORCHELASTIC_RESTART_COUNT: " + std::to_string(restarts) + " is negative");
  }
  out.restart_count = static_cast<int>(restarts);
  check_ranks(out, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return out;
}

DistEnv from_slurm(const EnvReader& env) {
  DistEnv out;
  out.source = "slurm";
  out.rank = static_cast<int>(env.required_integer("SLURM_PROCID", "SLURM_PROCID"));
  out.world_size = static_cast<int>(env.required_integer("SLURM_NTASKS", "SLURM_PROCID"));
  std::optional<long long> local_world = env.integer("SLURM_NTASKS_PER_NODE");
  std::string local_world_var = "SLURM_NTASKS_PER_NODE";
  if (!local_world) {
    if (const auto list = env.text("SLURM_TASKS_PER_NODE")) {
      local_world_var = "SLURM_TASKS_PER_NODE";
      const std::vector<int> per_node = expand_tasks_per_node(local_world_var, *list);
      const long long node = env.integer("SLURM_NODEID").value_or(0);
      if (node < 0 || node >= static_cast<long long>(per_node.size())) {
        throw UserError("SLURM_NODEID: " + std::to_string(node) + " is outside the " +
                        std::to_string(per_node.size()) + " nodes of SLURM_TASKS_PER_NODE");
      }
      local_world = per_node[node];
    }
  }
  default_locals(out, env.integer("SLURM_LOCALID"), local_world);

  for (const char* var : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const auto list = env.text(var)) {
      out.master_addr = first_slurm_host(var, *list);
      break;
    }
  }
  if (const auto job = env.text("SLURM_JOB_ID")) {
    out.master_port =
        20000 + static_cast<int>(std::llabs(parse_integer("SLURM_JOB_ID", *job)) % 10000);
  }
  apply_master_overrides(env, out);
  check_ranks(out, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_world_var);
  return out;
}

DistEnv from_openmpi(const EnvReader& env) {
  DistEnv out;
  out.source = "openmpi";
  out.rank = static_cast<int>(env.required_integer("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK"));
  out.world_size =
      static_cast<int>(env.required_integer("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"));
  default_locals(out, env.integer("OMPI_COMM_WORLD_LOCAL_RANK"),
                 env.integer("OMPI_COMM_WORLD_LOCAL_SIZE"));
  apply_master_overrides(env, out);
  check_ranks(out, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");
  return out;
}

}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

EnvLookup env_from_map(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

DistEnv detect_dist_env(const EnvLookup& lookup) {
  const EnvReader env(lookup);
  if (env.has("RANK") || env.has("WORLD_SIZE")) return from_torchrun(env);
  if (env.has("SLURM_PROCID")) return from_slurm(env);
  if (env.has("OMPI_COMM_WORLD_RANK")) return from_openmpi(env);
  DistEnv single;
  apply_master_overrides(env, single);
  return single;
}

std::string describe(const DistEnv& env) {
  return "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) + " (local " +
         std::to_string(env.local_rank) + " of " + std::to_string(env.local_world_size) + ", " +
         env.source + "), master " + env.master_addr + ":" + std::to_string(env.master_port) +
         (env.agent_store ? " (agent store)" : "");
}

}  // namespace ulysses::comm
