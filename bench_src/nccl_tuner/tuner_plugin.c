/*
 * libnccl-tuner-commcamp.so: applies per-size rules from NCCL_TUNER_CONFIG_FILE to NCCL's (or
 * RCCL's) algorithm/protocol/channel choice, without ever enabling what NCCL disabled and without
 * touching anything when no rule applies. Interface: commcamp_tuner_api.h.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "commcamp_tuner_api.h"
#include "commcamp_tuner_control.h"
#include "tuner_config.h"

#define CC_EXPORT __attribute__((visibility("default")))
#define PLUGIN_NAME "commcamp"

/*
 * One per communicator (NCCL calls init once per communicator). NCCL does not use one
 * communicator from several threads at once, so the log-deduplication fields need no lock;
 * contexts share nothing.
 */
struct cc_context {
  struct cc_rule_set rules;
  size_t n_ranks;
  size_t n_nodes;
  cc_nccl_logger_t log;
  /* Per-call messages are skipped when the call and its outcome repeat the previous logged one,
   * so NCCL_DEBUG=INFO shows each size a rule handles without a line per collective call. */
  struct cc_call last_logged_call;
  long last_logged_rule;
};

/*
 * The one process-wide state: the choice commcampTunerForce set (commcamp_tuner_control.h), for
 * every context, with its counters. Packed in one atomic word so that a getCollInfo on another
 * thread reads a whole (algorithm, protocol, channels) triple: -1 = nothing forced, else
 * algorithm << 16 | protocol << 8 | (channels + 1).
 */
static atomic_int forced = -1;
static atomic_ullong forced_applied, forced_unavailable;
/* nNodes and nRanks NCCL gave the context of the last call the forced choice applied to: a rule must
 * name NCCL's node count, which is not the host count (NCCL's socket transport between two processes of
 * one host counts 2 nodes; a multi-node NVLink domain counts 1). */
static atomic_ullong forced_nodes, forced_ranks;

CC_EXPORT int commcampTunerForce(int algorithm, int protocol, int channels) {
  if (algorithm < 0) {
    atomic_store(&forced, -1);
    return 0;
  }
  if (algorithm >= CC_NCCL_NUM_ALGORITHMS || protocol < 0 || protocol >= CC_NCCL_NUM_PROTOCOLS ||
      channels == 0 || channels < -1 || channels > CC_NCCL_MAX_CHANNELS)
    return -1;
  atomic_store(&forced, -1);
  atomic_store(&forced_applied, 0);
  atomic_store(&forced_unavailable, 0);
  atomic_store(&forced_nodes, 0);
  atomic_store(&forced_ranks, 0);
  atomic_store(&forced, algorithm << 16 | protocol << 8 | (channels + 1));
  return 0;
}

CC_EXPORT int commcampTunerStats(unsigned long long* applied, unsigned long long* unavailable) {
  if (applied == NULL || unavailable == NULL) return -1;
  *applied = atomic_load(&forced_applied);
  *unavailable = atomic_load(&forced_unavailable);
  return 0;
}

CC_EXPORT int commcampTunerScope(unsigned long long* nodes, unsigned long long* ranks) {
  if (nodes == NULL || ranks == NULL) return -1;
  *nodes = atomic_load(&forced_nodes);
  *ranks = atomic_load(&forced_ranks);
  return *nodes > 0 ? 0 : -1;
}

/* "-1" fields print as a word; `text` must hold 24 bytes. */
static const char* value_or(int value, const char* any_word, char* text) {
  if (value == CC_ANY) return any_word;
  snprintf(text, 24, "%d", value);
  return text;
}

static void log_rule(const struct cc_context* ctx, long index) {
  const struct cc_rule* r = &ctx->rules.rules[index];
  char channels[24], nodes[24], ranks[24], pipe_ops[24], reg_buff[24], max_bytes[24] = "max";
  if (r->max_bytes != SIZE_MAX) snprintf(max_bytes, sizeof max_bytes, "%zu", r->max_bytes);
  CC_LOG(ctx->log, CC_NCCL_LOG_INFO,
         "TUNER/commcamp: rule %ld (line %u): %s bytes [%zu, %s] -> %s/%s channels=%s if nNodes=%s nRanks=%s "
         "numPipeOps=%s regBuff=%s",
         index + 1, r->line, cc_collective_name(r->collective), r->min_bytes, max_bytes,
         cc_algorithm_name(r->algorithm), cc_protocol_name(r->protocol), value_or(r->channels, "nccl", channels),
         value_or(r->n_nodes, "any", nodes), value_or(r->n_ranks, "any", ranks),
         value_or(r->num_pipe_ops, "any", pipe_ops), value_or(r->reg_buff, "any", reg_buff));
}

static int same_call(const struct cc_call* a, const struct cc_call* b) {
  return a->collective == b->collective && a->n_bytes == b->n_bytes && a->num_pipe_ops == b->num_pipe_ops &&
         a->reg_buff == b->reg_buff;
}

/* True once per run of identical (call, applied rule) pairs. */
static int first_report(struct cc_context* ctx, const struct cc_call* call, long applied) {
  if (ctx->last_logged_rule == applied && same_call(&ctx->last_logged_call, call)) return 0;
  ctx->last_logged_call = *call;
  ctx->last_logged_rule = applied;
  return 1;
}

static cc_nccl_result_t context_create(size_t n_ranks, size_t n_nodes, cc_nccl_logger_t log, uint64_t comm_id,
                                       void** context) {
  if (context == NULL) return CC_NCCL_INVALID_ARGUMENT;
  *context = NULL;
  struct cc_context* ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return CC_NCCL_SYSTEM_ERROR;
  *ctx = (struct cc_context){.n_ranks = n_ranks, .n_nodes = n_nodes, .log = log, .last_logged_rule = -2};

  /* Unlike NCCL's example we read no default file from the working directory: no variable, no rules. */
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  if (path == NULL || path[0] == '\0') {
    CC_LOG(log, CC_NCCL_LOG_INFO,
           "TUNER/commcamp: NCCL_TUNER_CONFIG_FILE is not set: no overrides (comm %#llx, %zu ranks, %zu nodes)",
           (unsigned long long)comm_id, n_ranks, n_nodes);
  } else {
    if (cc_config_load_file(path, log, &ctx->rules) != 0) {
      free(ctx);
      return CC_NCCL_SYSTEM_ERROR;
    }
    CC_LOG(log, CC_NCCL_LOG_INFO,
           "TUNER/commcamp: %zu rules from %s (%zu bad lines skipped) for comm %#llx, %zu ranks, %zu nodes",
           ctx->rules.count, path, ctx->rules.skipped_lines, (unsigned long long)comm_id, n_ranks, n_nodes);
    for (size_t i = 0; i < ctx->rules.count; i++) log_rule(ctx, (long)i);
  }
  *context = ctx;
  return CC_NCCL_SUCCESS;
}

static cc_nccl_result_t context_destroy(void* context) {
  struct cc_context* ctx = context;
  if (ctx != NULL) cc_rule_set_free(&ctx->rules);
  free(ctx);
  return CC_NCCL_SUCCESS;
}

/* The rule's entry in the contiguous cost table, or NULL if it is outside the table or NCCL
 * disabled it: NCCL skips IGNORE (-1.0) and every other negative cost; "!(>= 0)" also catches NaN. */
static float* usable_entry(const struct cc_rule* rule, float* cost, int num_algo, int num_proto) {
  if (rule->algorithm >= num_algo || rule->protocol >= num_proto) return NULL;
  float* entry = &cost[rule->algorithm * num_proto + rule->protocol];
  return *entry >= 0.0f ? entry : NULL;
}

/* Matching rules passed over before the applied one that are named in the log. */
#define MAX_LOGGED_SKIPS 8

/*
 * The first matching rule whose (algorithm, protocol) entry NCCL left enabled is applied: that
 * entry's cost becomes 0.0 (NCCL picks the lowest non-negative cost) and, if the rule gives a
 * channel count, *nChannels is set. Matching rules whose entry is disabled are logged and passed
 * over. Nothing else in the table, and nothing at all when no rule applies, is written.
 */
/* Marks for first_report: the forced choice applied / unavailable (rule indices are >= 0). */
#define FORCED_APPLIED (-3)
#define FORCED_UNAVAILABLE (-4)

/* commcampTunerForce's choice, in place of the rules: applied like a rule when NCCL left its entry
 * enabled, else the call is counted as unavailable and nothing is touched. */
static void apply_forced(struct cc_context* ctx, const struct cc_call* call, int packed, float* cost, int num_algo,
                         int num_proto, int* n_channels, const char* unavailable_reason) {
  struct cc_rule choice = {.algorithm = packed >> 16, .protocol = (packed >> 8) & 0xff, .channels = (packed & 0xff) - 1};
  float* entry = usable_entry(&choice, cost, num_algo, num_proto);
  if (entry != NULL) {
    *entry = 0.0f;
    if (choice.channels > 0) *n_channels = choice.channels;
    atomic_store(&forced_nodes, ctx->n_nodes);
    atomic_store(&forced_ranks, ctx->n_ranks);
    atomic_fetch_add(&forced_applied, 1);
  } else {
    atomic_fetch_add(&forced_unavailable, 1);
  }
  if (first_report(ctx, call, entry != NULL ? FORCED_APPLIED : FORCED_UNAVAILABLE)) {
    char channels[24];
    CC_LOG(ctx->log, CC_NCCL_LOG_INFO, "TUNER/commcamp: forced %s/%s channels=%s for %s %zu bytes: %s",
           cc_algorithm_name(choice.algorithm), cc_protocol_name(choice.protocol),
           value_or(choice.channels, "nccl", channels), cc_collective_name(call->collective), call->n_bytes,
           entry != NULL ? "applied" : unavailable_reason);
  }
}

static cc_nccl_result_t apply_rules(struct cc_context* ctx, const struct cc_call* call, float* cost, int num_algo,
                                    int num_proto, int* n_channels, const char* unavailable_reason) {
  int packed = atomic_load(&forced);
  if (packed >= 0) {
    apply_forced(ctx, call, packed, cost, num_algo, num_proto, n_channels, unavailable_reason);
    return CC_NCCL_SUCCESS;
  }
  long applied = -1;
  float* entry = NULL;
  long skipped[MAX_LOGGED_SKIPS];
  size_t n_skipped = 0;
  for (long i = cc_rule_set_find(&ctx->rules, 0, call); i >= 0;
       i = cc_rule_set_find(&ctx->rules, (size_t)i + 1, call)) {
    entry = usable_entry(&ctx->rules.rules[i], cost, num_algo, num_proto);
    if (entry != NULL) {
      applied = i;
      break;
    }
    if (n_skipped < MAX_LOGGED_SKIPS) skipped[n_skipped++] = i;
  }
  const struct cc_rule* rule = applied >= 0 ? &ctx->rules.rules[applied] : NULL;
  if (rule != NULL) {
    *entry = 0.0f;
    if (rule->channels > 0) *n_channels = rule->channels;
  }
  if ((rule != NULL || n_skipped > 0) && first_report(ctx, call, applied)) {
    for (size_t k = 0; k < n_skipped; k++) {
      const struct cc_rule* skip = &ctx->rules.rules[skipped[k]];
      CC_LOG(ctx->log, CC_NCCL_LOG_INFO,
             "TUNER/commcamp: rule %ld (line %u) matches %s %zu bytes but cannot apply: %s/%s %s", skipped[k] + 1,
             skip->line, cc_collective_name(call->collective), call->n_bytes, cc_algorithm_name(skip->algorithm),
             cc_protocol_name(skip->protocol), unavailable_reason);
    }
    if (rule != NULL) {
      char channels[24];
      CC_LOG(ctx->log, CC_NCCL_LOG_INFO, "TUNER/commcamp: rule %ld applied: %s %zu bytes -> %s/%s channels=%s",
             applied + 1, cc_collective_name(call->collective), call->n_bytes, cc_algorithm_name(rule->algorithm),
             cc_protocol_name(rule->protocol), value_or(rule->channels, "nccl", channels));
    }
  }
  return CC_NCCL_SUCCESS;
}

static cc_nccl_result_t get_coll_info_with_table(void* context, cc_nccl_func_t coll_type, size_t n_bytes,
                                                 int num_pipe_ops, float** coll_cost_table, int num_algo, int num_proto,
                                                 int reg_buff, int* n_channels) {
  struct cc_context* ctx = context;
  if (ctx == NULL || coll_cost_table == NULL || n_channels == NULL || num_algo <= 0 || num_proto <= 0)
    return CC_NCCL_INVALID_ARGUMENT;
  struct cc_call call = {(int)coll_type, n_bytes, ctx->n_nodes, ctx->n_ranks, num_pipe_ops, reg_buff};
  /* A contiguous float[num_algo][num_proto] behind a float** (see commcamp_tuner_api.h). */
  return apply_rules(ctx, &call, (float*)coll_cost_table, num_algo, num_proto, n_channels,
                     "is disabled by NCCL for this call");
}

static cc_nccl_result_t get_coll_info_v4(void* context, cc_nccl_func_t coll_type, size_t n_bytes, int num_pipe_ops,
                                         float** coll_cost_table, int num_algo, int num_proto, int reg_buff,
                                         int* n_channels) {
  return get_coll_info_with_table(context, coll_type, n_bytes, num_pipe_ops, coll_cost_table, num_algo, num_proto,
                                  reg_buff != 0, n_channels);
}

/* v3 does not say whether buffers are registered: rules that filter on regBuff never match. */
static cc_nccl_result_t get_coll_info_v3(void* context, cc_nccl_func_t coll_type, size_t n_bytes, int num_pipe_ops,
                                         float** coll_cost_table, int num_algo, int num_proto, int* n_channels) {
  return get_coll_info_with_table(context, coll_type, n_bytes, num_pipe_ops, coll_cost_table, num_algo, num_proto,
                                  CC_ANY, n_channels);
}

/*
 * v2 (NCCL 2.21) gives no cost table, and NCCL 2.21 runs whatever algorithm/protocol the plugin
 * returns without checking it. So only combinations every NCCL 2.21 build can run for the
 * collective are selectable here: ring (any collective) and tree (allreduce only), with ll or
 * simple (NCCL 2.21 src/graph/tuning.cc:166-169 limits the algorithms per collective; LL128 is
 * enabled per platform, 304-305 "may cause silent data corruption" elsewhere). Other rules are
 * logged as not applicable. The result goes through the same rule walk as v3+ via a cost table
 * built here.
 */
static cc_nccl_result_t get_coll_info_v2(void* context, cc_nccl_func_t coll_type, size_t n_bytes, int coll_net_support,
                                         int nvls_support, int num_pipe_ops, int* algorithm, int* protocol,
                                         int* n_channels) {
  (void)coll_net_support; /* collnet and nvls are never selected through v2 */
  (void)nvls_support;
  struct cc_context* ctx = context;
  if (ctx == NULL || algorithm == NULL || protocol == NULL || n_channels == NULL) return CC_NCCL_INVALID_ARGUMENT;
  float cost[CC_NCCL_NUM_ALGORITHMS][CC_NCCL_NUM_PROTOCOLS];
  for (int a = 0; a < CC_NCCL_NUM_ALGORITHMS; a++) {
    int algorithm_safe = a == CC_NCCL_ALGO_RING || (a == CC_NCCL_ALGO_TREE && coll_type == CC_NCCL_FUNC_ALLREDUCE);
    for (int p = 0; p < CC_NCCL_NUM_PROTOCOLS; p++)
      cost[a][p] = algorithm_safe && p != CC_NCCL_PROTO_LL128 ? 1.0f : CC_NCCL_ALGO_PROTO_IGNORE;
  }
  struct cc_call call = {(int)coll_type, n_bytes, ctx->n_nodes, ctx->n_ranks, num_pipe_ops, CC_ANY};
  cc_nccl_result_t result = apply_rules(ctx, &call, &cost[0][0], CC_NCCL_NUM_ALGORITHMS, CC_NCCL_NUM_PROTOCOLS,
                                        n_channels, "is not selectable through the v2 tuner interface");
  for (int a = 0; a < CC_NCCL_NUM_ALGORITHMS; a++)
    for (int p = 0; p < CC_NCCL_NUM_PROTOCOLS; p++)
      if (cost[a][p] == 0.0f) {
        *algorithm = a;
        *protocol = p;
      }
  return result;
}

static cc_nccl_result_t init_v2(size_t n_ranks, size_t n_nodes, cc_nccl_logger_t log, void** context) {
  return context_create(n_ranks, n_nodes, log, 0, context);
}

/* The NVL-domain info and the model constants are left alone: commcamp tunes by rules only. */
static cc_nccl_result_t init_v5(void** context, uint64_t comm_id, size_t n_ranks, size_t n_nodes, cc_nccl_logger_t log,
                                struct cc_nccl_nvl_domain_info* nvl_domain_info,
                                struct cc_nccl_tuner_constants* constants) {
  (void)nvl_domain_info;
  (void)constants;
  return context_create(n_ranks, n_nodes, log, comm_id, context);
}

CC_EXPORT const cc_nccl_tuner_v2_t ncclTunerPlugin_v2 = {PLUGIN_NAME, init_v2, get_coll_info_v2, context_destroy};
CC_EXPORT const cc_nccl_tuner_v3_t ncclTunerPlugin_v3 = {PLUGIN_NAME, init_v2, get_coll_info_v3, context_destroy};
CC_EXPORT const cc_nccl_tuner_v4_t ncclTunerPlugin_v4 = {PLUGIN_NAME, init_v2, get_coll_info_v4, context_destroy};
CC_EXPORT const cc_nccl_tuner_v5_t ncclTunerPlugin_v5 = {PLUGIN_NAME, init_v5, get_coll_info_v4, context_destroy};
CC_EXPORT const cc_nccl_tuner_v6_t ncclTunerPlugin_v6 = {PLUGIN_NAME, init_v5, get_coll_info_v4, context_destroy, NULL};
CC_EXPORT const cc_nccl_tuner_v7_t ncclTunerPlugin_v7 = {PLUGIN_NAME, init_v5, get_coll_info_v4, context_destroy, NULL};
