// ulysses-bench: microbenchmarks on Google Benchmark: all-to-all over
// the SP group, attention per backend and sequence length, GEMMs and MLP (plain, TiledMLP) at the
// model's shapes, host<->device copies (CUDA). Its JSON output (--benchmark_format=json or
// --benchmark_out) feeds `ulysses-tune calibrate`. Rank and world come from the environment as for
// ulysses-train, so `ulysses-tune launch RUN.yaml --nproc N --trainer ulysses-bench` runs it on
// N ranks; only rank 0 prints and writes files.
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "comm/dist_env.h"
#include "comm/exit_status.h"
#include "common/error.h"
#include "config/run_config.h"
#include "tuner/bench/bench_context.h"
#include "tuner/bench/default_sizes.h"

namespace {

using ulysses::bench::BenchContext;

// Discards everything: the reporter of ranks other than 0.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Counts the benchmarks the filter selects without running any (declining the context makes
// Google Benchmark skip the runs) and keeps the library's own complaints to itself.
class MatchProbe : public benchmark::BenchmarkReporter {
 public:
  MatchProbe() {
    SetOutputStream(&discarded_);
    SetErrorStream(&discarded_);
  }
  bool ReportContext(const Context&) override { return false; }
  void ReportRuns(const std::vector<Run>&) override {}

 private:
  std::ostringstream discarded_;
};

// Throws UserError when --benchmark_filter selects no benchmark (Google Benchmark itself would
// print a line and exit 0). Every rank checks; run() keeps ranks other than 0 quiet.
void require_matching_benchmarks() {
  const std::string filter = benchmark::GetBenchmarkFilter();
  MatchProbe probe;
  if (benchmark::RunSpecifiedBenchmarks(&probe, filter) == 0) {
    throw ulysses::UserError("--benchmark_filter: '" + filter +
                             "' matches no benchmark (the names are in ulysses-bench --help)");
  }
}

constexpr const char* kFooter =
    "Google Benchmark flags are accepted too, e.g. --benchmark_filter=REGEX\n"
    "--benchmark_format=console|json|csv --benchmark_out=FILE --benchmark_out_format=json\n"
    "--benchmark_min_time=SECONDS --benchmark_repetitions=N (or BENCHMARK_<FLAG> variables).\n"
    "Benchmarks (names are key:value pieces):\n"
    "  AllToAll/bytes:S/ranks:n   all-to-all over the SP group; counters algbw_GBps, busbw_GBps\n"
    "                             (nccl-tests definitions: busbw = algbw*(n-1)/n), slowest rank\n"
    "  Attention/backend:B/sl:L/heads:H/hd:D   causal attention fwd+bwd, counter tflops\n"
    "  Gemm/op:O/tokens:T/in:I/out:N           one linear layer of the model, counter tflops\n"
    "  Mlp/impl:plain|tiled/tiles:N/tokens:T   SwiGLU MLP fwd+bwd (TiledMLP), counter tflops\n"
    "  Copy/dir:h2d|d2h/host:pinned|pageable/bytes:S   CUDA only, counter GBps\n"
    "Multi-rank: ulysses-tune launch RUN.yaml --nproc N --trainer ulysses-bench\n"
    "Exit status 2: bad options or run config.";

std::vector<int64_t> parse_sizes(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  size_t begin = 0;
  while (begin <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    char* stop = nullptr;
    const long long value = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || value < 1) {
      throw ulysses::UserError(flag + ": expected positive integers separated by commas, got '" +
                               text + "'");
    }
    out.push_back(value);
    begin = end + 1;
  }
  return out;
}

struct Flags {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string a2a_bytes, seqlens, copy_bytes;
  int64_t tokens = 0;
};

void add_flags(CLI::App& app, Flags* flags) {
  app.add_option("--config", flags->config_path,
                 "Run config: model shapes, mesh, device, precision (default: preset tiny, "
                 "sp = world, cpu)")
      ->type_name("RUN.yaml");
  app.add_option("--set", flags->overrides, "Override a run-config key (repeatable)")
      ->type_name("KEY=VALUE");
  using namespace ulysses::bench;
  app.add_option("--a2a-bytes", flags->a2a_bytes,
                 std::string("All-to-all send-buffer sizes per rank (default cpu ") + kCpuA2aBytes +
                     "; cuda " + kCudaA2aBytes + ")")
      ->type_name("LIST");
  app.add_option("--seqlens", flags->seqlens,
                 std::string("Attention sequence lengths (default cpu ") + kCpuSeqlens +
                     "; cuda sl/4,sl/2,sl)")
      ->type_name("LIST");
  app.add_option("--tokens", flags->tokens,
                 "Tokens per GEMM/MLP call (default cpu " + std::to_string(kCpuTokens) +
                     "; cuda sl/sp)")
      ->type_name("T");
  app.add_option("--copy-bytes", flags->copy_bytes,
                 std::string("Host<->device copy sizes, cuda only (default ") + kCopyBytes + ")")
      ->type_name("LIST");
  app.footer(kFooter);
}

void setup(const Flags& flags, const ulysses::comm::DistEnv& env, BenchContext* ctx) {
  using namespace ulysses;
  // Without --config: the tiny preset on one SP group of all ranks (overrides still win).
  const std::string default_yaml =
      "model: {preset: tiny}\nmesh: {sp: " + std::to_string(env.world_size) + ", dp: 1}\n";
  config::RunConfig config = flags.config_path.empty()
                                 ? config::parse_run_config_yaml(default_yaml, flags.overrides)
                                 : config::load_run_config(flags.config_path, flags.overrides);
  config::validate(config, env.world_size);
  ctx->config = config;
  ctx->device = config.train.device == "cuda"
                    ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank))
                    : at::Device(at::kCPU);
  if (ctx->device.is_cuda() && !at::hasCUDA()) {
    throw UserError("train.device: cuda requested but this build or machine has no CUDA");
  }
  ctx->dtype = config.memory.precision == "fp32" ? at::kFloat : at::kBFloat16;  // bf16, bf16-states
  ctx->mesh = std::make_unique<comm::DeviceMesh>(
      comm::DeviceMesh::create(env, config.mesh.dp, config.mesh.sp, config.comm, ctx->device));

  const bool cuda = ctx->device.is_cuda();
  const int64_t sl = config.sequence.length;
  bench::BenchSizes& sizes = ctx->sizes;
  sizes.a2a_bytes = parse_sizes(
      "--a2a-bytes", flags.a2a_bytes.empty() ? (cuda ? bench::kCudaA2aBytes : bench::kCpuA2aBytes)
                                             : flags.a2a_bytes);
  sizes.seqlens = !flags.seqlens.empty() ? parse_sizes("--seqlens", flags.seqlens)
                  : cuda ? std::vector<int64_t>{std::max<int64_t>(sl / 4, 1),
                                                std::max<int64_t>(sl / 2, 1), sl}
                         : parse_sizes("--seqlens", bench::kCpuSeqlens);
  if (flags.tokens < 0) throw UserError("--tokens: must be positive");
  sizes.tokens = flags.tokens > 0 ? flags.tokens
                 : cuda           ? std::max<int64_t>(sl / config.mesh.sp, 1)
                                  : bench::kCpuTokens;
  sizes.copy_bytes =
      parse_sizes("--copy-bytes", flags.copy_bytes.empty() ? bench::kCopyBytes : flags.copy_bytes);
}

// Rank 0 keeps every argument; the others drop --benchmark_out so that only one process writes
// the file.
std::vector<char*> arguments_for_rank(int argc, char** argv, int rank) {
  std::vector<char*> out;
  for (int i = 0; i < argc; ++i) {
    if (rank != 0 && std::strncmp(argv[i], "--benchmark_out", 15) == 0) continue;
    out.push_back(argv[i]);
  }
  if (rank != 0) unsetenv("BENCHMARK_OUT");
  return out;
}

int run(int argc, char** argv) {
  using namespace ulysses;
  CLI::App app{"ulysses-bench: microbenchmarks for the ulysses-tune cost model", "ulysses-bench"};
  Flags flags;
  add_flags(app, &flags);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::cout << app.help();
      return kExitOk;
    }
  }
  const comm::DistEnv env = comm::detect_dist_env();
  std::vector<char*> args = arguments_for_rank(argc, argv, env.rank);
  int bench_argc = static_cast<int>(args.size());
  benchmark::Initialize(&bench_argc, args.data());
  try {
    app.parse(bench_argc, args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  BenchContext ctx;
  setup(flags, env, &ctx);
  benchmark::AddCustomContext("ulysses_world_size", std::to_string(ctx.world_size()));
  benchmark::AddCustomContext("ulysses_sp", std::to_string(ctx.config.mesh.sp));
  benchmark::AddCustomContext("ulysses_device", ctx.device.str());
  benchmark::AddCustomContext("ulysses_dtype", ctx.dtype == at::kBFloat16 ? "bf16" : "fp32");
  bench::register_comm_benchmarks(ctx);
  bench::register_compute_benchmarks(ctx);
  bench::register_copy_benchmarks(ctx);
  try {
    require_matching_benchmarks();
  } catch (const UserError&) {
    if (env.rank != 0) return kExitUsage;  // rank 0 reports it: one line, not one per rank
    throw;
  }
  if (env.rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  ctx.mesh->finish();  // final barrier: no rank tears down its store while others use it
  benchmark::Shutdown();
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return ulysses::comm::run_with_exit_status([&] { return run(argc, argv); });
}
