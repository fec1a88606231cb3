// A cuda::AttentionShape from its extents, for the attention tests (k/v dense unless kv_bs).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention.h"

namespace kiln::test_attention {

inline cuda::AttentionShape shape(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv,
                                  int64_t D, int64_t q_offset = 0, int64_t kv_bs = 0) {
  cuda::AttentionShape s;
  s.B = B;
  s.Tq = Tq;
  s.Tk = Tk;
  s.Hq = Hq;
  s.Hkv = Hkv;
  s.D = D;
  s.q_offset = q_offset;
  s.kv_batch_stride = kv_bs ? kv_bs : Tk * Hkv * D;
  return s;
}

}  // namespace kiln::test_attention
