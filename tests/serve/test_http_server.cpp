// kiln serve's HTTP side against a live server on a loopback port (cpp-httplib's client): /health
// before and after the model, chat and completions (plain and SSE), seeds, stop strings, usage,
// OpenAI error objects for bad requests, concurrent streams equal to their solo runs, and a client
// that leaves mid-stream, whose KV blocks are freed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "models/io/tokenizer.h"
#include "serve/http_server.h"
#include "tests/models/tiny_hf.h"
#include "tests/test_data.h"

namespace kiln::serve {
namespace {

using nlohmann::json;

// A tiny Qwen3 with the real Qwen vocabulary size, so the chat template's ids fit.
struct Live {
  Live() {
    models::ModelConfig c = test_hf::tiny_qwen3(false, 128);
    c.vocab_size = 151936;
    model = std::make_unique<models::DecoderModel>(c, 1, DType::F32);
    test_hf::init_weights(*model, 3);
    tok = io::make_tokenizer("qwen:" + test_shared_data() + "/qwen");
    engine = std::make_unique<Engine>(*model,
                                      EngineOptions{.max_seqs = 8, .context = 128, .max_queue = 8});
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.max_body_bytes = 64 * 1024;
    o.threads = 16;
    o.timeout_s = 2;
    server = std::make_unique<HttpServer>(o);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
  }
  ~Live() {
    server->stop();
    thread.join();
  }
  void attach() {
    if (attached) return;
    attached = true;
    engine->start();
    server->attach(*tok, *engine, {151645});  // <|im_end|>
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    return client().Post(path.c_str(), body, "application/json");
  }
  std::unique_ptr<models::DecoderModel> model;
  std::unique_ptr<io::Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<HttpServer> server;
  int port = 0;
  bool attached = false;
  std::thread thread;
};

// ctest runs each test in its own process: the first use starts the server with the model.
Live& live() {
  static Live l;
  l.attach();
  return l;
}

// The SSE stream's content deltas, joined; fails on a malformed event or a missing [DONE].
std::string stream_text(const std::string& body, std::string* finish = nullptr) {
  std::string text;
  std::size_t at = 0;
  bool done = false;
  while (at < body.size()) {
    const auto end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << body;
    if (end == std::string::npos) break;
    const std::string ev = body.substr(at, end - at);
    at = end + 2;
    EXPECT_TRUE(ev.starts_with("data: ")) << ev;
    if (ev == "data: [DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(ev.substr(6));
    const json& ch = j["choices"][0];
    const json content = ch.contains("delta") ? ch["delta"].value("content", json("")) : ch["text"];
    if (content.is_string()) text += content.get<std::string>();
    if (finish && !ch["finish_reason"].is_null()) *finish = ch["finish_reason"];
  }
  EXPECT_TRUE(done) << "no data: [DONE]";
  return text;
}

TEST(ServeHttp, HealthIsUnavailableUntilTheModelIsAttached) {
  Live l;
  auto r = l.client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["status"], "loading");
  auto c = l.post("/v1/completions", R"({"prompt": "hi"})");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 503);
  l.attach();
  r = l.client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  auto m = l.client().Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
}

TEST(ServeHttp, ChatPlainAndStreamedAgreeForOneSeed) {
  Live& l = live();
  const std::string req =
      R"({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Tell me a story."}], "max_tokens": 12, "seed": 5,
          "temperature": 0.8, "chat_template_kwargs": {"enable_thinking": false}})";
  auto a = l.post("/v1/chat/completions", req);
  auto b = l.post("/v1/chat/completions", req);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200) << a->body;
  const json ja = json::parse(a->body), jb = json::parse(b->body);
  EXPECT_EQ(ja["object"], "chat.completion");
  EXPECT_EQ(ja["choices"][0]["message"]["content"], jb["choices"][0]["message"]["content"]);
  EXPECT_EQ(ja["usage"]["completion_tokens"], 12);
  const std::int64_t prompt_tokens = ja["usage"]["prompt_tokens"];
  EXPECT_EQ(prompt_tokens, static_cast<std::int64_t>(
                               l.tok
                                   ->encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>"
                                            "user\nTell me a story.<|im_end|>\n<|im_start|>"
                                            "assistant\n<think>\n\n</think>\n\n")
                                   .size()));
  EXPECT_EQ(ja["usage"]["total_tokens"], prompt_tokens + 12);
  json sreq = json::parse(req);
  sreq["stream"] = true;
  auto s = l.post("/v1/chat/completions", sreq.dump());
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  EXPECT_EQ(s->get_header_value("Content-Type"), "text/event-stream");
  std::string finish;
  EXPECT_EQ(stream_text(s->body, &finish), ja["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, "length");
}

TEST(ServeHttp, CompletionsStopStringsAndLogprobs) {
  Live& l = live();
  auto r = l.post("/v1/completions",
                  R"({"prompt": "Once upon a time", "max_tokens": 10, "seed": 1, "logprobs": 2})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const std::string text = j["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["token_logprobs"].size(), 10u);
  for (const json& lp : j["choices"][0]["logprobs"]["token_logprobs"])
    EXPECT_LT(lp.get<double>(), 0);
  // A stop string taken from the middle of that text ends it just before.
  const std::string stop = text.substr(text.size() / 2, 2);
  json req = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"seed", 1}, {"stop", stop}};
  auto s = l.post("/v1/completions", req.dump());
  ASSERT_TRUE(s);
  const json js = json::parse(s->body);
  EXPECT_EQ(js["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(js["choices"][0]["finish_reason"], "stop");
  auto t = l.post("/tokenize", R"({"content": "Hello world"})");
  ASSERT_TRUE(t);
  const json ids = json::parse(t->body)["tokens"];
  auto d = l.post("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_TRUE(d);
  EXPECT_EQ(json::parse(d->body)["content"], "Hello world");
}

TEST(ServeHttp, BadRequestsGetOpenAiErrorsAndTheServerStaysUp) {
  Live& l = live();
  auto expect_error = [&](const std::string& path, const std::string& body, int status,
                          const std::string& needle) {
    auto r = l.post(path, body);
    ASSERT_TRUE(r) << body.substr(0, 80);
    EXPECT_EQ(r->status, status) << r->body;
    const json j = json::parse(r->body);
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
  };
  expect_error("/v1/chat/completions", "{\"messages\": [", 400, "[json] request body");
  expect_error("/v1/chat/completions", R"({"model": "gpt-4", "messages": []})", 404,
               "model 'gpt-4' is not served here");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "tool", "content": "x"}]})", 400,
               "messages[0].role 'tool' is not supported");
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": 9})", 400,
               "'temperature' is 9");
  expect_error("/v1/completions", std::string(100000, ' '), 413, "too large");
  expect_error("/v1/completions", std::string(1000, '[') + std::string(1000, ']'), 400,
               "deeper than");
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += " hello";
  expect_error("/v1/completions", json{{"prompt", long_prompt}}.dump(), 400,
               "this server's context is 128");
  auto h = l.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// Eight streams at once, each equal to its run alone (batch invariance through the server).
TEST(ServeHttp, ConcurrentStreamsEqualTheirSoloRuns) {
  Live& l = live();
  auto body = [](int i) {
    return json{{"prompt", "Story number " + std::to_string(i)},
                {"max_tokens", 8},
                {"seed", 100 + i},
                {"temperature", 0.9},
                {"stream", true}}
        .dump();
  };
  std::vector<std::string> solo(8), together(8);
  for (int i = 0; i < 8; ++i) {
    auto r = l.post("/v1/completions", body(i));
    ASSERT_TRUE(r);
    solo[i] = stream_text(r->body);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      auto r = l.post("/v1/completions", body(i));
      if (r) together[i] = stream_text(r->body);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_FALSE(solo[i].empty());
    EXPECT_EQ(together[i], solo[i]) << "stream " << i;
  }
}

TEST(ServeHttp, AClientThatLeavesMidStreamFreesItsBlocks) {
  Live& l = live();
  httplib::Client c = l.client();
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": "A long tale", "max_tokens": 100, "stream": true, "seed": 2})";
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  c.send(req);
  EXPECT_GE(chunks, 2);
  // The engine frees the blocks at its next iteration after the write fails: wait for it, with a
  // deadline (a state to reach, not a timing).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::int64_t used = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = l.client().Get("/metrics");
    ASSERT_TRUE(m);
    const auto at = m->body.find("\nkiln_kv_blocks_used ");
    ASSERT_NE(at, std::string::npos);
    used = std::stoll(m->body.substr(at + 21));
    if (used == 0 && l.engine->metrics().running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0);
  EXPECT_LT(l.engine->metrics().generated_tokens, 100 + 200);  // it did not run to 100 tokens
}

// A client that sends half a request and stalls is dropped after the read timeout (2 s here):
// the server closes the connection (recv returns 0), well before the test's own 20 s limit.
TEST(ServeHttp, AStalledClientIsDroppedAfterTheReadTimeout) {
  Live& l = live();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(l.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string partial =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro";
  ASSERT_EQ(send(fd, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[512];
  const auto t0 = std::chrono::steady_clock::now();
  ssize_t n = 0;
  std::string got;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<std::size_t>(n));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  EXPECT_EQ(n, 0) << "the server did not close the connection";
  EXPECT_LT(waited, 19.0);
  auto h = l.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

}  // namespace
}  // namespace kiln::serve

namespace kiln::serve {
namespace {

ServerOptions loopback(int port) {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.model_name = "tiny";
  o.threads = 2;
  return o;
}

// A second server on a port already served fails to bind (httplib's default SO_REUSEPORT let it
// bind and take half of the first one's connections).
TEST(ServeHttpSocket, ASecondServerOnTheSamePortIsRefused) {
  HttpServer first(loopback(0));
  const int port = first.bind();
  ASSERT_GT(port, 0);
  HttpServer second(loopback(port));
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << port;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[serve] cannot bind 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e.what();
  }
}

// The listen backlog is kiln's (512), not httplib's compiled-in 5: with nothing accepting, 64
// clients all complete their handshakes into the queue. (With a backlog of 5 the kernel takes
// 6 and drops the other SYNs until one is accepted, which never happens here.)
TEST(ServeHttpSocket, SixtyFourPendingConnectionsFitTheBacklog) {
  HttpServer server(loopback(0));  // bound, never listening: no accept()
  const int port = server.bind();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> pending;
  int connected = 0;
  for (int i = 0; i < 64; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      ++connected;
      ::close(fd);
    } else {
      ASSERT_EQ(errno, EINPROGRESS) << std::strerror(errno);
      pending.push_back(fd);
    }
  }
  // Writable once the handshake completed; a dropped SYN stays pending. One poll over all of them,
  // at most 5 s in all (loopback handshakes take microseconds; the rest is for a loaded machine).
  std::vector<pollfd> polls;
  for (int fd : pending) polls.push_back({fd, POLLOUT, 0});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::size_t ready = 0;
  while (ready < polls.size() && std::chrono::steady_clock::now() < deadline) {
    for (pollfd& p : polls) p.revents = 0;
    if (::poll(polls.data(), polls.size(), 100) < 0) break;
    ready = 0;
    for (const pollfd& p : polls) ready += (p.revents & POLLOUT) != 0;
  }
  for (const pollfd& p : polls) {
    int err = 0;
    socklen_t len = sizeof(err);
    if ((p.revents & POLLOUT) && ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
        err == 0)
      ++connected;
    ::close(p.fd);
  }
  EXPECT_EQ(connected, 64);
}

}  // namespace
}  // namespace kiln::serve
