/* Varlen: sequence b of a packed batch, from the caller's device cu_seqlens (and seqused), the arrays no kernel
 * reads any other way. */
#ifndef FA_CUDA_PACKED_CUH
#define FA_CUDA_PACKED_CUH

/* Its first row, clamped into the packed tensor's [0, total] rows, and its length (returned), bounded by its span and
 * by the bound the grid was sized for (opts.max_seqlen_q/k), so that no value reads or writes out of bounds; with used
 * (seqused_q/k, or NULL) its first used[b] rows only (seqused.cu writes the rest of the span). */
template <typename R>
__device__ __forceinline__ int fa_packed_seq(const int *cu, const int *used, int b, int total, int bound, R *row) {
    const int lo = min(max(cu[b], 0), total), hi = min(max(cu[b + 1], lo), total);
    *row = lo;
    const int n = min(hi - lo, bound);
    return used ? min(n, max(used[b], 0)) : n;
}

#endif
