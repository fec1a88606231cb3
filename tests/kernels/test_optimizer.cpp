// Tests for kernels/cpu/optimizer.h: AdamW and SGD against float64 references of PyTorch's
// update rules over several steps, and (when /usr/bin/python3 has torch) against torch itself
// via tests/kernels/adamw_ref.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cpu/optimizer.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_python.h"

namespace kiln {
namespace {

KILN_OP_TESTED(Op::AdamW);
KILN_OP_TESTED(Op::Sgd);

struct AdamCfg {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f;
};

TEST(AdamW, MatchesFloat64ReferenceOverSteps) {
  for (int64_t n : {1, 7, 33, 129, 40001}) {
    for (const AdamCfg cfg : {AdamCfg{}, AdamCfg{3e-2f, 0.8f, 0.95f, 1e-6f, 0.0f}}) {
      auto p = test::random_uniform_vec<float>(n, 1 + n);
      std::vector<float> m(n, 0.f), v(n, 0.f);
      auto pd = test::to_f64(p);
      std::vector<double> md(n, 0.0), vd(n, 0.0);
      const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.wd;
      for (int64_t step = 1; step <= 6; ++step) {
        const auto g = test::random_normal_vec<float>(n, 100 * step + n, 0, step == 3 ? 1e-4 : 1);
        cpu::adamw_step(n, p.data(), g.data(), m.data(), v.data(), cfg.lr, cfg.beta1, cfg.beta2,
                        cfg.eps, cfg.wd, step);
        const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
        for (int64_t i = 0; i < n; ++i) {
          pd[i] *= 1 - lr * wd;
          md[i] = b1 * md[i] + (1 - b1) * g[i];
          vd[i] = b2 * vd[i] + (1 - b2) * double(g[i]) * g[i];
          pd[i] -= lr * (md[i] / bc1) / (std::sqrt(vd[i] / bc2) + eps);
        }
      }
      // The float kernel carries ~1e-7 relative error per op; updates are O(lr).
      EXPECT_TRUE(test::all_close(p, pd, 1e-6, 1e-6)) << "n " << n << " lr " << cfg.lr;
      EXPECT_TRUE(test::all_close(m, md, 1e-7, 1e-5)) << "n " << n;
      EXPECT_TRUE(test::all_close(v, vd, 1e-9, 1e-5)) << "n " << n;
    }
  }
}

// The f64 kernel against the same rules in long double (x87's 64-bit significand): within a few
// f64 roundings per step.
TEST(AdamW, Float64MatchesLongDoubleReferenceOverSteps) {
  for (int64_t n : {1, 7, 40001}) {
    const double lr = 3e-3, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
    auto p32 = test::random_uniform_vec<float>(n, 3 + n);
    std::vector<double> p = test::to_f64(p32), m(n, 0.0), v(n, 0.0);
    std::vector<long double> pl(p.begin(), p.end()), ml(n, 0.0L), vl(n, 0.0L);
    for (int64_t step = 1; step <= 6; ++step) {
      // Step 3's gradients are tiny: the eps term matters.
      const auto g32 = test::random_normal_vec<float>(n, 100 * step + n, 0, step == 3 ? 1e-9 : 1);
      const std::vector<double> g = test::to_f64(g32);
      cpu::adamw_step(n, p.data(), g.data(), m.data(), v.data(), lr, b1, b2, eps, wd, step);
      const long double bc1 = 1 - std::pow(static_cast<long double>(b1), step),
                        bc2 = 1 - std::pow(static_cast<long double>(b2), step);
      for (int64_t i = 0; i < n; ++i) {
        pl[i] *= 1 - static_cast<long double>(lr) * wd;
        ml[i] = b1 * ml[i] + (1 - static_cast<long double>(b1)) * g[i];
        vl[i] = b2 * vl[i] + (1 - static_cast<long double>(b2)) * g[i] * g[i];
        pl[i] -= lr * (ml[i] / bc1) / (std::sqrt(vl[i]) / std::sqrt(bc2) + eps);
      }
    }
    // Normwise: the largest error over the largest |reference| (m's elements can cancel to ~0).
    auto rel = [&](const std::vector<double>& got, const std::vector<long double>& want) {
      long double err = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        err = std::max(err, std::fabs(got[i] - want[i]));
        mag = std::max(mag, std::fabs(want[i]));
      }
      return double(err / mag);
    };
    EXPECT_LE(rel(p, pl), 1e-14) << "n " << n;
    EXPECT_LE(rel(m, ml), 1e-14) << "n " << n;
    EXPECT_LE(rel(v, vl), 1e-14) << "n " << n;
  }
}

struct SgdCfg {
  float lr, momentum, dampening, wd;
  bool nesterov;
};

TEST(Sgd, MatchesFloat64ReferenceOverSteps) {
  const SgdCfg cfgs[] = {{0.1f, 0.0f, 0.0f, 0.0f, false},
                         {0.05f, 0.9f, 0.0f, 0.01f, false},
                         {0.05f, 0.9f, 0.1f, 0.0f, false},
                         {0.02f, 0.9f, 0.0f, 0.001f, true}};
  for (int64_t n : {1, 7, 33, 40001})
    for (const auto& c : cfgs) {
      auto p = test::random_uniform_vec<float>(n, 5 + n);
      std::vector<float> buf(n, 123.f);  // contents before step 1 must be ignored
      auto pd = test::to_f64(p);
      std::vector<double> bd(n);
      for (int64_t step = 1; step <= 5; ++step) {
        const auto g = test::random_normal_vec<float>(n, 7 * step + n);
        cpu::sgd_step(n, p.data(), g.data(), c.momentum != 0 ? buf.data() : nullptr, c.lr,
                      c.momentum, c.dampening, c.wd, c.nesterov, step);
        for (int64_t i = 0; i < n; ++i) {
          double d = g[i] + double(c.wd) * pd[i];
          if (c.momentum != 0) {
            bd[i] = step == 1 ? d : c.momentum * bd[i] + (1 - double(c.dampening)) * d;
            d = c.nesterov ? d + c.momentum * bd[i] : bd[i];
          }
          pd[i] -= c.lr * d;
        }
      }
      EXPECT_TRUE(test::all_close(p, pd, 1e-6, 1e-6)) << "n " << n << " mom " << c.momentum;
      if (c.momentum != 0) EXPECT_TRUE(test::all_close(buf, bd, 1e-5, 1e-5));
    }
}

TEST(Optimizer, RejectsBadArguments) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(cpu::adamw_step(1, &p, &g, &m, &v, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, 0), Error);
  EXPECT_THROW(cpu::sgd_step(1, &p, &g, nullptr, 0.1f, 0.9f, 0.f, 0.f, false, 1), Error);
  EXPECT_THROW(cpu::sgd_step(1, &p, &g, &m, 0.1f, 0.9f, 0.5f, 0.f, true, 1), Error);
}

// Runs tests/kernels/adamw_ref.py (torch.optim.AdamW / SGD) and compares final states.
TEST(AdamW, MatchesPyTorch) {
  if (std::system((test_python() + " -c 'import torch' > /dev/null 2>&1").c_str()) != 0)
    FAIL() << test_python()
           << " has no torch: this independent reference must run "
              "(scripts/setup.sh installs python3-torch)";
  const int64_t n = 37, steps = 5;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.99f, eps = 1e-8f, wd = 0.05f;
  const float mom = 0.9f, damp = 0.0f, sgd_wd = 0.01f;
  const bool nesterov = true;
  auto p = test::random_uniform_vec<float>(n, 1);
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < steps; ++s) grads.push_back(test::random_normal_vec<float>(n, 10 + s));

  const auto path = std::filesystem::temp_directory_path() /
                    ("kiln_adamw_ref_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream f(path);
    char buf[64];
    auto put = [&](double x) { std::snprintf(buf, sizeof buf, "%.9g ", x), f << buf; };
    f << n << ' ' << steps << ' ';
    for (double x : {double(lr), double(b1), double(b2), double(eps), double(wd), double(mom),
                     double(damp), double(sgd_wd)})
      put(x);
    f << (nesterov ? 1 : 0) << '\n';
    for (float x : p) put(x);
    f << '\n';
    for (const auto& g : grads) {
      for (float x : g) put(x);
      f << '\n';
    }
  }
  const std::string cmd =
      test_python() + " " KILN_SOURCE_DIR "/tests/kernels/adamw_ref.py " + path.string();
  std::string out;
  if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (size_t k = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, k);
    ASSERT_EQ(::pclose(pipe), 0) << "adamw_ref.py failed:\n" << out;
  }
  std::filesystem::remove(path);
  std::istringstream is(out);
  std::vector<std::vector<double>> ref(5, std::vector<double>(n));
  for (auto& row : ref)
    for (auto& x : row) ASSERT_TRUE(is >> x) << "short output from adamw_ref.py:\n" << out;

  std::vector<float> pa = p, m(n, 0.f), v(n, 0.f), ps = p, buf(n, 0.f);
  for (int s = 0; s < steps; ++s) {
    cpu::adamw_step(n, pa.data(), grads[s].data(), m.data(), v.data(), lr, b1, b2, eps, wd, s + 1);
    cpu::sgd_step(n, ps.data(), grads[s].data(), buf.data(), lr, mom, damp, sgd_wd, nesterov,
                  s + 1);
  }
  // Same float arithmetic in the same order: agreement to a few float ulps.
  EXPECT_TRUE(test::all_close(pa, ref[0], 1e-7, 5e-7)) << "adamw param";
  EXPECT_TRUE(test::all_close(m, ref[1], 1e-8, 5e-7)) << "adamw exp_avg";
  EXPECT_TRUE(test::all_close(v, ref[2], 1e-10, 5e-7)) << "adamw exp_avg_sq";
  EXPECT_TRUE(test::all_close(ps, ref[3], 1e-7, 5e-7)) << "sgd param";
  EXPECT_TRUE(test::all_close(buf, ref[4], 1e-7, 5e-7)) << "sgd momentum";
}

}  // namespace
}  // namespace kiln
