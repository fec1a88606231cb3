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

namespace kiln::test {

namespace fs = std::filesystem;

inline constexpr double kBound = 1e-6;

inline dist::Communicator& comm() { return dist::world(); }

// A folder shared by the ranks of this job: named after rank 0's pid.
inline fs::path shared_dir(const std::string& name) {
  Tensor pid = Tensor::empty({1}, DType::F64);
  *pid.data<double>() = static_cast<double>(::getpid());
  comm().broadcast(pid, 0);
  fs::path d = fs::temp_directory_path() /
               fmt::format("kiln_test_dist_{}_{}", name, static_cast<long>(*pid.data<double>()));
  if (comm().rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
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
