// Finding, checking and reading loss-mask datasets (see loss_mask.h).
#include "data/loss_mask.h"

#include <c10/util/Exception.h>

#include <filesystem>

#include "common/error.h"

namespace ulysses::data {

std::string loss_mask_prefix_of(const std::string& token_prefix) {
  return token_prefix + "_loss_mask";
}

std::string find_loss_mask(const std::string& token_prefix, const std::string& policy,
                           const std::string& key) {
  TORCH_CHECK(policy == "auto" || policy == "require" || policy == "ignore",
              "find_loss_mask: policy ", policy);
  if (policy == "ignore") return "";
  const std::string mask = loss_mask_prefix_of(token_prefix);
  std::error_code ec;
  if (std::filesystem::exists(mask + ".bin", ec) || std::filesystem::exists(mask + ".idx", ec)) {
    return mask;
  }
  if (policy == "require") {
    throw UserError(key + ": data.loss_mask is require, but " + mask + ".bin and " + mask +
                    ".idx (the loss mask of megatron:" + token_prefix + ") do not exist");
  }
  return "";
}

void check_loss_mask_matches(const MegatronStream& tokens, const MegatronStream& mask,
                             const std::string& key) {
  const std::string where = key + ": " + mask.prefix() + ".idx: ";
  if (mask.sequence_count() != tokens.sequence_count()) {
    throw UserError(where + "holds " + std::to_string(mask.sequence_count()) +
                    " sequences but the token dataset " + tokens.prefix() + ".idx holds " +
                    std::to_string(tokens.sequence_count()) +
                    " (a loss mask needs one value per token, sequence by sequence)");
  }
  const std::vector<int64_t>& token_starts = tokens.sequence_starts();
  const std::vector<int64_t>& mask_starts = mask.sequence_starts();
  for (int64_t i = 0; i < tokens.sequence_count(); ++i) {
    const int64_t token_count = token_starts[i + 1] - token_starts[i];
    const int64_t mask_count = mask_starts[i + 1] - mask_starts[i];
    if (token_count != mask_count) {
      throw UserError(where + "sequence " + std::to_string(i) + " has " +
                      std::to_string(mask_count) + " values but its tokens in " +
                      tokens.prefix() + ".idx are " + std::to_string(token_count) +
                      " (a loss mask needs one value per token, sequence by sequence)");
    }
  }
}

std::vector<uint8_t> read_loss_mask(const MegatronStream& mask, int64_t first, int64_t count) {
  std::vector<int64_t> values(static_cast<size_t>(count));
  mask.read(first, count, values.data());
  std::vector<uint8_t> out(values.size());
  for (size_t j = 0; j < values.size(); ++j) out[j] = values[j] != 0 ? 1 : 0;
  return out;
}

}  // namespace ulysses::data
