// The integer engine's kernels: one per oracle op (fx_integer/oracle.py).
// Each computes exactly what the numpy op computes, with the same integer formulas.
#include "common.cuh"

// x [T, D] Q.16 = round_half_up(q8 code * D24, 8) for token rows.   grid (T), block any.
extern "C" __global__ void nl_embed(const signed char* __restrict__ codes,
                                    const int* __restrict__ scale,
                                    const i64* __restrict__ tokens, i64* __restrict__ x, int D) {
    int t = blockIdx.x;
    i64 tok = tokens[t];
    int nb = D / 32;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 c = (i64)codes[tok * D + i];
        i64 s = (i64)scale[tok * nb + i / 32];
        x[(i64)t * D + i] = rshift_round(c * s, 8);
    }
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

// y [T, O] = Q8_0 matrix [O, K] times x [T, K].   grid (O, T), block any (<= 256).
extern "C" __global__ void nl_q8_matmul(const signed char* __restrict__ codes,
                                        const int* __restrict__ scale,
                                        const i64* __restrict__ x, i64* __restrict__ y,
                                        int T, int O, int K) {
    __shared__ i64 red[NL_RED];
    int o = blockIdx.x;
    int t = blockIdx.y;
    int nb = K / 32;
    const i64* xr = x + (i64)t * K;
    const signed char* cr = codes + (i64)o * K;
    i64 acc = 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        i64 p = 0;
        for (int j = 0; j < 32; ++j) p += (i64)cr[b * 32 + j] * xr[b * 32 + j];
        acc += (i64)scale[(i64)o * nb + b] * p;
    }
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) y[(i64)t * O + o] = rshift_round(acc, 24);
}

// RMSNorm of rows x [T, D] with Q.24 gains -> Q.16.   grid (T), block any (<= 256).
extern "C" __global__ void nl_rmsnorm(const i64* __restrict__ x, const int* __restrict__ gain,
                                      i64* __restrict__ y, int D, i64 eps_q32) {
    __shared__ i64 red[NL_RED];
    int t = blockIdx.x;
    const i64* xr = x + (i64)t * D;
    i64 mx = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 a = xr[i] < 0 ? -xr[i] : xr[i];
        mx = a > mx ? a : mx;
    }
    mx = block_max(mx, red);
    int s = bit_length64(mx) - 26;
    if (s < 0) s = 0;
    i64 ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        i64 u = rshift_round(xr[i], s);
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
        i64 u = rshift_round(xr[i], s);
        i64 nrm = rshift_round(u * inv, e);
        y[(i64)t * D + i] = rshift_round(nrm * (i64)gain[i], 32);
    }
}

// Interleaved-pair RoPE of x [n, nh, hd] with Q.30 tables [ctx, hd/2].   grid (n, nh).
extern "C" __global__ void nl_rope(const i64* __restrict__ x, const int* __restrict__ cos_t,
                                   const int* __restrict__ sin_t, const i64* __restrict__ pos,
                                   i64* __restrict__ y, int nh, int hd) {
    int row = blockIdx.x;
    int h = blockIdx.y;
    int half = hd / 2;
    i64 p = pos[row];
    const i64* xv = x + ((i64)row * nh + h) * hd;
    i64* yv = y + ((i64)row * nh + h) * hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        i64 c = (i64)cos_t[p * half + i];
        i64 s = (i64)sin_t[p * half + i];
        i64 x0 = xv[2 * i];
        i64 x1 = xv[2 * i + 1];
        yv[2 * i] = rshift_round(x0 * c - x1 * s, 30);
        yv[2 * i + 1] = rshift_round(x0 * s + x1 * c, 30);
    }
}

// Causal GQA attention: q [n, H, hd] over k, v [m, KV, hd]; a row at position p sees
// rows 0..p. scratch [n, H, m] holds scores, then exp2 weights, then Q.30 probabilities.
// grid (n, H), block any (<= 256).
extern "C" __global__ void nl_attention(const i64* __restrict__ q, const i64* __restrict__ k,
                                        const i64* __restrict__ v, const i64* __restrict__ qpos,
                                        i64* __restrict__ out, i64* __restrict__ scratch,
                                        int H, int KV, int hd, int m, i64 scale_q30) {
    __shared__ i64 red[NL_RED];
    int row = blockIdx.x;
    int h = blockIdx.y;
    int kvh = h / (H / KV);
    int p = (int)qpos[row];
    const i64* qv = q + ((i64)row * H + h) * hd;
    i64* sc = scratch + ((i64)row * H + h) * m;
    i64 mx = -(1LL << 62);
    for (int j = threadIdx.x; j <= p; j += blockDim.x) {
        const i64* kr = k + ((i64)j * KV + kvh) * hd;
        i64 s = 0;
        for (int d = 0; d < hd; ++d) s += qv[d] * kr[d];
        sc[j] = s;
        mx = s > mx ? s : mx;
    }
    mx = block_max(mx, red);
    i64 tot = 0;
    for (int j = threadIdx.x; j <= p; j += blockDim.x) {
        i64 z = rshift_round(sc[j] - mx, 16);
        if (z < NL_EXP2_ARG_MIN) z = NL_EXP2_ARG_MIN;
        i64 t = rshift_round(z * scale_q30, 30);
        i64 w = exp2_neg_q30(t);
        sc[j] = w;
        tot += w;
    }
    tot = block_sum(tot, red);
    for (int j = threadIdx.x; j <= p; j += blockDim.x) sc[j] = div_round(sc[j] << 30, tot);
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        i64 acc = 0;
        for (int j = 0; j <= p; ++j) acc += sc[j] * v[((i64)j * KV + kvh) * hd + d];
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
