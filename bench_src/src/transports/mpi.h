/* The mpi transport's state is just its buffers, so other transports (staging) can drive its
 * primitives on buffers of their own. */
#ifndef COMMBENCH_TRANSPORT_MPI_H
#define COMMBENCH_TRANSPORT_MPI_H

#include "../commbench.h"

struct cb_mpi_bufs {
    void *send, *recv;
};

#endif
