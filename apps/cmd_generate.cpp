// kiln generate: one prompt -> streamed text, then time to first token,
// prefill / decode tokens/s, bytes read per decoded token and memory by category.
// kiln chat: a multi-turn ChatML REPL on stdin that keeps its KV cache across turns.
//
// Both load through models::load_model (an HF folder, a llama2.c .bin, or
// --random-weights --config config.json) and generate through
// models::GenerationSession, the same path the golden tests check.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/flags.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/runtime.h"
#include "models/generation_config.h"
#include "models/io/qwen_tokenizer.h"
#include "models/sampling.h"
#include "tensor/caching_allocator.h"
#include "tensor/memory.h"

namespace kiln::apps {

namespace {

// Flags shared by generate and chat; optionals are unset when the flag is absent, so the
// defaults come from generation_config.json.
struct CommonOptions {
  std::string model, config, tokenizer, device = "cpu", dtype = "auto", attention = "auto";
  bool random_weights = false, dequantize = false;
  std::uint64_t weights_seed = 0, seed = 0;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<std::int64_t> top_k, max_new;
};

void add_common(CLI::App& app, CommonOptions& o) {
  app.add_option("--model", o.model,
                 "Hugging Face model folder, a GGUF file (.gguf: f32/f16/bf16 weights, or "
                 "q8_0/q4_k/q6_k ones, which stay quantized), or a llama2.c .bin");
  app.add_flag("--dequantize", o.dequantize,
               "GGUF: dequantize q8_0/q4_k/q6_k weights into --dtype at load (more memory; "
               "exact float matmuls instead of 8-bit activations)");
  app.add_option("--config", o.config, "config.json (HF names) for --random-weights");
  app.add_flag("--random-weights", o.random_weights,
               "Seeded random weights in --dtype for --config (no weight files needed)");
  app.add_option("--weights-seed", o.weights_seed, "Seed of --random-weights")
      ->capture_default_str()
      ->check(uint64_flag());
  app.add_option("--tokenizer", o.tokenizer,
                 "Tokenizer spec (qwen:DIR, llama2c:PATH, byte); default: next to the model");
  app.add_option("--max-new-tokens", o.max_new,
                 "Tokens to generate (default: "
                 "generation_config.json, else 256)")
      ->check(int_in(1, INT64_MAX));
  app.add_option("--temperature", o.temperature, "0: greedy (default: generation_config.json)")
      ->check(real_in(0, 1e6));
  app.add_option("--top-k", o.top_k, "Keep the k most likely tokens (0: all)")
      ->check(int_in(0, models::kMaxVocab));
  app.add_option("--top-p", o.top_p, "Nucleus sampling mass (1: off)")
      ->check(real_in(0, 1, /*lo_open=*/true));
  app.add_option("--min-p", o.min_p, "Drop tokens below min_p x the top probability (0: off)")
      ->check(real_in(0, 1));
  app.add_option("--repetition-penalty", o.repetition_penalty, "CTRL-style penalty (1: off)")
      ->check(real_in(0, 1e6, /*lo_open=*/true));
  app.add_option("--seed", o.seed, "Sampling seed")->capture_default_str()->check(uint64_flag());
  app.add_option("--device", o.device, "cpu | cuda[:N]")->capture_default_str();
  app.add_option("--dtype", o.dtype,
                 "auto (bf16 on cuda and on CPUs with AVX2 or better: decode runs at the "
                 "weights' bytes, and bf16 halves them; f32 below AVX2; printed with the reason) "
                 "| f32 | bf16 (weights and KV cache) | f16 (an f16 model's weights used in place, "
                 "exactly, widened by F16C)")
      ->capture_default_str();
  app.add_option("--attention", o.attention,
                 "CUDA attention: auto (cuDNN for training's shape, kiln's kernels for decode; "
                 "measured) | kiln | cudnn")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "kiln", "cudnn"}));
}

// The memory table of the device the model ran on; on CUDA with the runtime and unattributed
// rows (the driver's figure).
std::string memory_summary(Device d) {
  if (!d.is_cuda())
    return format_memory_summary(MemoryTracker::get(d.type).stats(), "memory (" + d.str() + ")");
  cuda::device_synchronize();
  const DeviceMemoryRows rows = cuda_device_memory(d.index);
  return format_memory_summary(
      MemoryTracker::get(DeviceType::CUDA).stats(),
      fmt::format("memory ({}, {})", d.str(), cuda::device_info(d.index).name), &rows);
}

models::LoadedModel load(const CommonOptions& o) {
  models::ModelSource src;
  src.model = o.model;
  src.config = o.config;
  src.random_weights = o.random_weights;
  src.weights_seed = o.weights_seed;
  src.tokenizer = o.tokenizer;
  src.device = resolve_device(o.device, "generate");
  const DTypeChoice dtype_choice = choose_inference_dtype(o.dtype, src.device, "generate");
  src.dtype = dtype_choice.dtype;
  if (!dtype_choice.why.empty())
    fmt::print(stderr, "dtype auto: {} ({})\n", dtype_name(src.dtype), dtype_choice.why);
  src.keep_quantized = !o.dequantize;
  KILN_CHECK(!o.dequantize || o.model.ends_with(".gguf"),
             "[generate] --dequantize applies to a .gguf --model only");
  set_attention_from_flag(o.attention, "generate");
  KILN_CHECK(o.random_weights || !o.model.empty(),
             "[generate] give --model DIR|file.bin, or --random-weights --config config.json");
  KILN_CHECK(!(o.random_weights && !o.model.empty()),
             "[generate] --model and --random-weights exclude each other");
  auto t0 = std::chrono::steady_clock::now();
  models::LoadedModel m = models::load_model(src);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::map<std::string, int> quantized;  // GGML type -> Linear weights of it
  for (const auto& [name, l] : m.model->linears())
    if (l->weight_quant) ++quantized[std::string(quant::quant_info(*l->weight_quant).name)];
  if (const auto& e = *m.model->model->embed_tokens; e.weight_quant)
    ++quantized[std::string(quant::quant_info(*e.weight_quant).name)];
  std::string qdesc;
  for (const auto& [q, n] : quantized)
    qdesc += fmt::format("{}{} {} weights", qdesc.empty() ? "" : ", ", n, q);
  fmt::print(stderr, "loaded {} in {:.2f} s ({}{}, {}{}, {} layers, vocab {}{})\n", m.description,
             s, dtype_name(src.dtype), qdesc.empty() ? "" : " with " + qdesc, o.device,
             src.device.is_cuda() ? "" : fmt::format(" (cpu isa {})", kiln::cpu::cpu_isa_summary()),
             m.model->cfg.n_layers, m.model->cfg.vocab_size,
             m.tokenizer ? fmt::format(", tokenizer {} ({} ids)", m.tokenizer->name(),
                                       m.tokenizer->vocab_size())
                         : ", no tokenizer");
  return m;
}

models::GenerateOptions generate_options(const CommonOptions& o, const models::LoadedModel& m) {
  const models::GenerationConfig& g = m.generation;
  models::GenerateOptions go;
  go.sampling = g.sampling(o.seed);
  if (o.temperature) go.sampling.temperature = *o.temperature;
  if (o.top_k) go.sampling.top_k = *o.top_k;
  if (o.top_p) go.sampling.top_p = *o.top_p;
  if (o.min_p) go.sampling.min_p = *o.min_p;
  if (o.repetition_penalty) go.sampling.repetition_penalty = *o.repetition_penalty;
  go.max_new_tokens = o.max_new ? *o.max_new : g.max_new_tokens.value_or(256);
  KILN_CHECK(go.max_new_tokens >= 1, "[generate] --max-new-tokens {} must be >= 1",
             go.max_new_tokens);
  go.eos_ids = g.eos_token_ids;
  if (m.tokenizer && m.tokenizer->vocab_size() < m.model->cfg.vocab_size)
    go.sample_limit = m.tokenizer->vocab_size();  // the padded ids have no text
  return go;
}

// Bytes a decode step reads at batch 1: every weight matrix once (the input embedding only its
// row, unless tied, when the LM head reads it whole), plus the keys and values of `ctx` positions.
struct DecodeBytes {
  double weights = 0, kv = 0;
};
DecodeBytes decode_bytes(const models::DecoderModel& m, double ctx) {
  DecodeBytes b;
  for (const auto& [name, p] : m.named_parameters()) {
    double bytes = static_cast<double>(p.nbytes());
    if (name == "model.embed_tokens.weight" && !m.cfg.tie_embeddings)
      bytes = static_cast<double>(p.nbytes()) / static_cast<double>(m.cfg.vocab_size);  // one row
    b.weights += bytes;
  }
  double esize = static_cast<double>(dtype_size(m.dtype()));
  b.kv = 2.0 * static_cast<double>(m.cfg.n_layers * m.cfg.kv_dim()) * esize * ctx;
  return b;
}

struct GenerateCmd {
  CommonOptions c;
  std::string prompt, prompt_ids;
  bool bandwidth = false;
};

int run_generate(const GenerateCmd& o) {
  KILN_CHECK(!o.prompt.empty() || !o.prompt_ids.empty(),
             "[generate] give --prompt TEXT or --prompt-ids 1,2,3");
  KILN_CHECK(o.prompt.empty() || o.prompt_ids.empty(),
             "[generate] --prompt and --prompt-ids exclude each other");
  models::LoadedModel m = load(o.c);
  const Device device = m.model->device();
  models::DecoderModel& model = *m.model;
  const io::Tokenizer* tok = m.tokenizer.get();
  std::vector<std::int32_t> ids;
  if (!o.prompt_ids.empty()) {
    ids = parse_token_ids(o.prompt_ids, "[generate] --prompt-ids");
    KILN_CHECK(!ids.empty(), "[generate] --prompt-ids is empty");
  } else {
    KILN_CHECK(tok,
               "[generate] --prompt needs a tokenizer: none was found next to the model; "
               "give --tokenizer SPEC or --prompt-ids");
    ids = tok->encode(o.prompt, /*bos=*/tok->bos_id() >= 0, false);
    KILN_CHECK(!ids.empty(), "[generate] the prompt encodes to no tokens");
  }
  const std::int64_t V = model.cfg.vocab_size, ctx_max = model.cfg.max_seq_len;
  for (auto id : ids)
    KILN_CHECK(id >= 0 && id < V,
               "[generate] prompt token id {} is out of range [0, {}) "
               "(vocab_size of the model)",
               id, V);
  auto P = static_cast<std::int64_t>(ids.size());
  KILN_CHECK(P < ctx_max,
             "[generate] the prompt has {} tokens; max_position_embeddings is {}, "
             "which leaves no room to generate",
             P, ctx_max);
  models::GenerateOptions go = generate_options(o.c, m);
  // P < ctx_max, so this never overflows, whatever --max-new-tokens is.
  std::int64_t context = P + std::min(go.max_new_tokens, ctx_max - P);
  models::GenerationSession session(model, context);

  std::optional<io::Utf8StreamDecoder> dec;
  if (tok) {
    dec.emplace(*tok);
    for (auto id : ids) std::cout << dec->push(id);  // the prompt, as the tokens spell it
  } else {
    for (auto id : ids) std::cout << id << ' ';
    std::cout << "|";
  }
  std::cout << std::flush;
  models::GenerationStats st = session.generate(ids, go, [&](std::int32_t id) {
    if (std::find(go.eos_ids.begin(), go.eos_ids.end(), id) != go.eos_ids.end())
      return true;  // the session stops there; EOS is not printed
    if (dec)
      std::cout << dec->push(id);
    else
      std::cout << ' ' << id;
    std::cout << std::flush;
    return true;
  });
  if (dec) std::cout << dec->flush();
  std::cout << std::endl;

  // Stats on stderr, so stdout is the text alone.
  const auto& sp = go.sampling;
  fmt::print(stderr,
             "\n--- {} prompt tokens, {} new (stop: {}); sampling: temperature {}, top_k {}, "
             "top_p {}, min_p {}, repetition_penalty {}, seed {}\n",
             st.prompt_tokens, st.new_tokens, models::stop_reason_name(st.stop), sp.temperature,
             sp.top_k, sp.top_p, sp.min_p, sp.repetition_penalty, sp.seed);
  fmt::print(stderr, "time to first token  {:10.1f} ms\n", st.ttft_s() * 1e3);
  fmt::print(stderr, "prefill              {:10.2f} tokens/s ({} tokens in {:.3f} s)\n",
             st.prefill_tokens_per_s(), st.prompt_tokens, st.prefill_s);
  fmt::print(stderr, "decode               {:10.2f} tokens/s ({} tokens in {:.3f} s)\n",
             st.decode_tokens_per_s(), std::max<std::int64_t>(st.new_tokens - 1, 0), st.decode_s);
  // Mean context a decode step attends over: from P+1 to P+new-1 tokens.
  double mean_ctx = static_cast<double>(P) + static_cast<double>(st.new_tokens) / 2.0;
  DecodeBytes b = decode_bytes(model, mean_ctx);
  double per_tok = b.weights + b.kv;
  fmt::print(stderr,
             "bytes read per decode token: {:.1f} MB weights + {:.2f} MB KV (mean context "
             "{:.0f}) = {:.1f} MB -> {:.2f} GB/s at the decode rate\n",
             b.weights / 1e6, b.kv / 1e6, mean_ctx, per_tok / 1e6,
             per_tok * st.decode_tokens_per_s() / 1e9);
  if (o.bandwidth && !device.is_cpu())
    fmt::print(stderr, "--bandwidth measures host memory: skipped for {}\n", device.str());
  if (o.bandwidth && device.is_cpu()) {
    const kiln::cpu::Bandwidth bw = kiln::cpu::measure_bandwidth();
    fmt::print(stderr,
               "memory bandwidth ({} MB buffers, {} threads): copy {:.2f} GB/s, read "
               "{:.2f} GB/s; decode reaches {:.0f}% of read bandwidth\n",
               bw.bytes >> 20, bw.threads, bw.copy_gbs, bw.read_gbs,
               100.0 * per_tok * st.decode_tokens_per_s() / 1e9 / bw.read_gbs);
  }
  fmt::print(stderr, "{}", memory_summary(device));
  return 0;
}

struct ChatCmd {
  CommonOptions c;
  bool think = true;
  std::string system;
  std::int64_t context = 4096;
};

int run_chat(const ChatCmd& o) {
  models::LoadedModel m = load(o.c);
  const auto* tok = dynamic_cast<const io::QwenTokenizer*>(m.tokenizer.get());
  KILN_CHECK(tok,
             "[chat] needs a Qwen tokenizer (ChatML): tokenizer.json or vocab.json + "
             "merges.txt next to the model, or --tokenizer qwen:DIR");
  std::int32_t im_end = tok->token_to_id("<|im_end|>");
  KILN_CHECK(tok->token_to_id("<|im_start|>") >= 0 && im_end >= 0,
             "[chat] the tokenizer has no <|im_start|> / <|im_end|> tokens");
  models::GenerateOptions go = generate_options(o.c, m);
  if (std::find(go.eos_ids.begin(), go.eos_ids.end(), im_end) == go.eos_ids.end())
    go.eos_ids.push_back(im_end);
  std::int64_t context = std::min(o.context, m.model->cfg.max_seq_len);
  models::GenerationSession session(*m.model, context);
  const std::string assistant =
      std::string("<|im_start|>assistant\n") + (o.think ? "" : "<think>\n\n</think>\n\n");
  const bool tty = ::isatty(0);
  auto fresh_prefix = [&] {
    return o.system.empty() ? std::string() : "<|im_start|>system\n" + o.system + "<|im_end|>\n";
  };
  std::string history_prefix = fresh_prefix();  // text owed to the template before the next turn
  std::string line;
  int turn = 0;
  while (true) {
    if (tty) std::cout << "\n> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      session.reset();
      history_prefix = fresh_prefix();
      std::cout << "(conversation reset)\n" << std::flush;
      continue;
    }
    std::string text = history_prefix + "<|im_start|>user\n" + line + "<|im_end|>\n" + assistant;
    std::vector<std::int32_t> ids = tok->encode(text);
    if (static_cast<std::int64_t>(session.tokens().size() + ids.size()) >= context) {
      // No room left: start over with this turn alone (re-prefill).
      fmt::print(stderr, "[chat] context of {} tokens is full: starting a new conversation\n",
                 context);
      session.reset();
      history_prefix = fresh_prefix();
      ids = tok->encode(history_prefix + "<|im_start|>user\n" + line + "<|im_end|>\n" + assistant);
    }
    io::Utf8StreamDecoder dec(*tok);
    std::int32_t last = -1;
    models::GenerationStats st;
    try {
      st = session.generate(ids, go, [&](std::int32_t id) {
        last = id;
        if (std::find(go.eos_ids.begin(), go.eos_ids.end(), id) != go.eos_ids.end()) return true;
        std::cout << dec.push(id) << std::flush;
        return true;
      });
    } catch (const Error& e) {  // e.g. a message longer than the context: the REPL goes on
      fmt::print(stderr, "error: {}\n(conversation reset)\n", e.what());
      session.reset();
      history_prefix = fresh_prefix();
      continue;
    }
    std::cout << dec.flush() << "\n" << std::flush;
    ++turn;
    // The pending token (fed next turn) ends the assistant message when it is <|im_end|>;
    // otherwise close the message ourselves.
    history_prefix = last == im_end ? "\n" : "<|im_end|>\n";
    fmt::print(stderr,
               "[turn {}: {} tokens prefilled, {} new (stop: {}), ttft {:.0f} ms, decode "
               "{:.2f} tokens/s, {} / {} context tokens used]\n",
               turn, st.prompt_tokens, st.new_tokens, models::stop_reason_name(st.stop),
               st.ttft_s() * 1e3, st.decode_tokens_per_s(), session.tokens().size(), context);
  }
  fmt::print(stderr, "{}", memory_summary(m.model->device()));
  return 0;
}

}  // namespace

Run add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateCmd>();
  add_common(app, o->c);
  app.add_option("--prompt", o->prompt, "Text to continue (needs a tokenizer)");
  app.add_option("--prompt-ids", o->prompt_ids, "Prompt as token ids: 1,2,3 (no tokenizer needed)");
  app.add_flag("--bandwidth", o->bandwidth,
               "Also measure memory bandwidth (STREAM-like copy and read) after generating");
  app.footer(models::hf_config_fields_help());
  return [o] { return run_generate(*o); };
}

Run add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatCmd>();
  add_common(app, o->c);
  app.add_flag("--think,!--no-think", o->think,
               "Qwen3 thinking (default on); --no-think adds the empty think block "
               "(enable_thinking=False)");
  app.add_option("--system", o->system, "System message");
  app.add_option("--context", o->context,
                 "KV cache size in tokens (capped at "
                 "max_position_embeddings)")
      ->capture_default_str()
      ->check(int_in(1, models::kMaxPositions));
  return [o] { return run_chat(*o); };
}

}  // namespace kiln::apps
