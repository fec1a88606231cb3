// kiln params: per-component parameter table, the formula beside the count
// from the model built on the meta device (models/param_count.h), with
// what-ifs.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/flags.h"
#include "models/param_count.h"

namespace kiln::apps {

namespace {

struct ParamsOptions {
  std::string model;
  std::int64_t kv_heads = 0, intermediate = 0, layers = 0;
  std::string norm, mlp, act;
  bool tie = false, untie = false, no_final_norm = false, bias = false, json = false;
};

}  // namespace

Run add_params_command(CLI::App &app) {
  auto o = std::make_shared<ParamsOptions>();
  std::string presets;
  for (auto &n : models::preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  app.add_option("--model", o->model,
                 "Preset (" + presets + "), a config.json, or a Hugging Face model folder")
      ->required();
  auto *kv = app.add_option("--kv-heads", o->kv_heads,
                            "What-if: key/value heads (= heads: MHA, 1: MQA, else GQA)")
                 ->check(int_in(1, models::kMaxHeads));
  auto *inter = app.add_option("--intermediate", o->intermediate, "What-if: MLP hidden size")
                    ->check(int_in(1, models::kMaxHidden));
  auto *layers = app.add_option("--layers", o->layers, "What-if: number of layers")
                     ->check(int_in(1, models::kMaxLayers));
  auto *tie = app.add_flag("--tie", o->tie, "What-if: tie the LM head to the embedding");
  auto *untie = app.add_flag("--untie", o->untie, "What-if: a separate LM head");
  tie->excludes(untie);
  app.add_option("--norm", o->norm, "What-if: layernorm (with bias) | rmsnorm")
      ->check(CLI::IsMember({"layernorm", "rmsnorm"}));
  app.add_option("--mlp", o->mlp,
                 "What-if: plain (fc/proj, GPT-2) | gated (gate/up/down, LLaMA); the activation "
                 "becomes gelu_pytorch_tanh or silu unless --act says otherwise")
      ->check(CLI::IsMember({"plain", "gated"}));
  std::vector<std::string> acts;
  for (Op a : kActivations) acts.emplace_back(op_hf_name(a));
  app.add_option("--act", o->act, "What-if: the MLP's activation, by its Hugging Face name")
      ->check(CLI::IsMember(acts));
  app.add_flag("--bias", o->bias, "What-if: biases on every linear (classic GPT block)");
  app.add_flag("--no-final-norm", o->no_final_norm, "What-if: no norm before the LM head");
  app.add_flag("--json", o->json, "Print JSON instead of the table");
  return [o, kv, inter, layers] {
    models::ModelConfig base = models::resolve_model_config(o->model);
    models::WhatIf w;
    if (kv->count()) w.kv_heads = o->kv_heads;
    if (inter->count()) w.intermediate = o->intermediate;
    if (layers->count()) w.layers = o->layers;
    if (o->tie) w.tie = true;
    if (o->untie) w.tie = false;
    if (!o->norm.empty()) w.norm = *nn::parse_norm_kind(o->norm);
    if (!o->mlp.empty()) w.mlp = *nn::parse_mlp_kind(o->mlp);
    if (!o->act.empty()) w.act = nn::parse_mlp_activation(o->act);
    if (o->no_final_norm) w.final_norm = false;
    w.bias = o->bias;
    models::ModelConfig cfg = models::apply_what_if(base, w);

    models::ParamCount formula = models::count_params(cfg);
    std::map<std::string, std::int64_t> actual = models::count_meta_params(cfg);
    bool identical = false;
    if (o->json) {
      nlohmann::json j = models::param_report_json(cfg, formula, actual);
      identical = j["identical"].get<bool>();
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << models::param_report_text(cfg, formula, actual, &identical);
    }
    // A mismatch means the formula or the model builder is wrong: fail loudly.
    return identical ? 0 : 2;
  };
}

}  // namespace kiln::apps
