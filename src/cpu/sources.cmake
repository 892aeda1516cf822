# The CPU backend's sources. Included by the root CMakeLists.txt; sets FA_CPU_SOURCES, FA_CPU_BLAS_LIBS, FA_CPU_HAVE_CBLAS and
# FA_CPU_BLAS_INCLUDE. Layout: backend.c (init, plan, run), frame.c (the workspace frame), algo/ (one file per
# algorithm, kvcache.c for fa_forward_kvcache), tiles/ (the tile steps the algorithms share, the tile table, counted
# tile transfers), simd/ (the kernel table per ISA, its runtime dispatch, and the KV-cache kernel each table points
# to). A new ISA is a table file and a kvcache_<isa>.c in simd/ with their flags below, and a case in simd/dispatch.c.
set(FA_CPU_SOURCES
    src/cpu/backend.c src/cpu/frame.c src/cpu/traffic.c src/cpu/contract.c src/cpu/blas.c src/cpu/sinks.c
    src/cpu/seqused.c
    src/cpu/fp8.c src/cpu/quantize.c
    src/cpu/algo/standard.c src/cpu/algo/flash1.c src/cpu/algo/flash2.c
    src/cpu/algo/flash2_bf16.c src/cpu/algo/flash2_amx.c src/cpu/algo/kvcache.c
    src/cpu/tiles/head.c src/cpu/tiles/scores.c src/cpu/tiles/bwd_tile.c src/cpu/tiles/tile_io.c
    src/cpu/tiles/tile_table.c
    src/cpu/simd/dispatch.c src/cpu/simd/scalar.c src/cpu/simd/kvcache_scalar.c)

# The KV-cache kernels (simd/kvcache_<isa>.c, the body in simd/kvcache_impl.h): -ffp-contract=fast lets the vector
# code fuse its multiply-adds; -Wno-psabi: its 64-byte vector types only cross static inline functions, no ABI
# boundary. FA_KVCACHE_KERNEL_FLAGS adds options to those files alone (the name tests/fuzz/build.sh passes): the fuzz
# build gives -O0, since clang's inliner spends minutes on their always-inline vector code under ASan.
set(FA_KVCACHE_KERNEL_FLAGS "" CACHE STRING "Extra compile options for the CPU KV-cache kernels (src/cpu/simd/kvcache_*.c)")
set(FA_KV_FLAGS "-ffp-contract=fast;-Wno-psabi;${FA_KVCACHE_KERNEL_FLAGS}")
# The avx512f level's files get AVX-512 F/BW/VL/DQ and nothing more, so they run on every AVX-512 CPU (Skylake-X to
# Ice Lake have no AVX512_BF16); only the avx512bf16 and amx levels' files add -mavx512bf16.
set(FA_AVX512F_FLAGS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mfma")
set(FA_AVX512BF16_FLAGS "${FA_AVX512F_FLAGS};-mavx512bf16")
set_source_files_properties(src/cpu/simd/kvcache_scalar.c PROPERTIES COMPILE_OPTIONS "${FA_KV_FLAGS}")

# Each ISA file gets its own flags; the dispatcher and everything that runs before the CPUID check stay at the
# baseline ISA, so one binary runs on any x86-64.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i.86)$" AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  list(APPEND FA_CPU_SOURCES src/cpu/simd/avx2.c src/cpu/simd/avx512.c src/cpu/simd/avx512bf16.c src/cpu/simd/amx.c
                             src/cpu/simd/kvcache_avx2.c src/cpu/simd/kvcache_avx512f.c src/cpu/simd/kvcache_avx512bf16.c)
  set_source_files_properties(src/cpu/simd/avx2.c PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
  set_source_files_properties(src/cpu/simd/avx512.c PROPERTIES COMPILE_OPTIONS "${FA_AVX512F_FLAGS}")
  set_source_files_properties(src/cpu/simd/avx512bf16.c PROPERTIES COMPILE_OPTIONS "${FA_AVX512BF16_FLAGS}")
  set_source_files_properties(src/cpu/simd/amx.c PROPERTIES COMPILE_OPTIONS "-mamx-tile;-mamx-bf16;${FA_AVX512BF16_FLAGS}")
  set_source_files_properties(src/cpu/simd/kvcache_avx2.c PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;${FA_KV_FLAGS}")
  set_source_files_properties(src/cpu/simd/kvcache_avx512f.c PROPERTIES
    COMPILE_OPTIONS "${FA_AVX512F_FLAGS};-ffp-contract=fast;${FA_KVCACHE_KERNEL_FLAGS}")
  set_source_files_properties(src/cpu/simd/kvcache_avx512bf16.c PROPERTIES
    COMPILE_OPTIONS "${FA_AVX512BF16_FLAGS};-ffp-contract=fast;${FA_KVCACHE_KERNEL_FLAGS}")
endif()

# STANDARD uses a system CBLAS when one is found (OpenBLAS preferred), else our micro-kernels: standard_blas.c is
# built, and offered by the plan (backend.c, FA_HAVE_CBLAS), only then.
set(FA_CPU_BLAS_LIBS "")
set(FA_CPU_BLAS_INCLUDE "")
set(FA_CPU_HAVE_CBLAS OFF) # the one test of "a CBLAS was found" (FA_CPU_BLAS_LIBS also holds the dl library)
option(FA_USE_BLAS "Use a system CBLAS for FA_ALGO_STANDARD on the CPU when found" ON)
if(FA_USE_BLAS)
  find_path(FA_CBLAS_INCLUDE_DIR NAMES cblas.h PATH_SUFFIXES openblas openblas-openmp openblas-pthread)
  find_library(FA_OPENBLAS_LIBRARY NAMES openblas)
  if(FA_CBLAS_INCLUDE_DIR AND FA_OPENBLAS_LIBRARY)
    set(FA_CPU_BLAS_LIBS ${FA_OPENBLAS_LIBRARY})
    set(FA_CPU_BLAS_INCLUDE ${FA_CBLAS_INCLUDE_DIR})
    set(FA_CPU_HAVE_CBLAS ON)
    list(APPEND FA_CPU_SOURCES src/cpu/algo/standard_blas.c)
    set_source_files_properties(src/cpu/algo/standard_blas.c src/cpu/backend.c PROPERTIES
                                COMPILE_DEFINITIONS "FA_HAVE_CBLAS=1" INCLUDE_DIRECTORIES "${FA_CBLAS_INCLUDE_DIR}")
    message(STATUS "flashattn: STANDARD uses CBLAS from ${FA_OPENBLAS_LIBRARY}")
  else()
    message(STATUS "flashattn: no OpenBLAS found; STANDARD uses the built-in micro-kernels")
  endif()
endif()

# blas.c finds the BLAS's thread control with dlsym.
list(APPEND FA_CPU_BLAS_LIBS ${CMAKE_DL_LIBS})

# The root CMakeLists.txt links FA_CPU_BLAS_LIBS into the library targets (PUBLIC, so the installed package and
# everything linking flashattn carry it).
