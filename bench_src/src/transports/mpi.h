/* The mpi transport's state is its buffers and communicator, so other transports (staging) can
 * drive its primitives on buffers of their own (comm = MPI_COMM_WORLD). */
#ifndef COMMBENCH_TRANSPORT_MPI_H
#define COMMBENCH_TRANSPORT_MPI_H

#include <mpi.h>

#include "../commbench.h"

/* A communicator made for one forced selection (Open MPI), kept for the op's whole sweep. */
struct cb_mpi_selection_comm {
    char cvar[128];
    int value, segsize;
    MPI_Comm comm;
    struct cb_kv readback[2]; /* the variables' values read back after the write */
    int nreadback;
};

struct cb_mpi_bufs {
    void *send, *recv;
    MPI_Comm comm; /* MPI_COMM_WORLD, or a duplicate made for a forced selection */
    struct cb_mpi_selection_comm *selection_comms; /* owned by mpi_selection.c */
    int nselection_comms;
    struct cb_kv reported[CB_MAX_REPORTED]; /* what the last select read back */
    int nreported;
};

/* Selection sweep through MPI_T (mpi_selection.c): the mpi transport's selections/select hooks. */
int cb_mpi_selections(void *state, const struct cb_op *op, struct cb_selection *out, int max);
int cb_mpi_select(void *state, const struct cb_op *op, const struct cb_selection *sel);
int cb_mpi_reported(void *state, struct cb_kv *out, int max);

#endif
