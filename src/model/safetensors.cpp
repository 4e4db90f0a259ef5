// safetensors reader and writer (see safetensors.h).
#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <c10/util/accumulate.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp writes host-order bytes and assumes a little-endian host"
#endif

namespace ulysses::model {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the limit of the reference implementation

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

// One tensor entry of a parsed header; offsets are relative to data_start.
struct Entry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
};

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw UserError(path + ": corrupt safetensors file: " + what);
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j,
                  uint64_t data_bytes) {
  if (!j.is_object()) corrupt(path, "entry '" + name + "' is not an object");
  Entry e;
  e.name = name;
  auto dtype = j.find("dtype");
  if (dtype == j.end() || !dtype->is_string()) corrupt(path, "entry '" + name + "' has no dtype");
  const std::string dtype_str = dtype->get<std::string>();
  bool known = false;
  for (const auto& d : kDtypes) {
    if (dtype_str == d.name) e.dtype = d.type, known = true;
  }
  if (!known) corrupt(path, "entry '" + name + "' has unsupported dtype '" + dtype_str + "'");
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array()) corrupt(path, "entry '" + name + "' has no shape");
  uint64_t numel = 1;
  for (const auto& dim : *shape) {
    if (!dim.is_number_unsigned()) corrupt(path, "entry '" + name + "' has a bad shape");
    const uint64_t size = dim.get<uint64_t>();
    if (size != 0 && numel > data_bytes / size) {
      corrupt(path, "entry '" + name + "' is larger than the file");
    }
    numel *= size;
    e.shape.push_back(static_cast<int64_t>(size));
  }
  auto offsets = j.find("data_offsets");
  if (offsets == j.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    corrupt(path, "entry '" + name + "' has no valid data_offsets");
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes) {
    corrupt(path, "entry '" + name + "' has data_offsets outside the data");
  }
  if (e.end - e.begin != numel * c10::elementSize(e.dtype)) {
    corrupt(path, "entry '" + name + "' has data_offsets that do not match its shape and dtype");
  }
  return e;
}

Header read_header(const std::string& path, std::ifstream& in) {
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) throw UserError(path + ": cannot read: " + ec.message());
  if (file_bytes < 8) corrupt(path, "shorter than the 8-byte header length");
  unsigned char length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  if (!in) corrupt(path, "cannot read the header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > file_bytes - 8 || header_bytes > kMaxHeaderBytes) {
    corrupt(path, "header length " + std::to_string(header_bytes) + " exceeds the file");
  }
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) corrupt(path, "truncated header");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    corrupt(path, std::string("header is not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) corrupt(path, "header is not a JSON object");
  Header h;
  h.data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) corrupt(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) corrupt(path, "__metadata__ value '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
    } else {
      h.entries.push_back(parse_entry(path, it.key(), *it, data_bytes));
    }
  }
  return h;
}

std::ifstream open_for_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open: " + std::strerror(errno));
  return in;
}

// The 8-byte length and the JSON header for `tensors` (data in that order), padded to a multiple
// of 8 bytes; each tensor's file_offset set to where its data will begin.
std::string encode_header(const std::string& path, std::vector<SafetensorsTensor>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensor& tensor : tensors) {
    TORCH_CHECK(tensor.name != "__metadata__" && names.insert(tensor.name).second,
                "save_safetensors: duplicate or reserved tensor name '", tensor.name, "'");
    const char* dtype = nullptr;
    for (const auto& d : kDtypes) {
      if (tensor.dtype == d.type) dtype = d.name;
    }
    if (dtype == nullptr) {
      throw UserError(path + ": tensor '" + tensor.name + "' has dtype " +
                      std::string(c10::toString(tensor.dtype)) +
                      ", which safetensors cannot store");
    }
    const uint64_t bytes = static_cast<uint64_t>(c10::multiply_integers(tensor.shape)) *
                           c10::elementSize(tensor.dtype);
    header[tensor.name] = {{"dtype", dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(text.size() >> (8 * i));
  out += text;
  uint64_t begin = out.size();
  for (SafetensorsTensor& tensor : tensors) {
    tensor.file_offset = begin;
    begin += static_cast<uint64_t>(c10::multiply_integers(tensor.shape)) *
             c10::elementSize(tensor.dtype);
  }
  return out;
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensor> described;
  for (const auto& [name, tensor] : tensors) {
    described.push_back({name, tensor.scalar_type(), tensor.sizes().vec(), 0});
  }
  const std::string header = encode_header(path, described, metadata);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw UserError(path + ": cannot write: " + std::strerror(errno));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& item : tensors) {
    at::Tensor cpu = item.second.detach().to(at::kCPU).contiguous();
    out.write(static_cast<const char*>(cpu.data_ptr()),
              static_cast<std::streamsize>(cpu.numel() * cpu.element_size()));
  }
  out.close();
  if (!out) throw UserError(path + ": cannot write: " + std::strerror(errno));
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream in = open_for_read(path);
  const Header header = read_header(path, in);
  std::map<std::string, at::Tensor> tensors;
  for (const Entry& e : header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    in.seekg(static_cast<std::streamoff>(header.data_start + e.begin));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) corrupt(path, "cannot read the data of '" + e.name + "'");
    tensors.emplace(e.name, std::move(t));
  }
  return tensors;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  std::ifstream in = open_for_read(path);
  return read_header(path, in).metadata;
}

std::vector<SafetensorsTensor> read_safetensors_tensors(const std::string& path) {
  std::ifstream in = open_for_read(path);
  const Header header = read_header(path, in);
  std::vector<SafetensorsTensor> out;
  for (const Entry& e : header.entries) {
    out.push_back({e.name, e.dtype, e.shape, header.data_start + e.begin});
  }
  return out;
}

void read_safetensors_range(const std::string& path, const SafetensorsTensor& tensor,
                            int64_t begin, at::Tensor out) {
  TORCH_CHECK(out.is_cpu() && out.is_contiguous() && out.scalar_type() == tensor.dtype,
              "read_safetensors_range: out must be a contiguous CPU tensor of ", tensor.name,
              "'s dtype");
  TORCH_CHECK(begin >= 0 && begin + out.numel() <= c10::multiply_integers(tensor.shape),
              "read_safetensors_range: range outside ", tensor.name);
  std::ifstream in = open_for_read(path);
  const uint64_t element = c10::elementSize(tensor.dtype);
  in.seekg(static_cast<std::streamoff>(tensor.file_offset + begin * element));
  in.read(static_cast<char*>(out.data_ptr()), static_cast<std::streamsize>(out.numel() * element));
  if (!in) corrupt(path, "cannot read the data of '" + tensor.name + "'");
}

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     const std::vector<SafetensorsTensor>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(tensors) {
  const std::string header = encode_header(path, tensors_, metadata);
  uint64_t size = header.size();
  if (!tensors_.empty()) {
    const SafetensorsTensor& last = tensors_.back();
    size = last.file_offset +
           static_cast<uint64_t>(c10::multiply_integers(last.shape)) * c10::elementSize(last.dtype);
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(path + ": cannot write: " + std::strerror(errno));
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0 ||
      ::pwrite(fd_, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    throw UserError(path + ": cannot write: " + why);
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(size_t index, int64_t begin, const at::Tensor& values) {
  const SafetensorsTensor& tensor = tensors_.at(index);
  TORCH_CHECK(fd_ >= 0, "SafetensorsWriter::write after close");
  TORCH_CHECK(values.is_cpu() && values.is_contiguous() && values.scalar_type() == tensor.dtype,
              "SafetensorsWriter::write: values must be a contiguous CPU tensor of ", tensor.name,
              "'s dtype");
  TORCH_CHECK(begin >= 0 && begin + values.numel() <= c10::multiply_integers(tensor.shape),
              "SafetensorsWriter::write: range outside ", tensor.name);
  const uint64_t element = c10::elementSize(tensor.dtype);
  const char* data = static_cast<const char*>(values.data_ptr());
  uint64_t left = static_cast<uint64_t>(values.numel()) * element;
  uint64_t at = tensor.file_offset + static_cast<uint64_t>(begin) * element;
  while (left > 0) {
    const ssize_t written = ::pwrite(fd_, data, left, static_cast<off_t>(at));
    if (written <= 0) throw UserError(path_ + ": cannot write: " + std::strerror(errno));
    data += written;
    at += static_cast<uint64_t>(written);
    left -= static_cast<uint64_t>(written);
  }
}

void SafetensorsWriter::close() {
  if (fd_ < 0) return;
  const bool synced = ::fsync(fd_) == 0;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) throw UserError(path_ + ": cannot write: " + std::strerror(errno));
}

}  // namespace ulysses::model
