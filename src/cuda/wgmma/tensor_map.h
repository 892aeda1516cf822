/* TMA tensor maps of the FLASH3 kernels (host): encoded per call through the driver entry point, so that nothing
 * links libcuda. */
#ifndef FA_WGMMA_TENSOR_MAP_H
#define FA_WGMMA_TENSOR_MAP_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "flashattn.h" /* FA_DTYPE_F16 */

static inline PFN_cuTensorMapEncodeTiled_v12000 fa3_encode_fn(void) {
    /* the driver's function pointer: the same for the whole process, so looked up once */
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
    }
    return fn;
}

/* [batch, rows, heads, D] as a 4-D map {D, rows, heads, batch}; a box is 64 columns (128 B, the swizzle span) of
 * box_rows rows of one head; rows past the end read as zeros. */
static inline int fa3_map(CUtensorMap *m, const void *base, int dtype, int D, int rows, int heads, int batch,
                   int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = fa3_encode_fn();
    if (!enc) return -1;
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)(rows > 0 ? rows : 1), (cuuint64_t)heads, (cuuint64_t)batch};
    /* a zero stride only comes with an extent of 1 (the plan's row); TMA wants non-zero multiples of 16 B */
    const cuuint64_t strides[3] = {(cuuint64_t)(row_stride ? row_stride : 8) * 2,
                                   (cuuint64_t)(head_stride ? head_stride : 8) * 2,
                                   (cuuint64_t)(batch_stride ? batch_stride : 8) * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    const CUresult r =
        enc(m, dtype == FA_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base,
            dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* A packed (varlen) [rows, heads, D] tensor as a map whose boxes end at a sequence's last row: {D, box_rows, heads,
 * rows + 1}, dims 1 and 3 both stepping one row, the base box_rows rows early. A box at coordinates
 * (c, box_rows − v, h, r + v) holds rows r .. r + v − 1 and zeros after them (dim 1 runs out at box_rows), so a tile
 * never reads the next sequence's rows (fa3b_box in flash3_bwd_steps.cuh). Only rows r .. r + v − 1 are ever read:
 * the early base is never dereferenced. */
static inline int fa3_map_ragged(CUtensorMap *m, const void *base, int dtype, int D, int rows, int heads,
                                 int64_t row_stride, int64_t head_stride, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = fa3_encode_fn();
    if (!enc) return -1;
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)box_rows, (cuuint64_t)heads, (cuuint64_t)rows + 1};
    const cuuint64_t rs = (cuuint64_t)(row_stride ? row_stride : 8) * 2;
    const cuuint64_t strides[3] = {rs, (cuuint64_t)(head_stride ? head_stride : 8) * 2, rs};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    const char *early = (const char *)base - (int64_t)box_rows * (int64_t)rs;
    const CUresult r =
        enc(m, dtype == FA_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
            (void *)early, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}

#endif
