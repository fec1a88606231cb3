// Writes the seed corpora of the fuzz targets into <out>/<target>/ (fuzz/corpus/ in the repo):
// for each format a few small valid files, written by kiln's own writers where it has one, and a
// few invalid ones next to them. The corpora are committed; run this again only when a format
// changes (build-asan/fuzz/make_seeds fuzz/corpus).
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/io/checkpoint_h5.h"
#include "models/io/safetensors.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path g_out;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out / target);
  std::ofstream f(g_out / target / name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

template <typename T>
void append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void safetensors_seeds() {
  const fs::path tmp = fs::temp_directory_path() / "kiln_make_seeds.safetensors";
  std::array<float, 6> a{1, 2, 3, 4, 5, 6};
  std::array<uint16_t, 2> b{0x3f80, 0xc000};
  std::array<int64_t, 1> c{7};
  kiln::io::SafetensorsWriter w;
  w.add("model.embed_tokens.weight", "F32", {2, 3}, a.data(), sizeof(a));
  w.add("model.norm.weight", "BF16", {2}, b.data(), sizeof(b));
  w.add("step", "I64", {}, c.data(), sizeof(c));
  w.write(tmp.string(), {{"format", "pt"}});
  const std::string valid = slurp(tmp);
  put("safetensors", "valid", valid);
  put("safetensors", "truncated", valid.substr(0, valid.size() - 3));
  std::string empty_hdr;
  append<uint64_t>(empty_hdr, 2);
  empty_hdr += "{}";
  put("safetensors", "empty_header", empty_hdr);
  std::string overlap;
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  append<uint64_t>(overlap, h.size());
  overlap += h + std::string(4, '\0');
  put("safetensors", "overlap", overlap);
  fs::remove(tmp);
}

void index_seeds() {
  put("safetensors_index", "valid",
      json{{"metadata", {{"total_size", 12}}},
           {"weight_map", {{"x", "a.safetensors"}, {"y", "a.safetensors"}}}}
          .dump());
  put("safetensors_index", "missing_tensor",
      json{{"weight_map", {{"x", "a.safetensors"}, {"z", "a.safetensors"}}}}.dump());
  put("safetensors_index", "missing_shard", json{{"weight_map", {{"x", "b.safetensors"}}}}.dump());
  put("safetensors_index", "traversal", json{{"weight_map", {{"x", "../a.safetensors"}}}}.dump());
}

void config_seeds() {
  // Qwen3-0.6B's config.json, shrunk to toy sizes.
  json qwen3 = {{"architectures", {"Qwen3ForCausalLM"}},
                {"model_type", "qwen3"},
                {"vocab_size", 300},
                {"hidden_size", 16},
                {"intermediate_size", 32},
                {"num_hidden_layers", 2},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 8},
                {"max_position_embeddings", 64},
                {"rms_norm_eps", 1e-6},
                {"rope_theta", 1000000},
                {"rope_scaling", nullptr},
                {"hidden_act", "silu"},
                {"tie_word_embeddings", true},
                {"attention_bias", false},
                {"torch_dtype", "bfloat16"}};
  put("hf_config", "qwen3", qwen3.dump(2));
  json llama = {
      {"model_type", "llama"},         {"vocab_size", 32000},    {"hidden_size", 64},
      {"intermediate_size", 172},      {"num_hidden_layers", 2}, {"num_attention_heads", 8},
      {"max_position_embeddings", 256}};
  put("hf_config", "llama", llama.dump());
  json qwen2 = llama;
  qwen2["model_type"] = "qwen2";
  qwen2["rope_parameters"] = {{"rope_theta", 10000.0}};
  put("hf_config", "qwen2", qwen2.dump());
  json gpt2 = {{"model_type", "gpt2"}, {"vocab_size", 50257},
               {"n_embd", 64},         {"n_layer", 2},
               {"n_head", 4},          {"n_positions", 128},
               {"n_inner", nullptr},   {"activation_function", "gelu_new"}};
  put("hf_config", "gpt2", gpt2.dump());
  json bad = qwen3;
  bad["num_attention_heads"] = "4";
  put("hf_config", "wrong_type", bad.dump());
  put("hf_config", "not_json", "{\"model_type\": \"qwen3\", ");

  put("generation_config", "qwen3",
      json{{"bos_token_id", 151643},
           {"do_sample", true},
           {"eos_token_id", {151645, 151643}},
           {"pad_token_id", 151643},
           {"temperature", 0.6},
           {"top_k", 20},
           {"top_p", 0.95},
           {"transformers_version", "4.51.0"}}
          .dump(2));
  put("generation_config", "greedy",
      json{
          {"eos_token_id", 2}, {"max_new_tokens", 64}, {"repetition_penalty", 1.1}, {"min_p", 0.05}}
          .dump());
  put("generation_config", "bad_range", json{{"top_p", 7}, {"eos_token_id", -1}}.dump());
}

// GPT-2's byte-to-unicode alphabet, as the Qwen vocabularies spell bytes.
std::string byte_spelling(int b) {
  auto printable = [](int x) {
    return (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
  };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += !printable(x);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

void qwen_seeds() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_spelling(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"}, {"ll", "o"}, {"H", "e"}, {"He", "llo"}, {"\xc4\xa0", "w"}, {"o", "r"}};
  int next = 256;
  for (const auto& [a, b] : merges) vocab[a + b] = next++;
  std::string merges_txt = "#version: 0.2\n";
  json merges_json = json::array();
  for (const auto& [a, b] : merges) {
    merges_txt += a + " " + b + "\n";
    merges_json.push_back(a + " " + b);
  }
  json added = json::array();
  added.push_back({{"id", next}, {"content", "<|endoftext|>"}, {"special", true}});
  added.push_back({{"id", next + 1}, {"content", "<|im_end|>"}, {"special", true}});
  added.push_back({{"id", next + 2}, {"content", "<think>"}, {"special", false}});
  json tok = {{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", {{"type", "NFC"}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges_json}}}};
  json config = {{"eos_token", "<|im_end|>"},
                 {"added_tokens_decoder",
                  {{std::to_string(next), {{"content", "<|endoftext|>"}, {"special", true}}},
                   {std::to_string(next + 1), {{"content", "<|im_end|>"}, {"special", true}}}}}};
  put("tokenizer_json", "valid", tok.dump());
  put("tokenizer_json", "valid_with_config", tok.dump() + std::string(1, '\0') + config.dump());
  json pairs = tok;
  pairs["model"]["merges"] = json::array();
  for (const auto& [a, b] : merges) pairs["model"]["merges"].push_back({a, b});
  pairs["model"]["ignore_merges"] = true;
  put("tokenizer_json", "merge_pairs", pairs.dump());
  json bad = tok;
  bad["model"]["merges"].push_back("zz qq");
  put("tokenizer_json", "unknown_merge", bad.dump());

  const std::string z(1, '\0');
  put("vocab_merges", "valid", vocab.dump() + z + merges_txt);
  put("vocab_merges", "valid_with_config", vocab.dump() + z + merges_txt + z + config.dump());
  put("vocab_merges", "crlf", vocab.dump() + z + "l l\r\nll o\r\n");
  put("vocab_merges", "bad_line", vocab.dump() + z + "l l l\n");
}

// llama2.c: the 7-int header, then the float32 segments (all 0.5 here: the values do not matter).
std::string llama2c_legacy(int32_t dim, int32_t hidden, int32_t layers, int32_t heads,
                           int32_t kv_heads, int32_t vocab, int32_t seq, bool shared) {
  std::string s;
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq})
    append(s, v);
  const int64_t kv = int64_t{dim} * kv_heads / heads, hs = dim / heads;
  int64_t n = int64_t{vocab} * dim +
              layers * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hidden * dim) + dim +
              seq * hs;  // freq_cis_real + freq_cis_imag: 2 * seq * hs / 2
  if (!shared) n += int64_t{vocab} * dim;
  for (int64_t i = 0; i < n; ++i) append(s, 0.5f);
  return s;
}

std::string llama2c_v1(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv_heads,
                       int32_t vocab, int32_t seq, bool shared) {
  std::string s;
  append<uint32_t>(s, 0x616b3432);
  append<int32_t>(s, 1);
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, vocab, seq}) append(s, v);
  s += static_cast<char>(shared ? 1 : 0);
  s.resize(256, '\0');
  const int64_t kv = int64_t{dim} * kv_heads / heads;
  int64_t n = layers * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hidden * dim) + dim +
              int64_t{vocab} * dim;
  if (!shared) n += int64_t{vocab} * dim;
  for (int64_t i = 0; i < n; ++i) append(s, 0.25f);
  return s;
}

void llama2c_seeds() {
  put("llama2c_bin", "legacy_shared", llama2c_legacy(8, 16, 1, 2, 1, 5, 4, true));
  put("llama2c_bin", "legacy_unshared", llama2c_legacy(8, 16, 2, 2, 2, 3, 2, false));
  put("llama2c_bin", "v1_shared", llama2c_v1(8, 16, 1, 2, 2, 4, 4, true));
  put("llama2c_bin", "v1_unshared", llama2c_v1(4, 8, 1, 1, 1, 3, 4, false));
  std::string trunc = llama2c_legacy(8, 16, 1, 2, 1, 5, 4, true);
  put("llama2c_bin", "truncated", trunc.substr(0, trunc.size() - 4));
  std::string v2 = llama2c_v1(4, 8, 1, 1, 1, 3, 4, true);
  v2[4] = 2;
  put("llama2c_bin", "version2", v2);

  // tokenizer.bin: <unk>, <s>, </s>, the 256 byte pieces, then a few merges of a tiny vocabulary.
  auto piece = [](std::string& s, float score, const std::string& p) {
    append(s, score);
    append(s, static_cast<int32_t>(p.size()));
    s += p;
  };
  std::string t;
  append<int32_t>(t, 8);
  piece(t, 0, "<unk>");
  piece(t, 0, "<s>");
  piece(t, 0, "</s>");
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    piece(t, 0, buf);
  }
  float score = -1;
  for (const char* p : {" ", "e",  "n",  "c",    "O",  "u",  "p",    "o",  "a",  "t",        "i",
                        "m", " O", "On", "Once", " t", "ti", "time", " a", "up", "\xc3\xa9", "caf"})
    piece(t, score -= 0.5f, p);
  put("llama2c_tokenizer", "valid", t);
  put("llama2c_tokenizer", "truncated", t.substr(0, t.size() - 2));
  std::string bad_len = t;
  const int32_t big = 1 << 20;
  std::memcpy(bad_len.data() + 4 + 4, &big, 4);
  put("llama2c_tokenizer", "bad_length", bad_len);
}

void checkpoint_seeds() {
  const fs::path tmp = fs::temp_directory_path() / "kiln_make_seeds.h5";
  std::array<float, 4> w{1, 2, 3, 4};
  std::array<uint16_t, 2> h{0x3f80, 0x4000};
  std::array<int64_t, 1> s{3};
  kiln::io::CheckpointWriter cw;
  cw.add_tensor("model/model.embed_tokens.weight", "F32", {2, 2}, w.data());
  cw.add_tensor("model/model.norm.weight", "BF16", {2}, h.data());
  cw.add_tensor("optim_m/model.norm.weight", "F32", {2}, w.data());
  cw.add_tensor("optim_v/model.norm.weight", "F32", {2}, w.data());
  cw.add_tensor("model/scalar", "I64", {}, s.data());
  cw.set_attr_i64("step", 3);
  cw.set_attr_f64("best_val_loss", 1.5);
  cw.set_attr_string("config", R"({"name":"tiny","dim":2})");
  cw.add_bytes("tokenizer", {'c', 'h', 'a', 'r'});
  cw.write(tmp.string());
  const std::string valid = slurp(tmp);
  put("checkpoint_h5", "valid", valid);
  put("checkpoint_h5", "truncated", valid.substr(0, valid.size() / 2));
  fs::remove(tmp);
}

}  // namespace

int main(int argc, char** argv) {
  g_out = argc > 1 ? argv[1] : "fuzz/corpus";
  safetensors_seeds();
  index_seeds();
  config_seeds();
  qwen_seeds();
  llama2c_seeds();
  checkpoint_seeds();
  return 0;
}
