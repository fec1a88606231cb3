#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "models/io/json_limits.h"
#include "serve/openai.h"

namespace kiln::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A Prometheus histogram of seconds with fixed buckets.
class Histogram {
 public:
  void observe(double s) {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < kBounds.size(); ++i)
      if (s <= kBounds[i]) ++counts_[i];
    ++count_;
    sum_ += s;
  }
  std::string text(const std::string& name, const std::string& help) const {
    std::lock_guard lock(mu_);
    std::string out = fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
    for (std::size_t i = 0; i < kBounds.size(); ++i)
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
    out += fmt::format("{0}_bucket{{le=\"+Inf\"}} {1}\n{0}_sum {2}\n{0}_count {1}\n", name, count_,
                       sum_);
    return out;
  }

 private:
  static constexpr std::array<double, 11> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                     0.5,   1,    2.5,   5,    10};
  mutable std::mutex mu_;
  std::array<std::int64_t, 11> counts_{};
  std::int64_t count_ = 0;
  double sum_ = 0;
};

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server svr;
  std::atomic<const io::Tokenizer*> tok{nullptr};
  std::atomic<Engine*> engine{nullptr};
  Histogram ttft, itl;
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::int64_t> http_errors{0};
  std::vector<std::int32_t> eos_ids;  // written once, before `engine` is published
  std::mutex run_mu;                  // listen() against stop()
  bool stopping = false, entered = false;
  std::atomic<bool> done{false};
  int listen_fd = -1;  // the bound socket (set_socket_options sees it before bind)
};

// Connections the kernel queues before accept(). Debian's cpp-httplib is a shared library built
// with its default of 5 (CPPHTTPLIB_LISTEN_BACKLOG), so a burst of clients (32 streams of a
// bench, an agent's parallel calls) would wait out SYN retransmits: bind() listens again with
// this backlog (Linux updates the backlog of a listening socket).
constexpr int kListenBacklog = 512;

HttpServer::HttpServer(ServerOptions o) : impl_(std::make_unique<Impl>()), opt_(std::move(o)) {
  Impl& im = *impl_;
  httplib::Server& svr = im.svr;
  const int threads = opt_.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // SO_REUSEADDR only (a restart binds over TIME_WAIT connections). httplib's default adds
  // SO_REUSEPORT, which let a second server bind a port already served and take half its
  // connections; now that second bind fails.
  svr.set_socket_options([&im](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    im.listen_fd = sock;
  });
  svr.set_payload_max_length(opt_.max_body_bytes);
  svr.set_read_timeout(opt_.timeout_s, 0);
  svr.set_write_timeout(opt_.timeout_s, 0);
  svr.set_keep_alive_max_count(100);
  const ServerOptions& opt = opt_;

  // Errors httplib makes itself (413, 404 for unknown paths, 400 for bad HTTP) in OpenAI's form.
  svr.set_error_handler([&im](const httplib::Request&, httplib::Response& res) {
    ++im.http_errors;
    if (!res.body.empty()) return;
    const std::string msg = res.status == 413   ? "request body too large"
                            : res.status == 404 ? "no such endpoint"
                                                : fmt::format("HTTP error {}", res.status);
    send_json(
        res, res.status,
        error_body(HttpError(res.status, msg,
                             res.status == 404 ? "not_found_error" : "invalid_request_error")));
  });
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::rethrow_exception(ep);
        } catch (const HttpError& e) {
          send_json(res, e.status, error_body(e));
        } catch (const QueueFull& e) {
          send_json(res, 429, error_body(HttpError(429, e.what(), "rate_limit_error")));
        } catch (const std::exception& e) {
          // kiln's own checks (a prompt longer than the context, an id out of range): the
          // request is at fault.
          send_json(res, 400, error_body(HttpError(400, e.what())));
        }
      });

  auto ready = [&im] {
    if (!im.engine.load()) throw HttpError(503, "the model is loading", "service_unavailable");
    return std::pair<const io::Tokenizer&, Engine&>(*im.tok.load(), *im.engine.load());
  };
  auto parse = [&opt](const httplib::Request& req) {
    try {
      json j = io::parse_json_limited(req.body, "request body", {.max_bytes = opt.max_body_bytes});
      if (!j.is_object()) throw HttpError(400, "the request body must be a JSON object");
      if (j.contains("model") && !j["model"].is_null() &&
          (!j["model"].is_string() || j["model"].get<std::string>() != opt.model_name))
        throw HttpError(
            404,
            fmt::format("model '{}' is not served here (this server has '{}')",
                        j["model"].is_string() ? j["model"].get<std::string>() : j["model"].dump(),
                        opt.model_name),
            "invalid_request_error", "model", "model_not_found");
      return j;
    } catch (const HttpError&) {
      throw;
    } catch (const std::exception& e) {
      throw HttpError(400, e.what());
    }
  };

  svr.Get("/health", [&im](const httplib::Request&, httplib::Response& res) {
    const bool up = im.engine.load() != nullptr;
    send_json(res, up ? 200 : 503, {{"status", up ? "ok" : "loading"}});
  });
  svr.Get("/v1/models", [&opt](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", opt.model_name},
                                      {"object", "model"},
                                      {"created", unix_time()},
                                      {"owned_by", "kiln"}}})}});
  });
  svr.Get("/metrics", [&im](const httplib::Request&, httplib::Response& res) {
    EngineMetrics m;
    if (Engine* e = im.engine.load()) m = e->metrics();
    std::string out;
    auto counter = [&](const char* name, const char* help, std::int64_t v, const char* type) {
      out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, v);
    };
    counter("kiln_requests_total", "Requests accepted by the engine.", m.requests, "counter");
    counter("kiln_prompt_tokens_total", "Prompt tokens of accepted requests.", m.prompt_tokens,
            "counter");
    counter("kiln_generation_tokens_total", "Tokens sampled.", m.generated_tokens, "counter");
    counter("kiln_http_errors_total", "Responses with an error status made by the HTTP layer.",
            im.http_errors.load(), "counter");
    counter("kiln_kv_blocks_used", "KV cache blocks held by sequences.", m.blocks_used, "gauge");
    counter("kiln_kv_blocks_free", "KV cache blocks free.", m.blocks_free, "gauge");
    counter("kiln_kv_blocks_cached", "KV cache blocks only the prefix cache holds (evictable).",
            m.blocks_cached, "gauge");
    counter("kiln_prefix_cache_hit_tokens_total", "Prompt tokens reused from the prefix cache.",
            m.prefix_hit_tokens, "counter");
    counter("kiln_queue_length", "Requests waiting for a sequence slot.", m.queued, "gauge");
    counter("kiln_running_sequences", "Sequences in the continuous batch.", m.running, "gauge");
    counter("kiln_engine_iterations_total", "Forward passes of the engine.", m.iterations,
            "counter");
    out += im.ttft.text("kiln_time_to_first_token_seconds", "Time to first token.");
    out += im.itl.text("kiln_inter_token_latency_seconds", "Time between streamed tokens.");
    res.set_content(out, "text/plain; version=0.0.4");
  });
  svr.Post("/tokenize", [ready, parse](const httplib::Request& req, httplib::Response& res) {
    const json body = parse(req);
    // Plain references, not a structured binding: clang 14 (the fuzz build) cannot capture one.
    const auto loaded = ready();
    const io::Tokenizer& tok = loaded.first;
    Engine& engine = loaded.second;
    const json c = body.contains("content") ? body["content"] : body.value("prompt", json());
    if (!c.is_string())
      throw HttpError(400, "'content' must be a string", "invalid_request_error", "content");
    send_json(res, 200, {{"tokens", tok.encode(c.get<std::string>())}});
  });
  svr.Post("/detokenize", [ready, parse](const httplib::Request& req, httplib::Response& res) {
    const json body = parse(req);
    // Plain references, not a structured binding: clang 14 (the fuzz build) cannot capture one.
    const auto loaded = ready();
    const io::Tokenizer& tok = loaded.first;
    Engine& engine = loaded.second;
    if (!body.contains("tokens") || !body["tokens"].is_array())
      throw HttpError(400, "'tokens' must be an array of token ids", "invalid_request_error",
                      "tokens");
    std::vector<std::int32_t> ids;
    for (const json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
          t.get<std::int64_t>() >= tok.vocab_size())
        throw HttpError(400,
                        fmt::format("token {} is not an id in [0, {})", t.dump(), tok.vocab_size()),
                        "invalid_request_error", "tokens");
      ids.push_back(t.get<std::int32_t>());
    }
    send_json(res, 200, {{"content", tok.decode(ids)}});
  });

  // Both completion endpoints: prompt ids, sampling, then one response or an SSE stream.
  auto complete = [this, ready](json body, bool chat, httplib::Response& res) {
    Impl& im = *impl_;
    // Plain references, not a structured binding: clang 14 (the fuzz build) cannot capture one.
    const auto loaded = ready();
    const io::Tokenizer& tok = loaded.first;
    Engine& engine = loaded.second;
    std::vector<std::int32_t> prompt;
    std::vector<std::int32_t> stop_ids = im.eos_ids;
    if (chat) {
      const std::string text = qwen3_chat_prompt(parse_messages(body), enable_thinking(body));
      prompt = tok.encode(text);
    } else {
      const json& p = body.contains("prompt") ? body["prompt"] : json();
      if (p.is_string()) {
        prompt = tok.encode(p.get<std::string>());
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        prompt = tok.encode(p[0].get<std::string>());
      } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
        for (const json& t : p) {
          if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
              t.get<std::int64_t>() >= (std::int64_t{1} << 31))
            throw HttpError(400, "'prompt' token ids must be non-negative integers",
                            "invalid_request_error", "prompt");
          prompt.push_back(t.get<std::int32_t>());
        }
      } else {
        throw HttpError(400, "'prompt' must be a string, or an array of token ids",
                        "invalid_request_error", "prompt");
      }
    }
    SamplingParams params =
        sampling_from_body(body, chat, im.next_id.load() * 7919 + 17, opt_.default_max_tokens);
    // ignore_eos (vLLM's and llama.cpp's extension, for benchmarks): only max_tokens or a stop
    // string ends the request.
    if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
      if (!body["ignore_eos"].is_boolean())
        throw HttpError(400, "'ignore_eos' must be a boolean", "invalid_request_error",
                        "ignore_eos");
      if (body["ignore_eos"].get<bool>()) stop_ids.clear();
    }
    params.stop_ids = stop_ids;
    params.sample_limit = tok.vocab_size();
    const std::vector<std::string> stops = stop_strings(body);
    const bool stream = body.value("stream", false);
    const bool usage_in_stream = stream && body.contains("stream_options") &&
                                 body["stream_options"].is_object() &&
                                 body["stream_options"].value("include_usage", false);
    if (prompt.size() >= static_cast<std::size_t>(engine.options().context))
      throw HttpError(400,
                      fmt::format("the prompt has {} tokens; this server's context is {}",
                                  prompt.size(), engine.options().context),
                      "invalid_request_error", chat ? "messages" : "prompt",
                      "context_length_exceeded");
    const Clock::time_point t0 = Clock::now();
    std::shared_ptr<Request> r = engine.submit(prompt, params);
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", im.next_id++);
    const std::int64_t created = unix_time();
    const std::string model = opt_.model_name;
    const auto n_prompt = static_cast<std::int64_t>(prompt.size());

    // Pulls tokens until the end or a stop string; on_delta(text, event) per token.
    struct State {
      std::int64_t count = 0;  // generated, stop ids included
      std::string finish = "length";
      json logprobs = json::array();
    };
    auto pump = [r, &tok, &im, stops, t0, chat, stop_ids](
                    State& st, const std::function<bool(const std::string&)>& on_delta) {
      TextStream ts(stops);
      IncrementalDecoder text(tok);
      TokenEvent e;
      Clock::time_point last = t0;
      while (r->next(e)) {
        const Clock::time_point now = Clock::now();
        (st.count == 0 ? im.ttft : im.itl)
            .observe(std::chrono::duration<double>(now - last).count());
        last = now;
        ++st.count;
        const bool is_stop = std::find(stop_ids.begin(), stop_ids.end(), e.id) != stop_ids.end();
        if (r->params.top_logprobs >= 0 && !is_stop) {
          const std::string s = tok.decode(std::vector<std::int32_t>{e.id});
          if (chat) {
            json top = json::array();
            for (const auto& [tid, lp] : e.top)
              top.push_back(
                  {{"token", tok.decode(std::vector<std::int32_t>{tid})}, {"logprob", lp}});
            st.logprobs.push_back({{"token", s}, {"logprob", e.logprob}, {"top_logprobs", top}});
          } else {
            json top = json::object();
            for (const auto& [tid, lp] : e.top)
              top[tok.decode(std::vector<std::int32_t>{tid})] = lp;
            st.logprobs.push_back({{"token", s}, {"logprob", e.logprob}, {"top", top}});
          }
        }
        const std::string delta = is_stop ? std::string() : ts.push(text.push(e.id));
        if (!delta.empty() && !on_delta(delta)) {
          r->cancel();
          st.finish = "cancelled";
          return;
        }
        if (ts.stopped()) {
          r->cancel();
          st.finish = "stop";
          return;
        }
      }
      const std::string rest = ts.flush();
      if (!rest.empty()) on_delta(rest);
      st.finish = r->finish() == FinishReason::Stop ? "stop" : "length";
    };
    auto usage = [n_prompt](const State& st) {
      return json{{"prompt_tokens", n_prompt},
                  {"completion_tokens", st.count},
                  {"total_tokens", n_prompt + st.count}};
    };
    auto logprobs_json = [chat](const State& st) -> json {
      if (chat) return {{"content", st.logprobs}};
      json tokens = json::array(), lps = json::array(), tops = json::array();
      for (const json& l : st.logprobs) {
        tokens.push_back(l["token"]);
        lps.push_back(l["logprob"]);
        tops.push_back(l["top"]);
      }
      return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}};
    };

    if (!stream) {
      State st;
      std::string text;
      pump(st, [&](const std::string& d) {
        text += d;
        return true;
      });
      json choice = {{"index", 0}, {"finish_reason", st.finish}};
      choice["logprobs"] = params.top_logprobs >= 0 ? logprobs_json(st) : json(nullptr);
      if (chat) {
        const ReasonedText rt = split_reasoning(text);
        json msg = {{"role", "assistant"}, {"content", rt.content}};
        if (!rt.reasoning.empty()) msg["reasoning_content"] = rt.reasoning;
        choice["message"] = msg;
      } else {
        choice["text"] = text;
      }
      send_json(res, 200,
                {{"id", id},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", model},
                 {"choices", json::array({choice})},
                 {"usage", usage(st)}});
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    auto produce = [=](httplib::DataSink& sink) -> bool {
      auto send = [&](const json& j) {
        const std::string s =
            "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        return sink.is_writable() && sink.write(s.data(), s.size());
      };
      auto chunk = [&](json delta, json finish, json lp) {
        json choice = {{"index", 0}, {"finish_reason", finish}};
        if (chat)
          choice["delta"] = std::move(delta);
        else
          choice["text"] = delta.value("content", "");
        if (!lp.is_null()) choice["logprobs"] = std::move(lp);
        return json{{"id", id},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", model},
                    {"choices", json::array({choice})}};
      };
      if (chat && !send(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)))
        return r->cancel(), false;
      // Reasoning streams as reasoning_content until </think>, then content (ReasoningStream);
      // a token's logprobs go with the next chunk that carries text.
      State st;
      ReasoningStream reasoning;
      std::size_t sent_lp = 0;
      auto send_text = [&](const ReasonedText& t) {
        json lp = nullptr;
        if (r->params.top_logprobs >= 0 && st.logprobs.size() > sent_lp) {
          State part;
          part.logprobs = json(std::vector<json>(
              st.logprobs.begin() + static_cast<std::ptrdiff_t>(sent_lp), st.logprobs.end()));
          sent_lp = st.logprobs.size();
          lp = logprobs_json(part);
        }
        if (!t.reasoning.empty() && !send(chunk({{"reasoning_content", t.reasoning}}, nullptr,
                                                t.content.empty() ? lp : json(nullptr))))
          return false;
        if (!t.content.empty()) return send(chunk({{"content", t.content}}, nullptr, lp));
        return true;
      };
      pump(st, [&](const std::string& d) {
        const ReasonedText t = chat ? reasoning.push(d) : ReasonedText{"", d};
        if (t.reasoning.empty() && t.content.empty()) return true;  // held: nothing to send
        return send_text(t);
      });
      if (st.finish == "cancelled") return false;  // the client left
      if (chat) {
        const ReasonedText rest = reasoning.flush();
        if (!rest.reasoning.empty() || !rest.content.empty()) send_text(rest);
      }
      send(chunk(json::object(), st.finish, nullptr));
      if (usage_in_stream) {
        json u = chunk(json::object(), nullptr, nullptr);
        u["choices"] = json::array();
        u["usage"] = usage(st);
        send(u);
      }
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    };
    // Headers are sent by now: a failure mid-stream ends the stream with an error event (and
    // the request), never the process.
    res.set_chunked_content_provider(
        "text/event-stream", [r, produce](size_t, httplib::DataSink& sink) {
          try {
            return produce(sink);
          } catch (const std::exception& e) {
            r->cancel();
            const std::string ev = "data: " +
                                   error_body(HttpError(500, e.what(), "server_error"))
                                       .dump(-1, ' ', false, json::error_handler_t::replace) +
                                   "\n\ndata: [DONE]\n\n";
            if (sink.is_writable()) sink.write(ev.data(), ev.size());
            sink.done();
            return true;
          }
        });
  };
  svr.Post("/v1/chat/completions",
           [complete, parse](const httplib::Request& req, httplib::Response& res) {
             complete(parse(req), true, res);
           });
  svr.Post("/v1/completions",
           [complete, parse](const httplib::Request& req, httplib::Response& res) {
             complete(parse(req), false, res);
           });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  if (opt_.port == 0) {
    port_ = impl_->svr.bind_to_any_port(opt_.host);
    KILN_CHECK(port_ > 0, "[serve] cannot bind {} on any port", opt_.host);
  } else {
    KILN_CHECK(impl_->svr.bind_to_port(opt_.host, opt_.port), "[serve] cannot bind {}:{}",
               opt_.host, opt_.port);
    port_ = opt_.port;
  }
  KILN_CHECK(impl_->listen_fd >= 0 && ::listen(impl_->listen_fd, kListenBacklog) == 0,
             "[serve] listen({}:{}, backlog {}): {}", opt_.host, port_, kListenBacklog,
             std::strerror(errno));
  return port_;
}

void HttpServer::listen() {
  {
    std::lock_guard lock(impl_->run_mu);
    if (impl_->stopping) return;
    impl_->entered = true;
  }
  impl_->svr.listen_after_bind();
  impl_->done = true;
}

// httplib's stop() does nothing before listen() has set the server running, so a stop() that
// races the start waits for one or the other.
void HttpServer::stop() {
  {
    std::lock_guard lock(impl_->run_mu);
    impl_->stopping = true;
    if (!impl_->entered) return;
  }
  while (!impl_->svr.is_running() && !impl_->done)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->svr.stop();
}

void HttpServer::attach(const io::Tokenizer& tok, Engine& engine,
                        std::vector<std::int32_t> eos_ids) {
  impl_->eos_ids = std::move(eos_ids);
  impl_->tok = &tok;
  impl_->engine = &engine;
}

}  // namespace kiln::serve
