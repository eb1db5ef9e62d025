// Causal GQA attention over the KV cache (f16 or q8_0 head rows, layout in model.cuh).
//
// Shapes: T = tokens of this call (at positions pos0 .. pos0+T-1, pos0 = sp[0]; slot sp[1]),
// Nh / Nkv = query / KV heads, G = Nh/Nkv query heads per KV head (≤ 16), D = head dim
// (64, 128 or 256; 256 with G ≤ 8). q is f32 [T, Nh, D] (normed and rotated), the output f32 [T, Nh, D]. Token t
// sees positions 0 ..= pos0 + t, whose K/V rows are already in the cache; with `window` W > 0
// only the last W of them, pos0 + t − W < p ≤ pos0 + t (sliding-window attention). `sinks`
// (f32 [Nh], or null): per query head one more logit in the softmax, with no value (it raises
// the max and adds e^(sink − max) to the sum, as ggml's soft_max_ext with sinks).
//
// Decode (small T): `strata_attn_decode_*` splits the visible positions into at most n_split
// ranges (grid.x) of one KV head (grid.y) and token (grid.z), as many as the live length
// needs; the G query heads of the KV head share every K/V read. With `hs` > 1 the launcher
// passes n_head_kv = Nkv·hs: grid.y row r takes G/hs of KV head r / hs's query heads (each
// head computed as with hs = 1, bitwise: a head's sums never mix with another's), more
// blocks for short contexts at hs reads of the same K/V. One live split writes the
// output; several leave partials (acc, max, sum) that the last of them to finish merges.
// The ranges are computed on the device from pos0, so a captured graph serves every length.
// Prefill (large T): `strata_attn_prefill_*` is a flash-attention kernel on tensor cores
// (mma.sync m16n8k16, f16 in, f32 accumulate): a block is 64 (token, head) rows of one KV
// head, K/V tiles of 64 positions go through shared memory as f16 (q8_0: K as its int8 values
// beside the block scales, V dequantized). D = 256: tiles of 32 positions, and each block
// writes half of the output dims (grid.z = 2; both halves compute the same scores in the same
// order, so the softmax is one), which keeps the accumulators and tiles within a block's
// registers and static shared memory.
//
// Numerics: for an f16 cache q is rounded to f16 and q·k summed in f32 (as the CPU path);
// for q8_0, q is quantized to q8_0 and q·k is the ggml integer block dot (decode: dp4a;
// prefill: the int8 values on tensor cores, exact, one block at a time). Scores are scaled by
// `scale` (1/√D) and soft-maxed in f32. Prefill rounds probabilities and V values to f16.
#include "model.cuh"
#include "actq.cuh"

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_TILE 128      // positions per pass of the decode kernel
#define ATT_OCT 8         // lanes per position in the decode score pass
#define ATT_SU 4          // score steps (of 16 positions) whose K loads are in flight at once
#define ATT_VU 8          // V rows a warp loads at once
#define ATT_MIN_CHUNK 32  // fewest positions a decode split takes
#define NEG_INF (-__builtin_huge_valf())

// ---- decode --------------------------------------------------------------------------
//
// Block (s, kvh, t) takes split s of the n = pos0 + t + 1 visible positions: chunk =
// max(⌈n / n_split⌉, ATT_MIN_CHUNK) positions, so n_live = ⌈n / chunk⌉ splits have work and
// the blocks s ≥ n_live return at once (short contexts use few blocks, long ones all).
// Scores: 8 lanes per position (each D/8 dims, reduced by 3 shuffles), 16 positions per
// step, into shared memory; online softmax per head over a pass of ATT_TILE positions; then
// P·V with one warp per position (each lane D/32 dims of the G heads).
// n_live = 1: the block writes out directly. Otherwise each block leaves its partial
// (acc, max, sum) and the last block of (t, kvh) to finish (a counter in part_ml's tail,
// reset by that block) merges the n_live partials into out.
//
// part_o f32 [T, Nh, S, D] unnormalized; part_ml per token t: i32 [Nh] counters (the first
// Nkv used), then f32 [Nh, S, 2] (max, sum); a token's part does not depend on T, so calls
// with different T share the buffer. The counters are zero before the first launch, and
// every launch leaves them zero.
// out f32 [T, Nh, D]; with `act` ACT_Q8_0 / ACT_Q8_K (actq.cuh) the block that writes the
// G heads' rows of out also quantizes them into qout (block_q8a [T, Nh·D / 32]) as the
// output projection's quantize kernel would, from a copy in shared memory (G·D a multiple of
// the kind's item; ACT_NONE: qout unused). Launch: grid (S, Nkv, T), block ATT_THREADS.
// The decode block's output rows (their copy in shared memory, `rows` [n], the rows from
// query head `head0`) quantized into qout for the output projection; nothing (no barrier
// either) for ACT_NONE. `act` is the same for the whole block, so the barrier inside the
// branch is reached by every thread.
SM_D void attn_act_tail(const float* rows, block_q8a* qout, size_t head0, int d, int n,
                        int act) {
  if (act == ACT_NONE) return;
  __syncthreads();  // the rows, written by other warps, visible to the quantizing ones
  act_quantize_block(rows, qout + head0 * d / 32, n, act);
}

template <int KV, int D, int MAXG>
__device__ void attn_decode(const float* q, const uint8_t* kc, const uint8_t* vc,
                            unsigned long long slot_stride, const int* sp, float* part_o,
                            float* part_ml, float* out, int n_head, int n_head_kv, int n_ctx,
                            int n_split, float scale, const float* sinks, int window,
                            block_q8a* qout, int act, int hs) {
  constexpr int HB = KV == SM_KV_F16 ? 2 * D : D / 32 * 34;
  constexpr int DL = D / ATT_OCT;      // dims of a lane in the score pass (16 or 8)
  constexpr int QS = DL + 4;           // padded stride of a lane's q chunk (no bank conflicts)
  constexpr int LPB = 32 / DL;         // q8_0: lanes per 32-value block (2 or 4)
  constexpr int VD = D / 32;           // dims of a lane in the V pass (4 or 2)
  constexpr int PSTEP = ATT_THREADS / ATT_OCT;  // positions per score step (16)
  __shared__ __align__(16) float qf[MAXG][ATT_OCT * QS];  // f16 cache: q rounded to f16
  __shared__ int qq[MAXG][D / 4];     // q8_0 cache: q's int8 quants, packed by 4
  __shared__ float qd[MAXG][D / 32];  // and their block scales
  __shared__ float sc[MAXG][ATT_TILE];  // scores, then probabilities of a pass
  __shared__ float mrun[MAXG], lrun[MAXG], alpha[MAXG];
  __shared__ __align__(16) float red[MAXG][D];  // 16-byte rows: the tails' float4 reads
  __shared__ float wsp[MAXG][32], lsum[MAXG];
  __shared__ int is_last;
  const int G = n_head / n_head_kv;
  const int s = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = sp[0] + t + 1;
  const int lo = window > 0 && n > window ? n - window : 0;  // the first visible position
  int chunk = (n - lo + n_split - 1) / n_split;
  chunk = chunk < ATT_MIN_CHUNK ? ATT_MIN_CHUNK : chunk;
  const int n_live = (n - lo + chunk - 1) / chunk;
  if (s >= n_live) return;  // the whole block: no barrier is skipped by part of it
  const int p_begin = lo + s * chunk;
  const int p_end = p_begin + chunk < n ? p_begin + chunk : n;
  // a KV head's query heads split over hs blocks: block row kvh reads KV head kvh / hs
  const size_t base = (size_t)sp[1] * slot_stride + (size_t)(kvh / hs) * n_ctx * HB;
  const uint8_t* kb = kc + base;
  const uint8_t* vb = vc + base;
  const size_t head0 = (size_t)t * n_head + (size_t)kvh * G;  // first query head row
  const float* qh = q + head0 * D;
  float* ml_t = part_ml + (size_t)t * n_head * (2 * n_split + 1);  // token t's counters, then
  float* ml = ml_t + n_head + (size_t)kvh * G * n_split * 2;     // (max, sum) of head kvh·G..

  // q of the G heads in the key type's dot form
  if (KV == SM_KV_F16) {
    for (int i = tid; i < G * D; i += ATT_THREADS) {
      int g = i / D, dm = i % D;
      qf[g][(dm / DL) * QS + dm % DL] = sm_round_h(qh[i]);
    }
  } else {
    for (int gb = warp; gb < G * (D / 32); gb += ATT_WARPS) {
      int g = gb / (D / 32), b = gb % (D / 32);
      float x = qh[g * D + b * 32 + lane];
      float amax = sm_warp_max(fabsf(x));
      int v = sm_rint(x * sm_q8_0_inv(amax)) & 0xff;
      // pack lanes 4j..4j+3 into word j of the block
      int w = v << (8 * (lane & 3));
      w |= __shfl_xor_sync(0xffffffffu, w, 1);
      w |= __shfl_xor_sync(0xffffffffu, w, 2);
      if ((lane & 3) == 0) qq[g][b * 8 + (lane >> 2)] = w;
      if (lane == 0) qd[g][b] = sm_round_h(amax / 127.0f);
    }
  }
  if (tid < MAXG) {
    mrun[tid] = NEG_INF;
    lrun[tid] = 0.0f;
  }
  float acc[MAXG][VD];
#pragma unroll
  for (int g = 0; g < MAXG; g++)
#pragma unroll
    for (int i = 0; i < VD; i++) acc[g][i] = 0.0f;
  const int oct = tid / ATT_OCT, c = tid % ATT_OCT;  // score pass: position oct, dims c·DL..
  const int dd = lane * VD;                          // V pass: dims dd .. dd + VD
  __syncthreads();

  for (int p0 = p_begin; p0 < p_end; p0 += ATT_TILE) {
    const int cnt = p_end - p0 < ATT_TILE ? p_end - p0 : ATT_TILE;
    // scores of positions p0 + j, j < cnt: ATT_SU steps of PSTEP positions at a time, their
    // K loads issued together (the loop bounds are uniform over the block)
    for (int j0 = 0; j0 < cnt; j0 += ATT_SU * PSTEP) {
      constexpr int KW = KV == SM_KV_F16 ? DL / 8 : 1;  // f16: uint4 per lane and position
      uint4 kraw[ATT_SU][KW];  // f16 K chunks
      int kq[ATT_SU][DL / 4];  // q8_0 K quants (words)
      float kd[ATT_SU];        // q8_0 K block scales
      const int b = c / LPB, part = c % LPB;  // q8_0: block and quarter/half of this lane
#pragma unroll
      for (int u = 0; u < ATT_SU; u++) {
        const int j = j0 + u * PSTEP + oct;
        const bool ok = j < cnt;
        const uint8_t* kr = kb + (size_t)(p0 + (ok ? j : 0)) * HB;
        if (KV == SM_KV_F16) {
#pragma unroll
          for (int v = 0; v < KW; v++) {
            kraw[u][v] = make_uint4(0, 0, 0, 0);
            if (ok) kraw[u][v] = *(const uint4*)(kr + 2 * (c * DL + 8 * v));
          }
        } else {
          // lane c: values part·DL .. of block b; the block's integer dot is summed over its
          // LPB lanes, then scaled once (ggml's q8_0 block dot)
          const uint16_t* kw = (const uint16_t*)(kr + 34 * b);
          kd[u] = ok ? sm_h2f(kw[0]) : 0.0f;
#pragma unroll
          for (int v = 0; v < DL / 4; v++) {
            int o = 1 + part * (DL / 2) + 2 * v;
            kq[u][v] = ok ? (int)((uint32_t)kw[o] | ((uint32_t)kw[o + 1] << 16)) : 0;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < ATT_SU; u++) {
        if (j0 + u * PSTEP >= cnt) break;  // uniform
        const int j = j0 + u * PSTEP + oct;
        const bool ok = j < cnt;
        float sg[MAXG];
        if (KV == SM_KV_F16) {
          float kf[DL];
#pragma unroll
          for (int v = 0; v < KW; v++) {
            uint32_t ws[4] = {kraw[u][v].x, kraw[u][v].y, kraw[u][v].z, kraw[u][v].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
              kf[8 * v + 2 * i] = sm_h2f((uint16_t)(ws[i] & 0xffff));
              kf[8 * v + 2 * i + 1] = sm_h2f((uint16_t)(ws[i] >> 16));
            }
          }
#pragma unroll
          for (int g = 0; g < MAXG; g++) {
            sg[g] = 0.0f;
            if (g < G) {
              const float4* qv = (const float4*)&qf[g][c * QS];
#pragma unroll
              for (int v = 0; v < DL / 4; v++) {
                float4 a = qv[v];
                sg[g] += a.x * kf[4 * v] + a.y * kf[4 * v + 1] + a.z * kf[4 * v + 2] +
                         a.w * kf[4 * v + 3];
              }
            }
          }
        } else {
#pragma unroll
          for (int g = 0; g < MAXG; g++) {
            sg[g] = 0.0f;
            if (g < G) {
              int isum = 0;
#pragma unroll
              for (int v = 0; v < DL / 4; v++)
                isum = __dp4a(kq[u][v], qq[g][b * 8 + part * (DL / 4) + v], isum);
#pragma unroll
              for (int o = 1; o < LPB; o <<= 1) isum += __shfl_xor_sync(0xffffffffu, isum, o);
              sg[g] = part == 0 ? (float)isum * (kd[u] * qd[g][b]) : 0.0f;
            }
          }
        }
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
          if (g < G) {
            float v = sg[g];
#pragma unroll
            for (int o = 1; o < ATT_OCT; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (c == 0) sc[g][j] = ok ? v * scale : NEG_INF;
          }
        }
      }
    }
    __syncthreads();
    // running max and sum per head (warp w takes heads w, w+4, ...)
    for (int g = warp; g < G; g += ATT_WARPS) {
      float mx = NEG_INF;
      for (int j = lane; j < cnt; j += 32) mx = fmaxf(mx, sc[g][j]);
      mx = sm_warp_max(mx);
      float mold = mrun[g], mnew = fmaxf(mold, mx);  // finite: position p0 is visible
      float sum = 0.0f;
      for (int j = lane; j < cnt; j += 32) {
        float e = expf(sc[g][j] - mnew);
        sc[g][j] = e;
        sum += e;
      }
      sum = sm_warp_sum(sum);
      if (lane == 0) {
        float a = expf(mold - mnew);
        alpha[g] = a;
        lrun[g] = lrun[g] * a + sum;
        mrun[g] = mnew;
      }
    }
    __syncthreads();
    // acc = acc·alpha + Σ_j p_j·v_j over this pass's positions (warp w takes j ≡ w)
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
      if (g < G) {
#pragma unroll
        for (int i = 0; i < VD; i++) acc[g][i] *= alpha[g];
      }
    }
    for (int j0 = warp; j0 < cnt; j0 += ATT_VU * ATT_WARPS) {
      float vv[ATT_VU][VD], vd[ATT_VU];  // V rows j0 + u·ATT_WARPS, loaded together
#pragma unroll
      for (int u = 0; u < ATT_VU; u++) {
        const int j = j0 + u * ATT_WARPS;
        const bool ok = j < cnt;
        const uint8_t* vr = vb + (size_t)(p0 + (ok ? j : j0)) * HB;
        vd[u] = 1.0f;
        if (KV == SM_KV_F16) {
#pragma unroll
          for (int i = 0; i < VD / 2; i++) {
            uint32_t w = ok ? *(const uint32_t*)(vr + 2 * dd + 4 * i) : 0u;
            vv[u][2 * i] = sm_h2f((uint16_t)(w & 0xffff));
            vv[u][2 * i + 1] = sm_h2f((uint16_t)(w >> 16));
          }
        } else {
          const uint8_t* blk = vr + (dd >> 5) * 34;
          vd[u] = ok ? sm_h2f(*(const uint16_t*)blk) : 0.0f;
#pragma unroll
          for (int i = 0; i < VD / 2; i++) {
            uint16_t w = ok ? *(const uint16_t*)(blk + 2 + (dd & 31) + 2 * i) : 0;
            vv[u][2 * i] = (float)(int8_t)(w & 0xff);
            vv[u][2 * i + 1] = (float)(int8_t)(w >> 8);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < ATT_VU; u++) {
        const int j = j0 + u * ATT_WARPS;
        if (j >= cnt) break;  // rows past cnt were not loaded (and sc holds no probability)
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
          if (g < G) {
            float pj = KV == SM_KV_F16 ? sc[g][j] : vd[u] * sc[g][j];
#pragma unroll
            for (int i = 0; i < VD; i++) acc[g][i] += pj * vv[u][i];
          }
        }
      }
    }
    __syncthreads();  // sc is rewritten by the next pass
  }

  // sum the warps' partials into warp 0
  for (int wi = 1; wi < ATT_WARPS; wi++) {
    if (warp == wi) {
#pragma unroll
      for (int g = 0; g < MAXG; g++)
        if (g < G)
#pragma unroll
          for (int i = 0; i < VD; i++) red[g][dd + i] = acc[g][i];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int g = 0; g < MAXG; g++)
        if (g < G)
#pragma unroll
          for (int i = 0; i < VD; i++) acc[g][i] += red[g][dd + i];
    }
    __syncthreads();
  }
  if (n_live == 1) {  // the only split: normalize and write the output
    if (warp == 0) {
#pragma unroll
      for (int g = 0; g < MAXG; g++) {
        if (g < G) {
          float l = lrun[g], a = 1.0f;
          if (sinks != nullptr) {  // the sink joins the max and the sum
            const float sk = sinks[kvh * G + g], mx = fmaxf(mrun[g], sk);
            a = expf(mrun[g] - mx);
            l = l * a + expf(sk - mx);
          }
#pragma unroll
          for (int i = 0; i < VD; i++) {
            const float v = acc[g][i] * a / l;
            out[(head0 + g) * D + dd + i] = v;
            red[g][dd + i] = v;  // the rows again for the quantizing warps (red is free now)
          }
        }
      }
    }
    attn_act_tail(&red[0][0], qout, head0, D, G * D, act);
    return;
  }
  if (warp == 0) {
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
      if (g < G) {
        size_t row = (head0 + g) * n_split + s;
#pragma unroll
        for (int i = 0; i < VD; i++) part_o[row * D + dd + i] = acc[g][i];
      }
    }
  }
  if (tid < G) {
    ml[2 * (tid * n_split + s)] = mrun[tid];
    ml[2 * (tid * n_split + s) + 1] = lrun[tid];
  }
  // the last block of (t, kvh) to get here merges the partials
  int* counter = (int*)ml_t + kvh;
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(counter, 1) == n_live - 1;
  __syncthreads();
  if (!is_last) return;
  if (tid == 0) *counter = 0;  // ready for the next launch
  // out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s (every live split has a finite max)
  for (int g = warp; g < G; g += ATT_WARPS) {
    float m = NEG_INF, l = 0.0f;
    if (lane < n_live) {
      m = __ldcg(ml + 2 * (g * n_split + lane));
      l = __ldcg(ml + 2 * (g * n_split + lane) + 1);
    }
    float mx = sm_warp_max(m);
    const float sk = sinks != nullptr ? sinks[kvh * G + g] : NEG_INF;
    mx = fmaxf(mx, sk);
    float w = lane < n_live ? expf(m - mx) : 0.0f;
    float ls = sm_warp_sum(w * l) + (sinks != nullptr ? expf(sk - mx) : 0.0f);
    wsp[g][lane] = w;
    if (lane == 0) lsum[g] = ls;
  }
  __syncthreads();
  // float4 f = tid + j·ATT_THREADS of the G·D/4 outputs; the loads of all j (and, unrolled,
  // of several splits) are in flight together
  constexpr int D4 = D / 4, NJ = (MAXG * D4 + ATT_THREADS - 1) / ATT_THREADS;
  float4 a[NJ];
#pragma unroll
  for (int j = 0; j < NJ; j++) a[j].x = a[j].y = a[j].z = a[j].w = 0.0f;
#pragma unroll 4
  for (int k = 0; k < n_live; k++) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int f = tid + j * ATT_THREADS, g = f / D4;
      if (g < G) {
        const float4* src = (const float4*)(part_o + ((head0 + g) * n_split + k) * D) + f % D4;
        float4 p = __ldcg(src);
        float wk = wsp[g][k];
        a[j].x += wk * p.x;
        a[j].y += wk * p.y;
        a[j].z += wk * p.z;
        a[j].w += wk * p.w;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    int f = tid + j * ATT_THREADS, g = f / D4;
    if (g < G) {
      float* o = out + (head0 + g) * D + 4 * (f % D4);
      float* r = &red[g][4 * (f % D4)];  // the rows again for the quantizing warps
      float l = lsum[g];
      o[0] = r[0] = a[j].x / l;
      o[1] = r[1] = a[j].y / l;
      o[2] = r[2] = a[j].z / l;
      o[3] = r[3] = a[j].w / l;
    }
  }
  attn_act_tail(&red[0][0], qout, head0, D, G * D, act);
}

#define ATT_DECODE(KVN, KV, D, MAXG)                                                          \
  extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                  \
      strata_attn_decode_##KVN##_d##D##_g##MAXG(                                             \
          const float* q, const uint8_t* kc, const uint8_t* vc,                              \
          unsigned long long slot_stride, const int* sp, float* part_o, float* part_ml,      \
          float* out, int n_head, int n_head_kv, int n_ctx, int n_split, float scale,        \
          const float* sinks, int window, block_q8a* qout, int act, int hs) {                \
    attn_decode<KV, D, MAXG>(q, kc, vc, slot_stride, sp, part_o, part_ml, out, n_head,      \
                             n_head_kv, n_ctx, n_split, scale, sinks, window, qout, act, hs); \
  }

ATT_DECODE(f16, SM_KV_F16, 64, 8)
ATT_DECODE(f16, SM_KV_F16, 64, 16)
ATT_DECODE(f16, SM_KV_F16, 128, 8)
ATT_DECODE(f16, SM_KV_F16, 128, 16)
ATT_DECODE(q8_0, SM_KV_Q8_0, 64, 8)
ATT_DECODE(q8_0, SM_KV_Q8_0, 64, 16)
ATT_DECODE(q8_0, SM_KV_Q8_0, 128, 8)
ATT_DECODE(q8_0, SM_KV_Q8_0, 128, 16)
// D = 256 (Qwen3.5, Qwen3-Next: G = 8): G ≤ 8 only, the G = 16 buffers pass 48 KiB
ATT_DECODE(f16, SM_KV_F16, 256, 8)
ATT_DECODE(q8_0, SM_KV_Q8_0, 256, 8)

// ---- prefill ---------------------------------------------------------------------------

#define PF_ROWS 64  // (token, head) rows per block: 4 warps × 16

// Rows are the T·G (token, query head) pairs of one KV head, flattened as idx = t·G + g.
// BK: positions per K/V tile; DO: output dims per block, d0 = blockIdx.z·DO.. of each row.
// out f32 [T, Nh, D]. Launch: grid (ceil(T·G / PF_ROWS), Nkv, D / DO), block ATT_THREADS.
template <int KV, int D, int DO, int BK>
__device__ void attn_prefill(const float* q, const uint8_t* kc, const uint8_t* vc,
                             unsigned long long slot_stride, const int* sp, float* out,
                             int n_tok, int n_head, int n_head_kv, int n_ctx, float scale,
                             const float* sinks, int window) {
  constexpr int HB = KV == SM_KV_F16 ? 2 * D : D / 32 * 34;
  constexpr int KS = D + 8;   // sK row stride (halves): [BK][KS], K rows by position
  constexpr int VS = BK + 8;  // sV row stride (halves): [DO][VS], V's dims d0.. transposed
  __shared__ __align__(16) uint16_t sK[BK * KS];
  __shared__ float sKd[BK][D / 32];  // q8_0 cache: the tile's K block scales
  __shared__ __align__(16) uint16_t sV[DO * VS];
  const int G = n_head / n_head_kv, kvh = blockIdx.y, d0 = blockIdx.z * DO;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, c4 = lane & 3;
  const int pos0 = sp[0];
  const size_t base = (size_t)sp[1] * slot_stride + (size_t)kvh * n_ctx * HB;
  const uint8_t* kb = kc + base;
  const uint8_t* vb = vc + base;
  const int total = n_tok * G;
  const int blk0 = blockIdx.x * PF_ROWS;
  int last = blk0 + PF_ROWS - 1 < total - 1 ? blk0 + PF_ROWS - 1 : total - 1;
  const int p_max = pos0 + last / G;  // the block's last visible position
  // the block's first visible position (its first row's), rounded down to a tile
  const int p_lo = window > 0 && pos0 + blk0 / G + 1 > window ? pos0 + blk0 / G + 1 - window : 0;

  // this thread's two rows: r0 = g8, r1 = g8 + 8 of the warp's 16
  int idx[2], lim[2];
  const float* qr[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    idx[r] = blk0 + warp * 16 + g8 + 8 * r;
    int ii = idx[r] < total ? idx[r] : total - 1;  // padding rows repeat the last row
    int t = ii / G, hq = kvh * G + ii % G;
    lim[r] = pos0 + t;
    qr[r] = q + ((size_t)t * n_head + hq) * D;
  }
  // q in the key type's dot form: rounded to f16 (f16 cache), or quantized to q8_0 as the CPU
  // does (q8_0 cache: the int8 values, exact in f16, and each row's block scales qd)
  float qd[2][D / 32], qid[2][D / 32];
#pragma unroll
  for (int r = 0; r < 2; r++) {
#pragma unroll
    for (int b = 0; b < D / 32; b++) {
      float amax = 0.0f;
      if (KV == SM_KV_Q8_0)
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(qr[r][32 * b + i]));
      qd[r][b] = sm_round_h(amax / 127.0f);
      qid[r][b] = sm_q8_0_inv(amax);
    }
  }
  auto qv = [&](int r, int c) -> float {
    return KV == SM_KV_F16 ? qr[r][c] : (float)sm_rint(qr[r][c] * qid[r][c >> 5]);
  };
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    int c = kk * 16 + 2 * c4;
    qa[kk][0] = sm_pack_h2(qv(0, c), qv(0, c + 1));
    qa[kk][1] = sm_pack_h2(qv(1, c), qv(1, c + 1));
    qa[kk][2] = sm_pack_h2(qv(0, c + 8), qv(0, c + 9));
    qa[kk][3] = sm_pack_h2(qv(1, c + 8), qv(1, c + 9));
  }
  float o[DO / 8][4];
#pragma unroll
  for (int i = 0; i < DO / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};

  for (int kt = p_lo / BK * BK; kt <= p_max; kt += BK) {
    __syncthreads();  // the previous tile is consumed
    if (KV == SM_KV_F16) {
      for (int c = tid; c < BK * D / 8; c += ATT_THREADS) {
        int j = c / (D / 8), dc = (c % (D / 8)) * 8;  // K: position-major (coalesced)
        uint4 w = make_uint4(0, 0, 0, 0);
        if (kt + j <= p_max) w = *(const uint4*)(kb + (size_t)(kt + j) * HB + 2 * dc);
        *(uint4*)&sK[j * KS + dc] = w;
      }
      for (int c = tid; c < BK * DO / 8; c += ATT_THREADS) {
        int j = c % BK, dc = (c / BK) * 8;  // V: position-minor (transposed store)
        uint4 w = make_uint4(0, 0, 0, 0);
        if (kt + j <= p_max) w = *(const uint4*)(vb + (size_t)(kt + j) * HB + 2 * (d0 + dc));
        uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
          sV[(dc + 2 * i) * VS + j] = (uint16_t)(ws[i] & 0xffff);
          sV[(dc + 2 * i + 1) * VS + j] = (uint16_t)(ws[i] >> 16);
        }
      }
    } else {
      for (int c = tid; c < BK * D / 32; c += ATT_THREADS) {
        int j = c % BK, b = c / BK;
        bool ok = kt + j <= p_max;
        const uint8_t* kblk = kb + (size_t)(kt + j) * HB + 34 * b;
        float kd = ok ? sm_h2f(*(const uint16_t*)kblk) : 0.0f;
        sKd[j][b] = kd;
        for (int i = 0; i < 32; i += 2) {  // K: the int8 values (exact in f16)
          uint16_t kw = ok ? *(const uint16_t*)(kblk + 2 + i) : 0;
          sK[j * KS + 32 * b + i] = sm_f2h((float)(int8_t)(kw & 0xff));
          sK[j * KS + 32 * b + i + 1] = sm_f2h((float)(int8_t)(kw >> 8));
        }
      }
      for (int c = tid; c < BK * DO / 32; c += ATT_THREADS) {
        int j = c % BK, b = c / BK;  // V: block b of the dims d0..
        bool ok = kt + j <= p_max;
        const uint8_t* vblk = vb + (size_t)(kt + j) * HB + 34 * (d0 / 32 + b);
        float vd = ok ? sm_h2f(*(const uint16_t*)vblk) : 0.0f;
        for (int i = 0; i < 32; i += 2) {
          uint16_t vw = ok ? *(const uint16_t*)(vblk + 2 + i) : 0;
          sV[(32 * b + i) * VS + j] = sm_f2h(vd * (float)(int8_t)(vw & 0xff));
          sV[(32 * b + i + 1) * VS + j] = sm_f2h(vd * (float)(int8_t)(vw >> 8));
        }
      }
    }
    __syncthreads();

    // S = Q·Kᵀ for the warp's 16 rows × BK positions
    float sc[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
      if (KV == SM_KV_F16) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
          const uint16_t* kr = &sK[(nt * 8 + g8) * KS + kk * 16 + 2 * c4];
          uint32_t b[2] = {*(const uint32_t*)kr, *(const uint32_t*)(kr + 8)};
          sm_mma_16816(sc[nt], qa[kk], b);
        }
      } else {
        // per 32-block: the integer dot (exact in f32: |Σ| ≤ 32·127²) times kd·qd, as the
        // CPU's q8_0 block dot
#pragma unroll
        for (int b = 0; b < D / 32; b++) {
          float isum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int kk = 2 * b; kk < 2 * b + 2; kk++) {
            const uint16_t* kr = &sK[(nt * 8 + g8) * KS + kk * 16 + 2 * c4];
            uint32_t bf[2] = {*(const uint32_t*)kr, *(const uint32_t*)(kr + 8)};
            sm_mma_16816(isum, qa[kk], bf);
          }
#pragma unroll
          for (int i = 0; i < 4; i++)
            sc[nt][i] += isum[i] * (sKd[nt * 8 + 2 * c4 + (i & 1)][b] * qd[i >> 1][b]);
        }
      }
    }
    // scale, causal mask, online softmax (rows r0: sc[.][0..1], r1: sc[.][2..3])
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = i >> 1, p = kt + nt * 8 + 2 * c4 + (i & 1);
        const bool vis = p <= lim[r] && (window <= 0 || p > lim[r] - window);
        float v = vis ? sc[nt][i] * scale : NEG_INF;
        sc[nt][i] = v;
        mx[r] = fmaxf(mx[r], v);
      }
    }
    float al[2], ms[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float mnew = fmaxf(m[r], mx[r]);
      // -inf while a windowed row has seen no visible position yet (o and l are still 0)
      ms[r] = mnew == NEG_INF ? 0.0f : mnew;
      al[r] = expf(m[r] - ms[r]);
      m[r] = mnew;
      l[r] *= al[r];
    }
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float e = expf(sc[nt][i] - ms[i >> 1]);
        sc[nt][i] = e;
        l[i >> 1] += e;
      }
    }
#pragma unroll
    for (int dt = 0; dt < DO / 8; dt++) {
      o[dt][0] *= al[0];
      o[dt][1] *= al[0];
      o[dt][2] *= al[1];
      o[dt][3] *= al[1];
    }
    // O += P·V
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      uint32_t pa[4] = {sm_pack_h2(sc[2 * kk][0], sc[2 * kk][1]),
                        sm_pack_h2(sc[2 * kk][2], sc[2 * kk][3]),
                        sm_pack_h2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                        sm_pack_h2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < DO / 8; dt++) {
        const uint16_t* vr = &sV[(dt * 8 + g8) * VS + kk * 16 + 2 * c4];
        uint32_t b[2] = {*(const uint32_t*)vr, *(const uint32_t*)(vr + 8)};
        sm_mma_16816(o[dt], pa, b);
      }
    }
  }

  // normalize and write the valid rows
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (idx[r] < total) {
      int t = idx[r] / G, hq = kvh * G + idx[r] % G;
      float* orow = out + ((size_t)t * n_head + hq) * D + d0;
      float a = 1.0f, lt = l[r];
      if (sinks != nullptr) {  // the sink joins the max and the sum
        const float sk = sinks[hq], mx2 = fmaxf(m[r], sk);
        a = expf(m[r] - mx2);
        lt = lt * a + expf(sk - mx2);
      }
      float inv = a / lt;
#pragma unroll
      for (int dt = 0; dt < DO / 8; dt++) {
        orow[dt * 8 + 2 * c4] = o[dt][2 * r] * inv;
        orow[dt * 8 + 2 * c4 + 1] = o[dt][2 * r + 1] * inv;
      }
    }
  }
}

// DO = D and tiles of 64 positions up to D = 128; D = 256: two halves of 128, tiles of 32
#define ATT_PREFILL(KVN, KV, D)                                                               \
  extern "C" __global__ void __launch_bounds__(ATT_THREADS) strata_attn_prefill_##KVN##_d##D( \
      const float* q, const uint8_t* kc, const uint8_t* vc, unsigned long long slot_stride,  \
      const int* sp, float* out, int n_tok, int n_head, int n_head_kv, int n_ctx,            \
      float scale, const float* sinks, int window) {                                         \
    attn_prefill<KV, D, (D > 128 ? 128 : D), (D > 128 ? 32 : 64)>(                          \
        q, kc, vc, slot_stride, sp, out, n_tok, n_head, n_head_kv, n_ctx, scale, sinks,      \
        window);                                                                             \
  }

ATT_PREFILL(f16, SM_KV_F16, 64)
ATT_PREFILL(f16, SM_KV_F16, 128)
ATT_PREFILL(f16, SM_KV_F16, 256)
ATT_PREFILL(q8_0, SM_KV_Q8_0, 64)
ATT_PREFILL(q8_0, SM_KV_Q8_0, 128)
ATT_PREFILL(q8_0, SM_KV_Q8_0, 256)
