/* Job layout from MPI (ranks, nodes, hosts). */
#ifndef COMMBENCH_COMM_H
#define COMMBENCH_COMM_H

#include "commbench.h"

/* Collective over MPI_COMM_WORLD; fills everything but backend and args. */
int cb_ctx_init(struct cb_ctx *ctx);
void cb_ctx_free(struct cb_ctx *ctx);
/* CB_OK for MPI_SUCCESS, else CB_ERROR (CB_UNSUPPORTED for error class
 * MPI_ERR_UNSUPPORTED_OPERATION) + cb_errorf("<what> failed: <MPI's message>"). */
int cb_mpi_check(int rc, const char *what);
/* MPI_Get_library_version, or "" */
void cb_mpi_library(char *buf, size_t len);
/* Sends len bytes of this rank's block to rank 0, which receives nranks blocks into all. */
int cb_gather_to_root(const void *mine, void *all, size_t bytes_each);

#endif
