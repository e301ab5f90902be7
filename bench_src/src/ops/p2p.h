/* Shared pieces of the point-to-point ops (pingpong, pingpong_bi, pairmatrix). */
#ifndef COMMBENCH_OPS_P2P_H
#define COMMBENCH_OPS_P2P_H

#include "plan.h"

/* The pair measured by pingpong ops: rank 0 and --peer (default the last rank). */
int cb_p2p_default_pair(const struct cb_ctx *ctx, enum cb_direction dir, struct cb_instance *out, int max);
void cb_p2p_data(const struct cb_ctx *ctx, const struct cb_plan *plan, const struct cb_instance *inst, uint32_t seed,
                 struct cb_data *data);
/* uni: src sends, dst answers (one round trip); bi: both exchange at once. */
int cb_p2p_run(const struct cb_exec *exec);

#endif
