/* Exact-integer CPU kernels of the integer oracle (fx_integer/int_kernel.py builds this file).
 *
 * Each function computes exactly what its numpy twin in fx_integer/oracle.py computes: every
 * value is an integer and every sum is exact (int32 block dot products bounded far below
 * 2**31, int64 accumulation under the oracle's own exactness check), so the summation order,
 * SIMD and threads cannot change a bit. Where the numpy oracle would raise FixedPointOverflow
 * (or meets an input outside the proven range), a function returns a non-zero status instead
 * and writes nothing that is used: the caller then runs the numpy oracle's op, which raises
 * (or answers) exactly as the canonical reference does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define X_LIMIT (1LL << 41)          /* oracle._BLAS_X_LIMIT */
#define ACC_CHECK_LIMIT (1LL << 32)  /* oracle._ACC_CHECK_LIMIT */
#define TB 8                         /* rows per register tile */

#ifdef __cplusplus
extern "C" {
#endif

static inline int64_t iabs64(int64_t v) { return v < 0 ? -v : v; }

/* The numpy oracle's split_pieces check: after (n - 1) centred splits of `bits` bits the rest
 * must satisfy |rest| <= 2**(bits-1). */
static inline int top_piece_ok(int64_t x, int bits, int n) {
    const int64_t half = 1LL << (bits - 1), mask = (1LL << bits) - 1;
    int64_t rest = x;
    for (int j = 0; j < n - 1; j++) {
        int64_t lo = ((rest + half) & mask) - half;
        rest = (rest - lo) >> bits;
    }
    return iabs64(rest) <= half;
}

/* Quantized matmul: x [T, K] Q.16 int64, codes [O, K] int8 (Q4_1: 0..15, Q8_0: -128..127,
 * every other format's signed codes), blocks of G weights (16, 32, ... 256), scale/offset
 * [O, nb = K / G] Q.24 (offset NULL where the format has none), wq [nb] the exactness-check
 * weights,
 * oracle_bits/oracle_pieces the numpy oracle's float32 split (for its range check only).
 * out [T, O] Q.16 = round_half_up(sum_b D*P + M*S, 24). Returns 0, or 1 where the numpy
 * oracle raises. */
int nl_qmatmul(const int64_t *x, int T, int K, const int8_t *codes, int O,
               const int64_t *scale, const int64_t *offset, const int64_t *wq,
               int oracle_bits, int oracle_pieces, int64_t *out, int nthreads, int G) {
    if (G <= 0 || G > 256 || K % G != 0) return 1;
    const int nb = K / G;
    if (T <= 0) return 0;
    /* 1. the oracle's checks, and the input split into centred 16-bit pieces (int16) */
    int npieces = 1;
    int64_t *S = (int64_t *)malloc(sizeof(int64_t) * (size_t)T * nb);
    int16_t *pc = (int16_t *)malloc(sizeof(int16_t) * (size_t)T * 3 * K);
    if (!S || !pc) { free(S); free(pc); return 2; }
    int bad = 0;
    for (int t = 0; t < T && !bad; t++) {
        const int64_t *xr = x + (size_t)t * K;
        int64_t bound = 0;
        for (int b = 0; b < nb; b++) {
            int64_t a = 0, s = 0;
            for (int j = 0; j < G; j++) {
                int64_t v = xr[b * G + j];
                int64_t av = iabs64(v);
                if (av > X_LIMIT) { bad = 1; break; }
                a += av;
                s += v;
            }
            if (bad) break;
            S[(size_t)t * nb + b] = s;
            bound += ((a >> 20) + 1) * wq[b];
        }
        if (bad || bound > ACC_CHECK_LIMIT) { bad = 1; break; }
        for (int k = 0; k < K; k++) {
            int64_t rest = xr[k];
            if (!top_piece_ok(rest, oracle_bits, oracle_pieces)) { bad = 1; break; }
            for (int j = 0; j < 3; j++) {
                int64_t lo = ((rest + 32768) & 65535) - 32768;
                pc[((size_t)t * 3 + j) * K + k] = (int16_t)lo;
                rest = (rest - lo) >> 16;
                if (lo != 0 && j + 1 > npieces) npieces = j + 1;
            }
        }
    }
    if (bad) { free(S); free(pc); return 1; }
    /* 2. exact block dot products (int32: |q * piece| <= 2**22, G <= 256 terms < 2**30) */
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int o = 0; o < O; o++) {
        const int8_t *c = codes + (size_t)o * K;
        const int64_t *d = scale + (size_t)o * nb;
        const int64_t *m = offset ? offset + (size_t)o * nb : NULL;
        /* the row's codes widened once to int16, so every block dot below is an
         * int16 x int16 multiply-add (vpmaddwd) for every token and piece */
        int16_t cw[K];
        for (int i = 0; i < K; i++) cw[i] = (int16_t)c[i];
        for (int t0 = 0; t0 < T; t0 += TB) {
            const int t1 = t0 + TB < T ? t0 + TB : T;
            int64_t acc[TB] = {0};
            for (int b = 0; b < nb; b++) {
                const int16_t *cb = cw + b * G;
                for (int t = t0; t < t1; t++) {
                    int64_t p = 0;
                    for (int j = npieces - 1; j >= 0; j--) {
                        const int16_t *xp = pc + ((size_t)t * 3 + j) * K + b * G;
                        int32_t s = 0;
                        for (int i = 0; i < G; i++) s += (int32_t)cb[i] * (int32_t)xp[i];
                        p = p * 65536 + s;
                    }
                    int64_t v = d[b] * p;
                    if (m) v += m[b] * S[(size_t)t * nb + b];
                    acc[t - t0] += v;
                }
            }
            for (int t = t0; t < t1; t++)
                out[(size_t)t * O + o] = (acc[t - t0] + (1LL << 23)) >> 24;
        }
    }
    free(S);
    free(pc);
    return 0;
}

/* ---------------------------------------------------------------- RMSNorm (oracle.rmsnorm) */

static inline int64_t bit_length(int64_t v) { /* 0 <= v < 2**63 */
    int64_t n = 0;
    while (v > 0) { n++; v >>= 1; }
    return n;
}

static inline int64_t rshift_round_var(int64_t x, int64_t s) { /* 0 <= s <= 62 */
    int64_t half = s > 0 ? (1LL << (s - 1)) : 0;
    return (x + half) >> s;
}

static inline int64_t isqrt(int64_t n) { /* _fixed.isqrt, digit by digit */
    int64_t res = 0, bit = 1LL << 60;
    for (int i = 0; i < 31; i++) {
        int64_t t = res + bit;
        if (n >= t) { n -= t; res = (res >> 1) + bit; }
        else res >>= 1;
        bit >>= 2;
    }
    return res;
}

/* x [T, D] Q.16, gain [D] Q.24 -> out [T, D] Q.16. Returns 0, or 1 outside the proven range
 * (the caller then runs the numpy oracle's rmsnorm). */
int nl_rmsnorm(const int64_t *x, int T, int D, const int64_t *gain, int64_t eps_q32,
               int64_t *out) {
    if (D <= 0 || D >= 2048) return 1;
    for (int t = 0; t < T; t++) {
        const int64_t *xr = x + (size_t)t * D;
        int64_t *orow = out + (size_t)t * D;
        int64_t ax = 0;
        for (int i = 0; i < D; i++) {
            if (xr[i] == INT64_MIN) return 1;
            int64_t a = iabs64(xr[i]);
            if (a > ax) ax = a;
        }
        int64_t s = bit_length(ax) - 26;
        if (s < 0) s = 0;
        if (2 * s > 62) return 1;
        int64_t ss = 0;
        for (int i = 0; i < D; i++) {
            int64_t u = rshift_round_var(xr[i], s);
            ss += u * u;
        }
        int64_t ms = ss / D;
        int64_t v = ms + rshift_round_var(eps_q32, 2 * s);
        if (v <= 0) return 1;
        int64_t c2 = ((62 - bit_length(v)) >> 1) << 1;
        int64_t r = isqrt(v << c2);
        if (r <= 0) return 1;
        int64_t inv = ((1LL << 62) + (r >> 1)) / r;
        int64_t e = 38 - (c2 >> 1);
        for (int i = 0; i < D; i++) {
            int64_t u = rshift_round_var(xr[i], s);
            int64_t nrm = rshift_round_var(u * inv, e);
            /* rshift_round(nrm * gain, 32) without an int64 product of both: exact for
             * |gain| < 2**40 (Q.24 gains up to 65536; Gemma 3's post-norms reach 1,657) */
            const int64_t gh = gain[i] >> 16, gl = gain[i] & 0xFFFF;
            orow[i] = (nrm * gh + ((nrm * gl) >> 16) + (1LL << 15)) >> 16;
        }
    }
    return 0;
}

/* ----------------------------------------------------------------- SwiGLU (oracle.swiglu) */

static const int64_t EXP2_POLY_Q30[8] = {1073741824, 744261124, 257941118, 59598166,
                                         10323001, 1441201, 154140, 23074};
#define LOG2E_Q30 1549082005LL
#define EXP2_ARG_MIN (-(1LL << 26))
#define SWIGLU_LIMIT (1LL << 31)

static inline int64_t rshift_round(int64_t x, int s) { return (x + (1LL << (s - 1))) >> s; }

static inline int64_t exp2_neg_q30(int64_t t) { /* _fixed.exp2_neg_q30, t <= 0 */
    if (t < EXP2_ARG_MIN) t = EXP2_ARG_MIN;
    int64_t i = t >> 16;
    int64_t fr = t - i * 65536;
    int64_t acc = EXP2_POLY_Q30[7];
    for (int c = 6; c >= 0; c--) acc = rshift_round(acc * fr, 16) + EXP2_POLY_Q30[c];
    int64_t sh = -i < 40 ? -i : 40;
    return rshift_round_var(acc, sh);
}

static inline int64_t sigmoid_q30(int64_t x) { /* _fixed.sigmoid_q30 */
    int64_t a = iabs64(x);
    if (a > (1LL << 26)) a = 1LL << 26;
    int64_t t = -rshift_round(a * LOG2E_Q30, 30);
    int64_t e = exp2_neg_q30(t);
    int64_t den = (1LL << 30) + e;
    if (x >= 0) return ((1LL << 60) + (den >> 1)) / den;
    return ((e << 30) + (den >> 1)) / den;
}

/* g, u: [T, N] rows of stride `stride` (elements) -> out [T, N] Q.16 = silu(g) * u. Returns 0,
 * or 1 where the numpy oracle raises (|g| or |u| past SWIGLU_LIMIT). */
int nl_swiglu(const int64_t *g, const int64_t *u, int T, int N, long long stride,
              int64_t *out) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) {
            int64_t gv = g[(size_t)t * stride + i], uv = u[(size_t)t * stride + i];
            if (gv < -SWIGLU_LIMIT || gv > SWIGLU_LIMIT || uv < -SWIGLU_LIMIT
                || uv > SWIGLU_LIMIT) return 1;
        }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) {
            int64_t gv = g[(size_t)t * stride + i], uv = u[(size_t)t * stride + i];
            int64_t silu = rshift_round(gv * sigmoid_q30(gv), 30);
            out[(size_t)t * N + i] = rshift_round(silu * uv, 16);
        }
    return 0;
}

/* -------------------------------------------------------------- attention (oracle.attention) */

#define V_LIMIT (1LL << 31)

/* Causal GQA attention of new rows q [n, H, hd] over cache rows k, v [m, KV, hd] (all
 * contiguous), query positions qpos [n]: out [n, H * hd] Q.16. Scores exact in int64, softmax
 * in base 2 with the integer exp2, probabilities Q.30, as oracle.attention. work: m int64.
 * Returns 0, or 1 where the numpy oracle raises (a bound) or the input is outside the range
 * handled here. */
int nl_attention(const int64_t *q, const int64_t *k, const int64_t *v, const int64_t *qpos,
                 int n, int H, int KV, int hd, int m, int64_t scale_q30, int64_t *out,
                 int64_t *work, int64_t qk_limit, int64_t window) {
    if (KV <= 0 || H % KV != 0 || m <= 0 || window < 0) return 1;
    const int g = H / KV;
    for (size_t i = 0; i < (size_t)n * H * hd; i++)
        if (q[i] < -qk_limit || q[i] > qk_limit) return 1;
    for (size_t i = 0; i < (size_t)m * KV * hd; i++) {
        if (k[i] < -qk_limit || k[i] > qk_limit) return 1;
        if (v[i] < -V_LIMIT || v[i] > V_LIMIT) return 1;
    }
    for (int i = 0; i < n; i++)
        if (qpos[i] < 0) return 1;
    for (int i = 0; i < n; i++) {
        const int64_t last = qpos[i] < m - 1 ? qpos[i] : m - 1; /* allowed: first <= j <= last */
        const int64_t first = window > 0 && qpos[i] - window + 1 > 0 ? qpos[i] - window + 1 : 0;
        for (int h = 0; h < H; h++) {
            const int kh = h / g;
            const int64_t *qr = q + ((size_t)i * H + h) * hd;
            int64_t mx = INT64_MIN;
            for (int64_t j = first; j <= last; j++) {
                const int64_t *kr = k + ((size_t)j * KV + kh) * hd;
                int64_t raw = 0;
                for (int d = 0; d < hd; d++) raw += qr[d] * kr[d];
                work[j] = raw;
                if (raw > mx) mx = raw;
            }
            int64_t tot = 0;
            for (int64_t j = first; j <= last; j++) {
                int64_t z = rshift_round(work[j] - mx, 16);
                if (z < EXP2_ARG_MIN) z = EXP2_ARG_MIN;
                int64_t t = rshift_round(z * scale_q30, 30);
                work[j] = exp2_neg_q30(t);
                tot += work[j];
            }
            int64_t *orow = out + (size_t)i * H * hd + (size_t)h * hd;
            for (int d = 0; d < hd; d++) orow[d] = 0;
            for (int64_t j = first; j <= last; j++) {
                const int64_t prob = ((work[j] << 30) + (tot >> 1)) / tot;
                const int64_t *vr = v + ((size_t)j * KV + kh) * hd;
                for (int d = 0; d < hd; d++) orow[d] += prob * vr[d];
            }
            for (int d = 0; d < hd; d++) orow[d] = rshift_round(orow[d], 30);
        }
    }
    return 0;
}

#ifdef __cplusplus
}
#endif
