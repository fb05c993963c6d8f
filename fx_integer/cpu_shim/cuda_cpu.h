// Maps the CUDA built-ins used by kernels/*.cu onto the CPU so the SAME sources build with g++:
//   __global__/__device__/__forceinline__ -> plain (inline) functions
//   __shared__                           -> static storage, shared by the threads of a block
//   threadIdx/blockIdx                    -> thread_local, set by nl_launch
//   blockDim/gridDim                      -> globals, set by nl_launch
//   __syncthreads()                       -> std::barrier across the block's std::threads
// nl_launch runs the grid's blocks one after another; each block runs blockDim.x*y*z
// std::threads that meet at the barrier. Because blocks never run concurrently, `static`
// storage behaves like per-block __shared__ memory. One launch at a time per process.
#pragma once
#include <barrier>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct nl_uint3 {
    unsigned x, y, z;
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

inline thread_local nl_uint3 threadIdx;
inline thread_local nl_uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;
inline std::barrier<>* nl_block_barrier = nullptr;

inline void __syncthreads() { nl_block_barrier->arrive_and_wait(); }

template <typename... P, typename... A>
void nl_launch(void (*kernel)(P...), dim3 grid, dim3 block, A... args) {
    gridDim = grid;
    blockDim = block;
    unsigned nt = block.x * block.y * block.z;
    std::barrier<> bar(nt);
    nl_block_barrier = &bar;
    auto body = [&](unsigned t) {
        threadIdx = nl_uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        for (unsigned bz = 0; bz < grid.z; ++bz)
            for (unsigned by = 0; by < grid.y; ++by)
                for (unsigned bx = 0; bx < grid.x; ++bx) {
                    blockIdx = nl_uint3{bx, by, bz};
                    kernel(args...);
                    bar.arrive_and_wait();  // the block's static "__shared__" is free again
                }
    };
    if (nt == 1) {
        body(0);
    } else {
        std::vector<std::thread> ts;
        ts.reserve(nt);
        for (unsigned t = 0; t < nt; ++t) ts.emplace_back(body, t);
        for (auto& th : ts) th.join();
    }
    nl_block_barrier = nullptr;
}
