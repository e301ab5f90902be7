/* The mpi transport's state is its buffers and communicator, so other transports (staging) can
 * drive its primitives on buffers of their own (comm = MPI_COMM_WORLD). */
#ifndef COMMBENCH_TRANSPORT_MPI_H
#define COMMBENCH_TRANSPORT_MPI_H

#include <mpi.h>

#include "../commbench.h"

struct cb_mpi_bufs {
    void *send, *recv;
    MPI_Comm comm; /* MPI_COMM_WORLD, or a duplicate made for a forced selection */
};

/* Selection sweep through MPI_T (mpi_selection.c): the mpi transport's selections/select hooks. */
int cb_mpi_selections(void *state, const struct cb_op *op, struct cb_selection *out, int max);
int cb_mpi_select(void *state, const struct cb_op *op, const struct cb_selection *sel);

#endif
