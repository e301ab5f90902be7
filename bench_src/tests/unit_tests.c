/* Unit tests of what needs neither MPI nor a device: argument parsing, size lists, statistics,
 * bandwidth factors, JSON escaping, the env filter and the validation pattern.
 * Prints one line per failed check and exits non-zero if any failed. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "args.h"
#include "json.h"
#include "pattern.h"
#include "record.h"
#include "stats.h"

static int failures, checks;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        checks++;                                                                                                      \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                                            \
        }                                                                                                              \
    } while (0)

#define CHECK_NEAR(a, b) CHECK(fabs((double)(a) - (double)(b)) <= 1e-9 * (1.0 + fabs((double)(b))))

static struct cb_args args;
static char err[512];

/* Parses a NULL-terminated argument list; returns cb_args_parse's result. */
static int parse(const char *first, ...)
{
    char *argv[64] = {"commbench"};
    int argc = 1;
    __builtin_va_list ap;
    __builtin_va_start(ap, first);
    for (const char *a = first; a && argc < 63; a = __builtin_va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    __builtin_va_end(ap);
    err[0] = '\0';
    return cb_args_parse(argc, argv, &args, err, sizeof err);
}

static int err_mentions(const char *text)
{
    return strstr(err, text) != NULL;
}

static void test_args(void)
{
    CHECK(parse(NULL) == 0);
    CHECK(args.action == CB_ACT_RUN && args.warmup == 5 && args.iters == 20 && args.batch == 1 && args.check == 1);
    CHECK(args.peer == -1 && args.device == -1 && args.timeout_s == 300.0 && args.output == NULL);
    CHECK(args.nsizes == 20 && args.sizes[0] == 8 && args.sizes[19] == 4u << 20);

    CHECK(parse("--min-bytes", "1K", "--max-bytes=1M", "--step-factor", "4", NULL) == 0);
    CHECK(args.nsizes == 6 && args.sizes[0] == 1024 && args.sizes[5] == 1u << 20);
    CHECK(parse("--sizes", "8,1K,64K,1M,2G", NULL) == 0);
    CHECK(args.nsizes == 5 && args.sizes[1] == 1024 && args.sizes[2] == 65536 && args.sizes[4] == 2ull << 30);
    CHECK(parse("--min-bytes", "8M", NULL) == 0 && args.nsizes == 1 && args.sizes[0] == 8u << 20);
    CHECK(parse("--max-bytes", "4", NULL) == 0 && args.nsizes == 1 && args.sizes[0] == 4);

    CHECK(parse("--op", "pingpong,allreduce", "--transport", "mpi", NULL) == 0);
    CHECK(args.nops == 2 && strcmp(args.ops[0], "pingpong") == 0 && strcmp(args.ops[1], "allreduce") == 0);
    CHECK(args.ntransports == 1 && strcmp(args.transports[0], "mpi") == 0);
    CHECK(parse("--iters", "3", "--warmup", "0", "--no-check", "--peer", "2", "--device", "1", "--timeout", "2.5",
                "--output", "x.jsonl", "--inject", "hang", "--assume-gpu-aware-mpi", NULL) == 0);
    CHECK(args.iters == 3 && args.warmup == 0 && !args.check && args.peer == 2 && args.device == 1);
    CHECK(args.timeout_s == 2.5 && strcmp(args.output, "x.jsonl") == 0 && args.inject == CB_INJECT_HANG);
    CHECK(args.assume_gpu_aware_mpi == 1);
    CHECK(parse("--inject", "corrupt", NULL) == 0 && args.inject == CB_INJECT_CORRUPT);
    CHECK(parse("--iters", "4", "--help", NULL) == 0 && args.action == CB_ACT_HELP);
    CHECK(parse("--version", NULL) == 0 && args.action == CB_ACT_VERSION);
    CHECK(parse("--list", NULL) == 0 && args.action == CB_ACT_LIST);
    CHECK(parse(NULL) == 0 && !args.selections && args.rounds == 5);
    CHECK(parse("--selections", "all", "--rounds", "3", NULL) == 0 && args.selections && args.selections_all);
    CHECK(args.rounds == 3 && args.nselection_names == 0);
    CHECK(parse("--selections", "ring,ring/simple/8", NULL) == 0 && args.selections && !args.selections_all);
    CHECK(args.nselection_names == 2 && strcmp(args.selection_names[1], "ring/simple/8") == 0);
    CHECK(parse("--selections", "ring,", NULL) == -1 && err_mentions("--selections"));
    CHECK(parse("--op", "a/b", NULL) == -1 && err_mentions("'a/b'")); /* '/' only in selection names */
    CHECK(parse("--rounds", "0", NULL) == -1 && err_mentions("--rounds"));
    CHECK(parse("--rounds", "7", NULL) == -1 && err_mentions("--selections")); /* was accepted and ignored */
    CHECK(parse("--selections", "all", NULL) == 0 && args.stop_slower == 0 && args.stop_after == 4);
    CHECK(parse("--selections", "all", "--rounds", "12", "--stop-slower", "2", "--stop-after", "6", NULL) == 0);
    CHECK(args.stop_slower == 2.0 && args.stop_after == 6);
    CHECK(parse("--selections", "all", "--rounds", "11", "--stop-slower", "2", "--stop-after", "6", NULL) == -1 &&
          err_mentions("--rounds >= 12"));
    CHECK(parse("--selections", "all", "--stop-slower", "2", NULL) == -1 && err_mentions("--rounds >= 8 (now 5)"));
    CHECK(parse("--selections", "all", "--rounds", "10000", "--stop-slower", "2", "--stop-after", "5000", NULL) == 0);
    CHECK(parse("--selections", "all", "--stop-slower", "2", "--stop-after", "5001", NULL) == -1 &&
          err_mentions("[3, 5000]"));
    CHECK(parse("--selections", "all", "--stop-slower", "0.5", NULL) == -1 && err_mentions("'0.5'"));
    CHECK(parse("--selections", "all", "--stop-slower", "2x", NULL) == -1 && err_mentions("--stop-slower"));
    CHECK(parse("--selections", "all", "--stop-slower", "2", "--stop-after", "2", NULL) == -1 &&
          err_mentions("--stop-after") && err_mentions("[3, "));
    CHECK(parse("--stop-slower", "2", NULL) == -1 && err_mentions("--selections"));
    CHECK(parse("--selections", "all", "--stop-after", "3", NULL) == -1 && err_mentions("--stop-slower"));
    CHECK(parse("--list-cvars", NULL) == 0 && args.action == CB_ACT_LIST_CVARS && args.list_cvars_prefix == NULL);
    CHECK(parse("--list-cvars", "coll_tuned_", NULL) == 0 && strcmp(args.list_cvars_prefix, "coll_tuned_") == 0);
    CHECK(parse("--list-cvars=MPIR_CVAR_", NULL) == 0 && strcmp(args.list_cvars_prefix, "MPIR_CVAR_") == 0);
    CHECK(parse("--list-cvars", "--iters", "2", NULL) == 0 && args.list_cvars_prefix == NULL && args.iters == 2);

    /* Rejections name the argument. */
    CHECK(parse("--iters", "0", NULL) == -1 && err_mentions("--iters") && err_mentions("'0'"));
    CHECK(parse("--iters", "-3", NULL) == -1 && err_mentions("--iters"));
    CHECK(parse("--iters", "ten", NULL) == -1 && err_mentions("'ten'"));
    CHECK(parse("--iters", "5x", NULL) == -1 && err_mentions("--iters"));
    CHECK(parse("--iters", "", NULL) == -1 && err_mentions("--iters"));
    CHECK(parse("--iters", "10000001", NULL) == -1 && err_mentions("--iters"));
    CHECK(parse("--warmup", "-1", NULL) == -1 && err_mentions("--warmup"));
    CHECK(parse("--batch", "20", NULL) == 0 && args.batch == 20);
    CHECK(parse("--batch=100000", NULL) == 0 && args.batch == 100000);
    CHECK(parse("--batch", "0", NULL) == -1 && err_mentions("--batch") && err_mentions("'0'"));
    CHECK(parse("--batch", "100001", NULL) == -1 && err_mentions("[1, 100000]"));
    CHECK(parse("--min-bytes", "0", NULL) == -1 && err_mentions("--min-bytes"));
    CHECK(parse("--min-bytes", "-8", NULL) == -1 && err_mentions("--min-bytes"));
    CHECK(parse("--max-bytes", "2048G", NULL) == -1 && err_mentions("--max-bytes"));
    CHECK(parse("--max-bytes", "99999999999999999999999", NULL) == -1 && err_mentions("--max-bytes"));
    CHECK(parse("--max-bytes", "1.5K", NULL) == -1 && err_mentions("'1.5K'"));
    CHECK(parse("--max-bytes", "1KB", NULL) == -1 && err_mentions("--max-bytes"));
    CHECK(parse("--min-bytes", "1M", "--max-bytes", "1K", NULL) == -1 && err_mentions("--max-bytes") &&
          err_mentions("--min-bytes"));
    CHECK(parse("--step-factor", "1", NULL) == -1 && err_mentions("--step-factor"));
    CHECK(parse("--sizes", "8,,16", NULL) == -1 && err_mentions("--sizes"));
    CHECK(parse("--sizes", "8,0", NULL) == -1 && err_mentions("'0'"));
    CHECK(parse("--sizes", "8", "--min-bytes", "8", NULL) == -1 && err_mentions("--sizes"));
    CHECK(parse("--op", "a,,b", NULL) == -1 && err_mentions("--op"));
    CHECK(parse("--op", "Ping", NULL) == -1 && err_mentions("'Ping'"));
    /* A name twice in one list is refused, naming it (65 of them overflowed the driver's op table). */
    CHECK(parse("--op", "allreduce,pingpong,allreduce", NULL) == -1 && err_mentions("--op") &&
          err_mentions("'allreduce' is named twice"));
    CHECK(parse("--transport", "mpi,mpi", NULL) == -1 && err_mentions("--transport") && err_mentions("'mpi'"));
    CHECK(parse("--selections", "ring,own,ring", NULL) == -1 && err_mentions("--selections") &&
          err_mentions("'ring' is named twice"));
    CHECK(parse("--op", "allreduce", "--op", "allreduce", NULL) == 0 && args.nops == 1); /* the last --op wins */
    /* An option where a value belongs is refused, not taken as the value. */
    CHECK(parse("--output", "--no-check", NULL) == -1 && err_mentions("--output needs a value") &&
          err_mentions("'--no-check'"));
    CHECK(parse("--output=--no-check", NULL) == -1 && err_mentions("--output"));
    CHECK(parse("--op", "--iters", "3", NULL) == -1 && err_mentions("--op needs a value"));
    CHECK(parse("--selections", "--rounds", NULL) == -1 && err_mentions("--selections needs a value"));
    CHECK(parse("--output", "./--no-check", NULL) == 0 && strcmp(args.output, "./--no-check") == 0);
    CHECK(parse("--timeout", "0", NULL) == -1 && err_mentions("--timeout"));
    CHECK(parse("--timeout", "nan", NULL) == -1 && err_mentions("--timeout"));
    CHECK(parse("--timeout", "1e9", NULL) == -1 && err_mentions("--timeout"));
    CHECK(parse("--peer", "0", NULL) == -1 && err_mentions("--peer"));
    CHECK(parse("--device", "-1", NULL) == -1 && err_mentions("--device"));
    CHECK(parse("--inject", "explode", NULL) == -1 && err_mentions("'explode'"));
    CHECK(parse("--output", "", NULL) == -1 && err_mentions("--output"));
    CHECK(parse("--iters", NULL) == -1 && err_mentions("--iters needs a value"));
    CHECK(parse("--bogus", NULL) == -1 && err_mentions("'--bogus'"));
    CHECK(parse("--check=yes", NULL) == -1 && err_mentions("--check takes no value"));
    CHECK(parse("extra", NULL) == -1 && err_mentions("'extra'"));
}

static void test_sizes(void)
{
    uint64_t out[8], b = 0;
    CHECK(cb_size_series(8, 64, 2, out, 8) == 4 && out[0] == 8 && out[3] == 64);
    CHECK(cb_size_series(8, 100, 4, out, 8) == 2 && out[1] == 32);
    CHECK(cb_size_series(5, 5, 2, out, 8) == 1 && out[0] == 5);
    CHECK(cb_size_series(1, 1ull << 40, 2, out, 8) == -1);
    CHECK(cb_size_series(1ull << 39, 1ull << 40, 1024, out, 8) == 1); /* no overflow past the end */
    CHECK(cb_parse_size("64k", &b) == 0 && b == 65536);
    CHECK(cb_parse_size("1G", &b) == 0 && b == 1ull << 30);
    CHECK(cb_parse_size("1024G", &b) == 0 && b == 1ull << 40);
    CHECK(cb_parse_size("1025G", &b) == -1);
    /* T: the messages name the limit "1T"; it was refused as no size at all */
    CHECK(cb_parse_size("1T", &b) == 0 && b == 1ull << 40);
    CHECK(cb_parse_size("1t", &b) == 0 && b == 1ull << 40);
    CHECK(cb_parse_size("2T", &b) == -1 && cb_parse_size("1TB", &b) == -1);
    CHECK(parse("--sizes", "8,1T", NULL) == 0 && args.nsizes == 2 && args.sizes[1] == 1ull << 40);
    CHECK(parse("--max-bytes", "2T", NULL) == -1 && err_mentions("K/M/G/T") && err_mentions("at most 1T"));
    CHECK(cb_parse_size(" 8", &b) == -1 && cb_parse_size("+8", &b) == -1 && cb_parse_size("", &b) == -1);
}

static void test_stats(void)
{
    struct cb_stats s;
    const double four[] = {4.0, 1.0, 3.0, 2.0};
    cb_stats_compute(four, 4, &s);
    CHECK_NEAR(s.min, 1.0);
    CHECK_NEAR(s.max, 4.0);
    CHECK_NEAR(s.median, 2.5);
    CHECK_NEAR(s.mean, 2.5);
    CHECK_NEAR(s.p95, 3.85); /* position 0.95 * 3 = 2.85 between 3 and 4 */
    CHECK_NEAR(s.stdev, sqrt(5.0 / 3.0));
    const double five[] = {10.0, 50.0, 20.0, 40.0, 30.0};
    cb_stats_compute(five, 5, &s);
    CHECK_NEAR(s.median, 30.0);
    CHECK_NEAR(s.p95, 48.0);
    const double one[] = {7.0};
    cb_stats_compute(one, 1, &s);
    CHECK(s.min == 7.0 && s.median == 7.0 && s.p95 == 7.0 && s.max == 7.0 && s.stdev == 0.0);

    /* nccl-tests: allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n; bcast, sendrecv 1 */
    for (int n = 1; n <= 64; n *= 2) {
        CHECK_NEAR(cb_busbw_factor(CB_BUSBW_ALLREDUCE, n), 2.0 * (n - 1) / n);
        CHECK_NEAR(cb_busbw_factor(CB_BUSBW_N_MINUS_1_OVER_N, n), (double)(n - 1) / n);
        CHECK_NEAR(cb_busbw_factor(CB_BUSBW_ONE, n), 1.0);
    }
    CHECK_NEAR(cb_busbw_factor(CB_BUSBW_ALLREDUCE, 4), 1.5);
    CHECK_NEAR(cb_busbw_factor(CB_BUSBW_N_MINUS_1_OVER_N, 8), 0.875);
    CHECK_NEAR(cb_gbps(1e9, 1e6), 1.0);      /* 1e9 bytes in one second */
    CHECK_NEAR(cb_gbps(1024.0, 1.0), 1.024); /* 1 KiB in 1 us */
    CHECK(cb_gbps(8.0, 0.0) == 0.0);
}

static int json_is(struct cb_json *j, const char *expected)
{
    int same = j->buf && strcmp(j->buf, expected) == 0;
    if (!same)
        fprintf(stderr, "  got      %s\n  expected %s\n", j->buf ? j->buf : "(null)", expected);
    cb_json_free(j);
    return same;
}

static void test_json(void)
{
    struct cb_json j;
    cb_json_init(&j);
    cb_json_begin_object(&j);
    cb_json_kstring(&j, "s", "a\"b\\c/\n\t\r\b\f\x01\x1f\x7f");
    cb_json_kint(&j, "i", -42);
    cb_json_knumber(&j, "x", 0.5);
    cb_json_knumber(&j, "nan", NAN);
    cb_json_knumber(&j, "inf", INFINITY);
    cb_json_kbool(&j, "t", 1);
    cb_json_key(&j, "a");
    cb_json_begin_array(&j);
    cb_json_int(&j, 1);
    cb_json_begin_object(&j);
    cb_json_end_object(&j);
    cb_json_begin_array(&j);
    cb_json_end_array(&j);
    cb_json_null(&j);
    cb_json_end_array(&j);
    cb_json_kraw(&j, "raw", "{\"k\":[1,2]}");
    cb_json_end_object(&j);
    CHECK(json_is(&j, "{\"s\":\"a\\\"b\\\\c/\\n\\t\\r\\b\\f\\u0001\\u001f\x7f\",\"i\":-42,\"x\":0.5,"
                      "\"nan\":null,\"inf\":null,\"t\":true,\"a\":[1,{},[],null],\"raw\":{\"k\":[1,2]}}"));

    /* Valid UTF-8 passes through; anything else becomes U+FFFD, one per bad byte. */
    cb_json_init(&j);
    cb_json_string(&j, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    CHECK(json_is(&j, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""));
    cb_json_init(&j);
    cb_json_string(&j, "a\xff"
                       "b\xc0\x80"
                       "c\xed\xa0\x80"
                       "d\xe2\x82");
    CHECK(json_is(&j, "\"a\\ufffdb\\ufffd\\ufffdc\\ufffd\\ufffd\\ufffdd\\ufffd\\ufffd\""));
    cb_json_init(&j);
    cb_json_key(&j, "k\"ey");
    cb_json_string(&j, "");
    CHECK(json_is(&j, "\"k\\\"ey\":\"\""));
    cb_json_init(&j);
    cb_json_number(&j, 123456789.125);
    CHECK(json_is(&j, "123456789"));
}

static void test_env_filter(void)
{
    CHECK(cb_env_keep("NCCL_ALGO"));
    CHECK(cb_env_keep("RCCL_MSCCL_ENABLE"));
    CHECK(cb_env_keep("MPICH_GPU_SUPPORT_ENABLED"));
    CHECK(cb_env_keep("MPIR_CVAR_CH4_OFI_ENABLE"));
    CHECK(cb_env_keep("UCX_TLS"));
    CHECK(cb_env_keep("FI_PROVIDER"));
    CHECK(cb_env_keep("HSA_ENABLE_SDMA"));
    CHECK(cb_env_keep("OMPI_MCA_btl"));
    CHECK(cb_env_keep("CUDA_VISIBLE_DEVICES"));
    CHECK(cb_env_keep("HIP_VISIBLE_DEVICES"));
    CHECK(!cb_env_keep("OMPI_COMM_WORLD_RANK"));
    CHECK(!cb_env_keep("OMPI_COMM_WORLD_LOCAL_RANK"));
    CHECK(!cb_env_keep("OMPI_MCA_orte_hnp_uri"));
    CHECK(!cb_env_keep("OMPI_MCA_ess_base_vpid"));
    CHECK(!cb_env_keep("OMPI_FILE_LOCATION"));
    CHECK(!cb_env_keep("MPIR_CVAR_CH3_INTERFACE_HOSTNAME"));
    CHECK(!cb_env_keep("PMI_RANK"));
    CHECK(!cb_env_keep("PATH"));
    CHECK(!cb_env_keep("NCCL"));
}

static void test_timestamp(void)
{
    char stamp[40];
    cb_timestamp(stamp, sizeof stamp);
    CHECK(strlen(stamp) == 24 && stamp[4] == '-' && stamp[10] == 'T' && stamp[19] == '.' && stamp[23] == 'Z');
}

static void test_pattern(void)
{
    struct cb_pattern p;
    float buf[64];
    /* Sum over ranks matches brute force and is exact. */
    cb_pattern_init(&p, 64, 1, CB_SRC_SUM, 5, 3, 7);
    for (uint64_t i = 0; i < 64; i++) {
        double sum = 0;
        for (int r = 0; r < 7; r++)
            sum += cb_pattern_value(r, 5 + i, 3);
        CHECK(cb_pattern_at(&p, i) == (float)sum);
    }
    /* Values differ between ranks and between seeds. */
    CHECK(cb_pattern_value(0, 10, 1) != cb_pattern_value(1, 10, 1));
    CHECK(cb_pattern_value(0, 10, 1) != cb_pattern_value(0, 10, 2));
    /* Segments: segment s comes from rank s, from index base on. */
    cb_pattern_init(&p, 4, 3, CB_SRC_SEGMENT, 8, 1, 3);
    CHECK(cb_pattern_count(&p) == 12);
    CHECK(cb_pattern_at(&p, 5) == cb_pattern_value(1, 9, 1));
    CHECK(cb_pattern_at(&p, 11) == cb_pattern_value(2, 11, 1));
    /* Fill then check: zero wrong; one flip and one NaN are counted. */
    cb_pattern_init(&p, 64, 1, 2, 0, 1, 4);
    cb_pattern_fill_host(buf, &p);
    CHECK(cb_pattern_count_wrong_host(buf, &p) == 0);
    buf[3] += 1.0f;
    buf[40] = NAN;
    CHECK(cb_pattern_count_wrong_host(buf, &p) == 2);
    /* Empty patterns have no elements. */
    cb_pattern_init(&p, 0, 4, 0, 0, 1, 4);
    CHECK(cb_pattern_count(&p) == 0);
}

/* Errors a pattern linear in index and rank cannot see ((13 i + 7 seed + 101 r) mod 251 had all
 * of them): a chunk read 251 elements too far on, rank 251's data in rank 0's place, and an allreduce
 * result shifted by one element at 251 and 502 ranks (where that pattern's sums were all alike).
 * The values stay small enough for exact float32 sums at 66,000 ranks. */
static void test_pattern_catches_misplacement(void)
{
    enum { chunk = 251 };
    static float buf[2 * chunk];
    struct cb_pattern p, other;
    cb_pattern_init(&p, 2 * chunk, 1, 0, 0, 1, 4);
    cb_pattern_fill_host(buf, &p);
    memmove(buf, buf + chunk, chunk * sizeof *buf);
    CHECK(cb_pattern_count_wrong_host(buf, &p) > chunk / 2);

    cb_pattern_init(&p, 2 * chunk, 1, 0, 0, 1, 256);
    cb_pattern_init(&other, 2 * chunk, 1, 251, 0, 1, 256);
    cb_pattern_fill_host(buf, &other);
    CHECK(cb_pattern_count_wrong_host(buf, &p) == 2 * chunk);
    CHECK(cb_pattern_value(0, 7, 2) != cb_pattern_value(251, 7, 2));

    for (int32_t nranks = chunk; nranks <= 2 * chunk; nranks += chunk) {
        cb_pattern_init(&p, 2 * chunk, 1, CB_SRC_SUM, 0, 1, nranks);
        cb_pattern_fill_host(buf, &p);
        memmove(buf, buf + 1, (2 * chunk - 1) * sizeof *buf);
        CHECK(cb_pattern_count_wrong_host(buf, &p) > chunk);
    }

    cb_pattern_init(&p, 16, 1, CB_SRC_SUM, 1000, 3, 66000);
    for (uint64_t i = 0; i < 16; i++) {
        double sum = 0;
        for (int32_t r = 0; r < 66000; r++)
            sum += cb_pattern_value(r, 1000 + i, 3);
        CHECK(sum < 16777216.0 && cb_pattern_at(&p, i) == (float)sum);
    }
}

/* Ranks share a GPU when host and UUID agree (PCI bus id where the UUID is empty); the same bus id
 * on two hosts (ranks 3 and 6) is two GPUs. */
static void test_ranks_per_device(void)
{
    static const char hosts[7][CB_HOST_MAX] = {"n1", "n1", "n1", "n2", "n2", "n1", "n3"};
    struct cb_device_info devices[7];
    memset(devices, 0, sizeof devices);
    const char *uuids[7] = {"GPU-a", "GPU-a", "GPU-b", "", "", "GPU-a", ""};
    const char *buses[7] = {"0000:01:00.0", "0000:01:00.0", "0000:02:00.0", "0000:01:00.0", "0000:02:00.0",
                            "0000:01:00.0", "0000:01:00.0"};
    for (int r = 0; r < 7; r++) {
        snprintf(devices[r].uuid, sizeof devices[r].uuid, "%s", uuids[r]);
        snprintf(devices[r].pci_bus_id, sizeof devices[r].pci_bus_id, "%s", buses[r]);
    }
    int per_rank[7] = {0};
    CHECK(cb_ranks_per_device(7, hosts, devices, per_rank) == 3);
    CHECK(per_rank[0] == 3 && per_rank[1] == 3 && per_rank[5] == 3);
    CHECK(per_rank[2] == 1 && per_rank[3] == 1 && per_rank[4] == 1 && per_rank[6] == 1);

    /* one GPU per rank: nobody shares */
    CHECK(cb_ranks_per_device(2, hosts + 3, devices + 3, per_rank) == 1);
    CHECK(per_rank[0] == 1 && per_rank[1] == 1);
    /* two ranks, one GPU: the single-GPU machine's case */
    CHECK(cb_ranks_per_device(2, hosts, devices, per_rank) == 2);
    CHECK(per_rank[0] == 2 && per_rank[1] == 2);
}

static void test_rank_attribution(void)
{
    /* 3 ranks x 4 iterations: rank 2 is slow in iterations 0, 1 and 3, rank 0 in iteration 2 */
    const double all[] = {1.0, 1.0, 9.0, 1.0, /* rank 0 */
                          2.0, 2.0, 2.0, 2.0, /* rank 1 */
                          5.0, 7.0, 1.0, 8.0 /* rank 2 */};
    double max_us[4], excess_us[4], median[3], p95[3];
    int slowest[4], count[3];
    struct cb_rank_attribution a = {.nranks = 3, .iters = 4, .max_us = max_us, .excess_us = excess_us,
                                    .slowest_rank = slowest, .rank_median_us = median, .rank_p95_us = p95,
                                    .slowest_count = count};
    cb_rank_attribution_compute(all, &a);
    CHECK(slowest[0] == 2 && slowest[1] == 2 && slowest[2] == 0 && slowest[3] == 2);
    CHECK_NEAR(max_us[0], 5.0);
    CHECK_NEAR(max_us[2], 9.0);
    CHECK_NEAR(excess_us[0], 3.0); /* 5 - median(1, 2, 5) */
    CHECK_NEAR(excess_us[2], 7.0); /* 9 - median(9, 2, 1) */
    CHECK(count[0] == 1 && count[1] == 0 && count[2] == 3);
    CHECK_NEAR(median[1], 2.0);
    CHECK_NEAR(median[2], 6.0);
    /* ties go to the lowest rank, as MPI_MAXLOC */
    const double tie[] = {3.0, 3.0};
    struct cb_rank_attribution b = {.nranks = 2, .iters = 1, .max_us = max_us, .excess_us = excess_us,
                                    .slowest_rank = slowest, .rank_median_us = median, .rank_p95_us = p95,
                                    .slowest_count = count};
    cb_rank_attribution_compute(tie, &b);
    CHECK(slowest[0] == 0 && count[0] == 1 && count[1] == 0);
}

/* ---- A failed record cut back only where nothing of another appender's would go with it ----
 * This program's write() replaces libc's for record.c (a definition in the executable wins; stdio does not
 * call it): it plays a disk that fills during a record, with another process appending to the same file
 * before, between or after the record's pieces. Pieces are written through a duplicate of the descriptor
 * (one open file description: the offset moves as the real write's would), the other appender through a
 * file of its own. */
enum { APPEND_NONE, APPEND_BEFORE, APPEND_BETWEEN, APPEND_AFTER };
static int fake_disk, fake_append, fake_calls;
static const char *fake_path;
static const char other_record[] = "{\"other\":1}\n";

static void put_through(int fd, const void *buf, size_t n, const char *mode)
{
    FILE *f = fd >= 0 ? fdopen(dup(fd), mode) : fopen(fake_path, mode);
    if (f) {
        fwrite(buf, 1, n, f);
        fclose(f);
    }
}

ssize_t write(int fd, const void *buf, size_t n)
{
    if (!fake_disk) {
        put_through(fd, buf, n, "a");
        return (ssize_t)n;
    }
    size_t piece = n < 10 ? n : 10;
    switch (++fake_calls) {
    case 1: /* the first 10 bytes of the record */
        if (fake_append == APPEND_BEFORE) /* landed after the lseek(SEEK_END) that once marked the start */
            put_through(-1, other_record, sizeof other_record - 1, "a");
        put_through(fd, buf, piece, "a");
        if (fake_append == APPEND_AFTER)
            put_through(-1, other_record, sizeof other_record - 1, "a");
        return (ssize_t)piece;
    case 2:
        if (fake_append == APPEND_BETWEEN) { /* the second piece lands after the other's record */
            put_through(-1, other_record, sizeof other_record - 1, "a");
            put_through(fd, buf, piece, "a");
            return (ssize_t)piece;
        }
        break;
    default: break;
    }
    errno = ENOSPC;
    return -1;
}

/* In a child (record.c's state is once per process): one record into a file holding one line, through a disk
 * that fills; returns the file's content and what stderr said. */
static void emit_on_full_disk(int append, char *content, size_t content_len, char *said, size_t said_len)
{
    char path[] = "/tmp/commbench_unit_XXXXXX", errpath[] = "/tmp/commbench_unit_err_XXXXXX";
    int fd = mkstemp(path), errfd = mkstemp(errpath);
    static const char prior[] = "{\"prior\":1}\n";
    content[0] = said[0] = '\0';
    if (fd < 0 || errfd < 0)
        return;
    if (pwrite(fd, prior, sizeof prior - 1, 0) != (ssize_t)(sizeof prior - 1))
        return;
    close(fd);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        static const struct cb_backend backend = {.name = "cpu"};
        static char hosts[1][CB_HOST_MAX] = {"unit"};
        static int node_of[1];
        static struct cb_ctx ctx = {.nranks = 1, .local_size = 1, .nnodes = 1, .node_of = node_of, .hosts = hosts,
                                    .backend = &backend};
        if (!freopen("/dev/null", "w", stdout) || dup2(errfd, 2) < 0)
            _exit(2);
        fake_path = path;
        cb_record_start(&ctx, "unit");
        if (cb_output_open(path) != CB_OK)
            _exit(2);
        fake_disk = 1;
        fake_append = append;
        cb_emit_error("allreduce", "mpi", NULL, NULL, CB_REASON_RUNTIME, "a record longer than two pieces of 10 bytes");
        fake_disk = 0;
        _exit(cb_output_close() == CB_ERROR ? 0 : 3);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(content, 1, content_len - 1, f) : 0;
    content[n] = '\0';
    if (f)
        fclose(f);
    n = (size_t)pread(errfd, said, said_len - 1, 0);
    said[n < said_len ? n : 0] = '\0';
    close(errfd);
    unlink(path);
    unlink(errpath);
}

static void test_output_cut_back(void)
{
    char content[4096], said[4096];
    /* alone: the half record goes, the file ends with its last whole line */
    emit_on_full_disk(APPEND_NONE, content, sizeof content, said, sizeof said);
    CHECK(strcmp(content, "{\"prior\":1}\n") == 0);
    CHECK(strstr(said, "No space left on device") && !strstr(said, "cut off"));
    /* another record appended just before ours: cut back to where ours began, the other's kept (the start
     * taken with lseek(SEEK_END) before the write removed it) */
    emit_on_full_disk(APPEND_BEFORE, content, sizeof content, said, sizeof said);
    CHECK(strcmp(content, "{\"prior\":1}\n{\"other\":1}\n") == 0);
    CHECK(strstr(said, "No space left on device") && !strstr(said, "cut off"));
    /* appended after our piece: the file no longer ends with our data, nothing is cut, and that is said */
    emit_on_full_disk(APPEND_AFTER, content, sizeof content, said, sizeof said);
    CHECK(strstr(content, "{\"other\":1}\n") != NULL);
    CHECK(strstr(said, "(its last line is cut off)") != NULL);
    /* appended between our two pieces: they do not lie together, nothing is cut */
    emit_on_full_disk(APPEND_BETWEEN, content, sizeof content, said, sizeof said);
    CHECK(strstr(content, "{\"other\":1}\n") != NULL);
    CHECK(strstr(said, "(its last line is cut off)") != NULL);
    /* said once, at the write (it was said again at close) */
    const char *first = strstr(said, "writing --output");
    CHECK(first && !strstr(first + 1, "writing --output"));
}

int main(void)
{
    test_args();
    test_sizes();
    test_stats();
    test_json();
    test_env_filter();
    test_timestamp();
    test_pattern();
    test_pattern_catches_misplacement();
    test_ranks_per_device();
    test_rank_attribution();
    test_output_cut_back();
    printf("commbench_unit: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
