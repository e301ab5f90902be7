#include "tuner_config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commcamp_tuner_control.h"

/* Index = NCCL id ([N-TUN] in commcamp_tuner_api.h). */
static const char* const collective_names[CC_NCCL_NUM_TUNABLE_FUNCS] = {"broadcast", "reduce", "allgather",
                                                                        "reducescatter", "allreduce"};
static const char* const algorithm_names[CC_NCCL_NUM_ALGORITHMS] = COMMCAMP_TUNER_ALGORITHM_NAMES;
static const char* const protocol_names[CC_NCCL_NUM_PROTOCOLS] = COMMCAMP_TUNER_PROTOCOL_NAMES;

enum { FIELDS_REQUIRED = 8, FIELDS_MAX = 10 };
static const char* const field_names[FIELDS_MAX] = {"collective", "min_bytes", "max_bytes", "algorithm",  "protocol",
                                                    "channels",   "nNodes",    "nRanks",    "numPipeOps", "regBuff"};

/* Longest field text quoted back in a message. */
#define QUOTE_MAX 40

void cc_logf(cc_nccl_logger_t logger, cc_nccl_log_level_t level, const char* file, int line, const char* fmt, ...) {
  if (logger == NULL) return;
  char message[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  logger(level, CC_NCCL_SUBSYS_TUNING, file, line, "%s", message);
}

static const char* name_or_unknown(const char* const* names, int count, int id) {
  return (id >= 0 && id < count) ? names[id] : "?";
}
const char* cc_collective_name(int collective) {
  return name_or_unknown(collective_names, CC_NCCL_NUM_TUNABLE_FUNCS, collective);
}
const char* cc_algorithm_name(int algorithm) {
  return name_or_unknown(algorithm_names, CC_NCCL_NUM_ALGORITHMS, algorithm);
}
const char* cc_protocol_name(int protocol) { return name_or_unknown(protocol_names, CC_NCCL_NUM_PROTOCOLS, protocol); }

/* A piece of the config text; not NUL-terminated. */
struct span {
  const char* p;
  size_t n;
};

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

static struct span trim(struct span s) {
  while (s.n > 0 && is_blank(s.p[0])) s.p++, s.n--;
  while (s.n > 0 && is_blank(s.p[s.n - 1])) s.n--;
  return s;
}

static int equals_ignoring_case(struct span s, const char* word) {
  size_t n = strlen(word);
  if (s.n != n) return 0;
  for (size_t i = 0; i < n; i++) {
    char a = s.p[i], b = word[i];
    if (a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
    if (a != b) return 0;
  }
  return 1;
}

static int lookup(struct span s, const char* const* names, int count) {
  for (int i = 0; i < count; i++)
    if (equals_ignoring_case(s, names[i])) return i;
  return -1;
}

/* Parses "-1" (sets *is_any) or an unsigned decimal number <= max. Returns NULL or why not. */
static const char* parse_number(struct span s, unsigned long long max, unsigned long long* value, int* is_any) {
  *is_any = 0;
  *value = 0;
  if (s.n == 2 && s.p[0] == '-' && s.p[1] == '1') {
    *is_any = 1;
    return NULL;
  }
  if (s.n == 0) return "is empty";
  for (size_t i = 0; i < s.n; i++) {
    if (s.p[i] < '0' || s.p[i] > '9') return "is not -1 or a non-negative decimal integer";
    unsigned digit = (unsigned)(s.p[i] - '0');
    if (*value > (max - digit) / 10) return "is too large";
    *value = *value * 10 + digit;
  }
  return NULL;
}

/* Filter fields: -1 or lowest..INT_MAX. Returns NULL or why not. */
static const char* parse_filter(struct span s, int lowest, int* out) {
  unsigned long long value;
  int is_any;
  const char* why = parse_number(s, INT_MAX, &value, &is_any);
  if (why != NULL) return why;
  if (is_any) {
    *out = CC_ANY;
    return NULL;
  }
  if (value < (unsigned long long)lowest) return lowest == 1 ? "must be -1 or at least 1" : "is out of range";
  *out = (int)value;
  return NULL;
}

enum line_kind { LINE_BAD, LINE_RULE, LINE_HEADER };

struct line_error {
  char text[256];
};

static enum line_kind fail(struct line_error* error, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static enum line_kind fail(struct line_error* error, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(error->text, sizeof error->text, fmt, args);
  va_end(args);
  return LINE_BAD;
}

static enum line_kind field_fail(struct line_error* error, int index, struct span field, const char* why) {
  return fail(error, "field %d (%s) '%.*s' %s", index + 1, field_names[index],
              (int)(field.n < QUOTE_MAX ? field.n : QUOTE_MAX), field.p, why);
}

/* Parses one non-empty, comment-free, trimmed line. */
static enum line_kind parse_rule(struct span line, struct cc_rule* rule, struct line_error* error) {
  struct span fields[FIELDS_MAX];
  size_t count = 0;
  const char* start = line.p;
  const char* end = line.p + line.n;
  for (const char* c = line.p;; c++) {
    if (c == end || *c == ',') {
      if (count == FIELDS_MAX)
        return fail(error, "has more than %d comma-separated fields (expected 8, 9 or 10)", FIELDS_MAX);
      fields[count++] = trim((struct span){start, (size_t)(c - start)});
      start = c + 1;
      if (c == end) break;
    }
  }
  if (count > 0 && equals_ignoring_case(fields[0], "collective_type")) return LINE_HEADER;
  if (count < FIELDS_REQUIRED) return fail(error, "has %zu comma-separated fields (expected 8, 9 or 10)", count);
  for (size_t i = 0; i < count; i++)
    if (fields[i].n == 0) return field_fail(error, (int)i, fields[i], "is empty");

  rule->collective = lookup(fields[0], collective_names, CC_NCCL_NUM_TUNABLE_FUNCS);
  if (rule->collective < 0)
    return field_fail(error, 0, fields[0], "is not broadcast|reduce|allgather|reducescatter|allreduce");

  unsigned long long bytes;
  int is_any;
  const char* why = parse_number(fields[1], SIZE_MAX, &bytes, &is_any);
  if (why != NULL) return field_fail(error, 1, fields[1], why);
  rule->min_bytes = is_any ? 0 : (size_t)bytes;
  why = parse_number(fields[2], SIZE_MAX, &bytes, &is_any);
  if (why != NULL) return field_fail(error, 2, fields[2], why);
  rule->max_bytes = is_any ? SIZE_MAX : (size_t)bytes;
  if (rule->min_bytes > rule->max_bytes)
    return fail(error, "min_bytes %zu is larger than max_bytes %zu", rule->min_bytes, rule->max_bytes);

  rule->algorithm = lookup(fields[3], algorithm_names, CC_NCCL_NUM_ALGORITHMS);
  if (rule->algorithm < 0)
    return field_fail(error, 3, fields[3], "is not tree|ring|collnet_direct|collnet_chain|nvls|nvls_tree|pat");
  rule->protocol = lookup(fields[4], protocol_names, CC_NCCL_NUM_PROTOCOLS);
  if (rule->protocol < 0) return field_fail(error, 4, fields[4], "is not ll|ll128|simple");

  why = parse_filter(fields[5], 1, &rule->channels);
  if (why == NULL && rule->channels > CC_NCCL_MAX_CHANNELS) why = "is more than NCCL's 64 channels";
  if (why != NULL) return field_fail(error, 5, fields[5], why);
  if ((why = parse_filter(fields[6], 1, &rule->n_nodes)) != NULL) return field_fail(error, 6, fields[6], why);
  if ((why = parse_filter(fields[7], 1, &rule->n_ranks)) != NULL) return field_fail(error, 7, fields[7], why);

  rule->num_pipe_ops = CC_ANY;
  if (count > 8 && (why = parse_filter(fields[8], 1, &rule->num_pipe_ops)) != NULL)
    return field_fail(error, 8, fields[8], why);
  rule->reg_buff = CC_ANY;
  if (count > 9) {
    why = parse_filter(fields[9], 0, &rule->reg_buff);
    if (why == NULL && rule->reg_buff > 1) why = "must be -1, 0 or 1";
    if (why != NULL) return field_fail(error, 9, fields[9], why);
  }
  return LINE_RULE;
}

int cc_config_parse(const char* text, size_t len, const char* source_name, cc_nccl_logger_t logger,
                    struct cc_rule_set* out) {
  *out = (struct cc_rule_set){0};
  size_t capacity = 0;
  unsigned line_number = 0;
  const char* end = text + len;
  for (const char* line_start = text; line_start < end;) {
    const char* newline = memchr(line_start, '\n', (size_t)(end - line_start));
    const char* line_end = newline ? newline : end;
    struct span line = {line_start, (size_t)(line_end - line_start)};
    line_start = newline ? newline + 1 : end;
    line_number++;

    const char* comment = memchr(line.p, '#', line.n);
    if (comment) line.n = (size_t)(comment - line.p);
    line = trim(line);
    if (line.n == 0) continue;

    struct line_error error = {{0}};
    struct cc_rule rule = {0};
    enum line_kind kind =
        memchr(line.p, '\0', line.n) ? fail(&error, "contains a NUL byte") : parse_rule(line, &rule, &error);
    if (kind == LINE_HEADER) continue;
    if (kind == LINE_BAD) {
      out->skipped_lines++;
      CC_LOG(logger, CC_NCCL_LOG_WARN, "TUNER/commcamp: %s line %u: %s; line skipped", source_name, line_number,
             error.text);
      continue;
    }
    if (out->count == capacity) {
      size_t grown = capacity ? 2 * capacity : 16;
      struct cc_rule* rules = realloc(out->rules, grown * sizeof *rules);
      if (rules == NULL) {
        cc_rule_set_free(out);
        return -1;
      }
      out->rules = rules;
      capacity = grown;
    }
    rule.line = line_number;
    out->rules[out->count++] = rule;
  }
  return 0;
}

/* Reads at most CC_CONFIG_MAX_BYTES + 1 bytes; returns NULL (errno set) on failure. */
static char* read_all(int fd, size_t* len) {
  char* buffer = malloc(CC_CONFIG_MAX_BYTES + 1);
  if (buffer == NULL) return NULL;
  size_t used = 0;
  while (used < CC_CONFIG_MAX_BYTES + 1) {
    ssize_t got = read(fd, buffer + used, CC_CONFIG_MAX_BYTES + 1 - used);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int saved = errno;
      free(buffer);
      errno = saved;
      return NULL;
    }
    if (got == 0) break;
    used += (size_t)got;
  }
  *len = used;
  return buffer;
}

int cc_config_load_file(const char* path, cc_nccl_logger_t logger, struct cc_rule_set* out) {
  *out = (struct cc_rule_set){0};
  char reason[128];
  /* O_NONBLOCK: opening a FIFO must not block NCCL's init; regular-file reads ignore it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      CC_LOG(logger, CC_NCCL_LOG_INFO, "TUNER/commcamp: config file %s not found: no overrides", path);
    } else {
      strerror_r(errno, reason, sizeof reason);
      CC_LOG(logger, CC_NCCL_LOG_WARN, "TUNER/commcamp: cannot open config file %s (%s): no overrides", path, reason);
    }
    return 0;
  }
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    CC_LOG(logger, CC_NCCL_LOG_WARN, "TUNER/commcamp: config file %s is not a regular file: no overrides", path);
    close(fd);
    return 0;
  }
  size_t len = 0;
  char* text = read_all(fd, &len);
  int read_errno = errno;
  close(fd);
  if (text == NULL) {
    if (read_errno == ENOMEM) return -1;
    strerror_r(read_errno, reason, sizeof reason);
    CC_LOG(logger, CC_NCCL_LOG_WARN, "TUNER/commcamp: cannot read config file %s (%s): no overrides", path, reason);
    return 0;
  }
  int result = 0;
  if (len > CC_CONFIG_MAX_BYTES) {
    CC_LOG(logger, CC_NCCL_LOG_WARN, "TUNER/commcamp: config file %s is larger than %d bytes: no overrides", path,
           CC_CONFIG_MAX_BYTES);
  } else {
    result = cc_config_parse(text, len, path, logger, out);
  }
  free(text);
  return result;
}

void cc_rule_set_free(struct cc_rule_set* set) {
  free(set->rules);
  *set = (struct cc_rule_set){0};
}

static int rule_matches(const struct cc_rule* rule, const struct cc_call* call) {
  return rule->collective == call->collective && call->n_bytes >= rule->min_bytes && call->n_bytes <= rule->max_bytes &&
         (rule->n_nodes == CC_ANY || (size_t)rule->n_nodes == call->n_nodes) &&
         (rule->n_ranks == CC_ANY || (size_t)rule->n_ranks == call->n_ranks) &&
         (rule->num_pipe_ops == CC_ANY || rule->num_pipe_ops == call->num_pipe_ops) &&
         (rule->reg_buff == CC_ANY || rule->reg_buff == call->reg_buff);
}

long cc_rule_set_find(const struct cc_rule_set* set, size_t start, const struct cc_call* call) {
  for (size_t i = start; i < set->count; i++)
    if (rule_matches(&set->rules[i], call)) return (long)i;
  return -1;
}
