/*
 * Loads libnccl-tuner-commcamp.so the way NCCL does (dlopen, dlsym of ncclTunerPlugin_vN) and checks
 * exactly what each call changes in synthetic cost tables and channel counts.
 * Usage: tuner_harness PATH/TO/libnccl-tuner-commcamp.so     Exit status 0 = every check passed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commcamp_tuner_api.h"
#include "commcamp_tuner_control.h"

/* ---- checks ---- */

static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;
static int checks_run;
static int checks_failed;

static void check(int ok, int line, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, int line, const char* fmt, ...) {
  pthread_mutex_lock(&check_lock);
  checks_run++;
  if (!ok) {
    checks_failed++;
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "FAIL (tuner_harness.c:%d): ", line);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
  }
  pthread_mutex_unlock(&check_lock);
}
#define CHECK(cond, ...) check((cond), __LINE__, __VA_ARGS__)

/* ---- fake NCCL logger: keeps every message ---- */

#define MAX_MESSAGES 4096
struct message {
  int level;
  unsigned long flags;
  char text[600];
};
static struct message messages[MAX_MESSAGES];
static int message_count;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void fake_logger(cc_nccl_log_level_t level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  (void)file;
  (void)line;
  pthread_mutex_lock(&log_lock);
  if (message_count < MAX_MESSAGES) {
    struct message* m = &messages[message_count++];
    m->level = level;
    m->flags = flags;
    va_list args;
    va_start(args, fmt);
    vsnprintf(m->text, sizeof m->text, fmt, args);
    va_end(args);
  }
  pthread_mutex_unlock(&log_lock);
}

static void clear_messages(void) {
  pthread_mutex_lock(&log_lock);
  message_count = 0;
  pthread_mutex_unlock(&log_lock);
}

/* Messages at `level` (any level if < 0), logged under NCCL's TUNING subsystem, containing `needle`. */
static int count_messages(int level, const char* needle) {
  int n = 0;
  pthread_mutex_lock(&log_lock);
  for (int i = 0; i < message_count; i++)
    if ((level < 0 || messages[i].level == level) && (messages[i].flags & CC_NCCL_SUBSYS_TUNING) &&
        strstr(messages[i].text, needle) != NULL)
      n++;
  pthread_mutex_unlock(&log_lock);
  return n;
}

static void dump_messages(void) {
  for (int i = 0; i < message_count; i++)
    fprintf(stderr, "  log[%d] level=%d: %s\n", i, messages[i].level, messages[i].text);
}

/* ---- the plugin, seen through one API version ---- */

struct api {
  int version;
  const void* symbol;
};

static cc_nccl_result_t api_init(const struct api* api, size_t n_ranks, size_t n_nodes, cc_nccl_logger_t log,
                                 void** ctx) {
  switch (api->version) {
    case 2:
      return ((const cc_nccl_tuner_v2_t*)api->symbol)->init(n_ranks, n_nodes, log, ctx);
    case 3:
      return ((const cc_nccl_tuner_v3_t*)api->symbol)->init(n_ranks, n_nodes, log, ctx);
    case 4:
      return ((const cc_nccl_tuner_v4_t*)api->symbol)->init(n_ranks, n_nodes, log, ctx);
    case 5:
      return ((const cc_nccl_tuner_v5_t*)api->symbol)->init(ctx, 0x1234, n_ranks, n_nodes, log, NULL, NULL);
    default: /* v6 and v7 share the function table */
      return ((const cc_nccl_tuner_v6_t*)api->symbol)->init(ctx, 0x1234, n_ranks, n_nodes, log, NULL, NULL);
  }
}

static cc_nccl_result_t api_destroy(const struct api* api, void* ctx) {
  switch (api->version) {
    case 2:
      return ((const cc_nccl_tuner_v2_t*)api->symbol)->destroy(ctx);
    case 3:
      return ((const cc_nccl_tuner_v3_t*)api->symbol)->destroy(ctx);
    case 4:
      return ((const cc_nccl_tuner_v4_t*)api->symbol)->destroy(ctx);
    case 5:
      return ((const cc_nccl_tuner_v5_t*)api->symbol)->finalize(ctx);
    default:
      return ((const cc_nccl_tuner_v6_t*)api->symbol)->finalize(ctx);
  }
}

typedef float cost_table[CC_NCCL_NUM_ALGORITHMS][CC_NCCL_NUM_PROTOCOLS];

/* Canaries around the table catch writes outside it even without ASan. */
struct guarded_table {
  float before[4];
  cost_table cost;
  float after[4];
};

/* Distinct positive costs; collnet, nvls and tree/ll128 disabled as NCCL does (-1.0). */
static void fill_table(struct guarded_table* t) {
  for (int i = 0; i < 4; i++) t->before[i] = t->after[i] = 12345.0f;
  for (int a = 0; a < CC_NCCL_NUM_ALGORITHMS; a++)
    for (int p = 0; p < CC_NCCL_NUM_PROTOCOLS; p++) {
      int disabled = a == CC_NCCL_ALGO_COLLNET_DIRECT || a == CC_NCCL_ALGO_COLLNET_CHAIN || a == CC_NCCL_ALGO_NVLS ||
                     a == CC_NCCL_ALGO_NVLS_TREE || (a == CC_NCCL_ALGO_TREE && p == CC_NCCL_PROTO_LL128);
      t->cost[a][p] = disabled ? CC_NCCL_ALGO_PROTO_IGNORE : 10.0f + (float)a + (float)p / 10.0f;
    }
}

struct call {
  int coll;
  size_t bytes;
  int pipe_ops;
  int reg_buff;
  int num_algo; /* rows NCCL says the table has */
};

/* A plain call: one op, unregistered buffers, NCCL 2.23+ table size. */
static struct call plain(int coll, size_t bytes) { return (struct call){coll, bytes, 1, 0, CC_NCCL_NUM_ALGORITHMS}; }

static const char* const algo_names[] = COMMCAMP_TUNER_ALGORITHM_NAMES;
static const char* const proto_names[] = COMMCAMP_TUNER_PROTOCOL_NAMES;

/*
 * Calls getCollInfo of a table-based version (v3..v6) on `table` and checks that exactly the entry
 * [algo][proto] became 0.0 (nothing changed when algo < 0), every other entry and both canaries are
 * bitwise unchanged, and *nChannels went from channels_in to expect_channels.
 */
static void expect_table_call(const struct api* api, void* ctx, const char* what, struct call c,
                              struct guarded_table* table, int algo, int proto, int channels_in, int expect_channels) {
  struct guarded_table before = *table;
  int n_channels = channels_in;
  float** cost = (float**)table->cost; /* what NCCL passes: the contiguous table cast to float** */
  cc_nccl_result_t rc;
  switch (api->version) {
    case 3:
      rc = ((const cc_nccl_tuner_v3_t*)api->symbol)
               ->getCollInfo(ctx, c.coll, c.bytes, c.pipe_ops, cost, c.num_algo, CC_NCCL_NUM_PROTOCOLS, &n_channels);
      break;
    case 4:
      rc = ((const cc_nccl_tuner_v4_t*)api->symbol)
               ->getCollInfo(ctx, c.coll, c.bytes, c.pipe_ops, cost, c.num_algo, CC_NCCL_NUM_PROTOCOLS, c.reg_buff,
                             &n_channels);
      break;
    case 5:
      rc = ((const cc_nccl_tuner_v5_t*)api->symbol)
               ->getCollInfo(ctx, c.coll, c.bytes, c.pipe_ops, cost, c.num_algo, CC_NCCL_NUM_PROTOCOLS, c.reg_buff,
                             &n_channels);
      break;
    default:
      rc = ((const cc_nccl_tuner_v6_t*)api->symbol)
               ->getCollInfo(ctx, c.coll, c.bytes, c.pipe_ops, cost, c.num_algo, CC_NCCL_NUM_PROTOCOLS, c.reg_buff,
                             &n_channels);
  }
  CHECK(rc == CC_NCCL_SUCCESS, "v%d %s: getCollInfo returned %d", api->version, what, rc);
  CHECK(n_channels == expect_channels, "v%d %s: nChannels %d, expected %d", api->version, what, n_channels,
        expect_channels);
  CHECK(memcmp(before.before, table->before, sizeof before.before) == 0 &&
            memcmp(before.after, table->after, sizeof before.after) == 0,
        "v%d %s: wrote outside the cost table", api->version, what);
  for (int a = 0; a < CC_NCCL_NUM_ALGORITHMS; a++)
    for (int p = 0; p < CC_NCCL_NUM_PROTOCOLS; p++) {
      if (a == algo && p == proto) {
        CHECK(table->cost[a][p] == 0.0f, "v%d %s: %s/%s is %g, expected 0 (selected)", api->version, what,
              algo_names[a], proto_names[p], table->cost[a][p]);
      } else {
        CHECK(memcmp(&before.cost[a][p], &table->cost[a][p], sizeof(float)) == 0, "v%d %s: %s/%s changed from %g to %g",
              api->version, what, algo_names[a], proto_names[p], before.cost[a][p], table->cost[a][p]);
      }
    }
}

static void expect_call(const struct api* api, void* ctx, const char* what, struct call c, int algo, int proto,
                        int channels_in, int expect_channels) {
  struct guarded_table table;
  fill_table(&table);
  expect_table_call(api, ctx, what, c, &table, algo, proto, channels_in, expect_channels);
}

/* v2 returns algorithm/protocol; both stay -1 (NCCL_ALGO_UNDEF) when nothing applies. */
static void expect_v2_call(const struct api* api, void* ctx, const char* what, struct call c, int algo, int proto,
                           int expect_channels) {
  int algorithm = CC_NCCL_ALGO_UNDEF, protocol = CC_NCCL_PROTO_UNDEF, n_channels = 0;
  cc_nccl_result_t rc = ((const cc_nccl_tuner_v2_t*)api->symbol)
                            ->getCollInfo(ctx, c.coll, c.bytes, 1, 1, c.pipe_ops, &algorithm, &protocol, &n_channels);
  CHECK(rc == CC_NCCL_SUCCESS, "v2 %s: getCollInfo returned %d", what, rc);
  CHECK(algorithm == algo && protocol == proto && n_channels == expect_channels,
        "v2 %s: got algorithm %d protocol %d channels %d, expected %d %d %d", what, algorithm, protocol, n_channels,
        algo, proto, expect_channels);
}

/* ---- config files ---- */

static char temp_dir[256];

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  if (f == NULL || fputs(text, f) == EOF || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
    exit(2);
  }
}

static void use_config(const char* name, const char* text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", temp_dir, name);
  if (text) write_file(path, text);
  setenv("NCCL_TUNER_CONFIG_FILE", path, 1);
}

enum { BROADCAST = 0, REDUCE = 1, ALLGATHER = 2, REDUCESCATTER = 3, ALLREDUCE = 4 };
enum { TREE = 0, RING = 1, PAT = 6 };
enum { LL = 0, LL128 = 1, SIMPLE = 2 };
enum { NONE = -1 };
#define SENTINEL 77 /* a channel count NCCL never passes in; must survive calls that set no channels */

/* Line numbers matter: the bad-line checks below name them. */
static const char config_a[] =
    "# commcamp tuner harness config: 11 rules, 14 bad lines\n"                                          /* 1 */
    "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n" /* 2 */
    "   \n"                                                                                              /* 3 */
    "allreduce, 0, 1023, tree, ll, -1, -1, -1          # rule 1\n"                                       /* 4 */
    "\tAllReduce,1024,65535,ring,LL128,8,-1,-1\t\r\n"                                                    /* 5 rule 2 */
    "allreduce,65536,-1,nvls,simple,16,-1,-1           # rule 3: disabled in the table\n"                /* 6 */
    "allreduce,65536,-1,ring,simple,-1,1,4             # rule 4: 1 node, 4 ranks\n"                      /* 7 */
    "allreduce,0,10,tree,ll\n"                                                                           /* 8 bad */
    "allreduce,65536,-1,collnet_direct,simple,2,-1,-1  # rule 5: disabled\n"                             /* 9 */
    "allreduce,-1,-1,ring,ll,2,-1,-1                   # rule 6: catch-all\n"                            /* 10 */
    "allreduse,0,10,tree,ll,-1,-1,-1\n"                                                                  /* 11 bad */
    "allgather,0,-1,ring,simple,4,2,-1                 # rule 7: 2 nodes only\n"                         /* 12 */
    "allreduce,abc,10,tree,ll,-1,-1,-1\n"                                                                /* 13 bad */
    "broadcast,0,4096,ring,ll,-1,-1,-1,1,-1            # rule 8: numPipeOps 1\n"                         /* 14 */
    "broadcast,0,4096,tree,simple,3,-1,-1,-1,1         # rule 9: registered only\n"                      /* 15 */
    "allreduce,10,5,tree,ll,-1,-1,-1\n"                                                                  /* 16 bad */
    "reducescatter,100,200,pat,simple,5,-1,-1          # rule 10\n"                                      /* 17 */
    "allreduce,0,10,tree,ll,0,-1,-1\n"                                                                   /* 18 bad */
    "allreduce,0,10,tree,ll,65,-1,-1\n"                                                                  /* 19 bad */
    "allreduce,0,10,tree,ll,-1,-1,-1,0,-1\n"                                                             /* 20 bad */
    "allreduce,0,10,tree,ll,-1,-1,-1,-1,2\n"                                                             /* 21 bad */
    "allreduce,0,10,tree,ll,-1,-1,-1,-1,-1,7\n"                                                          /* 22 bad */
    "allreduce,0,10,warp,ll,-1,-1,-1\n"                                                                  /* 23 bad */
    "allreduce,0,10,tree,ll256,-1,-1,-1\n"                                                               /* 24 bad */
    "allreduce,0,99999999999999999999999,tree,ll,-1,-1,-1\n"                                             /* 25 bad */
    "allreduce,,10,tree,ll,-1,-1,-1\n"                                                                   /* 26 bad */
    "allreduce,0,10,tree,ll,-1,0,-1\n"                                                                   /* 27 bad */
    "reduce,0,-1,tree,simple,-1,-1,-1                  # rule 11\n";                                     /* 28 */

static const struct {
  int line;
  const char* reason;
} bad_lines[] = {
    {8, "has 5 comma-separated fields"},
    {11, "is not broadcast|reduce|allgather"},
    {13, "is not -1 or a non-negative decimal"},
    {16, "is larger than max_bytes"},
    {18, "(channels) '0' must be -1 or at least 1"},
    {19, "is more than NCCL's 64 channels"},
    {20, "(numPipeOps) '0' must be -1 or at least 1"},
    {21, "(regBuff) '2' must be -1, 0 or 1"},
    {22, "more than 10 comma-separated fields"},
    {23, "(algorithm) 'warp' is not tree|ring"},
    {24, "(protocol) 'll256' is not ll|ll128|simple"},
    {25, "is too large"},
    {26, "(min_bytes) '' is empty"},
    {27, "(nNodes) '0' must be -1 or at least 1"},
};

/* ---- scenarios ---- */

static void test_bad_lines_reported(const struct api* api) {
  clear_messages();
  use_config("a.csv", config_a);
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS && ctx != NULL, "v%d: init with config A",
        api->version);
  size_t n_bad = sizeof bad_lines / sizeof bad_lines[0];
  CHECK(count_messages(CC_NCCL_LOG_WARN, "line ") == (int)n_bad, "v%d: expected %zu WARN lines, got %d", api->version,
        n_bad, count_messages(CC_NCCL_LOG_WARN, "line "));
  for (size_t i = 0; i < n_bad; i++) {
    char needle[64];
    snprintf(needle, sizeof needle, "a.csv line %d: ", bad_lines[i].line);
    int found = 0;
    for (int m = 0; m < message_count; m++)
      if (messages[m].level == CC_NCCL_LOG_WARN && strstr(messages[m].text, needle) &&
          strstr(messages[m].text, bad_lines[i].reason) && strstr(messages[m].text, "line skipped"))
        found++;
    CHECK(found == 1, "v%d: line %d should be reported once with \"%s\"", api->version, bad_lines[i].line,
          bad_lines[i].reason);
  }
  CHECK(count_messages(CC_NCCL_LOG_INFO, "11 rules from ") == 1 &&
            count_messages(CC_NCCL_LOG_INFO, "(14 bad lines skipped)") == 1,
        "v%d: init summary missing", api->version);
  CHECK(
      count_messages(CC_NCCL_LOG_INFO, "rule 2 (line 5): allreduce bytes [1024, 65535] -> ring/ll128 channels=8") == 1,
      "v%d: loaded rule 2 not logged", api->version);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "rule 6 (line 10): allreduce bytes [0, max] -> ring/ll channels=2") == 1,
        "v%d: loaded rule 6 not logged", api->version);
  CHECK(count_messages(-1, "a.csv line 2:") == 0, "v%d: the header line must be skipped silently", api->version);
  CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v%d: destroy", api->version);
}

static void test_one_node_four_ranks(const struct api* api) {
  use_config("a.csv", config_a);
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS, "v%d: init", api->version);
  clear_messages();
  int v4 = api->version >= 4;
  expect_call(api, ctx, "allreduce 0 B -> rule 1", plain(ALLREDUCE, 0), TREE, LL, 0, 0);
  expect_call(api, ctx, "allreduce 1023 B -> rule 1, channels kept", plain(ALLREDUCE, 1023), TREE, LL, SENTINEL,
              SENTINEL);
  expect_call(api, ctx, "allreduce 1024 B -> rule 2", plain(ALLREDUCE, 1024), RING, LL128, 0, 8);
  expect_call(api, ctx, "allreduce 65535 B -> rule 2", plain(ALLREDUCE, 65535), RING, LL128, SENTINEL, 8);
  expect_call(api, ctx, "allreduce 64 KiB -> rule 3 disabled -> rule 4", plain(ALLREDUCE, 65536), RING, SIMPLE,
              SENTINEL, SENTINEL);
  expect_call(api, ctx, "allreduce 1 GiB -> rule 4", plain(ALLREDUCE, (size_t)1 << 30), RING, SIMPLE, 0, 0);
  expect_call(api, ctx, "allreduce SIZE_MAX -> rule 4", plain(ALLREDUCE, SIZE_MAX), RING, SIMPLE, 0, 0);
  expect_call(api, ctx, "allgather: rule 7 needs 2 nodes", plain(ALLGATHER, 1 << 20), NONE, NONE, 0, 0);
  expect_call(api, ctx, "reduce -> rule 11", plain(REDUCE, 100), TREE, SIMPLE, SENTINEL, SENTINEL);
  expect_call(api, ctx, "broadcast 1 op -> rule 8", plain(BROADCAST, 100), RING, LL, 0, 0);
  expect_call(api, ctx, "broadcast 2 ops registered -> rule 9 (v4+)", (struct call){BROADCAST, 100, 2, 1, 7},
              v4 ? TREE : NONE, v4 ? SIMPLE : NONE, 0, v4 ? 3 : 0);
  expect_call(api, ctx, "broadcast 2 ops unregistered", (struct call){BROADCAST, 100, 2, 0, 7}, NONE, NONE, 0, 0);
  expect_call(api, ctx, "broadcast 4097 B", plain(BROADCAST, 4097), NONE, NONE, SENTINEL, SENTINEL);
  expect_call(api, ctx, "reducescatter 150 B -> rule 10", plain(REDUCESCATTER, 150), PAT, SIMPLE, 0, 5);
  expect_call(api, ctx, "reducescatter 150 B, table without PAT", (struct call){REDUCESCATTER, 150, 1, 0, 6}, NONE,
              NONE, 0, 0);
  expect_call(api, ctx, "reducescatter 99 B", plain(REDUCESCATTER, 99), NONE, NONE, 0, 0);
  expect_call(api, ctx, "reducescatter 201 B", plain(REDUCESCATTER, 201), NONE, NONE, 0, 0);
  expect_call(api, ctx, "sendrecv (5)", plain(5, 1024), NONE, NONE, 0, 0);
  expect_call(api, ctx, "alltoall (8)", plain(8, 1024), NONE, NONE, 0, 0);

  /* ring/ll128 disabled by NCCL: rule 2 must not re-enable it; the catch-all rule 6 applies. */
  struct guarded_table table;
  fill_table(&table);
  table.cost[RING][LL128] = CC_NCCL_ALGO_PROTO_IGNORE;
  expect_table_call(api, ctx, "allreduce 1024 B, ring/ll128 disabled -> rule 6", plain(ALLREDUCE, 1024), &table, RING,
                    LL, 0, 2);
  CHECK(table.cost[RING][LL128] == CC_NCCL_ALGO_PROTO_IGNORE, "v%d: disabled entry was touched", api->version);

  CHECK(count_messages(CC_NCCL_LOG_INFO,
                       "rule 3 (line 6) matches allreduce 65536 bytes but cannot apply: nvls/simple is disabled by "
                       "NCCL") == 1,
        "v%d: disabled rule 3 not logged", api->version);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "rule 2 applied: allreduce 1024 bytes -> ring/ll128 channels=8") == 1,
        "v%d: rule 2 application not logged", api->version);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "rule 1 applied: allreduce 0 bytes -> tree/ll channels=nccl") == 1,
        "v%d: rule 1 application not logged", api->version);
  /* A call repeating the previous one (same rule, size, outcome) does not log again; a new size does. */
  int before = count_messages(CC_NCCL_LOG_INFO, "rule 4 applied");
  expect_call(api, ctx, "allreduce 2 MiB -> rule 4", plain(ALLREDUCE, 2 << 20), RING, SIMPLE, 0, 0);
  expect_call(api, ctx, "allreduce 2 MiB again", plain(ALLREDUCE, 2 << 20), RING, SIMPLE, 0, 0);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "rule 4 applied") == before + 1, "v%d: repeated call logged again",
        api->version);
  expect_call(api, ctx, "allreduce 4 MiB -> rule 4", plain(ALLREDUCE, 4 << 20), RING, SIMPLE, 0, 0);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "rule 4 applied: allreduce 4194304 bytes") == 1, "v%d: new size not logged",
        api->version);
  CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v%d: destroy", api->version);
}

static void test_two_nodes_eight_ranks(const struct api* api) {
  use_config("a.csv", config_a);
  void* ctx = NULL;
  CHECK(api_init(api, 8, 2, fake_logger, &ctx) == CC_NCCL_SUCCESS, "v%d: init", api->version);
  expect_call(api, ctx, "2 nodes: allreduce 64 KiB -> rules 3,5 disabled, 4 wrong size -> rule 6",
              plain(ALLREDUCE, 65536), RING, LL, 0, 2);
  expect_call(api, ctx, "2 nodes: allgather -> rule 7", plain(ALLGATHER, 1 << 20), RING, SIMPLE, 0, 4);
  expect_call(api, ctx, "2 nodes: allreduce 100 B -> rule 1 (wildcards)", plain(ALLREDUCE, 100), TREE, LL, 0, 0);
  CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v%d: destroy", api->version);
}

static void test_v2(const struct api* api) {
  use_config("a.csv", config_a);
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS, "v2: init");
  clear_messages();
  expect_v2_call(api, ctx, "allreduce 0 B -> rule 1", plain(ALLREDUCE, 0), TREE, LL, 0);
  expect_v2_call(api, ctx, "allreduce 1024 B: ll128 not selectable -> rule 6", plain(ALLREDUCE, 1024), RING, LL, 2);
  expect_v2_call(api, ctx, "allreduce 64 KiB: nvls not selectable -> rule 4", plain(ALLREDUCE, 65536), RING, SIMPLE, 0);
  expect_v2_call(api, ctx, "reducescatter: pat not selectable", plain(REDUCESCATTER, 150), NONE, NONE, 0);
  expect_v2_call(api, ctx, "broadcast 1 op -> rule 8", plain(BROADCAST, 100), RING, LL, 0);
  expect_v2_call(api, ctx, "broadcast 2 ops: regBuff unknown", (struct call){BROADCAST, 100, 2, 1, 7}, NONE, NONE, 0);
  expect_v2_call(api, ctx, "reduce: tree only for allreduce", plain(REDUCE, 100), NONE, NONE, 0);
  expect_v2_call(api, ctx, "allgather 1 node", plain(ALLGATHER, 1 << 20), NONE, NONE, 0);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "ring/ll128 is not selectable through the v2 tuner interface") == 1,
        "v2: unselectable rule not logged");
  CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v2: destroy");
}

/* Every collective at sizes 0 B .. 4 GiB must come back untouched. */
static void expect_no_overrides(const struct api* api, void* ctx, const char* what) {
  for (int coll = 0; coll < 5; coll++)
    for (size_t bytes = 0; bytes <= ((size_t)1 << 32); bytes = bytes ? bytes * 16 : 1) {
      char label[128];
      snprintf(label, sizeof label, "%s: coll %d %zu B", what, coll, bytes);
      expect_call(api, ctx, label, plain(coll, bytes), NONE, NONE, 0, 0);
    }
}

static void test_no_config(const struct api* api) {
  struct {
    const char* what;
    const char* file; /* NULL: unset the variable */
    const char* text; /* NULL: do not create the file */
    int level;
    const char* message;
  } cases[] = {
      {"unset variable", NULL, NULL, CC_NCCL_LOG_INFO, "NCCL_TUNER_CONFIG_FILE is not set: no overrides"},
      {"missing file", "does-not-exist.csv", NULL, CC_NCCL_LOG_INFO, "does-not-exist.csv not found: no overrides"},
      {"directory", ".", NULL, CC_NCCL_LOG_WARN, "is not a regular file: no overrides"},
      {"comments only", "empty.csv", "# nothing\n\n   # still nothing\n", CC_NCCL_LOG_INFO, "0 rules from"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].file == NULL)
      unsetenv("NCCL_TUNER_CONFIG_FILE");
    else
      use_config(cases[i].file, cases[i].text);
    clear_messages();
    void* ctx = NULL;
    CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS && ctx != NULL, "v%d %s: init", api->version,
          cases[i].what);
    CHECK(count_messages(cases[i].level, cases[i].message) == 1, "v%d %s: expected log \"%s\"", api->version,
          cases[i].what, cases[i].message);
    expect_no_overrides(api, ctx, cases[i].what);
    CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v%d: destroy", api->version);
  }
}

static void test_oversized_config(const struct api* api) {
  size_t size = 1024 * 1024 + 100;
  char* text = malloc(size + 1);
  if (text == NULL) exit(2);
  memset(text, '#', size);
  text[size] = '\0';
  const char* matching = "allreduce,0,-1,ring,simple,1,-1,-1\n"; /* would match, must not load */
  memcpy(text, matching, strlen(matching));
  use_config("big.csv", text);
  free(text);
  clear_messages();
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS, "oversized: init");
  CHECK(count_messages(CC_NCCL_LOG_WARN, "is larger than 1048576 bytes: no overrides") == 1, "oversized: no WARN");
  expect_call(api, ctx, "oversized config", plain(ALLREDUCE, 0), NONE, NONE, 0, 0);
  api_destroy(api, ctx);
}

/* A FIFO as config must neither block init nor be read. */
static void test_fifo_config(const struct api* api) {
  char path[512];
  snprintf(path, sizeof path, "%s/fifo.csv", temp_dir);
  if (mkfifo(path, 0600) != 0) {
    perror("mkfifo");
    exit(2);
  }
  use_config("fifo.csv", NULL);
  clear_messages();
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS, "fifo: init");
  CHECK(count_messages(CC_NCCL_LOG_WARN, "fifo.csv is not a regular file: no overrides") == 1, "fifo: no WARN");
  expect_call(api, ctx, "fifo config", plain(ALLREDUCE, 0), NONE, NONE, 0, 0);
  api_destroy(api, ctx);
}

/* Contexts are independent: a context keeps the config it was created with, and works without logger. */
static void test_contexts_independent(const struct api* api) {
  use_config("a.csv", config_a);
  void* ctx_a = NULL;
  void* ctx_b = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx_a) == CC_NCCL_SUCCESS, "ctx A init");
  use_config("b.csv", "allreduce,0,-1,ring,simple,1,-1,-1\n");
  CHECK(api_init(api, 4, 1, NULL, &ctx_b) == CC_NCCL_SUCCESS, "ctx B init without logger");
  expect_call(api, ctx_b, "ctx B", plain(ALLREDUCE, 0), RING, SIMPLE, 0, 1);
  expect_call(api, ctx_a, "ctx A keeps config A", plain(ALLREDUCE, 0), TREE, LL, 0, 0);
  api_destroy(api, ctx_b);
  expect_call(api, ctx_a, "ctx A after B destroyed", plain(ALLREDUCE, 1024), RING, LL128, 0, 8);
  api_destroy(api, ctx_a);
}

static void test_bad_arguments(const struct api* api) {
  const cc_nccl_tuner_v5_t* v5 = api->symbol;
  struct guarded_table table;
  fill_table(&table);
  int n_channels = 0;
  CHECK(v5->getCollInfo(NULL, CC_NCCL_FUNC_ALLREDUCE, 0, 1, (float**)table.cost, 7, 3, 0, &n_channels) ==
            CC_NCCL_INVALID_ARGUMENT,
        "NULL context must be refused");
  CHECK(v5->init(NULL, 0, 4, 1, fake_logger, NULL, NULL) == CC_NCCL_INVALID_ARGUMENT, "NULL context pointer");
  CHECK(v5->finalize(NULL) == CC_NCCL_SUCCESS, "finalize(NULL)");
}

struct thread_job {
  const struct api* api;
  size_t n_ranks;
  size_t n_nodes;
};

static void* thread_main(void* arg) {
  const struct thread_job* job = arg;
  for (int i = 0; i < 50; i++) {
    void* ctx = NULL;
    CHECK(api_init(job->api, job->n_ranks, job->n_nodes, fake_logger, &ctx) == CC_NCCL_SUCCESS, "thread init");
    if (job->n_nodes == 1)
      expect_call(job->api, ctx, "thread 1 node", plain(ALLREDUCE, 65536), RING, SIMPLE, 0, 0);
    else
      expect_call(job->api, ctx, "thread 2 nodes", plain(ALLREDUCE, 65536), RING, LL, 0, 2);
    api_destroy(job->api, ctx);
  }
  return NULL;
}

static void test_threads(const struct api* api) {
  use_config("a.csv", config_a);
  pthread_t threads[4];
  struct thread_job jobs[4];
  for (int t = 0; t < 4; t++) {
    jobs[t] = (struct thread_job){api, t % 2 ? 8 : 4, t % 2 ? 2 : 1};
    if (pthread_create(&threads[t], NULL, thread_main, &jobs[t]) != 0) exit(2);
  }
  for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
}

/* ---- the control path (commcamp_tuner_control.h), found the way commbench finds it ---- */

static void expect_stats(const struct commcamp_tuner_control* control, const char* what, unsigned long long applied,
                         unsigned long long unavailable) {
  unsigned long long a = 99, u = 99;
  CHECK(control->stats(&a, &u) == 0 && a == applied && u == unavailable,
        "%s: stats applied=%llu unavailable=%llu, expected %llu %llu", what, a, u, applied, unavailable);
}

/* Forcing beats the config rules, applies (algorithm, protocol, channels) where NCCL left the entry
 * enabled, counts the calls where it did not (table and channels then untouched), and ends. */
static void test_force(const struct api* api, const struct commcamp_tuner_control* control) {
  use_config("a.csv", "allreduce,0,-1,tree,simple,2,-1,-1\n");
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS, "v%d force: init", api->version);
  CHECK(control->force(CC_NCCL_ALGO_RING, CC_NCCL_PROTO_SIMPLE, 8) == 0, "force ring/simple/8 refused");
  expect_call(api, ctx, "forced ring/simple/8", plain(CC_NCCL_FUNC_ALLREDUCE, 1 << 20), CC_NCCL_ALGO_RING,
              CC_NCCL_PROTO_SIMPLE, 0, 8);
  expect_call(api, ctx, "forced, other collective", plain(CC_NCCL_FUNC_ALLGATHER, 64), CC_NCCL_ALGO_RING,
              CC_NCCL_PROTO_SIMPLE, 0, 8);
  expect_stats(control, "after 2 applied calls", 2, 0);
  CHECK(control->force(CC_NCCL_ALGO_NVLS, CC_NCCL_PROTO_SIMPLE, -1) == 0, "force nvls/simple refused");
  expect_call(api, ctx, "forced nvls, disabled by NCCL", plain(CC_NCCL_FUNC_ALLREDUCE, 1 << 20), -1, -1, 0, 0);
  expect_stats(control, "forced nvls: counters reset, 1 unavailable", 0, 1);
  CHECK(count_messages(CC_NCCL_LOG_INFO, "is disabled by NCCL") >= 1, "v%d: unavailable forced choice not logged",
        api->version);
  CHECK(control->force(CC_NCCL_ALGO_TREE, CC_NCCL_PROTO_LL, -1) == 0, "force tree/ll refused");
  expect_call(api, ctx, "forced tree/ll, NCCL's channels", plain(CC_NCCL_FUNC_ALLREDUCE, 64), CC_NCCL_ALGO_TREE,
              CC_NCCL_PROTO_LL, 0, 0);
  CHECK(control->force(-1, 0, 0) == 0, "ending the forcing refused");
  expect_call(api, ctx, "forcing ended: the rule again", plain(CC_NCCL_FUNC_ALLREDUCE, 64), CC_NCCL_ALGO_TREE,
              CC_NCCL_PROTO_SIMPLE, 0, 2);
  CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v%d force: destroy", api->version);
}

/* v2 has no table: a forced choice outside ring/tree with ll/simple is unavailable, never returned. */
static void test_force_v2(const struct api* api, const struct commcamp_tuner_control* control) {
  use_config("empty.csv", "");
  void* ctx = NULL;
  CHECK(api_init(api, 4, 1, fake_logger, &ctx) == CC_NCCL_SUCCESS, "v2 force: init");
  CHECK(control->force(CC_NCCL_ALGO_RING, CC_NCCL_PROTO_LL, 4) == 0, "force ring/ll/4 refused");
  expect_v2_call(api, ctx, "forced ring/ll/4", plain(CC_NCCL_FUNC_ALLREDUCE, 64), CC_NCCL_ALGO_RING, CC_NCCL_PROTO_LL,
                 4);
  CHECK(control->force(CC_NCCL_ALGO_RING, CC_NCCL_PROTO_LL128, -1) == 0, "force ring/ll128 refused");
  expect_v2_call(api, ctx, "forced ring/ll128 (not selectable by v2)", plain(CC_NCCL_FUNC_ALLREDUCE, 64),
                 CC_NCCL_ALGO_UNDEF, CC_NCCL_PROTO_UNDEF, 0);
  expect_stats(control, "v2 ll128", 0, 1);
  control->force(-1, 0, 0);
  CHECK(api_destroy(api, ctx) == CC_NCCL_SUCCESS, "v2 force: destroy");
}

static void test_force_arguments(const struct commcamp_tuner_control* control) {
  CHECK(control->force(CC_NCCL_NUM_ALGORITHMS, CC_NCCL_PROTO_LL, -1) == -1, "algorithm out of range accepted");
  CHECK(control->force(CC_NCCL_ALGO_RING, CC_NCCL_NUM_PROTOCOLS, -1) == -1, "protocol out of range accepted");
  CHECK(control->force(CC_NCCL_ALGO_RING, CC_NCCL_PROTO_LL, 0) == -1, "0 channels accepted");
  CHECK(control->force(CC_NCCL_ALGO_RING, CC_NCCL_PROTO_LL, CC_NCCL_MAX_CHANNELS + 1) == -1, "65 channels accepted");
  CHECK(control->stats(NULL, NULL) == -1, "stats without outputs accepted");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH/TO/libnccl-tuner-commcamp.so\n", argv[0]);
    return 2;
  }
  const char* tmp = getenv("TMPDIR");
  snprintf(temp_dir, sizeof temp_dir, "%s/tuner_harness.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(temp_dir) == NULL) {
    perror("mkdtemp");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }

  struct api apis[6];
  for (int v = 2; v <= 7; v++) {
    char symbol[32];
    snprintf(symbol, sizeof symbol, "ncclTunerPlugin_v%d", v);
    apis[v - 2] = (struct api){v, dlsym(lib, symbol)};
    CHECK(apis[v - 2].symbol != NULL, "%s not exported", symbol);
    if (apis[v - 2].symbol == NULL) return 1;
    CHECK(strcmp(*(const char* const*)apis[v - 2].symbol, "commcamp") == 0, "%s: name is not commcamp", symbol);
  }
  CHECK(dlsym(lib, "ncclTunerPlugin_v1") == NULL, "v1 must not be exported (it has no context)");
  CHECK(dlsym(lib, "cc_config_parse") == NULL && dlsym(lib, "cc_logf") == NULL, "internal symbols are visible");
  CHECK(((const cc_nccl_tuner_v6_t*)apis[4].symbol)->getChunkSize == NULL, "v6 getChunkSize must be NULL");
  CHECK(((const cc_nccl_tuner_v7_t*)apis[5].symbol)->getChunkSize == NULL, "v7 getChunkSize must be NULL");

  test_v2(&apis[0]);
  for (int i = 1; i < 6; i++) {
    test_bad_lines_reported(&apis[i]);
    test_one_node_four_ranks(&apis[i]);
    test_two_nodes_eight_ranks(&apis[i]);
    test_no_config(&apis[i]);
  }
  test_oversized_config(&apis[3]);
  test_fifo_config(&apis[3]);
  test_contexts_independent(&apis[3]);
  test_bad_arguments(&apis[3]);
  test_threads(&apis[3]);

  struct commcamp_tuner_control control;
  char why[600];
  CHECK(commcamp_tuner_control_find("no-such-plugin", &control, why, sizeof why) == -1 && strstr(why, "no tuner plugin"),
        "a plugin that is not loaded was found: %s", why);
  CHECK(commcamp_tuner_control_find(argv[1], &control, why, sizeof why) == 0, "control path: %s", why);
  if (control.lib != NULL) {
    test_force_arguments(&control);
    test_force_v2(&apis[0], &control);
    for (int i = 1; i < 6; i++) test_force(&apis[i], &control);
    commcamp_tuner_control_release(&control);
  }

  const char* files[] = {"a.csv", "b.csv", "empty.csv", "big.csv", "fifo.csv"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", temp_dir, files[i]);
    unlink(path);
  }
  rmdir(temp_dir);
  dlclose(lib);
  if (checks_failed) {
    dump_messages();
    fprintf(stderr, "tuner_harness: %d of %d checks FAILED\n", checks_failed, checks_run);
    return 1;
  }
  printf("tuner_harness: all %d checks passed\n", checks_run);
  return 0;
}
