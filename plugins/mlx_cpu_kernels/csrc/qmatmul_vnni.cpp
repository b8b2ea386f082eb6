// 4-bit weights x int8 activations on AVX-512 VNNI (`vpdpbusd`), where the CPU has it: llama.cpp's
// Q4_0 x Q8_0 way, on MLX's affine layout. 8-bit layers: qmatmul_vnni8.cpp; shared parts: vnni.h.
//
// The int8 path (qmatmul.cpp) rounds x to int8 per block of 32 (dx = max|x| / 127) and computes,
// per block b of weight row n, the integer dot product of the centred weights (q - 8) with the
// int8 x, then sum_b s dx dot_b + sum_g (bias + 8 s) xsum_g. One `vpdpbusd` multiplies 64
// unsigned nibbles by 64 int8 values and sums them in fours into 16 int32 lanes. The centring is
// folded into the accumulator's start, -8 * (the sum of the block's 32 int8 values), computed
// once per call for x: each block's dot product is exact, the same integers as the AVX2 and
// portable paths; only the float sums after differ in order.
//
// Superblocks. The weights stay in MLX's layout (16 packed bytes a block: byte i holds elements
// 2i and 2i + 1). 16 blocks (256 bytes) are loaded as 4 vectors and transposed by dwords
// (`load_super`), so that lane L holds dword k of one block in vector k: 8 `vpdpbusd` (low and
// high nibbles of 4 vectors) then leave each lane with its whole block's dot product, and one
// convert, one multiply by dx and one FMA by the scale finish 16 blocks. Doing the float work
// per 64 weights instead bound the kernel by its 3 float ops a `vpdpbusd` (~245 GOP/s on 2 Zen 5
// cores, ~460 now). x is put in the matching order once per call (`prepare_x`). A row's last
// K % 512 weights (SmolLM2's 576) go by units of 64 (two blocks in one `vpdpbusd`, float work
// each), where a superblock would be mostly zeros.
//
// Many rows of x (a prompt, a batch): a thread transposes a few weight rows once into L1
// (`transpose_rows`), then every row of x passes them, 2 at a time against 4 weight rows (8
// accumulators: a vector of weights and one of x each feed several `vpdpbusd`). One row of x (a
// decode step) transposes in registers as it reads. Every output takes the same float operations
// in the same order in either case: a row gives the same bits alone and in any batch on a CPU.

#include <algorithm>
#include <atomic>
#include <vector>

#include "vnni.h"

namespace exo_kernels {

namespace {
std::atomic<bool> g_no_vnni{false};
}  // namespace

void force_no_vnni(bool on) {
  g_no_vnni = on;
}

bool vnni_available() {
#ifdef EXO_X86
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return cpu && avx512_available() && !g_no_vnni.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

bool vnni_takes(const Problem& p) {
  return p.int8 && (p.bits == 4 || p.bits == 8) && p.K % 64 == 0 && !p.dequantize &&
      vnni_available();
}

#ifdef EXO_X86

namespace {

using vnni::kTileBytes;
using vnni::kUnit;
using vnni::load16;
using vnni::prefetch_ahead;
using vnni::scratch;
using vnni::store_outputs;

// A superblock: 16 blocks of 32 weights, 256 packed bytes of a row. Transposed, its lane
// L = 4 b + i holds block 4 i + b (`lane_block`). A unit: 64 weights (two blocks), 32 bytes.
constexpr int64_t kSuper = 512;
constexpr int kSuperBlocks = 16;
constexpr int lane_block(int lane) {
  return 4 * (lane % 4) + lane / 4;
}

// x's rows for this kernel (`prepare_x`): per superblock 8 steps of 64 bytes, step 2 k holding
// each lane's block's even elements 4k..4k+3 (against the low nibbles of dword k), step 2 k + 1
// its odd ones (the high nibbles); then per unit its two blocks' evens, then their odds (against
// `nibbles64`). Per superblock and per unit, 16 starts and 16 dx, one a lane.
struct Layout {
  int64_t supers;  // whole superblocks a row
  int64_t units;   // units after them
  explicit Layout(int64_t K) : supers(K / kSuper), units(K % kSuper / kUnit) {}
  int64_t code_bytes() const { return supers * kSuper + units * kUnit; }
  int64_t lanes() const { return (supers + units) * 16; }
};

// Per lane, the index of its block's scale among a superblock's scales.
template <int GS>
EXO_VNNI inline __m512i scale_lanes() {
  alignas(64) int32_t idx[16];
  for (int lane = 0; lane < 16; ++lane) idx[lane] = lane_block(lane) * 32 / GS;
  return _mm512_load_si512(idx);
}

// The scales of superblock u's blocks, one per lane in lane order.
template <int GS, class T>
EXO_VNNI inline __m512 super_scales(const T* sr, int64_t u, __m512i lanes) {
  constexpr int64_t per = kSuper / GS;
  return _mm512_permutexvar_ps(lanes, load16(sr + u * per, per));
}

// The 4 dwords of each of 16 blocks (4 vectors of 4 blocks, one block a 128-bit lane),
// transposed so that t[k]'s lane 4 b + i holds dword k of block 4 i + b.
EXO_VNNI inline void load_super(const uint8_t* w, __m512i t[4]) {
  __m512i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm512_loadu_si512(w + 64 * i);
  const __m512i a = _mm512_unpacklo_epi32(r[0], r[1]);
  const __m512i b = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i c = _mm512_unpacklo_epi32(r[2], r[3]);
  const __m512i d = _mm512_unpackhi_epi32(r[2], r[3]);
  t[0] = _mm512_unpacklo_epi64(a, c);
  t[1] = _mm512_unpackhi_epi64(a, c);
  t[2] = _mm512_unpacklo_epi64(b, d);
  t[3] = _mm512_unpackhi_epi64(b, d);
}

// A unit's 32 packed bytes as 64 unsigned nibbles: lanes 0-3 block 0's even elements, 4-7 block
// 1's, 8-11 block 0's odd ones, 12-15 block 1's.
EXO_VNNI inline __m512i nibbles64(const uint8_t* w) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_srli_epi16(lo, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
}

// Each lane's block (0 or 1) in a unit.
constexpr int unit_block(int lane) {
  return lane / 4 % 2;
}

// The scale of each lane of unit u (the u-th 64 weights of a row whose scales start at sr).
template <int GS, class T>
EXO_VNNI inline __m512 unit_scale(const T* sr, int64_t u) {
  if constexpr (GS == 32) {
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(two_scales(sr + 2 * u)));
  } else {
    return _mm512_set1_ps(scale_at(sr, u * kUnit / GS));
  }
}

// The float work of a superblock or unit `at` of a row: each lane's dot product times its dx
// and its scale, added to the lane's total.
template <int W, int R>
EXO_VNNI __attribute__((always_inline)) inline void finish(
    const float* const (&dr)[R], int64_t at, const __m512 (&sv)[W], const __m512i (&acc)[W][R],
    __m512 (&total)[W][R]) {
  for (int r = 0; r < R; ++r) {
    const __m512 dv = _mm512_loadu_ps(dr[r] + 16 * at);
    for (int j = 0; j < W; ++j)
      total[j][r] =
          _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[j][r]), dv), sv[j], total[j][r]);
  }
}

// Where the weight rows of a block come from: a thread's buffer that `transpose_rows` filled
// once for every row of x (a prompt, a batch; rows from `n0`, K / 2 bytes each, superblocks
// transposed, units as they were), or (`at` null) the packed rows themselves, transposed in
// registers as they are read (one row of x: nothing to share).
struct Tiles {
  const uint8_t* at = nullptr;
  int64_t n0 = 0;
};

// Superblock u of weight rows n.. (`wr`: packed, or `tiles`) against rows of x: per lane its
// block's exact dot product (8 `vpdpbusd` from the block's start).
template <int W, int R>
EXO_VNNI __attribute__((always_inline)) inline void super_dots(
    const Problem& p, int64_t n, int64_t u, const Tiles& tiles, const uint8_t* const (&wr)[W],
    const int8_t* const (&xr)[R], const int32_t* const (&cr)[R], __m512i (&acc)[W][R]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t offset = u * (kSuper / 2);
  __m512i read[W][4];  // the superblock transposed here (no tiles)
  if (!tiles.at)
    for (int j = 0; j < W; ++j) {
      prefetch_ahead(p, wr[j], n + j, offset, kSuper / 2);
      load_super(wr[j] + offset, read[j]);
    }
  for (int r = 0; r < R; ++r) {
    const __m512i start = _mm512_loadu_si512(cr[r] + 16 * u);
    for (int j = 0; j < W; ++j) acc[j][r] = start;
  }
  for (int k = 0; k < 4; ++k) {
    __m512i tk[W];
    for (int j = 0; j < W; ++j)
      tk[j] = tiles.at ? _mm512_loadu_si512(wr[j] + offset + 64 * k) : read[j][k];
    for (int half = 0; half < 2; ++half) {
      __m512i nib[W];
      for (int j = 0; j < W; ++j)
        nib[j] = _mm512_and_si512(half ? _mm512_srli_epi16(tk[j], 4) : tk[j], low);
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_loadu_si512(xr[r] + u * kSuper + 128 * k + 64 * half);
        for (int j = 0; j < W; ++j) acc[j][r] = _mm512_dpbusd_epi32(acc[j][r], nib[j], xv);
      }
    }
  }
}

// Superblock u's float work: `finish` with each weight row's scales in lane order.
template <int GS, int W, int R, class T>
EXO_VNNI __attribute__((always_inline)) inline void super_finish(
    int64_t u, const T* const (&sr)[W], const float* const (&dr)[R], const __m512i (&acc)[W][R],
    __m512 (&total)[W][R]) {
  const __m512i lanes = scale_lanes<GS>();
  __m512 sv[W];
  for (int j = 0; j < W; ++j) sv[j] = super_scales<GS>(sr[j], u, lanes);
  finish(dr, u, sv, acc, total);
}

// Outputs [m0, m0 + R) x [n, n + W). T: how the scales are stored (float, F16, BF16), read in
// place. p.qx, p.qc (starts) and p.dx: x in this kernel's layout (`compute_vnni`). U: superblocks
// whose dot products are computed before their float work (one weight row streamed from memory
// takes 2: two chains of 8 `vpdpbusd` side by side); the float work stays in superblock order.
template <int GS, int W, int R, class T, int U = 1>
EXO_VNNI inline void block(const Problem& p, int64_t n, int64_t m0, const Tiles& tiles) {
  const Layout layout(p.K);
  const int64_t row_bytes = p.K / 2;
  const uint8_t* wr[W];
  const T* sr[W];
  const T* br[W];
  for (int j = 0; j < W; ++j) {
    wr[j] = tiles.at ? tiles.at + (n + j - tiles.n0) * row_bytes
                     : reinterpret_cast<const uint8_t*>(p.w) + (n + j) * row_bytes;
    sr[j] = scales_of<T>(p) + (n + j) * p.G;
    br[j] = p.implicit_bias ? nullptr : biases_of<T>(p) + (n + j) * p.G;
  }
  const int8_t* xr[R];
  const int32_t* cr[R];
  const float* dr[R];
  for (int r = 0; r < R; ++r) {
    xr[r] = p.qx + (m0 + r) * layout.code_bytes();
    cr[r] = p.qc + (m0 + r) * layout.lanes();
    dr[r] = p.dx + (m0 + r) * layout.lanes();
  }
  __m512 total[W][R];
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r) total[j][r] = _mm512_setzero_ps();
  int64_t u = 0;
  for (; u + U <= layout.supers; u += U) {
    __m512i acc[U][W][R];
    for (int v = 0; v < U; ++v) super_dots(p, n, u + v, tiles, wr, xr, cr, acc[v]);
    for (int v = 0; v < U; ++v) super_finish<GS>(u + v, sr, dr, acc[v], total);
  }
  for (; u < layout.supers; ++u) {
    __m512i acc[W][R];
    super_dots(p, n, u, tiles, wr, xr, cr, acc);
    super_finish<GS>(u, sr, dr, acc, total);
  }
  for (int64_t t = 0; t < layout.units; ++t) {
    const int64_t unit = layout.supers * (kSuper / kUnit) + t;  // among the row's units of 64
    __m512i wv[W];
    __m512 sv[W];
    for (int j = 0; j < W; ++j) {
      if (!tiles.at) prefetch_ahead(p, wr[j], n + j, unit * (kUnit / 2), kUnit / 2);
      wv[j] = nibbles64(wr[j] + unit * (kUnit / 2));
      sv[j] = unit_scale<GS>(sr[j], unit);
    }
    __m512i acc[W][R];
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(xr[r] + layout.supers * kSuper + kUnit * t);
      const __m512i start = _mm512_loadu_si512(cr[r] + 16 * (layout.supers + t));
      for (int j = 0; j < W; ++j) acc[j][r] = _mm512_dpbusd_epi32(start, wv[j], xv);
    }
    finish(dr, layout.supers + t, sv, acc, total);
  }
  store_outputs(p, n, m0, sr, br, total);
}

// Rows [m0, m0 + R) of x against weight rows [n0, n1): 4 at a time, then one by one.
template <int GS, int R, class T>
EXO_VNNI inline void weight_rows(
    const Problem& p, int64_t n0, int64_t n1, int64_t m0, const Tiles& tiles) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) block<GS, 4, R, T>(p, n, m0, tiles);
  for (; n < n1; ++n) block<GS, 1, R, T>(p, n, m0, tiles);
}

// Weight rows [n0, n1) into `out` as `Tiles` reads them: superblocks transposed, units copied.
EXO_VNNI void transpose_rows(const Problem& p, int64_t n0, int64_t n1, uint8_t* out) {
  const Layout layout(p.K);
  const int64_t row_bytes = p.K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(p.w) + n * row_bytes;
    uint8_t* to = out + (n - n0) * row_bytes;
    for (int64_t u = 0; u < layout.supers; ++u) {
      __m512i t[4];
      load_super(w + u * (kSuper / 2), t);
      for (int k = 0; k < 4; ++k) _mm512_storeu_si512(to + u * (kSuper / 2) + 64 * k, t[k]);
    }
    const int64_t done = layout.supers * (kSuper / 2);
    std::copy(w + done, w + row_bytes, to + done);
  }
}

// A one-row call over weights of this size or more (more than the last-level cache holds for it)
// whose rows are 1 KB or more streams them one row at a time, in memory order, two superblocks
// in flight: 4 rows side by side (sharing x's loads, 1.2-1.4x faster from cache) ran 1.3-1.8x
// slower there. 1 row of x, 2 threads, alternating in one process, 2026-12-06, ms for 4 rows
// side by side / one row / one row with two superblocks in flight: the 7B's gate/up 22016 x 4096
// 2.50 / 1.75 / 1.62, its head 49152 x 4096 6.30 / 4.45 / 4.36, q/k/v 12288 x 4096 0.98 / 0.71 /
// 0.66. Narrow rows (SmolLM2's 576: 4 rows are 1152 contiguous bytes) keep 4 side by side:
// 131072 x 576, 1.31 ms against 1.73 one row at a time.
constexpr int64_t kStreamBytes = 16 << 20;
inline bool streams_one_row_at_a_time(const Problem& p) {
  return p.N * p.K / 2 >= kStreamBytes && p.K >= 2048;
}

// The transposed weight rows a thread holds at once, in L1 while every row of a tile of x passes
// them (4 to 32 rows).
constexpr int64_t kTransposedBytes = 16 * 1024;

template <int GS, class T>
EXO_VNNI void rows_gs(const Problem& p, int64_t n0, int64_t n1) {
  if (p.M == 1) {
    // One row of x: each weight row is read once, transposed in registers.
    if (streams_one_row_at_a_time(p))
      for (int64_t n = n0; n < n1; ++n) block<GS, 1, 1, T, 2>(p, n, 0, Tiles{});
    else
      weight_rows<GS, 1, T>(p, n0, n1, 0, Tiles{});
    return;
  }
  const Layout layout(p.K);
  const int64_t row_bytes = p.K / 2;
  const int64_t batch = std::clamp<int64_t>(kTransposedBytes / row_bytes / 4 * 4, 4, 32);
  thread_local std::vector<uint8_t> store;
  if (static_cast<int64_t>(store.size()) < batch * row_bytes) store.resize(batch * row_bytes);
  const int64_t x_row_bytes = layout.code_bytes() + layout.lanes() * 8;
  const int64_t tile = std::max<int64_t>(2, kTileBytes / x_row_bytes / 2 * 2);
  for (int64_t t0 = 0; t0 < p.M; t0 += tile) {
    const int64_t t1 = std::min(p.M, t0 + tile);
    for (int64_t nb = n0; nb < n1; nb += batch) {
      const int64_t nb1 = std::min(n1, nb + batch);
      transpose_rows(p, nb, nb1, store.data());
      const Tiles tiles{store.data(), nb};
      int64_t m = t0;
      for (; m + 2 <= t1; m += 2) weight_rows<GS, 2, T>(p, nb, nb1, m, tiles);
      for (; m < t1; ++m) weight_rows<GS, 1, T>(p, nb, nb1, m, tiles);
    }
  }
}

// x as the int8 path quantized it (per block of 32: its 16 even elements, then its 16 odd ones;
// dx per block) into this kernel's `Layout`: per block its dwords where its lane reads them, its
// start (-8 * the sum of its values: the centring of the weights' nibbles) and its dx in every
// lane of its. Lanes of no block (a unit's starts but two) hold 0 and add 0.
void prepare_x(
    const int8_t* qx, const float* dx, int64_t M, int64_t K, int8_t* qv, int32_t* qc, float* dl) {
  const Layout layout(K);
  const int64_t blocks = K / 32;
  const int64_t super_blocks = layout.supers * kSuperBlocks;
  std::fill(qc, qc + M * layout.lanes(), 0);
  for (int64_t m = 0; m < M; ++m) {
    int8_t* row = qv + m * layout.code_bytes();
    for (int64_t b = 0; b < blocks; ++b) {
      const int8_t* src = qx + m * K + 32 * b;
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) sum += src[i];
      if (b < super_blocks) {
        const int64_t u = b / kSuperBlocks;
        const int lane = lane_block(static_cast<int>(b % kSuperBlocks));  // its own inverse
        int8_t* dst = row + u * kSuper + 4 * lane;
        for (int k = 0; k < 4; ++k) {
          std::copy(src + 4 * k, src + 4 * k + 4, dst + 128 * k);
          std::copy(src + 16 + 4 * k, src + 16 + 4 * k + 4, dst + 128 * k + 64);
        }
        const int64_t at = m * layout.lanes() + 16 * u + lane;
        qc[at] = -8 * sum;
        dl[at] = dx[m * blocks + b];
      } else {
        const int64_t t = (b - super_blocks) / 2;
        const int half = static_cast<int>((b - super_blocks) % 2);
        int8_t* dst = row + layout.supers * kSuper + kUnit * t + 16 * half;
        std::copy(src, src + 16, dst);
        std::copy(src + 16, src + 32, dst + 32);
        const int64_t at = m * layout.lanes() + 16 * (layout.supers + t);
        qc[at + 4 * half] = -8 * sum;
        for (int lane = 0; lane < 16; ++lane)
          if (unit_block(lane) == half) dl[at + lane] = dx[m * blocks + b];
      }
    }
  }
}


}  // namespace

void compute_vnni(Problem p, void (*run)(const Problem&)) {
  if (p.bits == 8) {
    vnni::compute8(p, run);
    return;
  }
  thread_local std::vector<int8_t> qv_store;
  thread_local std::vector<int32_t> qc_store;
  thread_local std::vector<float> dl_store;
  const Layout layout(p.K);
  int8_t* qv = scratch(qv_store, p.M * layout.code_bytes());
  int32_t* qc = scratch(qc_store, p.M * layout.lanes());
  float* dl = scratch(dl_store, p.M * layout.lanes());
  prepare_x(p.qx, p.dx, p.M, p.K, qv, qc, dl);
  p.qx = qv;
  p.qc = qc;
  p.dx = dl;
  run(p);
}

void rows_vnni(const Problem& p, int64_t n0, int64_t n1) {
  if (p.bits == 8)
    vnni::rows8(p, n0, n1);
  else
    vnni::by_layout(
        p, [&](auto gs, auto scale) { rows_gs<decltype(gs)::value, decltype(scale)>(p, n0, n1); });
}
#else
void compute_vnni(Problem p, void (*run)(const Problem&)) {
  run(p);
}
void rows_vnni(const Problem&, int64_t, int64_t) {}
#endif

}  // namespace exo_kernels
