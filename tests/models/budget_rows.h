// Indexing a budget's rows (BudgetRow) in the budget tests.
#pragma once

#include <cstddef>

#include "budget/budget.h"

namespace kiln::test {

inline std::size_t idx(models::BudgetRow r) { return static_cast<std::size_t>(r); }

}  // namespace kiln::test
