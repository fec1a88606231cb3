// kiln serve: an OpenAI-compatible server over continuous batching and a paged KV cache
// (serve/). The HTTP port is bound first, so /health answers 503 while the model loads; the
// serving budget (weights, the KV pool and how many full contexts it holds) is printed before the
// first request is accepted. SIGTERM or SIGINT stops accepting, lets every running request finish,
// and exits 0.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "apps/commands.h"
#include "apps/flags.h"
#include "kernels/cuda/runtime.h"
#include "models/generation_config.h"
#include "models/io/qwen_tokenizer.h"
#include "models/param_count.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "serve/kv_pool.h"
#include "serve/serve_budget.h"
#include "tensor/memory.h"

namespace kiln::apps {

namespace {

struct ServeCmd {
  std::string model, config, tokenizer, host = "127.0.0.1", dtype = "auto", device = "cpu";
  std::string name;
  bool random_weights = false;
  std::uint64_t weights_seed = 0;
  int port = 8080, threads = 64;
  std::int64_t max_seqs = 8, context = 0, block_size = 16, max_queue = 64, max_batch_tokens = 256,
               max_tokens = 256;
  double kv_gb = 0;
  std::size_t max_body_kb = 1024;
};

int run_serve(const ServeCmd& o) {
  // Signals go to the waiting thread below, never to a worker.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  models::ModelSource src;
  src.model = o.model;
  src.config = o.config;
  src.random_weights = o.random_weights;
  src.weights_seed = o.weights_seed;
  src.tokenizer = o.tokenizer;
  src.device = resolve_device(o.device, "serve");
  const DTypeChoice dtype_choice = choose_inference_dtype(o.dtype, src.device, "serve");
  src.dtype = dtype_choice.dtype;
  if (!dtype_choice.why.empty())
    fmt::print(stderr, "dtype auto: {} ({})\n", dtype_name(src.dtype), dtype_choice.why);
  KILN_CHECK(o.random_weights || !o.model.empty(),
             "[serve] give --model DIR|file.gguf, or --random-weights --config config.json");
  KILN_CHECK(!(o.random_weights && !o.model.empty()),
             "[serve] --model and --random-weights exclude each other");

  serve::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.threads = o.threads;
  so.max_body_bytes = o.max_body_kb * 1024;
  so.default_max_tokens = o.max_tokens;
  if (!o.name.empty())
    so.model_name = o.name;
  else if (!o.model.empty())
    so.model_name = std::filesystem::path(o.model).filename().string().empty()
                        ? std::filesystem::path(o.model).parent_path().filename().string()
                        : std::filesystem::path(o.model).filename().string();
  else
    so.model_name = std::filesystem::path(o.config).parent_path().filename().string();
  if (so.model_name.empty()) so.model_name = "kiln";
  serve::HttpServer server(so);
  const int port = server.bind();
  std::thread http([&] { server.listen(); });
  // However run_serve leaves (a refused budget, a bad model), the HTTP thread stops first.
  struct StopOnExit {
    serve::HttpServer& server;
    std::thread& http;
    ~StopOnExit() {
      server.stop();
      if (http.joinable()) http.join();
    }
  } stop_on_exit{server, http};
  fmt::print(stderr, "kiln serve: listening on http://{}:{} (loading the model; /health is 503)\n",
             o.host, port);

  // The budget before the weights are read: from config.json alone (a dry run on the meta
  // device), refused with its arithmetic when it cannot fit in the memory available.
  const std::int64_t available = available_memory(src.device);
  auto spec_of = [&](const models::ModelConfig& c) {
    serve::ServeBudgetSpec ss;
    ss.cfg = c;
    ss.dtype = src.dtype;
    ss.seqs = o.max_seqs;
    // Default: 4096 positions (as llama-server's), or fewer when the model has fewer: a full
    // max_position_embeddings (40960 for Qwen3) per sequence rarely fits --max-seqs times.
    ss.context = o.context > 0 ? o.context : std::min<std::int64_t>(4096, c.max_seq_len);
    ss.block_size = o.block_size;
    ss.max_batch_tokens = std::max(o.max_batch_tokens, o.max_seqs);
    ss.simulate = src.device.type == DeviceType::CUDA ? DeviceType::CUDA : DeviceType::CPU;
    if (o.kv_gb > 0) {
      const serve::ServeBudgetSpec r = ss.resolved();
      ss.num_blocks = static_cast<std::int64_t>(o.kv_gb * (1 << 30)) /
                      serve::kv_block_bytes(c, r.block_size, ss.dtype);
      KILN_CHECK(ss.num_blocks >= r.blocks_per_seq(),
                 "[serve] --kv-gb {} holds {} blocks of {} bytes; one full context of {} needs {}",
                 o.kv_gb, ss.num_blocks, serve::kv_block_bytes(c, r.block_size, ss.dtype),
                 r.context, r.blocks_per_seq());
    }
    return ss.resolved();
  };
  const std::string cfg_spec = o.random_weights ? o.config : o.model;
  std::optional<serve::ServeBudgetSpec> early;
  if (std::filesystem::is_directory(cfg_spec) || cfg_spec.ends_with(".json"))
    early = spec_of(models::resolve_model_config(cfg_spec));
  std::optional<serve::ServeBudget> analytic, dry;
  if (early) {
    analytic = serve::serve_budget_analytic(*early);
    dry = serve::serve_budget_run(*early, Device::meta());
    KILN_CHECK(available <= 0 || dry->total <= available,
               "[serve] this configuration needs {} (weights {} + KV pool {} for {} sequences of "
               "{} + activations {} + runtime {}) but {} has {} available: lower --max-seqs, "
               "--context or --kv-gb",
               format_bytes(dry->total), format_bytes(dry->weights), format_bytes(dry->kv_pool),
               early->seqs, early->context, format_bytes(dry->activations),
               format_bytes(dry->runtime), src.device.str(), format_bytes(available));
  }

  models::LoadedModel m = models::load_model(src);
  KILN_CHECK(m.tokenizer != nullptr, "[serve] the model has no tokenizer (give --tokenizer)");
  serve::ServeBudgetSpec ss = early ? *early : spec_of(m.model->cfg);
  // A GGUF model that kept its weights quantized: the budget takes the scheme its Linear weights
  // follow (kiln's rule for it; a file from another converter may hold a few tensors in other
  // types, which the "held now" column shows).
  if (!early) ss.weights = models::kept_scheme(*m.model);
  if (!early) {
    analytic = serve::serve_budget_analytic(ss);
    dry = serve::serve_budget_run(ss, Device::meta());
  }
  serve::EngineOptions eo;
  eo.max_seqs = ss.seqs;
  eo.context = ss.context;
  eo.block_size = ss.block_size;
  eo.num_blocks = ss.num_blocks;
  eo.max_queue = o.max_queue;
  eo.max_batch_tokens = ss.max_batch_tokens;
  serve::Engine engine(*m.model, eo);

  // What the process holds now, beside the analytic and dry-run figures (weights used in place
  // from a file mapping are in `mapped`, not in an allocator's figures).
  const MemStats st = MemoryTracker::get(src.device.type).stats();
  auto held = [&](MemCategory c) {
    const auto i = static_cast<std::size_t>(c);
    return st.current[i] + st.mapped[i];
  };
  serve::ServeBudget now;
  now.weights = held(MemCategory::Weights);
  now.kv_pool = held(MemCategory::KVCache);
  now.runtime = held(MemCategory::Runtime);
  now.total = st.total + st.mapped_total;
  fmt::print(stderr, "{}",
             serve::serve_budget_text(ss, *analytic, *dry, now, available, "held now"));
  if (m.model->cfg.vocab_size != ss.cfg.vocab_size || m.model->dtype() != ss.dtype)
    fmt::print(stderr, "(the loaded model computes in {}; the budget assumed {})\n",
               dtype_name(m.model->dtype()), dtype_name(ss.dtype));

  std::vector<std::int32_t> eos = m.generation.eos_token_ids;
  if (const auto* q = dynamic_cast<const io::QwenTokenizer*>(m.tokenizer.get())) {
    const std::int32_t im_end = q->token_to_id("<|im_end|>");
    if (im_end >= 0 && std::find(eos.begin(), eos.end(), im_end) == eos.end())
      eos.push_back(im_end);
  }
  if (eos.empty() && m.tokenizer->eos_id() >= 0) eos.push_back(m.tokenizer->eos_id());
  engine.start();
  server.attach(*m.tokenizer, engine, eos);
  fmt::print(stderr, "kiln serve: ready ({}); stop with SIGTERM or Ctrl-C\n", m.description);

  int sig = 0;
  sigwait(&sigs, &sig);
  fmt::print(stderr, "kiln serve: signal {}: finishing {} running and {} queued requests\n", sig,
             engine.metrics().running, engine.metrics().queued);
  engine.drain_and_stop();
  server.stop();
  if (http.joinable()) http.join();
  fmt::print(stderr, "kiln serve: stopped\n");
  return 0;
}

}  // namespace

Run add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeCmd>();
  CLI::App* s = &app;
  s->add_option("--model", o->model, "Hugging Face model folder or a GGUF file");
  s->add_option("--config", o->config, "config.json (HF names) for --random-weights");
  s->add_flag("--random-weights", o->random_weights, "Seeded random weights for --config");
  s->add_option("--weights-seed", o->weights_seed, "Seed of --random-weights")
      ->capture_default_str();
  s->add_option("--tokenizer", o->tokenizer,
                "Tokenizer spec (qwen:DIR, ...); default: next to the model");
  s->add_option("--name", o->name, "Model id clients ask for (default: the folder's name)");
  s->add_option("--host", o->host, "Address to bind (loopback by default)")->capture_default_str();
  s->add_option("--port", o->port, "Port (0: any free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  s->add_option("--max-seqs", o->max_seqs, "Sequences decoding at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  s->add_option(
       "--context", o->context,
       "Positions per sequence (default: 4096, or the model's max_position_embeddings when "
       "smaller)")
      ->check(CLI::Range(std::int64_t{1}, models::kMaxPositions));
  s->add_option("--kv-gb", o->kv_gb, "KV pool size in GiB (default: --max-seqs full contexts)")
      ->check(CLI::Range(0.0, 1e6));
  s->add_option("--block-size", o->block_size, "KV positions per block")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  s->add_option("--max-queue", o->max_queue, "Waiting requests before 429")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  s->add_option("--max-batch-tokens", o->max_batch_tokens, "Rows per forward pass")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--max-tokens", o->max_tokens, "Default max_tokens of a request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  s->add_option("--threads", o->threads, "HTTP worker threads (open connections served at once)")
      ->capture_default_str()
      ->check(CLI::Range(2, 4096));
  s->add_option("--max-body-kb", o->max_body_kb, "Largest request body (413 above)")
      ->capture_default_str();
  s->add_option("--device", o->device, "cpu | cuda[:N]")->capture_default_str();
  s->add_option("--dtype", o->dtype,
                "auto (bf16 on cuda and on CPUs with AVX2 or better, else f32; printed with the "
                "reason) | f32 | bf16 | f16")
      ->capture_default_str();
  return [o] { return run_serve(*o); };
}

}  // namespace kiln::apps
