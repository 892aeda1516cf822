/* The parts of ring attention a build leaves out: the CUDA element operations without the CUDA backend (no CUDA
 * context can exist then), the NCCL transport without NCCL. */
#include "dist/ring.h"

#ifndef FA_HAVE_CUDA
const fa_ring_ops *fa_ring_ops_cuda(void) { return NULL; }
#endif

#ifndef FA_HAVE_NCCL
fa_status fa_ring_transport_nccl(void *nccl_comm, void *side_stream, fa_ring_transport **t) {
    (void)nccl_comm, (void)side_stream, (void)t;
    return fa_ring_create_fail(FA_ERR_BACKEND_UNAVAILABLE, "fa_ring_comm_nccl: this flashattn is built without NCCL "
                               "(configure with the CUDA backend and NCCL found, -DFA_NCCL=ON)");
}
#endif
