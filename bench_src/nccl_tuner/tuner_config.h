/* Config rules of the commcamp tuner plugin: parsing the CSV file and matching a collective. */
#ifndef COMMCAMP_TUNER_CONFIG_H
#define COMMCAMP_TUNER_CONFIG_H

#include <stddef.h>

#include "commcamp_tuner_api.h"

/* "-1" in a config field: match anything (filters) or keep NCCL's choice (channels). */
#define CC_ANY (-1)

/* Configs larger than this are refused: a tuning table is a few hundred lines at most. */
#define CC_CONFIG_MAX_BYTES (1024 * 1024)

/* One line of `collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]`. */
struct cc_rule {
  int collective;   /* cc_nccl_func_t */
  size_t min_bytes; /* inclusive; -1 in the file = 0 */
  size_t max_bytes; /* inclusive; -1 in the file = no upper bound */
  int algorithm;
  int protocol;
  int channels;     /* 1..CC_NCCL_MAX_CHANNELS, or CC_ANY = keep NCCL's channel count */
  int n_nodes;      /* CC_ANY or >= 1 */
  int n_ranks;      /* CC_ANY or >= 1 */
  int num_pipe_ops; /* CC_ANY or >= 1 */
  int reg_buff;     /* CC_ANY, 0 or 1 */
  unsigned line;    /* 1-based line in the file, for messages */
};

struct cc_rule_set {
  struct cc_rule* rules;
  size_t count;
  size_t skipped_lines; /* bad lines reported and ignored */
};

/* What NCCL told the plugin about one collective call. */
struct cc_call {
  int collective;
  size_t n_bytes;
  size_t n_nodes;
  size_t n_ranks;
  int num_pipe_ops;
  int reg_buff; /* 0 or 1; CC_ANY when the API version does not say (then regBuff-filtered rules never match) */
};

/* Logs through NCCL's logger (subsystem TUNING) after formatting here, so that every format
 * string is checked by the compiler. A NULL logger drops the message. */
void cc_logf(cc_nccl_logger_t logger, cc_nccl_log_level_t level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define CC_LOG(logger, level, ...) cc_logf((logger), (level), __FILE__, __LINE__, __VA_ARGS__)

/* Parses `len` bytes of config text (need not be NUL-terminated). Each bad line is reported at
 * WARN with its line number and reason, and skipped; good lines are kept in file order.
 * Returns 0, or -1 if memory ran out (then `out` is empty). */
int cc_config_parse(const char* text, size_t len, const char* source_name, cc_nccl_logger_t logger,
                    struct cc_rule_set* out);

/* Reads and parses a config file. A missing, unreadable or oversized file is logged and gives an
 * empty rule set (NCCL's own choices stay in force). Returns -1 only if memory ran out. */
int cc_config_load_file(const char* path, cc_nccl_logger_t logger, struct cc_rule_set* out);

void cc_rule_set_free(struct cc_rule_set* set);

/* Index of the first rule at or after `start` that matches `call`, or -1. */
long cc_rule_set_find(const struct cc_rule_set* set, size_t start, const struct cc_call* call);

/* Config-file spellings of the NCCL ids; "?" for ids no config line can name. */
const char* cc_collective_name(int collective);
const char* cc_algorithm_name(int algorithm);
const char* cc_protocol_name(int protocol);

#endif /* COMMCAMP_TUNER_CONFIG_H */
