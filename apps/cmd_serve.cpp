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
#include <optional>
#include <thread>

#include "apps/commands.h"
#include "apps/flags.h"
#include "models/generation_config.h"
#include "models/io/qwen_tokenizer.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "serve/kv_pool.h"
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

double gib(std::int64_t b) { return static_cast<double>(b) / (1 << 30); }

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
  src.dtype = resolve_train_dtype(o.dtype, src.device, "serve");
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
  fmt::print(stderr, "kiln serve: listening on http://{}:{} (loading the model; /health is 503)\n",
             o.host, port);

  models::LoadedModel m = models::load_model(src);
  KILN_CHECK(m.tokenizer != nullptr, "[serve] the model has no tokenizer (give --tokenizer)");
  const models::ModelConfig& c = m.model->cfg;
  serve::EngineOptions eo;
  eo.max_seqs = o.max_seqs;
  eo.context = o.context == 0 ? c.max_seq_len : o.context;
  eo.block_size = o.block_size;
  eo.max_queue = o.max_queue;
  eo.max_batch_tokens = std::max(o.max_batch_tokens, o.max_seqs);
  const std::int64_t block_bytes = serve::kv_block_bytes(c, o.block_size, m.model->dtype());
  const std::int64_t per_seq = (eo.context + o.block_size - 1) / o.block_size;
  eo.num_blocks = o.kv_gb > 0 ? static_cast<std::int64_t>(o.kv_gb * (1 << 30)) / block_bytes
                              : eo.max_seqs * per_seq;
  KILN_CHECK(eo.num_blocks >= per_seq,
             "[serve] --kv-gb {} holds {} blocks of {} bytes ({} layers x 2 x {} positions x {} kv "
             "heads x {} dims x {} bytes); one full context of {} needs {}",
             o.kv_gb, eo.num_blocks, block_bytes, c.n_layers, o.block_size, c.n_kv_heads,
             c.head_dim, dtype_size(m.model->dtype()), eo.context, per_seq);
  serve::Engine engine(*m.model, eo);

  // The serving budget, before the first request.
  const MemStats st = MemoryTracker::get(src.device.type).stats();
  // Weights used in place from a file mapping are in `mapped`, not in an allocator's figures.
  const std::int64_t weights = st.current[static_cast<int>(MemCategory::Weights)] +
                               st.mapped[static_cast<int>(MemCategory::Weights)];
  const std::int64_t kv = st.current[static_cast<int>(MemCategory::KVCache)];
  fmt::print(stderr,
             "serving budget ({}):\n  weights   {:10.3f} GiB\n  KV pool   {:10.3f} GiB  ({} blocks "
             "of {} positions, {} bytes each; {} sequences of the full context {} fit, {} run at "
             "once)\n  total     {:10.3f} GiB (allocated so far, all categories: {:.3f} GiB)\n",
             src.device.str(), gib(weights), gib(kv), eo.num_blocks, o.block_size, block_bytes,
             eo.num_blocks / per_seq, eo.context, eo.max_seqs, gib(weights + kv),
             gib(st.total + st.mapped_total));

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
  http.join();
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
  s->add_option("--context", o->context,
                "Positions per sequence (default: the model's max_position_embeddings)")
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
  s->add_option("--dtype", o->dtype, "auto | f32 | bf16")->capture_default_str();
  return [o] { return run_serve(*o); };
}

}  // namespace kiln::apps
