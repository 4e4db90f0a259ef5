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

// One tensor of a safetensors file: what its header says.
struct SafetensorsTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t file_offset = 0;  // where its bytes begin in the file (set by the reader)
};

// The tensors of `path` in the header's order; reads the header only. Throws like
// load_safetensors.
std::vector<SafetensorsTensor> read_safetensors_tensors(const std::string& path);

// Reads elements [begin, begin + out.numel()) of `tensor` (flattened; listed by
// read_safetensors_tensors(path)) into `out` ([n], CPU, contiguous, tensor.dtype): only those
// bytes are read. Throws UserError("<path>: ...") when they cannot be read.
// REQUIRES: the range lies inside the tensor.
void read_safetensors_range(const std::string& path, const SafetensorsTensor& tensor,
                            int64_t begin, at::Tensor out);

// A safetensors file written piece by piece, in any order, so that no tensor needs to exist
// whole anywhere: the constructor writes the header for `tensors` (name, dtype, shape; their data
// in this order) and sizes the file, write() fills element ranges. Every element must be written
// before close(), or the file holds zeros there. Overwrites `path`.
class SafetensorsWriter {
 public:
  // Throws UserError("<path>: ...") when the file cannot be created or a dtype has no safetensors
  // name. REQUIRES: names unique and not "__metadata__".
  SafetensorsWriter(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes `values` ([n], CPU, contiguous, the tensor's dtype) as elements [begin, begin + n) of
  // tensor `index` (flattened). Throws UserError when the write fails.
  void write(size_t index, int64_t begin, const at::Tensor& values);
  // Flushes the file to stable storage and closes it. Throws UserError when that fails.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<SafetensorsTensor> tensors_;  // file_offset: absolute
};

}  // namespace ulysses::model
