// test_nn links only kiln_nn (tests/CMakeLists.txt), but the Module tests build real
// models::DecoderModel instances (HF names, preset parameter counts, a training step). The
// decoder and its config have no dependency beyond nn/ and header-only nlohmann_json, so they are
// compiled into this binary here. If test_nn is ever linked against kiln_models, delete this file.
#include "models/config.cpp"   // NOLINT(bugprone-suspicious-include)
#include "models/decoder.cpp"  // NOLINT(bugprone-suspicious-include)
