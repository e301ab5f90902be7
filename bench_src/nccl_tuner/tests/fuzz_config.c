/*
 * libFuzzer target: any byte string given as a config file must parse without crashing, leaking
 * or reading out of bounds, and every rule it keeps must be within the documented ranges.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tuner_config.h"

/* Formats like NCCL's logger would, so the format strings and their arguments are exercised. */
static void formatting_logger(cc_nccl_log_level_t level, unsigned long flags, const char* file, int line,
                              const char* fmt, ...) {
  (void)level, (void)flags, (void)file, (void)line;
  char text[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
}

static int filter_ok(int value, int lowest, int highest) {
  return value == CC_ANY || (value >= lowest && value <= highest);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct cc_rule_set set;
  if (cc_config_parse((const char*)data, size, "fuzz", formatting_logger, &set) != 0) abort();
  for (size_t i = 0; i < set.count; i++) {
    const struct cc_rule* r = &set.rules[i];
    if (r->collective < 0 || r->collective >= CC_NCCL_NUM_TUNABLE_FUNCS || r->min_bytes > r->max_bytes ||
        r->algorithm < 0 || r->algorithm >= CC_NCCL_NUM_ALGORITHMS || r->protocol < 0 ||
        r->protocol >= CC_NCCL_NUM_PROTOCOLS || !filter_ok(r->channels, 1, CC_NCCL_MAX_CHANNELS) ||
        !filter_ok(r->n_nodes, 1, INT32_MAX) || !filter_ok(r->n_ranks, 1, INT32_MAX) ||
        !filter_ok(r->num_pipe_ops, 1, INT32_MAX) || !filter_ok(r->reg_buff, 0, 1) || r->line == 0 ||
        (i > 0 && r->line <= set.rules[i - 1].line))
      abort();
    /* A rule must match a call at its own lower bound with its own filters. */
    struct cc_call call = {r->collective,
                           r->min_bytes,
                           r->n_nodes == CC_ANY ? 1 : (size_t)r->n_nodes,
                           r->n_ranks == CC_ANY ? 1 : (size_t)r->n_ranks,
                           r->num_pipe_ops == CC_ANY ? 1 : r->num_pipe_ops,
                           r->reg_buff == CC_ANY ? 0 : r->reg_buff};
    long found = cc_rule_set_find(&set, 0, &call);
    if (found < 0 || (size_t)found > i) abort();
  }
  cc_rule_set_free(&set);
  return 0;
}
