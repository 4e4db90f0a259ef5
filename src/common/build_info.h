// What this build is: the project version, the LibTorch it was built against and the compiled-in
// backends. `ulysses-train --version` and `ulysses-tune --version` print it; sweeps store it.
#pragma once
#include <string>

namespace ulysses {

// Several lines: "ulysses-tune 0.2.0", "LibTorch 2.13.0", "backends: gloo yes, nccl no,
// cuda no, nvtx yes", "compiler: GCC 12.2.0". `program` names the first line.
std::string build_info(const std::string& program);

}  // namespace ulysses
