// What differs between the LibTorch releases we support (>= 2.3) and the build's
// features. Nothing else in the tree tests TORCH_VERSION_* or USE_* macros (but common/build_info.cpp,
// which reports them for --version without pulling in LibTorch headers).
#pragma once
#include <torch/csrc/autograd/function.h>
#include <torch/version.h>

#include <memory>
#include <type_traits>
#include <utility>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3),
              "ulysses-tune needs LibTorch >= 2.3");

// cuDNN attention can be selected through at::globalContext() from LibTorch 2.4 on.
#define ULYSSES_HAS_CUDNN_SDPA (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
// at::scaled_dot_product_attention takes enable_gqa (k/v with fewer heads than q) from 2.5 on;
// before, k/v are expanded to hq heads.
#define ULYSSES_HAS_SDPA_GQA (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5)
// mm / addmm take out_dtype from 2.8 on: on CUDA, fp16/bf16 operands with an fp32 result
// accumulated and written in fp32 by the GEMM. addmm with an fp32 `self` and half operands is
// accepted only by later releases (2.8 and 2.9 reject it on CUDA); sp/wide_matmul.cpp asks at run
// time.
#define ULYSSES_HAS_GEMM_OUT_DTYPE (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 8)

// NCCL process groups: a CUDA build of LibTorch with c10d's NCCL backend compiled in.
#if defined(ULYSSES_WITH_CUDA) && defined(USE_C10D_NCCL)
#define ULYSSES_HAS_NCCL 1
#else
#define ULYSSES_HAS_NCCL 0
#endif

namespace ulysses::compat {

// True when this LibTorch was built with CUDA (CMake sets ULYSSES_WITH_CUDA then).
#ifdef ULYSSES_WITH_CUDA
inline constexpr bool kHasCuda = true;
#else
inline constexpr bool kHasCuda = false;
#endif

// Autograd nodes are held by std::shared_ptr (with torch::autograd::deleteNode) in older releases
// and by c10::intrusive_ptr in newer ones (2.13 does). NodePtr<T> is the holder this LibTorch's
// set_history / Edge take; make_autograd_node<T>() creates one. Detected from Node's base class,
// not from a version number.
inline constexpr bool kIntrusiveAutogradNodes =
    std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;

template <typename T>
using NodePtr = std::conditional_t<kIntrusiveAutogradNodes, c10::intrusive_ptr<T>,
                                   std::shared_ptr<T>>;

template <typename T, typename... Args>
NodePtr<T> make_autograd_node(Args&&... args) {
  if constexpr (kIntrusiveAutogradNodes) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    // deleteNode (older releases) found by argument-dependent lookup through T's base Node, so
    // that the name need not exist in newer releases.
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...),
                              [](T* node) { deleteNode(node); });
  }
}

}  // namespace ulysses::compat
