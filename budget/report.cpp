// The budget report: aligned text, JSON, and an SVG with two charts (stacked
// bars per mode by row; the timeline of one training step by category).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "budget/budget.h"

namespace kiln::models {

namespace {

bool per_rank(const BudgetSpec& s) {
  return s.mode == BudgetMode::Train && (s.nproc > 1 || s.zero > 0);
}

std::string spec_line(const BudgetSpec& s) {
  std::string line = fmt::format("{} | {}{} | ", budget_mode_name(s.mode), dtype_name(s.dtype),
                                 s.weights == GgufScheme::F32
                                     ? std::string()
                                     : fmt::format(", weights {}", gguf_scheme_name(s.weights)));
  line += per_rank(s) ? fmt::format("global batch {} ({} per rank) | ", s.batch, s.local_batch())
                      : fmt::format("batch {} | ", s.batch);
  if (s.mode != BudgetMode::Train)
    return line + fmt::format("prefill {} + {} decode steps | context {}", s.seq, s.decodes(),
                              s.kv_capacity());
  line += fmt::format("seq {} | {}{}", s.seq, s.adamw ? "AdamW" : "SGD (momentum)",
                      s.recompute ? " | recompute" : "");
  if (per_rank(s))
    line += fmt::format(" | {} rank{}, ZeRO-{} | rank {}", s.nproc, s.nproc > 1 ? "s" : "", s.zero,
                        s.rank);
  return line;
}

std::string signed_bytes(std::int64_t d) {
  return d == 0 ? "0" : (d > 0 ? "+" : "") + format_bytes(d);
}

nlohmann::json figures_json(const BudgetFigures& f) {
  nlohmann::json rows = nlohmann::json::object(), peaks = nlohmann::json::object();
  for (std::size_t i = 0; i < kNumBudgetRows; ++i) {
    std::string name(budget_row_name(static_cast<BudgetRow>(i)));
    rows[name] = f.at_peak[i];
    peaks[name] = f.peak[i];
  }
  nlohmann::json j = {{"at_peak", rows},
                      {"row_peaks", peaks},
                      {"total_peak", f.total_peak},
                      {"peak_phase", std::string(phase_name(f.peak_phase))},
                      {"peak_label", f.peak_label},
                      {"seconds", f.seconds}};
  if (f.device) {
    const DeviceMemoryRows& d = *f.device;
    j["device"] = {{"driver_total", d.total},          {"driver_used", d.used},
                   {"other_processes", d.other},       {"kiln_reserved", d.reserved},
                   {"kiln_allocated", d.allocated},    {"cuda_context", d.context},
                   {"cuda_libraries", d.libraries},    {"runtime", d.runtime()},
                   {"unattributed", d.unattributed()}, {"context_measured", d.context_measured}};
  }
  return j;
}

const char* row_color(std::size_t i) {
  static const char* colors[] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d",
                                 "#b6992d", "#e15759", "#499894", "#79706e", "#d4a6c8", "#bab0ac"};
  return colors[i % (sizeof(colors) / sizeof(colors[0]))];
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<')
      o += "&lt;";
    else if (ch == '>')
      o += "&gt;";
    else if (ch == '&')
      o += "&amp;";
    else
      o += ch;
  }
  return o;
}

}  // namespace

std::string budget_report_text(const std::vector<BudgetReport>& reports) {
  KILN_CHECK(!reports.empty(), "[budget] nothing to report");
  const ModelConfig& c = reports.front().spec.cfg;
  std::string out =
      fmt::format("kiln budget: {} | {} layers, dim {}, {}/{} heads x {}, vocab {}\n", c.name,
                  c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size);
  for (const auto& r : reports) out += "  " + spec_line(r.spec) + "\n";
  out += fmt::format("  bytes at the global peak; the dry run allocates like the {} allocator\n",
                     reports.front().spec.simulate == DeviceType::CUDA ? "CUDA" : "CPU");
  for (const auto& r : reports) {
    const BudgetSpec& s = r.spec;
    if (!per_rank(s)) continue;
    out += fmt::format(
        "  per rank: rank {} of {}; dist::shard_range gives rank 0 the largest shard of every "
        "parameter, so rank 0's figures are the max over ranks\n",
        s.rank, s.nproc);
    if (s.zero >= 1)
      out += fmt::format("  ZeRO-{}: sharded {}{}\n", s.zero,
                         s.dtype == DType::F32 ? "optimizer state" : "optimizer state, f32 masters",
                         s.zero == 1   ? ""
                         : s.zero == 2 ? ", gradients"
                                       : ", gradients, weights");
    if (s.zero >= 2)
      out += fmt::format(
          "  ZeRO-{} is a what-if (the trainer implements 0 and 1): {}held through the step\n",
          s.zero,
          s.zero == 2 ? "one full-gradient bucket (the largest parameter's) is "
                      : "one full-gradient bucket (the largest parameter's) and one gathered unit "
                        "of full weights (the largest of a decoder layer and each parameter "
                        "outside the layers; no prefetch) are ");
    out += fmt::format(
        "  measured per-rank figures come from `mpirun -np {} kiln train ... --zero {}` (its "
        "memory summary; the trainer runs ZeRO 0 and 1); --measure runs one process\n",
        s.nproc, std::min(s.zero, 1));
  }
  if (!simulates_native_dtype(reports.front().spec))
    out += fmt::format(
        "  the CPU lacks some {} kernels yet: the dry run (and a CPU run) makes f32 copies that "
        "the "
        "analytic model, which assumes native {}, leaves out (--simulate cuda for a GPU)\n",
        dtype_name(reports.front().spec.dtype), dtype_name(reports.front().spec.dtype));
  else if (gemm_scratch_unmodelled(reports.front().spec))
    out +=
        "  the dry run's temporaries include the CPU bf16 GEMMs' scratch (oneDNN's scratchpad "
        "or widening blocks), which the analytic model leaves out\n";
  out += "\n";
  // Header: per mode, analytic | dry run | Δ [| measured | Δ].
  const int w = 12;
  std::string h1 = fmt::format("{:<16}", ""), h2 = fmt::format("{:<16}", "row");
  for (const auto& r : reports) {
    int cols = r.measured ? 5 : 3;
    std::string title(budget_mode_name(r.spec.mode) == "train" ? "training" : "inference");
    h1 += fmt::format(" | {:^{}}", title, cols * (w + 1) - 1);
    h2 += fmt::format(" | {:>{}} {:>{}} {:>{}}", "analytic", w, "dry run", w, "dry-analyt", w);
    if (r.measured) h2 += fmt::format(" {:>{}} {:>{}}", "measured", w, "meas-dry", w);
  }
  out += h1 + "\n" + h2 + "\n" + std::string(h2.size(), '-') + "\n";
  auto line = [&](const std::string& name, auto get) {
    std::string l = fmt::format("{:<16}", name);
    for (const auto& r : reports) {
      std::int64_t a = get(r.analytic), d = get(r.dry);
      l += fmt::format(" | {:>{}} {:>{}} {:>{}}", format_bytes(a), w, format_bytes(d), w,
                       signed_bytes(d - a), w);
      if (r.measured) {
        std::int64_t m = get(*r.measured);
        l += fmt::format(" {:>{}} {:>{}}", format_bytes(m), w, signed_bytes(m - d), w);
      }
    }
    return l + "\n";
  };
  for (std::size_t i = 0; i < kNumBudgetRows; ++i) {
    bool any = false;
    for (const auto& r : reports)
      any = any || r.analytic.at_peak[i] || r.dry.at_peak[i] ||
            (r.measured && r.measured->at_peak[i]);
    auto row = static_cast<BudgetRow>(i);
    bool device_measured = false;
    for (const auto& r : reports)
      device_measured = device_measured || (r.measured && r.measured->device);
    // Unattributed exists only where a CUDA device was measured; Runtime and slack always show.
    if (row == BudgetRow::Unattributed && !device_measured) continue;
    if (!any && row != BudgetRow::Runtime && row != BudgetRow::Slack &&
        row != BudgetRow::Unattributed)
      continue;
    out += line(std::string(budget_row_name(row)),
                [i](const BudgetFigures& f) { return f.at_peak[i]; });
  }
  out += std::string(h2.size(), '-') + "\n";
  out += line("total at peak", [](const BudgetFigures& f) { return f.total_peak; });
  out += "\n";
  for (const auto& r : reports) {
    out += fmt::format("{}: peak {} in {}{} (dry run {:.3f} s)", budget_mode_name(r.spec.mode),
                       format_bytes(r.dry.total_peak), phase_name(r.dry.peak_phase),
                       r.dry.peak_label.empty() ? "" : ", at " + r.dry.peak_label, r.dry.seconds);
    if (r.measured)
      out += fmt::format("; measured {} in {}{}", format_bytes(r.measured->total_peak),
                         phase_name(r.measured->peak_phase),
                         r.measured->peak_label.empty() ? "" : ", at " + r.measured->peak_label);
    out += "\n";
    if (r.measured && r.measured->device)
      out += "  measured on the GPU, at the end of the run (the pool still holds its peak):\n" +
             format_device_memory(*r.measured->device);
    if (r.fit) {
      const FitResult& f = *r.fit;
      bool fits = r.dry.total_peak <= f.limit;
      out += fmt::format(
          "  in {}{}: {} by {}; largest {}batch {} at {} {}; largest {} {} at batch {}\n",
          format_bytes(f.limit), per_rank(r.spec) ? " per rank" : "",
          fits ? "fits, spare" : "does NOT fit, short",
          format_bytes(std::abs(f.limit - r.dry.total_peak)), per_rank(r.spec) ? "global " : "",
          f.max_batch, r.spec.mode == BudgetMode::Train ? "seq" : "context",
          r.spec.mode == BudgetMode::Train ? r.spec.seq : r.spec.kv_capacity(),
          r.spec.mode == BudgetMode::Train ? "seq" : "context", f.max_seq, r.spec.batch);
    }
  }
  return out;
}

nlohmann::json budget_report_json(const std::vector<BudgetReport>& reports) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : reports) {
    const BudgetSpec& s = r.spec;
    nlohmann::json j = {
        {"mode", std::string(budget_mode_name(s.mode))},
        {"model", s.cfg.to_json()},
        {"batch", s.batch},
        {"nproc", s.nproc},
        {"zero", s.zero},
        {"rank", s.rank},
        {"local_batch", s.local_batch()},
        {"seq", s.seq},
        {"dtype", std::string(dtype_name(s.dtype))},
        {"weights", s.weights == GgufScheme::F32 ? std::string("float")
                                                 : std::string(gguf_scheme_name(s.weights))},
        {"optimizer", s.adamw ? "adamw" : "sgd"},
        {"recompute", s.recompute},
        {"loss_chunk_rows", s.loss_chunk_rows},
        {"simulate", s.simulate == DeviceType::CUDA ? "cuda" : "cpu"},
        {"analytic", figures_json(r.analytic)},
        {"dry_run", figures_json(r.dry)}};
    if (s.mode == BudgetMode::Infer) {
      j["context"] = s.kv_capacity();
      j["decode_steps"] = s.decodes();
    }
    if (r.measured) j["measured"] = figures_json(*r.measured);
    if (r.fit)
      j["fit"] = {{"limit", r.fit->limit},
                  {"fits", r.dry.total_peak <= r.fit->limit},
                  {"max_batch", r.fit->max_batch},
                  {s.mode == BudgetMode::Train ? "max_seq" : "max_context", r.fit->max_seq}};
    arr.push_back(j);
  }
  return arr;
}

std::string budget_svg(const std::vector<BudgetReport>& reports,
                       const std::vector<MemEvent>& timeline) {
  const int W = 960, H = 420, top = 40, bottom = 360, left = 90;
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">)"
      "\n",
      W, 2 * H);
  svg += fmt::format(R"(<rect width="{}" height="{}" fill="white"/>)"
                     "\n",
                     W, 2 * H);
  // Chart 1: stacked bars, one per mode, by row (dry run at the peak).
  std::int64_t ymax = 1;
  for (const auto& r : reports) ymax = std::max(ymax, r.dry.total_peak);
  for (const auto& r : reports)
    if (r.fit) ymax = std::max(ymax, r.fit->limit);
  auto y_of = [&](double v) { return bottom - (bottom - top) * v / static_cast<double>(ymax); };
  svg += fmt::format(
      R"(<text x="{}" y="20" font-size="14">Memory at the peak by category (dry run): {}</text>)"
      "\n",
      left, xml_escape(reports.empty() ? "" : reports.front().spec.cfg.name));
  for (int t = 0; t <= 4; ++t) {
    double v = static_cast<double>(ymax) * t / 4;
    svg += fmt::format(
        R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/><text x="{}" y="{:.1f}" text-anchor="end">{}</text>)"
        "\n",
        left, left + 400, y_of(v), y_of(v), left - 5, y_of(v) + 4,
        format_bytes(static_cast<std::int64_t>(v)));
  }
  for (std::size_t k = 0; k < reports.size(); ++k) {
    const auto& r = reports[k];
    double x = left + 40 + 180.0 * static_cast<double>(k), acc = 0;
    for (std::size_t i = 0; i < kNumBudgetRows; ++i) {
      double v = static_cast<double>(r.dry.at_peak[i]);
      if (v <= 0) continue;
      svg += fmt::format(
          R"(<rect x="{:.1f}" y="{:.1f}" width="100" height="{:.2f}" fill="{}"><title>{}: {}</title></rect>)"
          "\n",
          x, y_of(acc + v), y_of(acc) - y_of(acc + v), row_color(i),
          budget_row_name(static_cast<BudgetRow>(i)), format_bytes(r.dry.at_peak[i]));
      acc += v;
    }
    svg += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle">{} ({})</text>)"
                       "\n",
                       x + 50, bottom + 16, budget_mode_name(r.spec.mode),
                       format_bytes(r.dry.total_peak));
    if (r.fit)
      svg += fmt::format(
          R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="red" stroke-dasharray="4"/><text x="{}" y="{:.1f}" fill="red">{}</text>)"
          "\n",
          left, left + 400, y_of(static_cast<double>(r.fit->limit)),
          y_of(static_cast<double>(r.fit->limit)), left + 405,
          y_of(static_cast<double>(r.fit->limit)) + 4, format_bytes(r.fit->limit));
  }
  for (std::size_t i = 0; i < kNumBudgetRows; ++i) {
    svg += fmt::format(
        R"(<rect x="{}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>)"
        "\n",
        left + 520, top + 16 * static_cast<int>(i), row_color(i), left + 535,
        top + 9 + 16 * static_cast<int>(i), budget_row_name(static_cast<BudgetRow>(i)));
  }
  // Chart 2: timeline of one training step, stacked by category.
  const int y0 = H;
  svg += fmt::format(
      R"(<text x="{}" y="{}" font-size="14">One training step on the meta device: allocated bytes by category per allocation event</text>)"
      "\n",
      left, y0 + 20);
  if (timeline.empty()) {
    svg += fmt::format(
        R"(<text x="{}" y="{}">(no training timeline: run with --mode train or both)</text>)"
        "\n",
        left, y0 + 60);
  } else {
    // Current bytes per category after each event, sampled to at most 800 columns.
    CategoryBytes cur{};
    std::vector<CategoryBytes> samples;
    std::vector<Phase> phases;
    const std::size_t n = timeline.size(), cols = std::min<std::size_t>(n, 800);
    std::int64_t tmax = 1;
    std::size_t next = 0;
    // Baseline: the events are deltas from the run's start, so the sum is the run's total.
    for (std::size_t k = 0; k < n; ++k) {
      cur[static_cast<std::size_t>(timeline[k].category)] += timeline[k].delta;
      std::int64_t tot = 0;
      for (auto v : cur) tot += v;
      tmax = std::max(tmax, tot);
      if (k * cols / n >= next || k + 1 == n) {
        samples.push_back(cur);
        phases.push_back(timeline[k].phase);
        next = k * cols / n + 1;
      }
    }
    const double pw = 760, pb = y0 + bottom, pt = y0 + top;
    auto py = [&](double v) { return pb - (pb - pt) * v / static_cast<double>(tmax); };
    auto px = [&](std::size_t k) {
      return left + pw * static_cast<double>(k) /
                        static_cast<double>(std::max<std::size_t>(samples.size() - 1, 1));
    };
    for (int t = 0; t <= 4; ++t) {
      double v = static_cast<double>(tmax) * t / 4;
      svg += fmt::format(
          R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/><text x="{}" y="{:.1f}" text-anchor="end">{}</text>)"
          "\n",
          left, left + pw, py(v), py(v), left - 5, py(v) + 4,
          format_bytes(static_cast<std::int64_t>(v)));
    }
    std::vector<double> lower(samples.size(), 0.0);
    for (std::size_t ci = 0; ci < kNumMemCategories; ++ci) {
      bool any = false;
      for (const auto& s : samples) any = any || s[ci] != 0;
      if (!any) continue;
      std::string pts;
      for (std::size_t k = 0; k < samples.size(); ++k)
        pts += fmt::format("{:.1f},{:.1f} ", px(k),
                           py(lower[k] + static_cast<double>(samples[k][ci])));
      for (std::size_t k = samples.size(); k-- > 0;) {
        pts += fmt::format("{:.1f},{:.1f} ", px(k), py(lower[k]));
        lower[k] += static_cast<double>(samples[k][ci]);
      }
      auto row = static_cast<std::size_t>(budget_row_of(static_cast<MemCategory>(ci)));
      svg +=
          fmt::format(R"(<polygon points="{}" fill="{}" stroke="none"><title>{}</title></polygon>)"
                      "\n",
                      pts, row_color(row), mem_category_name(static_cast<MemCategory>(ci)));
    }
    // Phase boundaries.
    for (std::size_t k = 1; k < phases.size(); ++k)
      if (phases[k] != phases[k - 1])
        svg += fmt::format(
            R"(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2}" stroke="#333" stroke-dasharray="2"/><text x="{3:.1f}" y="{4}">{5}</text>)"
            "\n",
            px(k), pt, pb, px(k) + 3, pt + 10, phase_name(phases[k]));
    svg += fmt::format(R"(<text x="{}" y="{}">allocation events ({} in all) →</text>)"
                       "\n",
                       left + 300, pb + 20, n);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace kiln::models
