// Helpers shared by the dist tests (run under mpirun -np 2 by ctest, or alone as a world of one).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "models/trainer.h"
#include "tests/temp_dir.h"

namespace kiln::test {

namespace fs = std::filesystem;

inline constexpr double kBound = 1e-6;

inline dist::Communicator& comm() { return dist::world(); }

// A folder shared by the ranks of this job: named after rank 0's pid. Rank 0 removes it when its
// process exits (every test has ended on both ranks by then: each ends in a collective).
inline fs::path shared_dir(const std::string& name) {
  Tensor pid = Tensor::empty({1}, DType::F64);
  *pid.data<double>() = static_cast<double>(::getpid());
  comm().broadcast(pid, 0);
  fs::path d = fs::temp_directory_path() /
               fmt::format("kiln_test_dist_{}_{}", name, static_cast<long>(*pid.data<double>()));
  if (comm().rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
    remove_at_exit(d);
    std::string text;
    const std::string words[] = {"the ", "king ", "and ",   "queen ",
                                 "of ",  "rome ", "said, ", "now.\n"};
    std::uint32_t x = 12345;
    while (text.size() < 20000) {
      x = x * 1664525u + 1013904223u;
      text += words[(x >> 16) % 8];
    }
    std::ofstream(d / "data.txt") << text;
  }
  comm().barrier();
  return d;
}

inline models::TrainOptions tiny_options(const fs::path& dir, const std::string& run) {
  models::TrainOptions o;
  o.device = "cpu";
  o.preset = "stories260K";
  o.data_path = (dir / "data.txt").string();
  o.batch = 8;  // the global batch: 4 rows per rank
  o.seq = 16;
  o.steps = 20;
  o.warmup = 3;
  o.lr = 3e-3;
  o.eval_interval = 0;
  o.eval_batches = 2;
  o.log_interval = 1000;
  o.out_dir = (dir / run).string();
  o.progress = 0;
  o.bucket_mb = 0.05;  // several buckets even for this tiny model
  return o;
}

// max |a - b| / max |b| over one tensor's elements (read in double: exact for every dtype).
inline double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

// ||a - b||_2 / ||b||_2 over one tensor's elements.
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The bound on |a_i - b_i| for one tensor's weights after AdamW's first step, taken by two runs
// from the same weights with clipped gradients that differ by at most delta_i per element (g: the
// reference's clipped gradient, w: its weights after the step). The first step is
// w - lr (g / (|g| + eps) + wd w) (bias-corrected m = g, v = g^2; the decay term is the same on
// both sides). f(g) = g / (|g| + eps) has slope eps / (|g| + eps)^2, largest where |g| is
// smallest, so element i's update differs by at most
//   lr min(2, delta_i eps / ((|g_i| - delta_i)_+ + eps)^2)
// (2 when a gradient within delta_i of zero flips sign), plus the rounding of each side's update
// in the weights' dtype: at most 4 units of roundoff u of |w_i| and of lr each (the subtraction,
// the decay product, the quotient and the square root). delta_i = rel_g max_j |g_j| + rel_c |g_i|:
// the per-tensor gradient bound the test asserts, and the clipping scale's relative difference
// (it is computed from the gradients' norm on each side).
inline std::vector<double> adamw_first_step_bounds(const std::vector<double>& g,
                                                   const std::vector<double>& w, double lr,
                                                   double eps, double rel_g, double rel_c,
                                                   double u) {
  double gmax = 0;
  for (double v : g) gmax = std::max(gmax, std::fabs(v));
  std::vector<double> e(std::min(g.size(), w.size()));
  for (std::size_t i = 0; i < e.size(); ++i) {
    const double delta = rel_g * gmax + rel_c * std::fabs(g[i]);
    const double slack = std::max(0.0, std::fabs(g[i]) - delta) + eps;
    e[i] = lr * std::min(2.0, delta * eps / (slack * slack)) + 2 * 4 * u * (std::fabs(w[i]) + lr);
  }
  return e;
}

// The largest rel_l2 over the parameters.
inline double max_rel_l2(models::DecoderModel& a, models::DecoderModel& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  for (std::size_t i = 0; i < pa.size() && i < pb.size(); ++i)
    worst =
        std::max(worst, rel_l2(pa[i].second.to_double_vector(), pb[i].second.to_double_vector()));
  return worst;
}

// The largest rel_diff over the parameters (or, with grads, their gradients).
inline double max_rel_diff(models::DecoderModel& a, models::DecoderModel& b, bool grads = false) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    const Tensor ta = grads ? pa[i].second.grad() : pa[i].second;
    const Tensor tb = grads ? pb[i].second.grad() : pb[i].second;
    worst = std::max(worst, rel_diff(ta.to_double_vector(), tb.to_double_vector()));
  }
  return worst;
}

inline void report(const std::string& what, double v) {
  if (comm().rank() == 0) std::cout << "measured: " << what << " = " << v << "\n";
  testing::Test::RecordProperty(what, fmt::format("{:.3e}", v));
}

inline std::int64_t optimizer_state_bytes() {
  return MemoryTracker::get(DeviceType::CPU)
      .stats()
      .current[static_cast<std::size_t>(MemCategory::OptimizerState)];
}

}  // namespace kiln::test
