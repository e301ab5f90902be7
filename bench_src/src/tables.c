/* The op and transport tables: a new one is its file, its line here, its extern (ops: here; transports:
 * commbench.h) and its source in the build (CMakeLists.txt; GPU: cmake/gpu.cmake). */
#include <string.h>

#include "commbench.h"

extern const struct cb_op cb_op_pingpong, cb_op_pingpong_bi, cb_op_allreduce, cb_op_alltoall, cb_op_allgather,
    cb_op_reduce_scatter, cb_op_bcast, cb_op_pairmatrix, cb_op_sendrecv, cb_op_h2d, cb_op_d2h;

const struct cb_op *const cb_ops[] = {
    &cb_op_pingpong,
    &cb_op_pingpong_bi,
    &cb_op_allreduce,
    &cb_op_alltoall,
    &cb_op_allgather,
    &cb_op_reduce_scatter,
    &cb_op_bcast,
    &cb_op_pairmatrix,
    &cb_op_sendrecv,
    &cb_op_h2d,
    &cb_op_d2h,
    NULL,
};

const struct cb_transport *const cb_transports[] = {
#if defined(COMMBENCH_GPU)
    &cb_transport_staging,
    &cb_transport_d2d,
    &cb_transport_d2d_kernel,
    &cb_transport_ccl,
#endif
    &cb_transport_mpi,
#if defined(COMMBENCH_GPU)
    &cb_transport_memcpy,
#endif
    NULL,
};

const struct cb_op *cb_find_op(const char *name)
{
    for (int i = 0; cb_ops[i]; i++)
        if (strcmp(cb_ops[i]->name, name) == 0)
            return cb_ops[i];
    return NULL;
}

const struct cb_transport *cb_find_transport(const char *name)
{
    for (int i = 0; cb_transports[i]; i++)
        if (strcmp(cb_transports[i]->name, name) == 0 && (cb_transports[i]->backends & cb_backend_bit()))
            return cb_transports[i];
    return NULL;
}

int cb_op_has_selections(const struct cb_op *op)
{
    return op->needs == CB_CAP_ALLREDUCE || op->needs == CB_CAP_ALLGATHER || op->needs == CB_CAP_ALLTOALL ||
           op->needs == CB_CAP_BCAST || op->needs == CB_CAP_REDUCE_SCATTER;
}
