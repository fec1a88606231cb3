// The bf16 attention forward's training/prefill blocks (Tq > 1) on AMX tiles: S = Q K^T and
// O = P V as bf16 tile products with f32 accumulation (tdpbf16ps), the softmax in f32 between
// them. Called by attention_forward<bf16> (attention_bf16.cpp) at the Amx level when D % 32 == 0;
// below it the widening + sgemm blocks run.
//
// Tasks are (b, kv head, query block of 64 rows), the block's G query heads inside the task, so
// the packed keys and values serve all G heads. Per task (kend = the block's last visible key + 1,
// kpad = kend rounded up to 32, mpad = its rows rounded up to 32):
//   - K [0, kpad) is packed into the B-operand layout of Q K^T (per 16 keys, the d pairs of each
//     key side by side: a 16 x 16 transpose of 32-bit pairs), V [0, kpad) into that of P V (rows
//     of two consecutive keys interleaved); keys past kend are zeros, never read (a KV cache's
//     tail may hold anything);
//   - per head: Q's rows copied (zero rows to mpad), S (mpad x kpad, f32) by 2 x 2 tiles of
//     16 x 16, only up to the last key a row pair sees; the softmax of scale * S per row in f32
//     (exp_fast, f32 sum), P rounded to bf16 (zeros past the row's last key); O = P V in f32,
//     rounded once into out.
// P in bf16 for the P V product is what flash attention does on GPUs: each p in [0, 1] carries
// bf16's 2^-9 relative rounding; O is a convex combination of the values, so its error stays
// within that of the final rounding to bf16 (the tests' 2^-7 tolerance, against f64).
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/bf16_util.h"
#include "kernels/cpu/isa.h"

namespace kiln::cpu::attn {

#if KILN_CPU_X86
namespace {

constexpr int64_t kTile = 16;  // tile rows; a tile row is 64 bytes = 32 bf16 or 16 f32
constexpr int64_t kPair = 32;  // a 2 x 2 block of tiles covers 32 rows x 32 columns

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Palette 1, tiles 0-7 all 16 rows x 64 bytes: 0-3 accumulators (f32 16 x 16), 4-5 the A
// operands (16 rows x 32 bf16), 6-7 the B operands (16 pairs x 16 columns x 2 bf16). The
// 64-byte LDTILECFG layout: palette, start row, 14 reserved, 16 x colsb (u16), 16 x rows (u8).
// A constant in memory: GCC drops stores to a local that only ldtilecfg reads.
struct alignas(64) TileConfig {
  std::uint8_t palette, start_row, reserved[14];
  std::uint16_t colsb[16];
  std::uint8_t rows[16];
};
constexpr TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
static_assert(sizeof(TileConfig) == 64);

KILN_TARGET_AMX void configure_tiles() { _tile_loadconfig(&kTileConfig); }
KILN_TARGET_AMX void release_tiles() { _tile_release(); }

// In place: r[i] (16 dwords each) becomes column i of the 16 x 16 matrix of dwords r was.
KILN_TARGET_AMX void transpose_16x16_epi32(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3)
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + c], lane L: column 4L + c of rows i..i+3
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);  // lanes 0, 2
    const __m512i w0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);  // lanes 1, 3
    const __m512i v1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(v0, v1, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(w0, w1, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(v0, v1, 0xdd);
    r[12 + c] = _mm512_shuffle_i32x4(w0, w1, 0xdd);
  }
}

// kp = K [0, kpad) as the B operand of S = Q K^T: for key tile t (16 keys) and d pair p,
// kp[t * 16 D + p * 32 + 2 n + e] = K[16 t + n][2 p + e]. Keys >= kend are zeros. k: row stride
// ldkv; D % 32 == 0.
KILN_TARGET_AMX void pack_keys(int64_t kend, int64_t kpad, int64_t D, const bf16* k, int64_t ldkv,
                               bf16* kp) {
  for (int64_t t0 = 0; t0 < kpad; t0 += kTile)
    for (int64_t c = 0; c < D; c += 32) {  // 16 keys x 16 d pairs
      __m512i r[16];
      for (int64_t n = 0; n < kTile; ++n)
        r[n] = t0 + n < kend ? _mm512_loadu_si512(k + (t0 + n) * ldkv + c) : _mm512_setzero_si512();
      transpose_16x16_epi32(r);
      bf16* dst = kp + t0 * D + (c / 2) * 32;
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 32, r[p]);
    }
}

// vp = V [0, kpad) as the B operand of O = P V: vp[(j / 2) * 2 D + 2 n + (j % 2)] = V[j][n].
// Keys >= kend are zeros.
KILN_TARGET_AMX void pack_values(int64_t kend, int64_t kpad, int64_t D, const bf16* v, int64_t ldkv,
                                 bf16* vp) {
  alignas(64) static constexpr std::uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                        37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                        53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                        27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_load_si512(kHi);
  for (int64_t j = 0; j < kpad; j += 2) {
    bf16* dst = vp + j * D;
    for (int64_t c = 0; c < D; c += 32) {
      const __m512i a = j < kend ? _mm512_loadu_si512(v + j * ldkv + c) : _mm512_setzero_si512();
      const __m512i b =
          j + 1 < kend ? _mm512_loadu_si512(v + (j + 1) * ldkv + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(dst + 2 * c + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// c (32 x 32 f32, row stride ldc) = sum over steps s of A_s B_s by 2 x 2 tiles: A_s is 32 rows
// x 32 bf16 at a + s * a_step (row stride lda), B_s two B-operand tiles (16 pairs x 16 columns)
// at b0 + s * b_step and b1 + s * b_step (row stride ldb), for columns [0, 16) and [16, 32).
KILN_TARGET_AMX void tiles_2x2(int64_t steps, const bf16* a, int64_t lda, int64_t a_step,
                               const bf16* b0, const bf16* b1, int64_t ldb, int64_t b_step,
                               float* c, int64_t ldc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t st = 0; st < steps; ++st) {
    _tile_loadd(4, a + st * a_step, lda * 2);
    _tile_loadd(5, a + st * a_step + kTile * lda, lda * 2);
    _tile_loadd(6, b0 + st * b_step, ldb * 2);
    _tile_loadd(7, b1 + st * b_step, ldb * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + kTile, ldc * 4);
  _tile_stored(2, c + kTile * ldc, ldc * 4);
  _tile_stored(3, c + kTile * ldc + kTile, ldc * 4);
}

// s rows [i, i + 32), columns [0, kcols) (row stride kpad) = qb (row stride D) kp: per 32 keys,
// D / 32 steps of 32 d.
void scores_rows(int64_t i, int64_t kcols, int64_t kpad, int64_t D, const bf16* qb, const bf16* kp,
                 float* s) {
  for (int64_t j = 0; j < kcols; j += kPair)
    tiles_2x2(D / 32, qb + i * D, D, 32, kp + j * D, kp + (j + kTile) * D, 32, 16 * 32,
              s + i * kpad + j, kpad);
}

// o rows [i, i + 32) (row stride D, f32) = p rows [i, i + 32), keys [0, kcols) (row stride
// kpad, bf16) vp: per 32 columns of o, kcols / 32 steps of 32 keys.
void values_rows(int64_t i, int64_t kcols, int64_t kpad, int64_t D, const bf16* p, const bf16* vp,
                 float* o) {
  for (int64_t n = 0; n < D; n += kPair)
    tiles_2x2(kcols / 32, p + i * kpad, kpad, 32, vp + 2 * n, vp + 2 * (n + kTile), 2 * D, 32 * D,
              o + i * D + n, D);
}

// The first `count` lanes set (none for count <= 0, all for count >= 16).
inline __mmask16 first_lanes(int64_t count) {
  if (count <= 0) return 0;
  return static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1u);
}

// p[0, kpad) = softmax(scale * s[0, valid)) rounded to bf16, zeros past valid; returns the
// log-sum-exp. s is overwritten with the unnormalized exponentials. kpad % 16 == 0.
KILN_TARGET_AMX float softmax_row(int64_t valid, int64_t kpad, float scale, float* s, bf16* p) {
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < valid; j += 16)
    mx = _mm512_mask_max_ps(mx, first_lanes(valid - j), mx, _mm512_loadu_ps(s + j));
  const float m = _mm512_reduce_max_ps(mx) * scale;
  const __m512 vscale = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < valid; j += 16) {
    const __mmask16 k = first_lanes(valid - j);
    const __m512 e =
        detail::exp_fast16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j), vscale, vm));
    _mm512_mask_storeu_ps(s + j, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  const float total = _mm512_reduce_add_ps(sum);
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t j = 0; j < kpad; j += 16) {  // zeros past valid
    const __m512 x = _mm512_maskz_mul_ps(first_lanes(valid - j), _mm512_loadu_ps(s + j), inv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  }
  return m + std::log(total);
}

// Per-thread scratch, sized for the largest task.
struct AmxTiles {
  std::vector<bf16> kp, vp, qb, p;
  std::vector<float> s, o;
  AmxTiles(int64_t kmax, int64_t D) {
    const auto n = [](int64_t e) { return static_cast<size_t>(e); };
    kp.resize(n(kmax * D));
    vp.resize(n(kmax * D));
    qb.resize(n(kBlockQ * D));
    p.resize(n(kBlockQ * kmax));
    s.resize(n(kBlockQ * kmax));
    o.resize(n(kBlockQ * D));
  }
};

// One query head's block: rows queries (row stride ldq) against the packed keys/values [0,
// kpad), row r seeing keys [0, min(kend, valid0 + r)); out rows (stride ldq) =, lse_blk =.
KILN_TARGET_AMX void head_block(AmxTiles& t, int64_t rows, int64_t kend, int64_t kpad, int64_t D,
                                float scale, const bf16* q, int64_t ldq, int64_t valid0, bf16* out,
                                float* lse_blk) {
  const int64_t mpad = round_up(rows, kPair);
  for (int64_t r = 0; r < mpad; ++r) {
    bf16* dst = t.qb.data() + r * D;
    if (r < rows)
      std::memcpy(dst, q + r * ldq, static_cast<size_t>(D) * sizeof(bf16));
    else
      std::memset(dst, 0, static_cast<size_t>(D) * sizeof(bf16));
  }
  for (int64_t i = 0; i < mpad; i += kPair) {
    // Keys the row pair sees at all (its last row sees the most), in whole 32-key steps.
    const int64_t kcols = round_up(std::min(kend, valid0 + std::min(i + kPair, rows) - 1), kPair);
    scores_rows(i, kcols, kpad, D, t.qb.data(), t.kp.data(), t.s.data());
    for (int64_t r = i; r < i + kPair; ++r) {
      bf16* pr = t.p.data() + r * kpad;
      if (r < rows)
        lse_blk[r] =
            softmax_row(std::min(kend, valid0 + r), kcols, scale, t.s.data() + r * kpad, pr);
      else
        std::memset(pr, 0, static_cast<size_t>(kcols) * sizeof(bf16));
    }
    values_rows(i, kcols, kpad, D, t.p.data(), t.vp.data(), t.o.data());
  }
  for (int64_t r = 0; r < rows; ++r) f32_to_bf16(D, t.o.data() + r * D, out + r * ldq);
}

}  // namespace
#endif  // KILN_CPU_X86

bool amx_forward_supported(int64_t Tq, int64_t D) {
#if KILN_CPU_X86
  return Tq > 1 && D % 32 == 0 && cpu_has(CpuIsa::Amx);
#else
  (void)Tq, (void)D;
  return false;
#endif
}

void attention_forward_amx(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                           int64_t q_offset, float scale, const bf16* q, const bf16* k,
                           const bf16* v, int64_t kv_batch_stride, bf16* out, float* lse) {
#if KILN_CPU_X86
  const int64_t G = Hq / Hkv, ldq = Hq * D, ldkv = Hkv * D;
  const int64_t nqb = (Tq + kBlockQ - 1) / kBlockQ, ntasks = B * Hkv * nqb;
  const int64_t kmax = round_up(Tk, kPair);
  const bool parallel =
      ntasks > 1 && double(ntasks) * double(G) * double(kBlockQ) * double(Tk) * double(D) >= 1e5;
#pragma omp parallel if (parallel)
  {
    AmxTiles t(kmax, D);
    configure_tiles();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      // The latest (largest) causal blocks first, for load balance.
      const int64_t qb = nqb - 1 - task / (B * Hkv), b = (task % (B * Hkv)) / Hkv, kvh = task % Hkv;
      const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, Tq - i0);
      const int64_t kend = std::min(Tk, q_offset + i0 + rows), kpad = round_up(kend, kPair);
      const int64_t kv_off = b * kv_batch_stride + kvh * D;
      pack_keys(kend, kpad, D, k + kv_off, ldkv, t.kp.data());
      pack_values(kend, kpad, D, v + kv_off, ldkv, t.vp.data());
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kvh * G + g, off = (b * Tq + i0) * ldq + h * D;
        head_block(t, rows, kend, kpad, D, scale, q + off, ldq, q_offset + i0 + 1, out + off,
                   lse + (b * Hq + h) * Tq + i0);
      }
    }
    release_tiles();
  }
#else
  (void)B, (void)Tq, (void)Tk, (void)Hq, (void)Hkv, (void)D, (void)q_offset, (void)scale;
  (void)q, (void)k, (void)v, (void)kv_batch_stride, (void)out, (void)lse;
#endif
}

}  // namespace kiln::cpu::attn
