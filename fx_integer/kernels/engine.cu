// The integer engine's kernels: one per oracle op (fx_integer/oracle.py).
// Each computes exactly what the numpy op computes, with the same integer formulas.
#include "common.cuh"

// Embedding rows of any format: x [T, D] Q.16 = round_half_up(code * D24 + M24, 8) for token
// rows, codes int8 [V, D], scales/offsets [V, D / G] (S = int or i64; has_off 0: no offsets,
// `offset` is then never read).   grid (T), block any.
template <typename S>
__device__ __forceinline__ void embed_body(const signed char* __restrict__ codes,
                                           const S* __restrict__ scale,
                                           const S* __restrict__ offset, int has_off,
                                           const i64* __restrict__ tokens, i64* __restrict__ x,
                                           int D, int G) {
    int t = blockIdx.x;
    i64 tok = tokens[t];
    int nb = D / G;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 c = (i64)codes[tok * D + i];
        i64 v = c * (i64)scale[tok * nb + i / G];
        if (has_off) v += (i64)offset[tok * nb + i / G];
        x[(i64)t * D + i] = rshift_round(v, 8);
    }
}

extern "C" __global__ void nl_embed_s32(const signed char* __restrict__ codes,
                                        const int* __restrict__ scale,
                                        const int* __restrict__ offset, int has_off,
                                        const i64* __restrict__ tokens, i64* __restrict__ x,
                                        int D, int G) {
    embed_body<int>(codes, scale, offset, has_off, tokens, x, D, G);
}

extern "C" __global__ void nl_embed_s64(const signed char* __restrict__ codes,
                                        const i64* __restrict__ scale,
                                        const i64* __restrict__ offset, int has_off,
                                        const i64* __restrict__ tokens, i64* __restrict__ x,
                                        int D, int G) {
    embed_body<i64>(codes, scale, offset, has_off, tokens, x, D, G);
}

// y [T, O] = Q4_1 matrix [O, K] times x [T, K]: exact int64 block sums, one rounding (>> 24).
// grid (O, T), block any (<= 256).
extern "C" __global__ void nl_q4_matmul(const unsigned char* __restrict__ codes,
                                        const int* __restrict__ scale,
                                        const int* __restrict__ offset,
                                        const i64* __restrict__ x, i64* __restrict__ y,
                                        int T, int O, int K) {
    __shared__ i64 red[NL_RED];
    int o = blockIdx.x;
    int t = blockIdx.y;
    int nb = K / 32;
    const i64* xr = x + (i64)t * K;
    const unsigned char* cr = codes + (i64)o * (K / 2);
    i64 acc = 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        i64 p = 0;
        i64 s = 0;
        for (int j = 0; j < 16; ++j) {
            unsigned int byte = cr[b * 16 + j];
            i64 x0 = xr[b * 32 + 2 * j];
            i64 x1 = xr[b * 32 + 2 * j + 1];
            p += (i64)(byte & 15u) * x0 + (i64)(byte >> 4) * x1;
            s += x0 + x1;
        }
        acc += (i64)scale[(i64)o * nb + b] * p + (i64)offset[(i64)o * nb + b] * s;
    }
    acc = block_sum(acc, red);
#ifdef NL_PARITY_FAULT
    // A deliberately broken build (never defined for a GPU or a normal CPU build): one
    // accumulation off by one unit of the output, the parity gate's refusal test.
    if (o == 0) acc += (i64)1 << 24;
#endif
    if (threadIdx.x == 0) y[(i64)t * O + o] = rshift_round(acc, 24);
}

// y [T, O] = quantized matrix [O, K] times x [T, K], any block size G (K % G == 0): codes int8
// [O, K], Q.24 scales/offsets [O, K / G] (S = int or i64; has_off 0: no offsets).
//   y_o = round_half_up( sum_b D[o,b] * P[o,b] + M[o,b] * S[b] , 24 )   (oracle.qmatmul)
// A thread takes the row's elements j = tid, tid + blockDim, ... and adds D * p + M * s of each
// run of them inside one block (a part of P[o,b], S[b]): every such partial sum is bounded by
// sum_b W[b] * A[b] <= 2**62 (the exactness check of the caller), so the int64 sum is exact in
// any order and the bytes do not depend on the block size.   grid (O, T), block any (<= 256).
template <typename S>
__device__ __forceinline__ void qmatmul_body(const signed char* __restrict__ codes,
                                             const S* __restrict__ scale,
                                             const S* __restrict__ offset, int has_off,
                                             const i64* __restrict__ x, i64* __restrict__ y,
                                             int T, int O, int K, int G, i64* red) {
    int o = blockIdx.x;
    int t = blockIdx.y;
    int nb = K / G;
    const i64* xr = x + (i64)t * K;
    const signed char* cr = codes + (i64)o * K;
    const S* sr = scale + (i64)o * nb;
    const S* mr = has_off ? offset + (i64)o * nb : offset;
    i64 acc = 0;
    i64 p = 0;
    i64 s = 0;
    int cur = -1;
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
        int b = j / G;
        if (b != cur) {
            if (cur >= 0) {
                acc += (i64)sr[cur] * p;
                if (has_off) acc += (i64)mr[cur] * s;
            }
            cur = b;
            p = 0;
            s = 0;
        }
        i64 xv = xr[j];
        p += (i64)cr[j] * xv;
        s += xv;
    }
    if (cur >= 0) {
        acc += (i64)sr[cur] * p;
        if (has_off) acc += (i64)mr[cur] * s;
    }
    acc = block_sum(acc, red);
#ifdef NL_PARITY_FAULT
    if (o == 0) acc += (i64)1 << 24;  // the deliberately broken build (see nl_q4_matmul)
#endif
    if (threadIdx.x == 0) y[(i64)t * O + o] = rshift_round(acc, 24);
}

extern "C" __global__ void nl_qmatmul_s32(const signed char* __restrict__ codes,
                                          const int* __restrict__ scale,
                                          const int* __restrict__ offset, int has_off,
                                          const i64* __restrict__ x, i64* __restrict__ y,
                                          int T, int O, int K, int G) {
    __shared__ i64 red[NL_RED];
    qmatmul_body<int>(codes, scale, offset, has_off, x, y, T, O, K, G, red);
}

extern "C" __global__ void nl_qmatmul_s64(const signed char* __restrict__ codes,
                                          const i64* __restrict__ scale,
                                          const i64* __restrict__ offset, int has_off,
                                          const i64* __restrict__ x, i64* __restrict__ y,
                                          int T, int O, int K, int G) {
    __shared__ i64 red[NL_RED];
    qmatmul_body<i64>(codes, scale, offset, has_off, x, y, T, O, K, G, red);
}

// RMSNorm of rows x [T, D] with Q.24 gains -> Q.16 (oracle.rmsnorm); with `center` 1 the row
// is first centred, x - floor(sum / D + 1/2) (oracle.center: LayerNorm without bias).
// grid (T), block any (<= 256).
extern "C" __global__ void nl_rmsnorm(const i64* __restrict__ x, const i64* __restrict__ gain,
                                      i64* __restrict__ y, int D, int center, i64 eps_q32) {
    __shared__ i64 red[NL_RED];
    int t = blockIdx.x;
    const i64* xr = x + (i64)t * D;
    i64 mean = 0;
    if (center) {
        i64 tot = 0;
        for (int i = threadIdx.x; i < D; i += blockDim.x) tot += xr[i];
        tot = block_sum(tot, red);
        mean = floor_div(2 * tot + D, 2 * (i64)D);
    }
    i64 mx = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 v = xr[i] - mean;
        i64 a = v < 0 ? -v : v;
        mx = a > mx ? a : mx;
    }
    mx = block_max(mx, red);
    int s = bit_length64(mx) - 26;
    if (s < 0) s = 0;
    i64 ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 u = rshift_round(xr[i] - mean, s);
        ss += u * u;
    }
    ss = block_sum(ss, red);
    i64 ms = ss / D;
    i64 v = ms + rshift_round(eps_q32, 2 * s);
    int c2 = ((62 - bit_length64(v)) >> 1) << 1;
    i64 r = isqrt64(v << c2);
    i64 inv = div_round(1LL << 62, r);
    int e = 38 - (c2 >> 1);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 u = rshift_round(xr[i] - mean, s);
        i64 nrm = rshift_round(u * inv, e);
        y[(i64)t * D + i] = mul_rshift_round32(nrm, gain[i]);
    }
}

// RoPE of x [n, nh, hd] with Q.30 tables [ctx, hd/2] (oracle.rope): pairs (2i, 2i+1), or with
// `neox` 1 pairs (i, i + hd/2).   grid (n, nh), block any.
extern "C" __global__ void nl_rope(const i64* __restrict__ x, const int* __restrict__ cos_t,
                                   const int* __restrict__ sin_t, const i64* __restrict__ pos,
                                   i64* __restrict__ y, int nh, int hd, int neox) {
    int row = blockIdx.x;
    int h = blockIdx.y;
    int half = hd / 2;
    i64 p = pos[row];
    const i64* xv = x + ((i64)row * nh + h) * hd;
    i64* yv = y + ((i64)row * nh + h) * hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        i64 c = (i64)cos_t[p * half + i];
        i64 s = (i64)sin_t[p * half + i];
        int i0 = neox ? i : 2 * i;
        int i1 = neox ? i + half : 2 * i + 1;
        i64 x0 = xv[i0];
        i64 x1 = xv[i1];
        yv[i0] = rshift_round(x0 * c - x1 * s, 30);
        yv[i1] = rshift_round(x0 * s + x1 * c, 30);
    }
}

// Causal GQA attention: q [n, H, hd] over k, v [m, KV, hd]; a row at position p sees rows
// 0..min(p, m - 1), and with a sliding window (> 0) only p - window < j <= p (oracle.attention: the rows
// outside get probability exactly 0 there). scratch [n, H, m] holds scores, then exp2 weights,
// then Q.30 probabilities.   grid (n, H), block any (<= 256).
extern "C" __global__ void nl_attention(const i64* __restrict__ q, const i64* __restrict__ k,
                                        const i64* __restrict__ v, const i64* __restrict__ qpos,
                                        i64* __restrict__ out, i64* __restrict__ scratch,
                                        int H, int KV, int hd, int m, int window,
                                        i64 scale_q30) {
    __shared__ i64 red[NL_RED];
    int row = blockIdx.x;
    int h = blockIdx.y;
    int kvh = h / (H / KV);
    int p = (int)qpos[row];
    int j0 = 0;
    if (window > 0 && p - window + 1 > 0) j0 = p - window + 1;
    int j1 = p < m - 1 ? p : m - 1;  // the last row it sees (every cache row from m - 1 on)
    const i64* qv = q + ((i64)row * H + h) * hd;
    i64* sc = scratch + ((i64)row * H + h) * m;
    i64 mx = -(1LL << 62);
    for (int j = j0 + threadIdx.x; j <= j1; j += blockDim.x) {
        const i64* kr = k + ((i64)j * KV + kvh) * hd;
        i64 s = 0;
        for (int d = 0; d < hd; ++d) s += qv[d] * kr[d];
        sc[j] = s;
        mx = s > mx ? s : mx;
    }
    mx = block_max(mx, red);
    i64 tot = 0;
    for (int j = j0 + threadIdx.x; j <= j1; j += blockDim.x) {
        i64 z = rshift_round(sc[j] - mx, 16);
        if (z < NL_EXP2_ARG_MIN) z = NL_EXP2_ARG_MIN;
        i64 t = rshift_round(z * scale_q30, 30);
        i64 w = exp2_neg_q30(t);
        sc[j] = w;
        tot += w;
    }
    tot = block_sum(tot, red);
    for (int j = j0 + threadIdx.x; j <= j1; j += blockDim.x) sc[j] = div_round(sc[j] << 30, tot);
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        i64 acc = 0;
        for (int j = j0; j <= j1; ++j) acc += sc[j] * v[((i64)j * KV + kvh) * hd + d];
        out[((i64)row * H + h) * hd + d] = rshift_round(acc, 30);
    }
}

// a [N] = round_half_up(silu(g) * u, 16), elementwise.   grid any, block any.
extern "C" __global__ void nl_swiglu(const i64* __restrict__ g, const i64* __restrict__ u,
                                     i64* __restrict__ a, i64 n) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        a[i] = rshift_round(silu_q16(g[i]) * u[i], 16);
    }
}

// a [N] = round_half_up(gelu_tanh(g) * u, 16), elementwise (oracle.geglu).   grid any, block any.
extern "C" __global__ void nl_geglu(const i64* __restrict__ g, const i64* __restrict__ u,
                                    i64* __restrict__ a, i64 n) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        a[i] = rshift_round(gelu_tanh_q16(g[i]) * u[i], 16);
    }
}

// y [N] = round_half_up(x * factor, 24), elementwise (oracle.scale_q24: the embedding and logit
// scales).   grid any, block any.
extern "C" __global__ void nl_scale(const i64* __restrict__ x, i64* __restrict__ y, i64 n,
                                    i64 factor_q24) {
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = rshift_round(x[i] * factor_q24, 24);
    }
}
