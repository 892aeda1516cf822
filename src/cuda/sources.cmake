# CUDA backend sources (included by the root CMakeLists.txt when a CUDA compiler is found).
# Built for sm_90a only (H100/H200): the mma_sync/ kernels' mma.sync/ldmatrix/cp.async run there; the build stays fast.
find_package(CUDAToolkit REQUIRED)
# Always sm_90a (the backend refuses other devices at context creation): shadows the toolkit default that
# enable_language(CUDA) puts in the cache.
set(CMAKE_CUDA_ARCHITECTURES 90a)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# backend.cu: context and run; plan.cu: the one decision; family.cu: the family table (family.h) and what its rows
# share; state.cu: the context's state; contract.cu: the numerics contract (scan, fix-up); standard.cu: cuBLAS and
# its row; zero_fill.cu: the outputs of calls without a (query, key) pair; seqused.cu: the padding rows of seqused;
# sinks.cu: learnable sinks (the forward's join, d sinks); quantize.cu: fa_quantize_fp8; mma_sync/: the mma.sync / ldmatrix /
# cp.async kernels and their rows (docs/cuda-kernels.md); wgmma/: FLASH3 (wgmma, TMA) and its row; kvcache/: KV-cache
# attention (docs/kvcache.md). The kernel files first: they take the longest to compile.
set(FA_CUDA_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/wgmma/flash3_fwd.cu
    ${CMAKE_CURRENT_LIST_DIR}/wgmma/flash3_bwd.cu
    ${CMAKE_CURRENT_LIST_DIR}/mma_sync/flash2_bwd.cu
    ${CMAKE_CURRENT_LIST_DIR}/mma_sync/flash2_fwd.cu
    ${CMAKE_CURRENT_LIST_DIR}/mma_sync/flash1.cu
    ${CMAKE_CURRENT_LIST_DIR}/mma_sync/bwd_util.cu
    ${CMAKE_CURRENT_LIST_DIR}/mma_sync/family.cu
    ${CMAKE_CURRENT_LIST_DIR}/wgmma/family.cu
    ${CMAKE_CURRENT_LIST_DIR}/contract.cu
    ${CMAKE_CURRENT_LIST_DIR}/backend.cu
    ${CMAKE_CURRENT_LIST_DIR}/family.cu
    ${CMAKE_CURRENT_LIST_DIR}/plan.cu
    ${CMAKE_CURRENT_LIST_DIR}/state.cu
    ${CMAKE_CURRENT_LIST_DIR}/standard.cu
    ${CMAKE_CURRENT_LIST_DIR}/zero_fill.cu
    ${CMAKE_CURRENT_LIST_DIR}/seqused.cu
    ${CMAKE_CURRENT_LIST_DIR}/sinks.cu
    ${CMAKE_CURRENT_LIST_DIR}/quantize.cu
    ${CMAKE_CURRENT_LIST_DIR}/kvcache/splitkv.cu
    ${CMAKE_CURRENT_LIST_DIR}/kvcache/pair.cu
    ${CMAKE_CURRENT_LIST_DIR}/kvcache/append.cu
    ${CMAKE_CURRENT_LIST_DIR}/kvcache/merge.cu
    ${CMAKE_CURRENT_LIST_DIR}/kvcache/host.cu)
# Host code warnings-clean; device code: report spills (-Xptxas -warn-spills) so a shipped tile that spills shows.
set_source_files_properties(${FA_CUDA_SOURCES} PROPERTIES COMPILE_OPTIONS
    "-Xcompiler=-Wall,-Wextra;-Xptxas=-warn-spills;--expt-relaxed-constexpr")
# The CUDA runtime is linked statically, as NCCL and cuBLAS link theirs (and CMake's CUDA default): libflashattn.so
# needs no libcudart.so.N, which in a process that loads flashattn before PyTorch would be the toolkit's, bound in
# place of PyTorch's own by their one soname. Every flashattn binary (tests, CLI, benchmarks) links FA_CUDART too, so
# that each has one runtime. cuBLAS stays a shared library (its static archives are hundreds of MB): the first
# libcublas.so.N loaded serves both (docs/python.md, "PyTorch's CUDA libraries").
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
set(FA_CUDART CUDA::cudart_static)
set(FA_CUDA_LIBS ${FA_CUDART} CUDA::cublas)
