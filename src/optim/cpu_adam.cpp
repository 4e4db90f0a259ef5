// Fused CPU AdamW (see cpu_adam.h). Compiled with -ffp-contract=off and -fno-math-errno (see
// optim.cmake): every fma below is written out, no other is formed, and sqrt vectorizes.
#include "optim/cpu_adam.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace ulysses::train {
namespace {

// Elements per work item (the buffers are split over the threads in these).
constexpr int64_t kChunk = 64 * 1024;

// The scalars of one update, rounded to the master dtype T as ATen rounds a Scalar argument.
template <typename T>
struct Coeffs {
  T decay;         // 1 - lr * weight_decay (1 when weight_decay is 0: w * 1 == w)
  T beta1, one_minus_beta1, beta2, one_minus_beta2;
  T sqrt_bias_correction2;
  T eps;
  T neg_step_size;  // -lr / (1 - beta1^t)
  T grad_scale;     // the clipping coefficient (1: x * 1 == x exactly)
};

template <typename T>
Coeffs<T> coeffs_for(double lr, int64_t step, const config::OptimOptions& o, double grad_scale) {
  const double beta1 = o.betas[0];
  const double beta2 = o.betas[1];
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  return Coeffs<T>{static_cast<T>(o.weight_decay != 0.0 ? 1.0 - lr * o.weight_decay : 1.0),
                   static_cast<T>(beta1),
                   static_cast<T>(1.0 - beta1),
                   static_cast<T>(beta2),
                   static_cast<T>(1.0 - beta2),
                   static_cast<T>(std::sqrt(bias_correction2)),
                   static_cast<T>(o.eps),
                   static_cast<T>(-(lr / bias_correction1)),
                   static_cast<T>(grad_scale)};
}

struct NoOutput {};  // P of a buffer without param_out

template <typename T, typename G>
[[gnu::always_inline]] inline T to_master(G g) {
  if constexpr (std::is_same_v<G, c10::BFloat16>) {
    return std::bit_cast<float>(static_cast<uint32_t>(g.x) << 16);
  } else {
    return static_cast<T>(g);  // same type, or c10::Half's exact conversion
  }
}

template <typename P, typename T>
[[gnu::always_inline]] inline P from_master(T w) {
  if constexpr (std::is_same_v<P, c10::BFloat16>) {
    // c10::BFloat16(float): round to nearest even, NaN -> 0x7FC0 (what copy_ gives).
    const uint32_t bits = std::bit_cast<uint32_t>(w);
    const uint16_t rounded = static_cast<uint16_t>((bits + ((bits >> 16) & 1u) + 0x7FFFu) >> 16);
    return c10::BFloat16(std::isnan(w) ? uint16_t{0x7FC0} : rounded, c10::BFloat16::from_bits());
  } else {
    return static_cast<P>(w);
  }
}

// The update of n <= kChunk elements in one pass over memory; see cpu_adam.h for the formula and
// why each op is where it is. std::sqrt is the correctly rounded hardware sqrt (vsqrtps under
// -fno-math-errno), the same in every ISA variant.
template <typename T, typename G, typename P>
[[gnu::always_inline]] inline void adamw_loop(T* __restrict w, T* __restrict m, T* __restrict v,
                                              const G* __restrict g, P* __restrict out, int64_t n,
                                              const Coeffs<T>& c) {
  for (int64_t i = 0; i < n; ++i) {
    const T grad = to_master<T>(g[i]) * c.grad_scale;
    const T m_new = std::fma(grad, c.one_minus_beta1, m[i] * c.beta1);
    const T v_new = std::fma(c.one_minus_beta2 * grad, grad, v[i] * c.beta2);
    m[i] = m_new;
    v[i] = v_new;
    const T denom = std::sqrt(v_new) / c.sqrt_bias_correction2 + c.eps;
    const T updated = w[i] * c.decay + c.neg_step_size * m_new / denom;
    w[i] = updated;
    if constexpr (!std::is_same_v<P, NoOutput>) {
      out[i] = from_master<P>(updated);
    }
  }
}

// One chunk: element range [offset, offset + n) of one buffer, type-erased.
using LoopFn = void (*)(const FusedAdamWBuffer& b, const void* coeffs, int64_t offset, int64_t n);

template <typename T, typename G, typename P>
[[gnu::always_inline]] inline void run_chunk(const FusedAdamWBuffer& b, const void* coeffs,
                                             int64_t offset, int64_t n) {
  P* out = nullptr;
  if constexpr (!std::is_same_v<P, NoOutput>) {
    out = b.param_out.data_ptr<P>() + offset;
  }
  adamw_loop<T, G, P>(b.master.data_ptr<T>() + offset, b.exp_avg.data_ptr<T>() + offset,
                      b.exp_avg_sq.data_ptr<T>() + offset, b.grad.data_ptr<G>() + offset, out, n,
                      *static_cast<const Coeffs<T>*>(coeffs));
}

template <typename T, typename G, typename P>
void chunk_baseline(const FusedAdamWBuffer& b, const void* c, int64_t offset, int64_t n) {
  run_chunk<T, G, P>(b, c, offset, n);
}

#if defined(__GNUC__) && defined(__x86_64__)
#define ULYSSES_X86_MULTIVERSION 1
template <typename T, typename G, typename P>
[[gnu::target("avx2,fma,f16c")]] void chunk_avx2(const FusedAdamWBuffer& b, const void* c,
                                                 int64_t offset, int64_t n) {
  run_chunk<T, G, P>(b, c, offset, n);
}
template <typename T, typename G, typename P>
[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,prefer-vector-width=512")]] void
chunk_avx512(const FusedAdamWBuffer& b, const void* c, int64_t offset, int64_t n) {
  run_chunk<T, G, P>(b, c, offset, n);
}
#endif

enum class Isa { kBaseline, kAvx2, kAvx512 };

Isa detect_isa() {
#ifdef ULYSSES_X86_MULTIVERSION
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kBaseline;
}

// The cap ULYSSES_CPU_ISA sets (baseline, avx2 or avx512; unset or empty: no cap), so that every
// variant can be tested on one machine, as ATEN_CPU_CAPABILITY does for ATen's kernels.
Isa isa_cap() {
  const char* value = std::getenv("ULYSSES_CPU_ISA");
  if (value == nullptr || *value == '\0') return Isa::kAvx512;
  const std::string cap(value);
  if (cap == "baseline" || cap == "default") return Isa::kBaseline;
  if (cap == "avx2") return Isa::kAvx2;
  if (cap == "avx512") return Isa::kAvx512;
  TORCH_CHECK(false, "ULYSSES_CPU_ISA: '", cap, "' is not one of baseline, avx2, avx512");
}

Isa isa() {
  static const Isa chosen = std::min(detect_isa(), isa_cap());
  return chosen;
}

template <typename T, typename G, typename P>
LoopFn pick() {
#ifdef ULYSSES_X86_MULTIVERSION
  switch (isa()) {
    case Isa::kAvx512:
      return &chunk_avx512<T, G, P>;
    case Isa::kAvx2:
      return &chunk_avx2<T, G, P>;
    case Isa::kBaseline:
      break;
  }
#endif
  return &chunk_baseline<T, G, P>;
}

template <typename G>
LoopFn pick_fp32_master(const at::Tensor& param_out) {
  if (!param_out.defined()) return pick<float, G, NoOutput>();
  switch (param_out.scalar_type()) {
    case at::kFloat:
      return pick<float, G, float>();
    case at::kBFloat16:
      return pick<float, G, c10::BFloat16>();
    case at::kHalf:
      return pick<float, G, c10::Half>();
    default:
      TORCH_CHECK(false, "fused_adamw_cpu: param_out dtype ", param_out.scalar_type(),
                  " with an fp32 master");
  }
}

// The loop for b's dtypes, after checking b against cpu_adam.h's REQUIRES.
LoopFn loop_for(const FusedAdamWBuffer& b) {
  TORCH_CHECK(b.master.defined() && b.exp_avg.defined() && b.exp_avg_sq.defined() &&
                  b.grad.defined(),
              "fused_adamw_cpu: undefined buffer");
  const int64_t n = b.master.numel();
  for (const at::Tensor* t : {&b.master, &b.exp_avg, &b.exp_avg_sq, &b.grad, &b.param_out}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() && t->numel() == n,
                "fused_adamw_cpu: buffers must be contiguous CPU tensors of ", n, " elements");
  }
  const at::ScalarType master = b.master.scalar_type();
  TORCH_CHECK(b.exp_avg.scalar_type() == master && b.exp_avg_sq.scalar_type() == master,
              "fused_adamw_cpu: moments must have the master dtype ", master);
  if (b.param_out.defined()) {
    TORCH_CHECK(!b.param_out.is_alias_of(b.master),
                "fused_adamw_cpu: param_out overlaps master (leave it undefined instead)");
  }
  const at::ScalarType grad = b.grad.scalar_type();
  if (master == at::kDouble) {
    TORCH_CHECK(grad == at::kDouble, "fused_adamw_cpu: fp64 master needs an fp64 gradient");
    if (!b.param_out.defined()) return pick<double, double, NoOutput>();
    TORCH_CHECK(b.param_out.scalar_type() == at::kDouble,
                "fused_adamw_cpu: fp64 master needs an fp64 param_out");
    return pick<double, double, double>();
  }
  TORCH_CHECK(master == at::kFloat, "fused_adamw_cpu: master dtype ", master,
              "; fp32 or fp64 required");
  switch (grad) {
    case at::kFloat:
      return pick_fp32_master<float>(b.param_out);
    case at::kBFloat16:
      return pick_fp32_master<c10::BFloat16>(b.param_out);
    case at::kHalf:
      return pick_fp32_master<c10::Half>(b.param_out);
    default:
      TORCH_CHECK(false, "fused_adamw_cpu: gradient dtype ", grad, " with an fp32 master");
  }
}

// Worker threads kept for the life of the process (the host pass runs once per batch of a few
// tens of MiB, hundreds of times per step: starting and joining threads for each would cost more
// than the small batches' work). run() hands task(t), t in [1, tasks), to workers 1..tasks-1 and
// runs task(0) on the caller; it returns when all are done and rethrows the first exception.
// Workers are started when a call first needs them and joined at exit. Calls are serialised.
// Invariants: workers_[k] runs index k + 1; remaining_ counts the current call's unfinished
// worker tasks; task_ is set only during a call.
class HostThreadPool {
 public:
  static HostThreadPool& shared() {
    static HostThreadPool pool;
    return pool;
  }

  ~HostThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  void run(int64_t tasks, const std::function<void(int64_t)>& task) {
    std::lock_guard<std::mutex> one_call(call_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int64_t>(workers_.size()) < tasks - 1) {
        const int64_t index = static_cast<int64_t>(workers_.size()) + 1;
        workers_.emplace_back([this, index, seen = generation_] { work(index, seen); });
        threads_started_.fetch_add(1);
      }
      task_ = &task;
      tasks_ = tasks;
      remaining_ = tasks - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr own;
    try {
      task(0);
    } catch (...) {
      own = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return remaining_ == 0; });
    task_ = nullptr;
    if (own) std::rethrow_exception(own);
    if (error_) std::rethrow_exception(error_);
  }

  static int64_t threads_started() { return threads_started_.load(); }

 private:
  void work(int64_t index, uint64_t seen) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= tasks_) continue;  // this call needs fewer threads
      const std::function<void(int64_t)>* task = task_;
      lock.unlock();
      std::exception_ptr failure;
      try {
        (*task)(index);
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure && !error_) error_ = failure;
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  inline static std::atomic<int64_t> threads_started_{0};
  std::mutex call_mutex_;  // one run() at a time
  std::mutex mutex_;       // everything below
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t tasks_ = 0;
  int64_t remaining_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

// Runs fn(begin, end) over [0, count) in `threads` contiguous shares, the first on the calling
// thread, the others on HostThreadPool's workers. Plain threads, not at::parallel_for: in a
// LibTorch built with OpenMP that is an inline `omp parallel` loop, which runs on one thread in a
// file compiled without -fopenmp (as this one is: the process's one OpenMP runtime is LibTorch's
// own libgomp).
template <typename Fn>
void run_on_threads(int64_t count, int64_t threads, const Fn& fn) {
  threads = std::clamp<int64_t>(threads, 1, std::max<int64_t>(count, 1));
  const int64_t share = (count + threads - 1) / threads;
  if (threads == 1) {
    fn(0, count);
    return;
  }
  HostThreadPool::shared().run(threads, [&fn, share, count](int64_t t) {
    fn(std::min(count, t * share), std::min(count, (t + 1) * share));
  });
}

// The fused pass's thread count: options.host_threads, or at::get_num_threads() when it is 0.
int64_t host_threads(const config::OptimOptions& options) {
  return options.host_threads > 0 ? options.host_threads : at::get_num_threads();
}

// Sum of x^2 over n elements of g, in fp64: eight running sums (element i into sum i % 8, which
// the vectorizer maps onto vector lanes), added pairwise at the end. The same order, so the same
// bits, in every ISA variant below.
template <typename G>
[[gnu::always_inline]] inline double sum_of_squares_loop(const G* __restrict g, int64_t n) {
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double x = static_cast<double>(static_cast<float>(g[i + j]));
      s[j] += x * x;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double x = static_cast<double>(static_cast<float>(g[i]));
    s[j] += x * x;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename G>
double sum_of_squares_baseline(const G* g, int64_t n) {
  return sum_of_squares_loop(g, n);
}
#ifdef ULYSSES_X86_MULTIVERSION
template <typename G>
[[gnu::target("avx2,fma,f16c")]] double sum_of_squares_avx2(const G* g, int64_t n) {
  return sum_of_squares_loop(g, n);
}
template <typename G>
[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,prefer-vector-width=512")]] double
sum_of_squares_avx512(const G* g, int64_t n) {
  return sum_of_squares_loop(g, n);
}
#endif

template <typename G>
double sum_of_squares(const G* g, int64_t n) {
#ifdef ULYSSES_X86_MULTIVERSION
  switch (isa()) {
    case Isa::kAvx512:
      return sum_of_squares_avx512(g, n);
    case Isa::kAvx2:
      return sum_of_squares_avx2(g, n);
    case Isa::kBaseline:
      break;
  }
#endif
  return sum_of_squares_baseline(g, n);
}

double sum_of_squares(const at::Tensor& g, int64_t offset, int64_t n) {
  switch (g.scalar_type()) {
    case at::kDouble: {
      const double* d = g.data_ptr<double>() + offset;
      double s0 = 0.0, s1 = 0.0;
      int64_t i = 0;
      for (; i + 2 <= n; i += 2) {
        s0 += d[i] * d[i];
        s1 += d[i + 1] * d[i + 1];
      }
      if (i < n) s0 += d[i] * d[i];
      return s0 + s1;
    }
    case at::kBFloat16:
      return sum_of_squares(g.data_ptr<c10::BFloat16>() + offset, n);
    case at::kHalf:
      return sum_of_squares(g.data_ptr<c10::Half>() + offset, n);
    default:
      return sum_of_squares(g.data_ptr<float>() + offset, n);
  }
}

}  // namespace

void fused_adamw_cpu(const std::vector<FusedAdamWBuffer>& buffers, double lr,
                     const config::OptimOptions& options, double grad_scale) {
  TORCH_CHECK(lr >= 0.0, "fused_adamw_cpu: lr must be >= 0, got ", lr);
  TORCH_CHECK(std::isfinite(grad_scale) && grad_scale > 0.0,
              "fused_adamw_cpu: grad_scale must be finite and > 0, got ", grad_scale);
  struct Prepared {
    LoopFn loop;
    Coeffs<float> coeffs32;
    Coeffs<double> coeffs64;
  };
  struct Chunk {
    size_t buffer;
    int64_t offset, length;
  };
  std::vector<Prepared> prepared;
  prepared.reserve(buffers.size());
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const FusedAdamWBuffer& b = buffers[i];
    prepared.push_back({loop_for(b), coeffs_for<float>(lr, b.step, options, grad_scale),
                        coeffs_for<double>(lr, b.step, options, grad_scale)});
    const int64_t numel = b.master.numel();
    for (int64_t offset = 0; offset < numel; offset += kChunk) {
      chunks.push_back({i, offset, std::min(kChunk, numel - offset)});
    }
  }
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Chunk& c = chunks[static_cast<size_t>(i)];
      const FusedAdamWBuffer& b = buffers[c.buffer];
      const Prepared& p = prepared[c.buffer];
      const void* coeffs = b.master.scalar_type() == at::kDouble
                               ? static_cast<const void*>(&p.coeffs64)
                               : static_cast<const void*>(&p.coeffs32);
      p.loop(b, coeffs, c.offset, c.length);
    }
  };
  run_on_threads(static_cast<int64_t>(chunks.size()), host_threads(options), run);
}

double host_gradient_norm(const std::vector<at::Tensor>& grads, int64_t threads) {
  struct Chunk {
    const at::Tensor* grad;
    int64_t offset, length;
  };
  std::vector<Chunk> chunks;
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    TORCH_CHECK(g.device().is_cpu() && g.is_contiguous(),
                "host_gradient_norm: gradients must be contiguous CPU tensors");
    const at::ScalarType dtype = g.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
                    dtype == at::kHalf,
                "host_gradient_norm: gradient dtype ", dtype, "; fp32, fp64, bf16 or fp16 required");
    for (int64_t offset = 0; offset < g.numel(); offset += kChunk) {
      chunks.push_back({&g, offset, std::min(kChunk, g.numel() - offset)});
    }
  }
  std::vector<double> partial(chunks.size(), 0.0);  // per chunk: its sum of squares
  run_on_threads(static_cast<int64_t>(chunks.size()), threads > 0 ? threads : at::get_num_threads(),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t i = begin; i < end; ++i) {
                     const Chunk& c = chunks[static_cast<size_t>(i)];
                     partial[static_cast<size_t>(i)] = sum_of_squares(*c.grad, c.offset, c.length);
                   }
                 });
  double total = 0.0;
  for (double p : partial) total += p;  // in chunk order: the same sum on any thread count
  return std::sqrt(total);
}

std::vector<double> host_gradient_square_sums(const at::Tensor& grad, int64_t threads) {
  if (!grad.defined()) return {};
  TORCH_CHECK(grad.device().is_cpu() && grad.is_contiguous(),
              "host_gradient_norm: gradients must be contiguous CPU tensors");
  const at::ScalarType dtype = grad.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
                  dtype == at::kHalf,
              "host_gradient_norm: gradient dtype ", dtype, "; fp32, fp64, bf16 or fp16 required");
  const int64_t chunks = (grad.numel() + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);  // per chunk: its sum of squares
  run_on_threads(chunks, threads > 0 ? threads : at::get_num_threads(),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t i = begin; i < end; ++i) {
                     const int64_t offset = i * kChunk;
                     partial[static_cast<size_t>(i)] =
                         sum_of_squares(grad, offset, std::min(kChunk, grad.numel() - offset));
                   }
                 });
  return partial;
}

double host_gradient_norm_of_sums(const std::vector<std::vector<double>>& sums) {
  double total = 0.0;
  for (const auto& chunks : sums) {
    for (double p : chunks) total += p;  // host_gradient_norm's order: gradients, then chunks
  }
  return std::sqrt(total);
}

int64_t host_threads_started() { return HostThreadPool::threads_started(); }

int64_t available_host_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int64_t cpus = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int64_t>(std::thread::hardware_concurrency());
  return std::max<int64_t>(cpus, 1);
}

int64_t resolve_host_threads(int64_t configured, bool host_is_device, int64_t intra_op_threads,
                             int64_t cpus, int64_t ranks_on_node) {
  if (configured > 0) return configured;
  if (host_is_device) return std::max<int64_t>(intra_op_threads, 1);
  return std::max<int64_t>(1, cpus / std::max<int64_t>(ranks_on_node, 1));
}

const char* fused_adamw_isa() {
  switch (isa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

}  // namespace ulysses::train
