# The core's sources. Included by the root CMakeLists.txt first; starts FA_SOURCES. Two layers (docs/architecture.md):
# the entry files above the backends (api.c, kvcache.c, entry.c, fp8_check.c, quantize.c) and the helpers below them that any layer may call
# (names.c, status.c, workspace.c, kv_split.c, kv_indices.c). cuda_stub.c is added by the root for a build without
# CUDA.
set(FA_SOURCES
    src/core/api.c src/core/kvcache.c src/core/entry.c src/core/fp8_check.c src/core/quantize.c
    src/core/names.c src/core/status.c src/core/workspace.c src/core/kv_split.c src/core/kv_indices.c)
