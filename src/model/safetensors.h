// The safetensors file format, by hand: 8-byte little-endian header length N, N bytes of JSON
// header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes (offsets relative to the end of the header).
// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ulysses::model {

// Writes `tensors` (any device, any layout; copied to contiguous CPU one at a time) to `path` in
// the given order, the header padded with spaces to a multiple of 8 bytes. Overwrites `path`;
// writing to a temporary name and renaming is the caller's job.
// Throws UserError("<path>: ...") when the file cannot be written or a dtype has no safetensors
// name. REQUIRES: names unique and not "__metadata__".
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` into CPU tensors of the stored dtype and shape.
// Throws UserError("<path>: ...") when the file is missing, truncated or its header is corrupt
// (bad JSON, unknown dtype, offsets outside the data or not matching the shape).
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

// The "__metadata__" map of `path` (empty when absent). Throws like load_safetensors.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace ulysses::model
