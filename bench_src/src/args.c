#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int cb_parse_size(const char *text, uint64_t *bytes)
{
    const char *p = text;
    uint64_t value = 0;
    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return -1;
        value = value * 10 + digit;
    }
    uint64_t unit = 1;
    switch (toupper((unsigned char)*p)) {
    case 'K':
        unit = 1ull << 10;
        p++;
        break;
    case 'M':
        unit = 1ull << 20;
        p++;
        break;
    case 'G':
        unit = 1ull << 30;
        p++;
        break;
    case 'T': /* CB_MAX_BYTES is 1T: the messages name the limit with it */
        unit = 1ull << 40;
        p++;
        break;
    default: break;
    }
    if (*p != '\0' || value == 0 || value > CB_MAX_BYTES / unit)
        return -1;
    *bytes = value * unit;
    return 0;
}

int cb_size_series(uint64_t min, uint64_t max, uint64_t factor, uint64_t *out, int max_sizes)
{
    int n = 0;
    for (uint64_t s = min; s <= max; s *= factor) {
        if (n == max_sizes)
            return -1;
        out[n++] = s;
        if (s > max / factor)
            break;
    }
    return n;
}

/* Whole-string integer in [lo, hi]. */
static int parse_long(const char *text, long lo, long hi, long *out)
{
    char *end;
    if (!*text || isspace((unsigned char)*text))
        return -1;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Whole-string number in [lo, hi] (lo excluded when open_lo). */
static int parse_double(const char *text, double lo, int open_lo, double hi, double *out)
{
    char *end;
    if (!*text || isspace((unsigned char)*text))
        return -1;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || !(open_lo ? v > lo : v >= lo) || !(v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* Splits a comma list into store (appending), checking each name's characters (selection
 * names may also hold '/', as in ring/simple/8). A name given twice is refused: it would run twice,
 * and the driver's per-name tables (ops of a transport, the kept selections) assume distinct names. */
static int parse_names(const char *flag, const char *text, const char **names, int *count, char *store, size_t *used,
                       char *err, size_t errlen)
{
    int slash_ok = strcmp(flag, "--selections") == 0;
    size_t len = strlen(text);
    if (*used + len + 1 > sizeof(((struct cb_args *)0)->name_store))
        return fail(err, errlen, "%s: list too long", flag);
    char *copy = store + *used;
    memcpy(copy, text, len + 1);
    *used += len + 1;
    *count = 0;
    for (char *item = copy;;) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        if (!*item)
            return fail(err, errlen, "%s: empty name in '%s'", flag, text);
        for (const char *c = item; *c; c++)
            if (!(islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_' || *c == '-' ||
                  (slash_ok && *c == '/')))
                return fail(err, errlen, "%s: invalid name '%s'", flag, item);
        for (int k = 0; k < *count; k++)
            if (strcmp(names[k], item) == 0)
                return fail(err, errlen, "%s: '%s' is named twice", flag, item);
        if (*count == CB_MAX_NAMES)
            return fail(err, errlen, "%s: more than %d names", flag, CB_MAX_NAMES);
        names[(*count)++] = item;
        if (!comma)
            return 0;
        item = comma + 1;
    }
}

static int parse_size_list(const char *text, struct cb_args *a, char *err, size_t errlen)
{
    char item[64];
    a->nsizes = 0;
    for (const char *p = text;;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item)
            return fail(err, errlen, "--sizes: bad entry in '%s'", text);
        memcpy(item, p, len);
        item[len] = '\0';
        if (a->nsizes == CB_MAX_SIZES)
            return fail(err, errlen, "--sizes: more than %d sizes", CB_MAX_SIZES);
        if (cb_parse_size(item, &a->sizes[a->nsizes]))
            return fail(err, errlen,
                        "--sizes: '%s' is not a size (a positive integer with optional K/M/G/T suffix, "
                        "at most 1T)",
                        item);
        a->nsizes++;
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

enum opt_id {
    OPT_HELP,
    OPT_VERSION,
    OPT_LIST,
    OPT_OP,
    OPT_TRANSPORT,
    OPT_MIN,
    OPT_MAX,
    OPT_FACTOR,
    OPT_SIZES,
    OPT_WARMUP,
    OPT_ITERS,
    OPT_BATCH,
    OPT_CHECK,
    OPT_NO_CHECK,
    OPT_PEER,
    OPT_DEVICE,
    OPT_TIMEOUT,
    OPT_OUTPUT,
    OPT_INJECT,
    OPT_ASSUME_GPU_AWARE,
    OPT_SELECTIONS,
    OPT_ROUNDS,
    OPT_STOP_SLOWER,
    OPT_STOP_AFTER,
    OPT_LIST_CVARS,
};

static const struct {
    const char *name;
    enum opt_id id;
    int has_value; /* 0 none, 1 required, 2 optional (--opt=V, or a next argument not starting with '-') */
} options[] = {
    {"--help", OPT_HELP, 0},
    {"-h", OPT_HELP, 0},
    {"--version", OPT_VERSION, 0},
    {"--list", OPT_LIST, 0},
    {"--op", OPT_OP, 1},
    {"--transport", OPT_TRANSPORT, 1},
    {"--min-bytes", OPT_MIN, 1},
    {"--max-bytes", OPT_MAX, 1},
    {"--step-factor", OPT_FACTOR, 1},
    {"--sizes", OPT_SIZES, 1},
    {"--warmup", OPT_WARMUP, 1},
    {"--iters", OPT_ITERS, 1},
    {"--batch", OPT_BATCH, 1},
    {"--check", OPT_CHECK, 0},
    {"--no-check", OPT_NO_CHECK, 0},
    {"--peer", OPT_PEER, 1},
    {"--device", OPT_DEVICE, 1},
    {"--timeout", OPT_TIMEOUT, 1},
    {"--output", OPT_OUTPUT, 1},
    {"--inject", OPT_INJECT, 1},
    {"--assume-gpu-aware-mpi", OPT_ASSUME_GPU_AWARE, 0},
    {"--selections", OPT_SELECTIONS, 1},
    {"--rounds", OPT_ROUNDS, 1},
    {"--stop-slower", OPT_STOP_SLOWER, 1},
    {"--stop-after", OPT_STOP_AFTER, 1},
    {"--list-cvars", OPT_LIST_CVARS, 2},
};

int cb_args_parse(int argc, char **argv, struct cb_args *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->action = CB_ACT_RUN;
    a->warmup = 5;
    a->iters = 20;
    a->batch = 1;
    a->check = 1;
    a->peer = -1;
    a->device = -1;
    a->timeout_s = 300.0;
    a->rounds = 5;
    a->stop_after = 4;
    int stop_after_given = 0, rounds_given = 0;
    uint64_t min = 8, max = 4ull << 20, factor = 2;
    int series_given = 0, min_given = 0, max_given = 0;
    int help = 0, version = 0; /* they win over the other actions, once the whole command line is checked */
    size_t used = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = NULL;
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        size_t k, nopt = sizeof options / sizeof options[0];
        for (k = 0; k < nopt; k++)
            if (strlen(options[k].name) == name_len && strncmp(options[k].name, arg, name_len) == 0)
                break;
        if (k == nopt)
            return fail(err, errlen, "unknown argument '%s' (see --help)", arg);
        const char *name = options[k].name;
        if (options[k].has_value) {
            if (eq)
                value = eq + 1;
            else if (i + 1 < argc && (options[k].has_value == 1 || argv[i + 1][0] != '-'))
                value = argv[++i];
            else if (options[k].has_value == 1)
                return fail(err, errlen, "%s needs a value", name);
        } else if (eq) {
            return fail(err, errlen, "%s takes no value", name);
        }
        /* `--output --no-check` meant a file name that was forgotten, not a file named "--no-check". */
        if (value && strncmp(value, "--", 2) == 0)
            return fail(err, errlen, "%s needs a value, not the option '%s'%s", name, value,
                        options[k].id == OPT_OUTPUT ? " (a file of that name: write ./ before it)" : "");
        long v;
        switch (options[k].id) {
        case OPT_HELP: help = 1; break;
        case OPT_VERSION: version = 1; break;
        case OPT_LIST: a->action = CB_ACT_LIST; break;
        case OPT_OP:
            if (parse_names(name, value, a->ops, &a->nops, a->name_store, &used, err, errlen))
                return -1;
            break;
        case OPT_TRANSPORT:
            if (parse_names(name, value, a->transports, &a->ntransports, a->name_store, &used, err, errlen))
                return -1;
            break;
        case OPT_MIN:
        case OPT_MAX:
            if (cb_parse_size(value, options[k].id == OPT_MIN ? &min : &max))
                return fail(err, errlen,
                            "%s: '%s' is not a size (a positive integer with optional K/M/G/T suffix, "
                            "at most 1T)",
                            name, value);
            series_given = 1;
            *(options[k].id == OPT_MIN ? &min_given : &max_given) = 1;
            break;
        case OPT_FACTOR:
            if (parse_long(value, 2, 1024, &v))
                return fail(err, errlen, "%s: '%s' is not an integer in [2, 1024]", name, value);
            factor = (uint64_t)v;
            series_given = 1;
            break;
        case OPT_SIZES:
            if (parse_size_list(value, a, err, errlen))
                return -1;
            break;
        case OPT_WARMUP:
            if (parse_long(value, 0, CB_MAX_ITERS, &v))
                return fail(err, errlen, "%s: '%s' is not an integer in [0, %d]", name, value, CB_MAX_ITERS);
            a->warmup = (int)v;
            break;
        case OPT_ITERS:
            if (parse_long(value, 1, CB_MAX_ITERS, &v))
                return fail(err, errlen, "%s: '%s' is not an integer in [1, %d]", name, value, CB_MAX_ITERS);
            a->iters = (int)v;
            break;
        case OPT_BATCH:
            if (parse_long(value, 1, CB_MAX_BATCH, &v))
                return fail(err, errlen, "%s: '%s' is not an integer in [1, %d]", name, value, CB_MAX_BATCH);
            a->batch = (int)v;
            break;
        case OPT_CHECK: a->check = 1; break;
        case OPT_NO_CHECK: a->check = 0; break;
        case OPT_PEER:
            if (parse_long(value, 1, 1 << 30, &v))
                return fail(err, errlen, "%s: '%s' is not a rank >= 1", name, value);
            a->peer = (int)v;
            break;
        case OPT_DEVICE:
            if (parse_long(value, 0, 1 << 20, &v))
                return fail(err, errlen, "%s: '%s' is not a device index >= 0", name, value);
            a->device = (int)v;
            break;
        case OPT_TIMEOUT:
            if (parse_double(value, 0.0, 1, CB_MAX_TIMEOUT_S, &a->timeout_s))
                return fail(err, errlen, "%s: '%s' is not a number of seconds in (0, %.0f]", name, value,
                            CB_MAX_TIMEOUT_S);
            break;
        case OPT_OUTPUT:
            if (!*value)
                return fail(err, errlen, "%s: empty file name", name);
            a->output = value;
            break;
        case OPT_INJECT:
            if (strcmp(value, "corrupt") == 0)
                a->inject = CB_INJECT_CORRUPT;
            else if (strcmp(value, "hang") == 0)
                a->inject = CB_INJECT_HANG;
            else if (strcmp(value, "crash") == 0)
                a->inject = CB_INJECT_CRASH;
            else if (strcmp(value, "fail") == 0)
                a->inject = CB_INJECT_FAIL;
            else
                return fail(err, errlen, "%s: '%s' is not one of corrupt, hang, crash, fail", name, value);
            break;
        case OPT_ASSUME_GPU_AWARE: a->assume_gpu_aware_mpi = 1; break;
        case OPT_SELECTIONS:
            a->selections = 1;
            a->selections_all = strcmp(value, "all") == 0;
            if (!a->selections_all && parse_names(name, value, a->selection_names, &a->nselection_names, a->name_store,
                                                  &used, err, errlen))
                return -1;
            for (int n = 0; n < a->nselection_names; n++)
                if (strcmp(a->selection_names[n], "all") == 0)
                    return fail(err, errlen, "%s: 'all' is every selection: give it alone, not in a list", name);
            break;
        case OPT_ROUNDS:
            if (parse_long(value, 1, CB_MAX_ROUNDS, &v))
                return fail(err, errlen, "%s: '%s' is not an integer in [1, %d]", name, value, CB_MAX_ROUNDS);
            a->rounds = (int)v;
            rounds_given = 1;
            break;
        case OPT_STOP_SLOWER:
            if (parse_double(value, 1.0, 0, CB_MAX_STOP_SLOWER, &a->stop_slower))
                return fail(err, errlen, "%s: '%s' is not a factor in [1, %g]", name, value, CB_MAX_STOP_SLOWER);
            break;
        case OPT_STOP_AFTER:
            if (parse_long(value, 3, CB_MAX_ROUNDS / 2, &v)) /* one judged round may be below F: 3 or more */
                return fail(err, errlen, "%s: '%s' is not an integer in [3, %d]", name, value, CB_MAX_ROUNDS / 2);
            a->stop_after = (int)v;
            stop_after_given = 1;
            break;
        case OPT_LIST_CVARS:
            a->action = CB_ACT_LIST_CVARS;
            a->list_cvars_prefix = value && *value ? value : NULL;
            break;
        }
    }
    if (rounds_given && !a->selections) /* else accepted and ignored: one block of --iters samples */
        return fail(err, errlen, "--rounds applies to a selection sweep: give --selections too");
    if (a->stop_slower > 0 && !a->selections)
        return fail(err, errlen, "--stop-slower applies to a selection sweep: give --selections too");
    if (stop_after_given && !(a->stop_slower > 0))
        return fail(err, errlen, "--stop-after needs --stop-slower");
    if (a->stop_slower > 0 && a->rounds < 2 * a->stop_after)
        return fail(err, errlen, "--stop-slower judges the rounds 0, 2, ..., %d and stops after them: give --rounds >= %d "
                    "(now %d) or fewer --stop-after", 2 * a->stop_after - 2, 2 * a->stop_after, a->rounds);
    if (a->nsizes && series_given)
        return fail(err, errlen, "--sizes cannot be combined with --min-bytes/--max-bytes/--step-factor");
    if (!a->nsizes) {
        /* A lone bound moves the other default out of its way. */
        if (min_given && !max_given && max < min)
            max = min;
        if (max_given && !min_given && min > max)
            min = max;
        if (max < min)
            return fail(err, errlen, "--max-bytes (%llu) is smaller than --min-bytes (%llu)", (unsigned long long)max,
                        (unsigned long long)min);
        a->nsizes = cb_size_series(min, max, factor, a->sizes, CB_MAX_SIZES);
        if (a->nsizes < 0)
            return fail(err, errlen, "--min-bytes/--max-bytes/--step-factor give more than %d sizes", CB_MAX_SIZES);
    }
    if (help)
        a->action = CB_ACT_HELP;
    else if (version)
        a->action = CB_ACT_VERSION;
    return 0;
}
