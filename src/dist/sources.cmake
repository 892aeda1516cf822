# Ring attention (include/flashattn_ring.h, docs/ring.md). Included by the root CMakeLists.txt after the CUDA
# detection; sets FA_DIST_SOURCES, FA_DIST_LIBS, FA_HAVE_NCCL and FA_NCCL_LIBRARY. Always built with the thread
# transport (CPU and CUDA contexts); the CUDA element operations with the CUDA backend; the NCCL transport where
# nccl.h is found (FA_NCCL=AUTO), required (ON) or never (OFF). The library never links NCCL: the transport loads
# libnccl.so.2 at run time (transport_nccl.cu says why); FA_NCCL_LIBRARY is for the GPU test and the benchmark that
# create communicators. stubs.c stands in for the parts a build leaves out.
find_package(Threads REQUIRED)
set(FA_DIST_SOURCES src/dist/create_error.c src/dist/comm.c src/dist/check.c src/dist/transport_thread.c src/dist/ops_cpu.c
    src/dist/ring_fwd.c src/dist/ring_bwd.c src/dist/stubs.c)
set(FA_DIST_LIBS Threads::Threads ${CMAKE_DL_LIBS})
set(FA_HAVE_NCCL OFF)
if(FA_HAVE_CUDA)
  list(APPEND FA_DIST_SOURCES src/dist/ops_cuda.cu)
  set_source_files_properties(src/dist/ops_cuda.cu PROPERTIES COMPILE_OPTIONS "-Xcompiler=-Wall,-Wextra;-Xptxas=-warn-spills")
  if(NOT FA_NCCL STREQUAL "OFF")
    find_path(FA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
    find_library(FA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ENV NCCL_HOME
                 PATH_SUFFIXES lib lib64)
    if(FA_NCCL_INCLUDE_DIR)
      set(FA_HAVE_NCCL ON)
      list(APPEND FA_DIST_SOURCES src/dist/transport_nccl.cu)
      set_source_files_properties(src/dist/transport_nccl.cu PROPERTIES COMPILE_OPTIONS "-Xcompiler=-Wall,-Wextra"
                                  INCLUDE_DIRECTORIES "${FA_NCCL_INCLUDE_DIR}")
    elseif(FA_NCCL STREQUAL "ON")
      message(FATAL_ERROR "FA_NCCL=ON but nccl.h was not found (set NCCL_HOME)")
    endif()
  endif()
elseif(FA_NCCL STREQUAL "ON")
  message(FATAL_ERROR "FA_NCCL=ON needs the CUDA backend (FA_CUDA)")
endif()
if(FA_HAVE_NCCL)
  set_source_files_properties(src/dist/stubs.c PROPERTIES COMPILE_DEFINITIONS "FA_HAVE_NCCL=1")
endif()
# The ring's benchmark over NCCL (bench/ring, run by scripts/bench-ring.sh), compiled wherever NCCL is.
if(FA_HAVE_NCCL AND FA_NCCL_LIBRARY AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/bench/ring/CMakeLists.txt)
  add_subdirectory(${CMAKE_CURRENT_SOURCE_DIR}/bench/ring ${CMAKE_BINARY_DIR}/bench/ring)
endif()
