// Precompiled header for every target: LibTorch's headers dominate compile time.
#pragma once
#include <torch/torch.h>
#include <string>
#include <vector>
