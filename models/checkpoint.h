// Training checkpoints (HDF5, written atomically by models/io/checkpoint_h5):
// weights, AdamW moments, step, data sampler state, config, tokenizer and the
// training arguments. Loading restores all of it, so --resume continues
// bit-exactly on the same machine.
#pragma once

#include <cstdint>
#include <string>

#include "models/decoder.h"
#include "models/io/tokenizer.h"
#include "nn/optim.h"

namespace kiln::models {

struct TrainState {
  std::int64_t step = 0;  // optimizer steps done
  std::uint64_t data_seed = 0;
  std::uint64_t data_position = 0;  // batches drawn by the train sampler
  std::uint64_t model_seed = 0;
  std::string tokenizer_spec;  // "char", "byte", "llama2c:PATH"
  std::string tokenizer_data;  // CharTokenizer vocabulary
  double best_val_loss = 0.0;
  std::string args_json;  // the training options (TrainOptions::to_json, dumped)
};

void save_checkpoint(const std::string& path, const DecoderModel& model, const nn::Optimizer* opt,
                     const TrainState& st);

// Reads the config and state without loading weights.
struct CheckpointMeta {
  ModelConfig config;
  TrainState state;
  bool has_optimizer = false;
};
CheckpointMeta read_checkpoint_meta(const std::string& path);

// The tokenizer for a run: the char vocabulary saved in a checkpoint when
// there is one, else the spec ("char", "byte", "llama2c:PATH"), where "char"
// builds its vocabulary from `training_text`.
std::unique_ptr<io::Tokenizer> run_tokenizer(const std::string& spec,
                                             const std::string& saved_vocab,
                                             const std::string& training_text);

// Loads weights (and the optimizer moments if opt is given) into an existing
// model built from the checkpoint's config.
void load_checkpoint(const std::string& path, DecoderModel& model, nn::Optimizer* opt);

}  // namespace kiln::models
