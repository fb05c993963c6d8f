// Fixed-point primitives shared by every kernel: the line-by-line twins of fixed_point.py.
// Rounding rule everywhere: round half up, floor(v + 1/2).
// No headers: NVRTC compiles this as is, g++ compiles it with cpu_shim/cuda_cpu.h.
#pragma once

typedef long long i64;

#define NL_ONE_Q30 (1LL << 30)
#define NL_LOG2E_Q30 1549082005LL
#define NL_EXP2_ARG_MIN (-(1LL << 26))
#define NL_RED 257  // shared reduction buffer: blockDim.x <= 256, plus one result slot

__device__ __forceinline__ i64 rshift_round(i64 x, int s) {
    return s == 0 ? x : ((x + (1LL << (s - 1))) >> s);
}

// floor(a / b + 1/2) for a >= 0, b > 0
__device__ __forceinline__ i64 div_round(i64 a, i64 b) { return (a + (b >> 1)) / b; }

// exact floor(sqrt(n)), 0 <= n < 2**62, digit by digit
__device__ __forceinline__ i64 isqrt64(i64 n) {
    i64 res = 0;
    i64 bit = 1LL << 60;
    for (int i = 0; i < 31; ++i) {
        i64 t = res + bit;
        if (n >= t) {
            n -= t;
            res = (res >> 1) + bit;
        } else {
            res >>= 1;
        }
        bit >>= 2;
    }
    return res;
}

__device__ __forceinline__ int bit_length64(i64 n) {
    int out = 0;
    for (int sh = 32; sh >= 1; sh >>= 1) {
        if (n >= (1LL << sh)) {
            out += sh;
            n >>= sh;
        }
    }
    return out + (n > 0 ? 1 : 0);
}

// 2**(fr / 2**16) in Q.30, 0 <= fr < 2**16 (degree-7 polynomial, Horner)
__device__ __forceinline__ i64 exp2_frac_q30(i64 fr) {
    i64 acc = 23074LL;
    acc = rshift_round(acc * fr, 16) + 154140LL;
    acc = rshift_round(acc * fr, 16) + 1441201LL;
    acc = rshift_round(acc * fr, 16) + 10323001LL;
    acc = rshift_round(acc * fr, 16) + 59598166LL;
    acc = rshift_round(acc * fr, 16) + 257941118LL;
    acc = rshift_round(acc * fr, 16) + 744261124LL;
    acc = rshift_round(acc * fr, 16) + 1073741824LL;
    return acc;
}

// 2**(t / 2**16) in Q.30 for t <= 0
__device__ __forceinline__ i64 exp2_neg_q30(i64 t) {
    if (t < NL_EXP2_ARG_MIN) t = NL_EXP2_ARG_MIN;
    i64 i = t >> 16;
    i64 fr = t - (i << 16);
    i64 p = exp2_frac_q30(fr);
    i64 s = -i;
    if (s > 40) s = 40;
    return rshift_round(p, (int)s);
}

__device__ __forceinline__ i64 sigmoid_q30(i64 x) {
    i64 a = x < 0 ? -x : x;
    if (a > (1LL << 26)) a = 1LL << 26;
    i64 t = -rshift_round(a * NL_LOG2E_Q30, 30);
    i64 e = exp2_neg_q30(t);
    i64 den = NL_ONE_Q30 + e;
    return x >= 0 ? div_round(1LL << 60, den) : div_round(e << 30, den);
}

__device__ __forceinline__ i64 silu_q16(i64 x) { return rshift_round(x * sigmoid_q30(x), 30); }

// gelu_tanh(x) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x**3)), Q.16 in and out (|x| < 2**31);
// the cube is taken of x clamped to +-16 (Q.16 2**20), where the sigmoid already saturates.
#define NL_GELU_2C_Q30 1713444047LL
#define NL_GELU_A_Q30 48012366LL
#define NL_GELU_CLAMP (1LL << 20)

__device__ __forceinline__ i64 gelu_tanh_q16(i64 x) {
    i64 c = x < -NL_GELU_CLAMP ? -NL_GELU_CLAMP : (x > NL_GELU_CLAMP ? NL_GELU_CLAMP : x);
    i64 c2 = rshift_round(c * c, 16);
    i64 c3 = rshift_round(c2 * c, 16);
    i64 inner = c + rshift_round(c3 * NL_GELU_A_Q30, 30);
    i64 arg = rshift_round(inner * NL_GELU_2C_Q30, 30);
    return rshift_round(x * sigmoid_q30(arg), 30);
}

// rshift_round(n * g, 32) for |n| < 2**31, |g| < 2**40 without forming n * g:
// g = gh * 2**16 + gl (0 <= gl < 2**16), floor shifts throughout.
__device__ __forceinline__ i64 mul_rshift_round32(i64 n, i64 g) {
    i64 gh = g >> 16;
    i64 gl = g & 0xFFFFLL;
    return (n * gh + ((n * gl) >> 16) + (1LL << 15)) >> 16;
}

// floor(a / b) for b > 0 and any sign of a (Python's //; C's / truncates towards zero)
__device__ __forceinline__ i64 floor_div(i64 a, i64 b) {
    i64 q = a / b;
    return (q * b > a) ? q - 1 : q;
}

// Block-wide integer sum and max (exact, so the reduction order cannot matter).
__device__ __forceinline__ i64 block_sum(i64 v, i64* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        i64 s = 0;
        for (unsigned i = 0; i < blockDim.x; ++i) s += red[i];
        red[NL_RED - 1] = s;
    }
    __syncthreads();
    i64 r = red[NL_RED - 1];
    __syncthreads();
    return r;
}

__device__ __forceinline__ i64 block_max(i64 v, i64* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        i64 m = red[0];
        for (unsigned i = 1; i < blockDim.x; ++i) m = red[i] > m ? red[i] : m;
        red[NL_RED - 1] = m;
    }
    __syncthreads();
    i64 r = red[NL_RED - 1];
    __syncthreads();
    return r;
}
