// C ABI over kernels/engine.cu for ctypes: nl_run_<kernel>(grid_x, [grid_y,] block_x, args...).
// Built with: g++ -std=c++20 -O2 -shared -fPIC -pthread -include cuda_cpu.h launch.cpp
#include "../kernels/engine.cu"

extern "C" {

void nl_run_embed_s32(unsigned gx, unsigned bx, const signed char* codes, const int* scale,
                      const int* offset, int has_off, const i64* tokens, i64* x, int D, int G) {
    nl_launch(nl_embed_s32, dim3(gx), dim3(bx), codes, scale, offset, has_off, tokens, x, D, G);
}

void nl_run_embed_s64(unsigned gx, unsigned bx, const signed char* codes, const i64* scale,
                      const i64* offset, int has_off, const i64* tokens, i64* x, int D, int G) {
    nl_launch(nl_embed_s64, dim3(gx), dim3(bx), codes, scale, offset, has_off, tokens, x, D, G);
}

void nl_run_q4_matmul(unsigned gx, unsigned gy, unsigned bx, const unsigned char* codes,
                      const int* scale, const int* offset, const i64* x, i64* y, int T, int O,
                      int K) {
    nl_launch(nl_q4_matmul, dim3(gx, gy), dim3(bx), codes, scale, offset, x, y, T, O, K);
}

void nl_run_qmatmul_s32(unsigned gx, unsigned gy, unsigned bx, const signed char* codes,
                        const int* scale, const int* offset, int has_off, const i64* x, i64* y,
                        int T, int O, int K, int G) {
    nl_launch(nl_qmatmul_s32, dim3(gx, gy), dim3(bx), codes, scale, offset, has_off, x, y, T,
              O, K, G);
}

void nl_run_qmatmul_s64(unsigned gx, unsigned gy, unsigned bx, const signed char* codes,
                        const i64* scale, const i64* offset, int has_off, const i64* x, i64* y,
                        int T, int O, int K, int G) {
    nl_launch(nl_qmatmul_s64, dim3(gx, gy), dim3(bx), codes, scale, offset, has_off, x, y, T,
              O, K, G);
}

void nl_run_rmsnorm(unsigned gx, unsigned bx, const i64* x, const i64* gain, i64* y, int D,
                    int center, i64 eps_q32) {
    nl_launch(nl_rmsnorm, dim3(gx), dim3(bx), x, gain, y, D, center, eps_q32);
}

void nl_run_rope(unsigned gx, unsigned gy, unsigned bx, const i64* x, const int* cos_t,
                 const int* sin_t, const i64* pos, i64* y, int nh, int hd, int neox) {
    nl_launch(nl_rope, dim3(gx, gy), dim3(bx), x, cos_t, sin_t, pos, y, nh, hd, neox);
}

void nl_run_attention(unsigned gx, unsigned gy, unsigned bx, const i64* q, const i64* k,
                      const i64* v, const i64* qpos, i64* out, i64* scratch, int H, int KV,
                      int hd, int m, int window, i64 scale_q30) {
    nl_launch(nl_attention, dim3(gx, gy), dim3(bx), q, k, v, qpos, out, scratch, H, KV, hd, m,
              window, scale_q30);
}

void nl_run_swiglu(unsigned gx, unsigned bx, const i64* g, const i64* u, i64* a, i64 n) {
    nl_launch(nl_swiglu, dim3(gx), dim3(bx), g, u, a, n);
}

void nl_run_geglu(unsigned gx, unsigned bx, const i64* g, const i64* u, i64* a, i64 n) {
    nl_launch(nl_geglu, dim3(gx), dim3(bx), g, u, a, n);
}

void nl_run_scale(unsigned gx, unsigned bx, const i64* x, i64* y, i64 n, i64 factor_q24) {
    nl_launch(nl_scale, dim3(gx), dim3(bx), x, y, n, factor_q24);
}

}  // extern "C"
