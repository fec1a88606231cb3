// Indexing a budget's rows (BudgetRow) in the budget tests.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "budget/budget.h"

namespace kiln::test {

inline std::size_t idx(models::BudgetRow r) { return static_cast<std::size_t>(r); }

// A dry run against the measured run: every row's breakdown at the global peak and its own peak
// (slack is the allocator's, not a category), the total peak, the peak's phase and op, and a
// peak that is not zero.
inline void expect_dry_equals_measured(const models::BudgetFigures& dry,
                                       const models::BudgetFigures& meas, const std::string& what) {
  for (std::size_t i = 0; i < models::kNumBudgetRows; ++i) {
    if (i == idx(models::BudgetRow::Slack)) continue;
    const std::string row(models::budget_row_name(static_cast<models::BudgetRow>(i)));
    EXPECT_EQ(dry.at_peak[i], meas.at_peak[i]) << what << ": " << row << " at the peak";
    EXPECT_EQ(dry.peak[i], meas.peak[i]) << what << ": " << row << " own peak";
  }
  EXPECT_EQ(dry.total_peak, meas.total_peak) << what;
  EXPECT_EQ(dry.peak_phase, meas.peak_phase) << what;
  EXPECT_EQ(dry.peak_label, meas.peak_label) << what;
  EXPECT_GT(dry.total_peak, 0) << what;
}

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
