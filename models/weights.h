// Model weight I/O on Modules: Hugging Face safetensors (single file or a
// sharded folder) read and written by parameter name, and llama2.c .bin
// checkpoints turned into a DecoderModel.
//
// Parameter names are the Module's own (HF names for DecoderModel), so a
// safetensors file maps one to one onto named_parameters().
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/decoder.h"
#include "models/io/llama2c_bin.h"
#include "models/io/safetensors.h"

namespace kiln::models {

// A CPU tensor of the given safetensors dtype ("F32", "BF16", ...) and shape,
// holding a copy of `nbytes` bytes at `data` (nbytes must equal
// numel * element size). Charged to the current MemoryScope category. `data` may point into a
// file mapping: a file truncated under it fails naming `source` (io::copy_from_mapping).
Tensor tensor_from_bytes(std::string_view st_dtype, const Shape& shape, const void* data,
                         std::size_t nbytes, std::string_view source = "mapped weights");

// Writes every named parameter, converted to `dtype` (F32, BF16, F16 or F64),
// contiguous, on the CPU. Metadata gets "format": "pt" unless given.
void save_safetensors(const nn::Module& m, const std::string& path, DType dtype = DType::F32,
                      io::Metadata metadata = {});
// Same, and adds the model config as JSON under metadata key "kiln_config".
void save_safetensors(const DecoderModel& m, const std::string& path, DType dtype = DType::F32,
                      io::Metadata metadata = {});

struct LoadOptions {
  // Skip a file's "lm_head.weight" when the module has no such parameter (a
  // tied model); otherwise it is reported as unexpected.
  bool ignore_tied_lm_head = false;
  // Other names in the file to skip silently.
  std::vector<std::string> ignore;
  // Inference: parameters on meta (a model built there, no memory) get storage on this device.
  // On the CPU, where the file holds a tensor in the parameter's dtype (bf16 weights for a bf16
  // model), the tensor is used in place in the read-only file mapping, not copied
  // (tensor/host_bytes.h): the memory report counts those bytes as mapped, and writing them
  // faults. Other tensors, and every tensor on another device, are converted into its memory.
  std::optional<Device> materialize_on;
  // Tensors used in place are paged in at load (io::prefault_mapping), so the first forward takes
  // no page faults; except these, which are only read a few rows at a time (an embedding table
  // that is not also the LM head): paging in Qwen3-8B's would add 1.2 GB of resident memory for
  // the rows of the prompt's tokens.
  std::vector<std::string> read_by_rows;
};

// Loads a single .safetensors file, or a Hugging Face model folder
// (model.safetensors.index.json, else model.safetensors), into `m`. Each
// tensor is converted from its file dtype (F32/F16/BF16/F64) to the
// parameter's dtype and device, in place (parameters keep their storage).
// Before any value is copied, every parameter must be present with the right
// shape and the file must hold no other names; otherwise one kiln::Error lists
// the missing, unexpected and mis-shaped names. Meta parameters are validated
// but not written, unless options.materialize_on.
void load_safetensors(nn::Module& m, const std::string& path_or_dir,
                      const LoadOptions& options = {});

// The ModelConfig llama2.c's run.c implies for a checkpoint header: interleaved
// RoPE, theta 10000, eps 1e-5, tied iff the classifier is shared.
ModelConfig llama2c_model_config(const io::Llama2cConfig& c);

// Reads a llama2.c .bin (legacy or version 1) into a new F32 CPU DecoderModel.
std::unique_ptr<DecoderModel> load_llama2c_model(const std::string& bin_path);

}  // namespace kiln::models
