// Indexing a budget's rows (BudgetRow) in the budget tests.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "budget/budget.h"

namespace kiln::test {

inline std::size_t idx(models::BudgetRow r) { return static_cast<std::size_t>(r); }

// The analytic model against a dry run, to the byte: every row at the peak (slack is the
// allocator's, not a category) and the peak's op.
inline void expect_rows_at_peak_equal(const models::BudgetFigures& analytic,
                                      const models::BudgetFigures& dry, const std::string& what) {
  for (std::size_t i = 0; i < models::kNumBudgetRows; ++i)
    if (i != idx(models::BudgetRow::Slack))
      EXPECT_EQ(analytic.at_peak[i], dry.at_peak[i])
          << what << ": " << models::budget_row_name(static_cast<models::BudgetRow>(i));
  EXPECT_EQ(analytic.peak_label, dry.peak_label) << what;
}

}  // namespace kiln::test
