// The run-config reference: every key of the field table has a meaning, no meaning is left for a
// key that is gone, and the committed docs/run-config.md is exactly what
// `ulysses-train --print-config-reference` generates (regenerate it with that command).
#include <gtest/gtest.h>

#include <string>

#include "common/paths.h"
#include "config/field_docs.h"
#include "config/field_table.h"
#include "support/test_files.h"

namespace ulysses::config {
namespace {

TEST(DocsReference, EveryKeyHasAMeaning) {
  EXPECT_EQ(undocumented_keys(), std::vector<std::string>{})
      << "add each key's meaning to src/config/field_docs.cpp, then regenerate docs/run-config.md";
  EXPECT_EQ(stale_documented_keys(), std::vector<std::string>{})
      << "remove these from src/config/field_docs.cpp";
}

TEST(DocsReference, EveryKeyIsInTheGeneratedPage) {
  const std::string page = config_reference_markdown();
  const RunConfig defaults;
  for_each_field(defaults, [&](const char* section, const char* key, const auto&) {
    const std::string row = "| `" + std::string(section) + "." + key + "` |";
    EXPECT_NE(page.find(row), std::string::npos) << row;
  });
  EXPECT_EQ(page.find("(undocumented)"), std::string::npos);
}

TEST(DocsReference, CommittedPageIsCurrent) {
  const std::string path = project_home() + "/docs/run-config.md";
  EXPECT_EQ(ulysses::testing::read_text(path), config_reference_markdown())
      << path << " is stale: build/bin/ulysses-train --print-config-reference > docs/run-config.md";
}

}  // namespace
}  // namespace ulysses::config
