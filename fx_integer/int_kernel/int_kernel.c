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
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#include <immintrin.h> /* the AVX-512 path of nl_qmatmul */
#define NL_QMM_AVX512 1
#endif

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

/* Layout flags of nl_qmatmul's weights (int_kernel.py's _NativeMatrix chooses them). */
#define QF_NIBBLES 1 /* codes 0..15 packed two to a byte: per 32 codes, 16 bytes, byte j holding
                        code j (low nibble) and code 16 + j (high nibble); K % 32 == 0 */
#define QF_S32 2     /* scale and offset stored int32 (every value fits) instead of int64 */

#ifdef NL_QMM_AVX512
#define QTT 4 /* tokens per tile of the AVX-512 path */

#define NL_INLINE static inline __attribute__((always_inline))

/* 16 int32 lanes -> the sum of each lane pair in the low half of its int64 lane (the high half
 * is left over and ignored by vpmuldq, which reads the low half sign-extended). Exact: both
 * lanes are partial sums of one block dot, whose absolute terms add up to <= 2**30. */
NL_INLINE __m512i fold_pairs(__m512i v) {
    return _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
}

/* d * (the low int32 of each lane), mod 2**64: vpmuldq with int32 scales (S32), else the lane
 * sign-extended and vpmullq with the int64 scale. */
NL_INLINE __m512i scale_lanes(__m512i f, __m512i dv, int S32) {
    if (S32) return _mm512_mul_epi32(f, dv);
    return _mm512_mullo_epi64(_mm512_srai_epi64(_mm512_slli_epi64(f, 32), 32), dv);
}

/* The scale of block b in every lane (for vpmuldq only the low half of each lane counts). */
NL_INLINE __m512i scale_bcast(const void *d, int b, int S32) {
    if (S32) return _mm512_set1_epi32(((const int32_t *)d)[b]);
    return _mm512_set1_epi64(((const int64_t *)d)[b]);
}

/* Blocks b (lanes 0-3) and b + 1 (lanes 4-7): G = 16, two blocks per vector. */
NL_INLINE __m512i scale_pair(const void *d, int b, int S32) {
    if (S32) {
        const int32_t *d32 = (const int32_t *)d;
        return _mm512_inserti64x4(_mm512_set1_epi32(d32[b]), _mm256_set1_epi32(d32[b + 1]), 1);
    }
    const int64_t *d64 = (const int64_t *)d;
    return _mm512_inserti64x4(_mm512_set1_epi64(d64[b]), _mm256_set1_epi64x(d64[b + 1]), 1);
}

/* Codes i .. i + 31 of a row (i a multiple of 32) as 32 int16 lanes. */
NL_INLINE __m512i load_codes32(const void *c, size_t i, int NIB) {
    if (NIB) {
        const __m512i b = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)((const uint8_t *)c + i / 2))));
        const __m512i sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        return _mm512_and_si512(_mm512_srlv_epi16(b, sh), _mm512_set1_epi16(15));
    }
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)((const int8_t *)c + i)));
}

NL_INLINE __m512i madd16(__m512i acc, __m512i a, __m512i b, int first) {
    if (first) return _mm512_madd_epi16(a, b);
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

/* One output row against TT tokens (t0..t0+TT-1) and NP input pieces: sum_b D[b] * P[t, b]
 * + M[b] * S[t, b] mod 2**64 into res[t]. The partial products stay in int64 lanes (one
 * accumulator per token and piece) and are reduced once per row and token.
 * c: the row's codes (int8, or nibbles), d, m: its nb scales and offsets (int32 or int64; m
 * NULL: none), S [T, nb] the input's block sums. */
NL_INLINE void qrow_avx512(const void *c, const void *d, const void *m, const int64_t *S,
                           int nb, int G, int K, const int16_t *pc, int t0, int TT, int NP, int S32, int NIB,
                           int G16, uint64_t *res) {
    __m512i acc[QTT][3];
    for (int t = 0; t < TT; t++)
        for (int j = 0; j < NP; j++) acc[t][j] = _mm512_setzero_si512();
    if (G16) { /* G = 16: two blocks per vector, their scales in the low/high four lanes */
        int b = 0;
        for (; b + 1 < nb; b += 2) {
            const __m512i cv = load_codes32(c, (size_t)b * 16, NIB);
            const __m512i dv = scale_pair(d, b, S32);
            for (int t = 0; t < TT; t++)
                for (int j = 0; j < NP; j++) {
                    const int16_t *xp = pc + ((size_t)(t0 + t) * 3 + j) * K + (size_t)b * 16;
                    const __m512i v = _mm512_madd_epi16(cv, _mm512_loadu_si512(xp));
                    acc[t][j] = _mm512_add_epi64(acc[t][j],
                                                 scale_lanes(fold_pairs(v), dv, S32));
                }
        }
        if (b < nb) { /* an odd last block (never nibbles: K % 32 == 16): high half zero */
            const __m512i cv = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(
                _mm_loadu_si128((const __m128i *)((const int8_t *)c + (size_t)b * 16))));
            const __m512i dv = scale_bcast(d, b, S32);
            for (int t = 0; t < TT; t++)
                for (int j = 0; j < NP; j++) {
                    const int16_t *xp = pc + ((size_t)(t0 + t) * 3 + j) * K + (size_t)b * 16;
                    const __m512i v = _mm512_madd_epi16(cv, _mm512_maskz_loadu_epi16(0xFFFF, xp));
                    acc[t][j] = _mm512_add_epi64(acc[t][j],
                                                 scale_lanes(fold_pairs(v), dv, S32));
                }
        }
    } else { /* G a multiple of 32: a block is G / 32 vectors, summed in int32 */
        const int nc = G / 32;
        for (int b = 0; b < nb; b++) {
            __m512i v[QTT][3];
            for (int ch = 0; ch < nc; ch++) {
                const __m512i cv = load_codes32(c, (size_t)b * G + ch * 32, NIB);
                for (int t = 0; t < TT; t++)
                    for (int j = 0; j < NP; j++) {
                        const int16_t *xp =
                            pc + ((size_t)(t0 + t) * 3 + j) * K + (size_t)b * G + ch * 32;
                        v[t][j] = madd16(v[t][j], cv, _mm512_loadu_si512(xp), ch == 0);
                    }
            }
            const __m512i dv = scale_bcast(d, b, S32);
            for (int t = 0; t < TT; t++)
                for (int j = 0; j < NP; j++)
                    acc[t][j] = _mm512_add_epi64(acc[t][j],
                                                 scale_lanes(fold_pairs(v[t][j]), dv, S32));
        }
    }
    for (int t = 0; t < TT; t++) {
        /* sum_j acc_j << 16j, plus the offset term sum_b M[b] * S[t, b], lane-wise mod 2**64,
         * then one horizontal sum */
        __m512i r = acc[t][NP - 1];
        for (int j = NP - 2; j >= 0; j--) r = _mm512_add_epi64(_mm512_slli_epi64(r, 16), acc[t][j]);
        if (m) {
            const int64_t *st = S + (size_t)(t0 + t) * nb;
            for (int b = 0; b < nb; b += 8) {
                const __mmask8 k = nb - b >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (nb - b)) - 1);
                const __m512i mv = S32 ? _mm512_cvtepi32_epi64(_mm256_maskz_loadu_epi32(
                                             k, (const int32_t *)m + b))
                                       : _mm512_maskz_loadu_epi64(k, (const int64_t *)m + b);
                r = _mm512_add_epi64(r, _mm512_mullo_epi64(mv, _mm512_maskz_loadu_epi64(k, st + b)));
            }
        }
        res[t] = (uint64_t)_mm512_reduce_add_epi64(r);
    }
}

/* The specialisations: TT tokens, NP pieces and the layout all compile-time constants. */
#define QROW_LAYOUTS(TT_, NP_)                                                             \
    switch (lay) {                                                                         \
        case 0: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 0, 0, 0, res); break;        \
        case 1: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 0, 0, 1, res); break;        \
        case 2: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 0, 1, 0, res); break;        \
        case 3: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 0, 1, 1, res); break;        \
        case 4: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 1, 0, 0, res); break;        \
        case 5: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 1, 0, 1, res); break;        \
        case 6: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 1, 1, 0, res); break;        \
        default: qrow_avx512(c, d, m, S, nb, G, K, pc, t0, TT_, NP_, 1, 1, 1, res); break;       \
    }
#define QROW_CASE(TT_, NP_) case (TT_) * 4 + (NP_): QROW_LAYOUTS(TT_, NP_) break;

static void qrow_dispatch(const void *c, const void *d, const void *m, const int64_t *S,
                          int nb, int G, int K,
                          const int16_t *pc, int t0, int TT, int NP, int flags, uint64_t *res) {
    const int lay = ((flags & QF_S32) ? 4 : 0) + ((flags & QF_NIBBLES) ? 2 : 0) + (G == 16);
    switch (TT * 4 + NP) {
        QROW_CASE(1, 1) QROW_CASE(1, 2) QROW_CASE(1, 3)
        QROW_CASE(2, 1) QROW_CASE(2, 2) QROW_CASE(2, 3)
        QROW_CASE(3, 1) QROW_CASE(3, 2) QROW_CASE(3, 3)
        QROW_CASE(4, 1) QROW_CASE(4, 2) QROW_CASE(4, 3)
        default: break;
    }
}
#undef QROW_CASE
#undef QROW_LAYOUTS
#endif /* AVX-512 */

/* Quantized matmul: x [T, K] Q.16 int64, codes [O, K] int8 (Q4_1: 0..15, Q8_0: -128..127,
 * every other format's signed codes; or [O, K / 2] nibbles, QF_NIBBLES), blocks of G weights
 * (16, 32, ... 256), scale/offset [O, nb = K / G] Q.24 int64 (int32 with QF_S32; offset NULL
 * where the format has none), wq [nb] the exactness-check weights,
 * oracle_bits/oracle_pieces the numpy oracle's float32 split (for its range check only).
 * out [T, O] Q.16 = round_half_up(sum_b D*P + M*S, 24). Returns 0, or 1 where the numpy
 * oracle raises.
 *
 * Exactness of the AVX-512 path (same bytes as the scalar one): each int32 lane holds a
 * partial sum of one block dot of codes and 16-bit input pieces (|sum| <= G * 128 * 2**15
 * <= 2**30). Everything after that is +, - and * in int64 lanes, i.e. arithmetic mod 2**64,
 * whatever the order; the true sum_b D*P + M*S is bounded by sum_b W[b] * A[b] <= 2**62 (the
 * oracle's accumulation check, applied first), so its residue mod 2**64, read as int64, is
 * that sum exactly. */
int nl_qmatmul(const int64_t *x, int T, int K, const void *codes, int O,
               const void *scale, const void *offset, const int64_t *wq,
               int oracle_bits, int oracle_pieces, int64_t *out, int nthreads, int G,
               int flags) {
    if (G <= 0 || G > 256 || K % G != 0) return 1;
    if ((flags & QF_NIBBLES) && K % 32 != 0) return 3;
    const int nb = K / G;
    if (T <= 0) return 0;
    const int nib = flags & QF_NIBBLES, s32 = flags & QF_S32;
    const size_t row_bytes = nib ? (size_t)K / 2 : (size_t)K;
    const size_t sc_bytes = s32 ? 4 : 8;
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
#ifdef NL_QMM_AVX512
    if (G == 16 || G % 32 == 0) {
        /* 2v. lane-wise int64 partial sums, reduced once per row (see above) */
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int o = 0; o < O; o++) {
            const void *c = (const uint8_t *)codes + (size_t)o * row_bytes;
            const void *d = (const uint8_t *)scale + (size_t)o * nb * sc_bytes;
            const void *m = offset ? (const uint8_t *)offset + (size_t)o * nb * sc_bytes : NULL;
            for (int t0 = 0; t0 < T; t0 += QTT) {
                const int tt = T - t0 < QTT ? T - t0 : QTT;
                uint64_t res[QTT];
                qrow_dispatch(c, d, m, S, nb, G, K, pc, t0, tt, npieces, flags, res);
                for (int t = 0; t < tt; t++) {
                    const uint64_t r = res[t];
                    out[(size_t)(t0 + t) * O + o] = (int64_t)(r + (1ULL << 23)) >> 24;
                }
            }
        }
        free(S);
        free(pc);
        return 0;
    }
#endif
    /* 2. exact block dot products (int32: |q * piece| <= 2**22, G <= 256 terms < 2**30) */
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int o = 0; o < O; o++) {
        const uint8_t *c = (const uint8_t *)codes + (size_t)o * row_bytes;
        /* the row's codes widened once to int16, so every block dot below is an
         * int16 x int16 multiply-add (vpmaddwd) for every token and piece */
        int16_t cw[K];
        if (nib)
            for (int i = 0; i < K; i += 32)
                for (int j = 0; j < 16; j++) {
                    cw[i + j] = (int16_t)(c[i / 2 + j] & 15);
                    cw[i + 16 + j] = (int16_t)(c[i / 2 + j] >> 4);
                }
        else
            for (int i = 0; i < K; i++) cw[i] = (int16_t)(int8_t)c[i];
        int64_t d[nb], m[nb];
        for (int b = 0; b < nb; b++) {
            const size_t q = (size_t)o * nb + b;
            d[b] = s32 ? ((const int32_t *)scale)[q] : ((const int64_t *)scale)[q];
            m[b] = !offset ? 0 : s32 ? ((const int32_t *)offset)[q] : ((const int64_t *)offset)[q];
        }
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
                    if (offset) v += m[b] * S[(size_t)t * nb + b];
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

static inline int64_t isqrt(int64_t n) { /* fixed_point.isqrt, digit by digit */
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

static inline int64_t exp2_neg_q30(int64_t t) { /* fixed_point.exp2_neg_q30, t <= 0 */
    if (t < EXP2_ARG_MIN) t = EXP2_ARG_MIN;
    int64_t i = t >> 16;
    int64_t fr = t - i * 65536;
    int64_t acc = EXP2_POLY_Q30[7];
    for (int c = 6; c >= 0; c--) acc = rshift_round(acc * fr, 16) + EXP2_POLY_Q30[c];
    int64_t sh = -i < 40 ? -i : 40;
    return rshift_round_var(acc, sh);
}

static inline int64_t sigmoid_q30(int64_t x) { /* fixed_point.sigmoid_q30 */
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
