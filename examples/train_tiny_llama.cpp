// Train a tiny LLaMA on a text file with kiln's library calls, then sample
// from it and print where the memory went. The `kiln train` command does the
// same with checkpoints, validation and logging (models/trainer.cpp).
//
//   ./build/examples/train_tiny_llama data/text/tinyshakespeare.txt [steps]
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "models/data.h"
#include "models/decoder.h"
#include "models/io/tokenizer.h"
#include "models/sampling.h"
#include "models/trainer.h"
#include "nn/optim.h"

using namespace kiln;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TEXT_FILE [STEPS]\n", argv[0]);
    return 2;
  }
  try {
    const std::int64_t steps = argc > 2 ? std::stoll(argv[2]) : 300;
    const std::int64_t batch = 16, seq = 64;

    // 1. Data: a char-level tokenizer built from the text; the last 10% is held out.
    std::string text = models::read_text_file(argv[1]);
    auto tok = io::CharTokenizer::from_text(text);
    models::TokenSplit split = models::split_tokens(tok.encode(text, false, false), 0.1);
    models::BatchSampler train_batches(split.train, batch, seq, /*seed=*/1);

    // 2. Model: the shakespeare-char preset (a ~1.8M-parameter LLaMA), sized to the vocab.
    models::ModelConfig cfg = models::preset("shakespeare-char");
    cfg.vocab_size = tok.vocab_size();
    models::DecoderModel model(cfg, /*seed=*/1337);
    std::printf("model: %lld parameters, vocab %lld\n",
                static_cast<long long>(model.num_parameters()),
                static_cast<long long>(cfg.vocab_size));

    // 3. Optimizer: AdamW (no decay on norms), cosine schedule with warm-up.
    nn::AdamW opt(model.named_parameters(), {1e-3, 0.9, 0.99, 1e-8, 0.1});

    // 4. The loop: forward under the Activations category, backward, clip, step.
    auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t step = 0; step < steps; ++step) {
      opt.lr = nn::cosine_lr(step, 50, steps, 1e-3, 1e-4);
      auto [x, y] = train_batches.next();
      Tensor loss;
      {
        MemoryScope scope(MemCategory::Activations);
        PhaseScope phase(Phase::Forward);
        loss = model.loss(x, y);
      }
      double loss_value = loss.item();
      backward(loss);
      loss = Tensor();  // drop the graph
      double norm = nn::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
      if (step % 50 == 0 || step + 1 == steps)
        std::printf("step %lld | loss %.4f | norm %.2f\n", static_cast<long long>(step),
                    loss_value, norm);
    }
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // 5. Validation loss on the held-out tail.
    double val = models::evaluate(model, split.val, batch, seq, 10, /*seed=*/2);
    std::printf("trained %lld steps in %.1f s | val loss %.4f\n", static_cast<long long>(steps),
                secs, val);

    // 6. Sample 200 characters after a prompt (KV cache, temperature 0.8, top-k 40).
    std::vector<std::int32_t> prompt = tok.encode("ROMEO:", false, false);
    std::cout << "\nROMEO:";
    models::SamplingOptions so{0.8, 40, 1.0, /*seed=*/7};
    models::generate_tokens(model, prompt, 200, so, [&](std::int32_t id) {
      std::cout << tok.decode(-1, id) << std::flush;
      return true;
    });
    std::cout << "\n\n";

    // 7. Where the memory went, by category, with the phase of the peak.
    std::cout << format_memory_summary(MemoryTracker::get(DeviceType::CPU).stats(),
                                       "memory (cpu), by category:");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
