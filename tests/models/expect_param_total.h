// The parameter-count check shared by the preset and GPT-2 tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>

#include "models/config.h"
#include "models/param_count.h"

namespace kiln::test {

// Asserts formula total == meta-device total == expected, and every row equal.
inline void expect_total(const models::ModelConfig& c, std::int64_t expected) {
  models::ParamCount f = models::count_params(c);
  auto actual = models::count_meta_params(c);
  EXPECT_EQ(f.total, expected) << c.name << " (formula)";
  EXPECT_EQ(actual.at("total"), expected) << c.name << " (meta-device model)";
  nlohmann::json j = models::param_report_json(c, f, actual);
  EXPECT_TRUE(j["identical"].get<bool>()) << j.dump(1);
}

}  // namespace kiln::test
