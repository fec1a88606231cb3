// kiln budget: the dry run and the measured run (one code path, two devices),
// the fit search and size parsing. The analytic model is in budget_analytic.cpp,
// the report (text, JSON, SVG) in budget_report.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>

#include "autograd/engine.h"
#include "budget/budget.h"
#include "distributed/shard.h"
#include "kernels/cuda/runtime.h"
#include "models/decoder.h"
#include "models/param_count.h"
#include "models/train_step.h"
#include "nn/optim.h"
#include "tensor/caching_allocator.h"
#include "tensor/op_args.h"
#include "tensor/storage.h"

namespace kiln::models {

std::string_view budget_mode_name(BudgetMode m) {
  return m == BudgetMode::Train ? "train" : "infer";
}

std::string_view budget_row_name(BudgetRow r) {
  switch (r) {
    case BudgetRow::Weights:
      return "weights";
    case BudgetRow::MasterWeights:
      return "master weights";
    case BudgetRow::Gradients:
      return "gradients";
    case BudgetRow::OptimizerState:
      return "optimizer state";
    case BudgetRow::Activations:
      return "activations";
    case BudgetRow::KVCache:
      return "kv cache";
    case BudgetRow::Temporaries:
      return "temporaries";
    case BudgetRow::Logits:
      return "logits+loss";
    case BudgetRow::Inputs:
      return "inputs";
    case BudgetRow::Runtime:
      return "runtime";
    case BudgetRow::Slack:
      return "allocator slack";
    case BudgetRow::Unattributed:
      return "unattributed";
    case BudgetRow::Count:
      break;
  }
  return "?";
}

BudgetRow budget_row_of(MemCategory c) {
  switch (c) {
    case MemCategory::Weights:
      return BudgetRow::Weights;
    case MemCategory::MasterWeights:
      return BudgetRow::MasterWeights;
    case MemCategory::Gradients:
      return BudgetRow::Gradients;
    case MemCategory::OptimizerState:
      return BudgetRow::OptimizerState;
    case MemCategory::Activations:
      return BudgetRow::Activations;
    case MemCategory::KVCache:
      return BudgetRow::KVCache;
    case MemCategory::Logits:
      return BudgetRow::Logits;
    case MemCategory::Temporaries:
      return BudgetRow::Temporaries;
    case MemCategory::Inputs:
      return BudgetRow::Inputs;
    case MemCategory::Runtime:
      return BudgetRow::Runtime;
    case MemCategory::Count:
      break;
  }
  fail("[budget] unknown memory category {}", static_cast<int>(c));
}

std::int64_t BudgetSpec::decodes() const {
  return std::max<std::int64_t>(0, std::min(decode_steps, kv_capacity() - seq));
}

void BudgetSpec::validate() const {
  cfg.validate();
  KILN_CHECK(batch > 0 && seq > 0, "[budget] batch ({}) and seq ({}) must be > 0", batch, seq);
  KILN_CHECK(decode_steps >= 0, "[budget] decode steps must be >= 0");
  KILN_CHECK(loss_chunk_rows >= 0, "[budget] loss chunk rows ({}) must be >= 0", loss_chunk_rows);
  KILN_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "[budget] dtype must be f32, bf16 or f16, got {}", dtype_name(dtype));
  KILN_CHECK(simulate != DeviceType::Meta, "[budget] cannot simulate the meta device");
  KILN_CHECK(nproc >= 1 && nproc <= kMaxBudgetRanks, "[budget] --nproc {} is out of range [1, {}]",
             nproc, kMaxBudgetRanks);
  KILN_CHECK(zero >= 0 && zero <= kMaxZeroStage, "[budget] --zero {} is not a ZeRO stage (0 to {})",
             zero, kMaxZeroStage);
  KILN_CHECK(rank >= 0 && rank < nproc, "[budget] rank {} is not in [0, {})", rank, nproc);
  KILN_CHECK(mode == BudgetMode::Train || (nproc == 1 && zero == 0),
             "[budget] --nproc and --zero budget a training step (data parallel, ZeRO): use --mode "
             "train");
  KILN_CHECK(batch % nproc == 0,
             "[budget] global --batch {} is not divisible by --nproc {}: every rank runs batch / "
             "nproc rows",
             batch, nproc);
  KILN_CHECK(weights == GgufScheme::F32 || mode == BudgetMode::Infer,
             "[budget] --weights {}: quantized weights are for inference (kiln trains float "
             "weights); use --mode infer",
             gguf_scheme_name(weights));
  if (mode == BudgetMode::Train) {
    KILN_CHECK(seq <= cfg.max_seq_len, "[budget] --seq {} exceeds the model's context of {}", seq,
               cfg.max_seq_len);
  } else {
    KILN_CHECK(kv_capacity() >= seq,
               "[budget] --context {} is shorter than the prompt of {} tokens", kv_capacity(), seq);
    KILN_CHECK(kv_capacity() <= cfg.max_seq_len,
               "[budget] context {} exceeds the model's max_seq_len {} (lower --seq or --context)",
               kv_capacity(), cfg.max_seq_len);
  }
}

// ---- the run: dry (meta) or measured -----------------------------------------------

namespace {

class TimelineScope {
 public:
  TimelineScope(MemoryTracker& t, bool on) : t_(t), on_(on) {
    if (on_) t_.set_timeline(true);
  }
  ~TimelineScope() {
    if (on_) t_.set_timeline(false);
  }

 private:
  MemoryTracker& t_;
  bool on_;
};

// Token ids: zeros (valid for any vocab; values never change the allocations).
Tensor token_ids(std::int64_t b, std::int64_t t, Device device) {
  MemoryScope scope(MemCategory::Inputs);
  return ops::zeros({b, t}, DType::I32, device);
}

// The gather unit of a parameter under ZeRO-3: its decoder layer ("model.layers.3."), or the
// parameter itself outside the layers.
std::string gather_unit(const std::string& name) {
  if (param_row_key(name) == name) return name;
  const std::size_t at = name.find("layers.");
  return name.substr(0, name.find('.', at + 7) + 1);
}

// One steady-state training step of rank s.rank of s.nproc under ZeRO stage s.zero, on its
// local batch: run_train_step (models/train_step.h), the step Trainer::step() runs, with the
// rank's optimizer and gradients set up as ZeRO stage s.zero keeps them. Under ZeRO-3 no rank holds
// the full weights: the model is built before the measured window (the constructor) and run()
// points every parameter at one gathered unit instead, restoring them at the end.
class TrainStep {
 public:
  TrainStep(const BudgetSpec& s, Device device) : s_(s), device_(device) {
    if (s.zero < 3) return;
    // Charged one reserve per tensor on the meta device, so the simulated CUDA pool of the
    // window starts empty, as a rank's that never allocates the full model.
    std::optional<MetaSimulatesScope> sim;
    if (device.is_meta()) sim.emplace(DeviceType::CPU);
    prebuilt_ = std::make_unique<DecoderModel>(s.cfg, 1234, s.dtype, device);
  }
  void run();

 private:
  const BudgetSpec& s_;
  Device device_;
  std::unique_ptr<DecoderModel> prebuilt_;
};

void TrainStep::run() {
  const BudgetSpec& s = s_;
  const Device device = device_;
  std::unique_ptr<DecoderModel> built;
  if (!prebuilt_) built = std::make_unique<DecoderModel>(s.cfg, 1234, s.dtype, device);
  DecoderModel& model = prebuilt_ ? *prebuilt_ : *built;
  model.recompute = s.recompute;
  model.loss_chunk_rows = s.loss_chunk_rows;
  model.train();
  auto named = model.named_parameters();

  // ZeRO-3: one flat buffer for the largest unit; each unit's parameters are consecutive views
  // of it (units overlap: the meta device holds no values). The full tensors stay alive outside
  // the window in `full`.
  std::vector<Tensor> full;
  std::unique_ptr<nn::Rope> outside_rope;
  if (s.zero == 3) {
    // The RoPE tables are the rank's own: made again inside the window.
    if (model.rope) {
      outside_rope = std::move(model.rope);
      model.rope =
          std::make_unique<nn::Rope>(model.cfg.max_seq_len, model.cfg.head_dim,
                                     model.cfg.rope_theta, model.cfg.rope_style, s.dtype, device);
    }
    std::map<std::string, std::int64_t> unit_numel;
    for (const auto& [name, p] : named) unit_numel[gather_unit(name)] += p.numel();
    std::int64_t largest = 0;
    for (const auto& [u, n] : unit_numel) largest = std::max(largest, n);
    Tensor gathered;
    {
      MemoryScope scope(MemCategory::Weights);
      gathered = Tensor::empty({largest}, s.dtype, device);
    }
    std::map<std::string, std::int64_t> unit_offset;
    for (auto& [name, p] : named) {
      full.push_back(p.detach());
      std::int64_t& off = unit_offset[gather_unit(name)];
      nn::assign_data(p, gathered.narrow(0, off, p.numel()).view(p.shape()));
      off += p.numel();
    }
  }
  // What the optimizer updates: each parameter's shard (dist::shard_range) from ZeRO-1 on, as a
  // view of the full parameter, or under ZeRO-3 the rank's own weight shard.
  std::vector<dist::ShardRange> ranges;
  std::vector<std::pair<std::string, Tensor>> updated;
  for (const auto& [name, p] : named) {
    if (s.zero == 0) {
      updated.emplace_back(name, p);
      continue;
    }
    ranges.push_back(dist::shard_range(p.numel(), s.rank, s.nproc));
    Tensor shard;
    if (s.zero == 3) {
      MemoryScope scope(MemCategory::Weights);
      shard = Tensor::empty({ranges.back().size()}, s.dtype, device);
    } else {
      shard = p.detach().flatten().narrow(0, ranges.back().begin, ranges.back().size());
    }
    updated.emplace_back(name, shard);
  }
  std::unique_ptr<nn::Optimizer> opt;
  if (s.adamw)
    opt = std::make_unique<nn::AdamW>(updated, nn::AdamWOptions{});
  else
    opt = std::make_unique<nn::Sgd>(updated, nn::SgdOptions{1e-2, 0.9});
  // Steady state: the previous step left every gradient allocated (zero_grad zeroes them, it
  // does not free them). From ZeRO-2 on a rank keeps gradient shards, and backward writes each
  // full gradient into one bucket the size of the largest parameter (every parameter's .grad is
  // a view of it) before it is reduce-scattered into the shards.
  {
    MemoryScope scope(MemCategory::Gradients);
    if (s.zero < 2) {
      for (auto& [name, p] : named) p.set_grad(ops::zeros_like(p));
    } else {
      std::int64_t largest = 0;
      for (const auto& [name, p] : named) largest = std::max(largest, p.numel());
      Tensor bucket = ops::zeros({largest}, s.dtype, device);
      for (auto& [name, p] : named) p.set_grad(bucket.narrow(0, 0, p.numel()).view(p.shape()));
    }
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      Tensor g = s.zero == 1
                     ? named[i].second.grad().flatten().narrow(0, ranges[i].begin, ranges[i].size())
                     : ops::zeros({ranges[i].size()}, s.dtype, device);
      updated[i].second.set_grad(g);
    }
  }
  Tensor x = token_ids(s.local_batch(), s.seq, device),
         y = token_ids(s.local_batch(), s.seq, device);
  // The trainer's step (models/train_step.h), with this rank's optimizer. Clipping reads the
  // gradients a rank holds (from ZeRO-2 on, its shards; the trainer sums their squares across
  // ranks).
  std::vector<Tensor> clipped;
  for (const auto& [name, t] : updated) clipped.push_back(t);
  models::TrainStepParts parts;
  parts.clip = [&] { return nn::clip_grad_norm(s.zero >= 2 ? clipped : model.parameters(), 1.0); };
  parts.update = [&] { opt->step(); };
  parts.zero_grad = [&] { opt->zero_grad(); };
  const models::TrainStepResult r = models::run_train_step(model, x, y, parts);
  KILN_CHECK(!r.skipped,
             "[budget] the measured step's loss ({}) or gradient norm ({}) is not "
             "finite: it made no update, so its figures would miss the optimizer's",
             r.loss, r.norm);
  for (auto& [name, p] : named) p.set_grad(Tensor());
  for (std::size_t i = 0; i < full.size(); ++i) nn::assign_data(named[i].second, full[i]);
  if (outside_rope) model.rope = std::move(outside_rope);
}

// The allocation pattern of generate_tokens (models/sampling.cpp), batched:
// the cache, a prefill of `seq` tokens, then one token per step; only the last
// position goes through the LM head. The next token is 0 (meta has no values;
// the values never change an allocation).
void infer_run(const BudgetSpec& s, Device device) {
  NoGradGuard no_grad;
  const std::unique_ptr<DecoderModel> built = inference_model(s.cfg, s.weights, s.dtype, device);
  DecoderModel& model = *built;
  model.eval();
  KVCache cache(s.cfg, s.batch, s.kv_capacity(), s.dtype, device);
  Tensor ids = token_ids(s.batch, s.seq, device);
  std::int64_t pos = 0;
  for (std::int64_t i = 0; i <= s.decodes(); ++i) {
    Tensor logits;
    {
      PhaseScope phase(i == 0 ? Phase::Prefill : Phase::Decode);
      MemoryScope scope(MemCategory::Activations);
      Tensor h = model.hidden(ids, pos, &cache);
      // (B, 1, C); contiguous() copies when B > 1 on every device alike.
      Tensor last = h.narrow(1, h.size(1) - 1, 1).contiguous();
      h = Tensor();
      MemLabelScope label("lm_head");
      MemoryScope logits_scope(MemCategory::Logits);
      logits = model.logits(last);
    }
    pos += ids.size(1);
    ids = Tensor();
    logits = Tensor();
    if (i < s.decodes()) ids = token_ids(s.batch, 1, device);
  }
}

}  // namespace

std::unique_ptr<DecoderModel> inference_model(const ModelConfig& c, GgufScheme weights, DType dtype,
                                              Device device) {
  if (weights == GgufScheme::F32) return std::make_unique<DecoderModel>(c, 1234, dtype, device);
  std::unique_ptr<DecoderModel> m = zero_model_as_stored(c, weights, dtype, device);
  // zero_model_as_stored builds a float skeleton on meta and replaces every parameter: on the
  // meta device (the dry run) those float tensors come and go in the tracker being read, a
  // moment no loader has (load_gguf_model's skeleton is on meta, its weights on the CPU or GPU).
  // The peaks restart from the model as stored, and the simulated cache (CUDA's allocator keeps
  // freed blocks) forgets the skeleton's blocks.
  if (device.is_meta()) {
    empty_meta_cuda_cache();
    MemoryTracker::get(device.type).reset_peaks();
  }
  return m;
}

bool simulates_native_dtype(const BudgetSpec& s) {
  // Every kernel the simulated backend runs in f32 and that some backend takes in s.dtype
  // (kernels f32 by design, as AdamW on its masters, count on none) must take s.dtype there too.
  const auto& regs = ops::registrations();
  auto has = [&](std::string_view kernel, DeviceType dev, DType dt, bool any_device) {
    return std::any_of(regs.begin(), regs.end(), [&](const ops::Registration& r) {
      return r.kernel == kernel && r.dtype == dt && (any_device || r.device == dev);
    });
  };
  for (const ops::Registration& r : regs)
    if (r.device == s.simulate && r.dtype == DType::F32 &&
        has(r.kernel, s.simulate, s.dtype, true) && !has(r.kernel, s.simulate, s.dtype, false))
      return false;
  return ops::find_kernel<ops::MatmulArgs>(s.simulate, s.dtype) != nullptr;
}

bool gemm_scratch_unmodelled(const BudgetSpec& s) {
  return s.simulate == DeviceType::CPU && (s.dtype == DType::BF16 || s.dtype == DType::F16) &&
         ops::find_kernel<ops::LinearArgs>(DeviceType::CPU, s.dtype) != nullptr;
}

BudgetFigures run_budget(const BudgetSpec& s, Device device, bool timeline) {
  s.validate();
  if (device.is_cuda()) {
    KILN_CHECK(cuda::compiled_with_cuda(),
               "[budget] --device {}: kiln was built without CUDA (-DKILN_CUDA=ON); use --device "
               "cpu",
               device.str());
    KILN_CHECK(device.index >= 0 && device.index < cuda::device_count(),
               "[budget] --device {}: no such CUDA device ({} found); use --device cpu",
               device.str(), cuda::device_count());
    cuda::set_device(device.index);
  }
  std::optional<MetaSimulatesScope> sim;
  if (device.is_meta()) sim.emplace(s.simulate);
  // Slack then counts only this run's cached blocks (on CPU, in the simulated
  // CUDA pool of a meta run, or in the device's pool).
  if (device.is_cpu()) empty_cpu_cache();
  if (device.is_meta()) empty_meta_cuda_cache();
  if (device.is_cuda()) cuda_caching_allocator(device.index).empty_cache();
  // Made before the baseline and freed after the figures: what a rank does not hold.
  std::optional<TrainStep> train;
  if (s.mode == BudgetMode::Train) train.emplace(s, device);
  auto& tracker = MemoryTracker::get(device.type);
  tracker.reset_peaks();
  const MemStats base = tracker.stats();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<MemEvent> events;
  {
    TimelineScope tl(tracker, timeline);
    if (train)
      train->run();
    else
      infer_run(s, device);
    if (timeline) events = tracker.timeline();  // cleared when the timeline is switched off
  }
  BudgetFigures f;
  f.timeline = std::move(events);
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MemStats st = tracker.stats();
  KILN_CHECK(st.total == base.total, "[budget] {} bytes still allocated after the run (a leak)",
             st.total - base.total);
  for (std::size_t i = 0; i < kNumMemCategories; ++i) {
    auto r = static_cast<std::size_t>(budget_row_of(static_cast<MemCategory>(i)));
    f.at_peak[r] += st.at_peak[i] - base.current[i];
    f.peak[r] += st.peak[i] - base.current[i];
  }
  f.total_peak = st.total_peak - base.total;
  f.peak_phase = st.peak_phase;
  f.peak_label = st.peak_label;
  const auto slack = static_cast<std::size_t>(BudgetRow::Slack);
  std::int64_t reserved = (st.reserved_peak - base.reserved) - f.total_peak;
  f.at_peak[slack] = f.peak[slack] = std::max<std::int64_t>(0, reserved);
  if (device.is_cuda()) {
    // The pool released nothing since the run began (empty_cache comes only before it, or on
    // an out-of-memory retry), so the driver now sees the segments of the reserved peak, and
    // the runtime's handles made during the run.
    cuda::device_synchronize();
    const DeviceMemoryRows d = cuda_device_memory(device.index);
    const auto runtime = static_cast<std::size_t>(BudgetRow::Runtime);
    const auto unattributed = static_cast<std::size_t>(BudgetRow::Unattributed);
    f.at_peak[runtime] += d.runtime();
    f.peak[runtime] += d.runtime();
    f.at_peak[unattributed] = f.peak[unattributed] = d.unattributed();
    f.device = d;
  }
  return f;
}

// ---- fit search and sizes ----------------------------------------------------------

namespace {

// Largest x in [lo, hi] with fits(x), given fits is monotone; lo - 1 if none.
template <typename P>
std::int64_t largest(std::int64_t lo, std::int64_t hi, P&& fits) {
  if (hi < lo || !fits(lo)) return lo - 1;
  // Grow the bracket from lo by doubling (a huge hi costs only log steps).
  std::int64_t good = lo, step = 1;
  while (good < hi) {
    std::int64_t next = std::min(hi, good + step);
    if (!fits(next)) {
      hi = next - 1;
      break;
    }
    good = next;
    step *= 2;
  }
  while (good < hi) {  // invariant: fits(good), and everything above hi fails
    std::int64_t mid = good + (hi - good + 1) / 2;
    if (fits(mid))
      good = mid;
    else
      hi = mid - 1;
  }
  return good;
}

}  // namespace

FitResult fit_budget(const BudgetSpec& s, std::int64_t limit) {
  KILN_CHECK(limit > 0, "[budget] the memory limit must be positive, got {}", limit);
  FitResult fr;
  fr.limit = limit;
  // The dry run decides (exact for kiln); it takes milliseconds per run.
  auto fits = [&](const BudgetSpec& t) {
    return run_budget(t, Device::meta()).total_peak <= limit;
  };
  // Training on several ranks searches the local batch: the global batch is a multiple of it.
  const std::int64_t ranks = s.mode == BudgetMode::Train ? s.nproc : 1;
  const std::int64_t kMaxBatch = std::int64_t{1} << 20;
  fr.max_batch = ranks * largest(1, kMaxBatch / ranks, [&](std::int64_t b) {
                   BudgetSpec t = s;
                   t.batch = b * ranks;
                   return fits(t);
                 });
  if (s.mode == BudgetMode::Train) {
    fr.max_seq = largest(1, s.cfg.max_seq_len, [&](std::int64_t n) {
      BudgetSpec t = s;
      t.seq = n;
      return fits(t);
    });
  } else {
    // The prompt fills the context: a prefill of (context - decode steps) tokens.
    const std::int64_t lo = std::max<std::int64_t>(1, s.decode_steps + 1);
    fr.max_seq = largest(lo, s.cfg.max_seq_len, [&](std::int64_t n) {
      BudgetSpec t = s;
      t.context = n;
      t.seq = std::max<std::int64_t>(1, n - s.decode_steps);
      return fits(t);
    });
    if (fr.max_seq < lo) fr.max_seq = 0;
  }
  return fr;
}

std::int64_t parse_bytes(std::string_view text) {
  std::string t(text);
  t.erase(std::remove_if(t.begin(), t.end(), [](unsigned char ch) { return std::isspace(ch); }),
          t.end());
  KILN_CHECK(!t.empty(), "[budget] empty size");
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    fail("[budget] '{}' is not a size (examples: 80GiB, 24GB, 512MiB, 1e9)", text);
  }
  std::string unit = t.substr(used);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 0;
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"b", 1},
                                                  {"kb", 1e3},
                                                  {"mb", 1e6},
                                                  {"gb", 1e9},
                                                  {"tb", 1e12},
                                                  {"k", 1024.0},
                                                  {"kib", 1024.0},
                                                  {"m", 1048576.0},
                                                  {"mib", 1048576.0},
                                                  {"g", 1073741824.0},
                                                  {"gib", 1073741824.0},
                                                  {"t", 1099511627776.0},
                                                  {"tib", 1099511627776.0}};
  for (const auto& [name, m] : units)
    if (unit == name) mult = m;
  KILN_CHECK(mult > 0, "[budget] unknown unit '{}' in '{}' (B, KB/MB/GB/TB, KiB/MiB/GiB/TiB)", unit,
             text);
  const double bytes = v * mult;
  KILN_CHECK(std::isfinite(bytes) && bytes >= 1 && bytes < 9.0e18,
             "[budget] size '{}' is out of range", text);
  return static_cast<std::int64_t>(std::llround(bytes));
}

}  // namespace kiln::models
