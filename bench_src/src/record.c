#include "record.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

extern char **environ;

/* Guards everything below: the watchdog thread emits too, at any time, also during start-up. */
static pthread_mutex_t emit_lock = PTHREAD_MUTEX_INITIALIZER;
static int output_fd = -1;
static char output_path[4096];
static int output_failed, output_errno; /* sticky: a record was lost, no further ones are written */
/* The first failed write or flush of the table on stdout (0: none): the final flush alone finds only
 * ferror, not why. Said on stderr once, when it happens. */
static int stdout_errno;
static int table_header_done;
static const struct cb_ctx *rec_ctx; /* NULL until cb_record_start: no record can be made yet */
static struct cb_selection_record current_selection;
static struct cb_selection current_sel;
static struct cb_kv current_reported[CB_MAX_REPORTED];
static char current_reason[CB_TEXT_MAX];
/* Serialised once: "hostnames", "mpi_library", "env" (cb_record_start), "devices", "gpu_sharing" (GPU
 * backends only), "versions" (cb_record_setup; NULL before it: records leave them out). */
static char *hostnames_json, *mpi_library_json, *devices_json, *gpu_sharing_json, *versions_json, *env_json,
    *slurm_job_json;

/* Keeps the first failure of the table on stdout and says it once, when it happens; failed: the printf
 * or fflush just made returned an error (errno is its reason). Called with emit_lock held. */
static void note_stdout(int failed)
{
    if (!failed || stdout_errno)
        return;
    stdout_errno = errno ? errno : EIO;
    fprintf(stderr, "commbench: writing the table to standard output failed: %s\n", strerror(stdout_errno));
}

static const char *const env_prefixes[] = {"NCCL_", "RCCL_", "MPICH_", "MPIR_CVAR_", "UCX_",
                                           "FI_",   "HSA_",  "OMPI_",  "CUDA_",      "HIP_"};
/* Set by mpirun/mpiexec for one process or one job: not configuration. */
static const char *const env_launcher_prefixes[] = {"OMPI_COMM_WORLD_",
                                                    "OMPI_MCA_orte_",
                                                    "OMPI_MCA_ess",
                                                    "OMPI_MCA_pmix",
                                                    "OMPI_MCA_initial_wdir",
                                                    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
                                                    "OMPI_FILE_LOCATION",
                                                    "OMPI_UNIVERSE_SIZE",
                                                    "OMPI_FIRST_RANKS",
                                                    "OMPI_NUM_APP_CTX",
                                                    "OMPI_APP_CTX_",
                                                    "OMPI_COMMAND",
                                                    "OMPI_ARGV",
                                                    "MPIR_CVAR_CH3_INTERFACE_HOSTNAME"};

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

int cb_env_keep(const char *name)
{
    int keep = 0;
    for (size_t i = 0; i < sizeof env_prefixes / sizeof env_prefixes[0]; i++)
        keep |= has_prefix(name, env_prefixes[i]);
    for (size_t i = 0; keep && i < sizeof env_launcher_prefixes / sizeof env_launcher_prefixes[0]; i++)
        keep = !has_prefix(name, env_launcher_prefixes[i]);
    return keep;
}

void cb_timestamp(char *buf, size_t len)
{
    struct timespec now;
    struct tm utc;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &utc);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &utc);
    snprintf(buf + n, len - n, ".%03ldZ", now.tv_nsec / 1000000);
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *take(struct cb_json *j)
{
    char *s = j->buf;
    j->buf = NULL;
    cb_json_free(j);
    return s;
}

static char *serialise_env(void)
{
    size_t n = 0, kept = 0;
    while (environ[n])
        n++;
    char **vars = malloc((n + 1) * sizeof *vars);
    if (!vars)
        abort();
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        if (!eq)
            continue;
        size_t name_len = (size_t)(eq - environ[i]);
        char name[256];
        if (name_len >= sizeof name)
            continue;
        memcpy(name, environ[i], name_len);
        name[name_len] = '\0';
        if (cb_env_keep(name))
            vars[kept++] = environ[i];
    }
    qsort(vars, kept, sizeof *vars, compare_strings);
    struct cb_json j;
    cb_json_init(&j);
    cb_json_begin_object(&j);
    for (size_t i = 0; i < kept; i++) {
        const char *eq = strchr(vars[i], '=');
        char name[256];
        memcpy(name, vars[i], (size_t)(eq - vars[i]));
        name[eq - vars[i]] = '\0';
        cb_json_kstring(&j, name, eq + 1);
    }
    cb_json_end_object(&j);
    free(vars);
    return take(&j);
}

struct device_key {
    const char *host, *id;
    int rank;
};

static int compare_device_keys(const void *a, const void *b)
{
    const struct device_key *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    return c ? c : strcmp(x->id, y->id);
}

int cb_ranks_per_device(int nranks, const char (*hosts)[CB_HOST_MAX], const struct cb_device_info *devices,
                        int *per_rank)
{
    struct device_key *keys = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof *keys);
    if (!keys)
        abort();
    for (int r = 0; r < nranks; r++)
        keys[r] = (struct device_key){hosts[r], devices[r].uuid[0] ? devices[r].uuid : devices[r].pci_bus_id, r};
    qsort(keys, (size_t)nranks, sizeof *keys, compare_device_keys);
    int most = 0;
    for (int first = 0, next; first < nranks; first = next) {
        for (next = first + 1; next < nranks && compare_device_keys(&keys[first], &keys[next]) == 0; next++)
            ;
        for (int k = first; k < next; k++)
            per_rank[keys[k].rank] = next - first;
        most = next - first > most ? next - first : most;
    }
    free(keys);
    return most;
}

/* 1 when every rank's work goes through MPS, 0 when no rank's does, -1 otherwise (unknown or mixed). */
static int mps_of_all(int nranks, const struct cb_device_info *devices)
{
    int on = 0, off = 0;
    for (int r = 0; r < nranks; r++) {
        on += devices[r].mps == 1;
        off += devices[r].mps == 0;
    }
    return on == nranks ? 1 : off == nranks ? 0 : -1;
}

static void json_tristate(struct cb_json *j, const char *key, int value)
{
    cb_json_key(j, key);
    if (value < 0)
        cb_json_null(j);
    else
        cb_json_bool(j, value);
}

/* Ranks that share a GPU measure the GPU's scheduling between their processes (time slices
 * without MPS), not the interconnect: the records say so, and so does the table. */
static void describe_sharing(const struct cb_ctx *ctx, const struct cb_device_info *devices)
{
    int *per_rank = calloc((size_t)ctx->nranks, sizeof *per_rank);
    if (!per_rank)
        abort();
    int most = cb_ranks_per_device(ctx->nranks, (const char (*)[CB_HOST_MAX])ctx->hosts, devices, per_rank);
    int mps = mps_of_all(ctx->nranks, devices);
    struct cb_json j;
    cb_json_init(&j);
    cb_json_begin_array(&j);
    for (int r = 0; r < ctx->nranks; r++) {
        cb_json_begin_object(&j);
        cb_json_kint(&j, "rank", r);
        cb_json_kstring(&j, "host", ctx->hosts[r]);
        cb_json_kint(&j, "index", devices[r].index);
        cb_json_kstring(&j, "name", devices[r].name);
        cb_json_kstring(&j, "pci_bus_id", devices[r].pci_bus_id);
        cb_json_kstring(&j, "uuid", devices[r].uuid);
        json_tristate(&j, "mps", devices[r].mps);
        cb_json_kint(&j, "ranks_on_device", per_rank[r]);
        cb_json_end_object(&j);
    }
    cb_json_end_array(&j);
    devices_json = take(&j);

    cb_json_init(&j);
    cb_json_begin_object(&j);
    cb_json_kint(&j, "max_ranks_per_gpu", most);
    json_tristate(&j, "mps", mps);
    cb_json_end_object(&j);
    gpu_sharing_json = take(&j);
    free(per_rank);

    if (most > 1)
        note_stdout(printf("# NOTE: up to %d ranks share one GPU (MPS %s): their GPU work is %s, so these times are "
                           "not interconnect numbers\n",
                           most, mps == 1 ? "on" : mps == 0 ? "off" : "unknown",
                           mps == 1 ? "scheduled together through MPS"
                                    : "time-sliced between their processes unless MPS runs") < 0);
}

void cb_record_start(const struct cb_ctx *ctx, const char *mpi_library)
{
    struct cb_json j;
    pthread_mutex_lock(&emit_lock);
    cb_json_init(&j);
    cb_json_begin_array(&j);
    for (int r = 0; r < ctx->nranks; r++)
        cb_json_string(&j, ctx->hosts[r]);
    cb_json_end_array(&j);
    hostnames_json = take(&j);

    /* Trailing newlines/blanks of MPI_Get_library_version are noise. */
    char library[CB_TEXT_MAX * 8];
    snprintf(library, sizeof library, "%s", mpi_library);
    for (size_t n = strlen(library);
         n && (library[n - 1] == '\n' || library[n - 1] == ' ' || library[n - 1] == '\t' || library[n - 1] == '\r');
         n--)
        library[n - 1] = '\0';
    cb_json_init(&j);
    cb_json_string(&j, library);
    mpi_library_json = take(&j);

    env_json = serialise_env();

    /* The batch allocation the run belongs to (rank 0's view): which rounds of a comparison shared one. */
    const char *job = getenv("SLURM_JOB_ID");
    if (job && *job) {
        cb_json_init(&j);
        cb_json_string(&j, job);
        slurm_job_json = take(&j);
    }
    rec_ctx = ctx;
    pthread_mutex_unlock(&emit_lock);
}

void cb_record_setup(const struct cb_device_info *devices, const struct cb_kv *versions, int nversions)
{
    struct cb_json j;
    pthread_mutex_lock(&emit_lock);
    if (devices) {
        describe_sharing(rec_ctx, devices);
    } else {
        cb_json_init(&j);
        cb_json_null(&j);
        devices_json = take(&j);
    }

    cb_json_init(&j);
    cb_json_begin_object(&j);
    for (int i = 0; i < nversions; i++)
        cb_json_kstring(&j, versions[i].key, versions[i].value);
    cb_json_end_object(&j);
    versions_json = take(&j);
    pthread_mutex_unlock(&emit_lock);
}

int cb_output_open(const char *path)
{
    if (!path)
        return CB_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        cb_errorf("cannot open --output %s: %s", path, strerror(errno));
        return CB_ERROR;
    }
    pthread_mutex_lock(&emit_lock);
    output_fd = fd;
    snprintf(output_path, sizeof output_path, "%s", path);
    pthread_mutex_unlock(&emit_lock);
    return CB_OK;
}

int cb_output_close(void)
{
    pthread_mutex_lock(&emit_lock);
    /* NFS reports a failed write here. A failed write was said when it happened: not again. */
    if (output_fd >= 0 && close(output_fd) != 0 && !output_failed) {
        output_failed = 1;
        output_errno = errno;
        fprintf(stderr, "commbench: writing --output %s failed (at close): %s; records are missing there\n",
                output_path, strerror(output_errno));
    }
    output_fd = -1;
    errno = 0;
    note_stdout(fflush(stdout) != 0 || ferror(stdout)); /* an error flag without a failed call seen: EIO */
    int rc = CB_OK;
    if (output_failed) {
        cb_errorf("writing --output %s failed: %s", output_path, strerror(output_errno));
        rc = CB_ERROR;
    } else if (stdout_errno) {
        cb_errorf("writing the table to standard output failed: %s", strerror(stdout_errno));
        rc = CB_ERROR;
    }
    pthread_mutex_unlock(&emit_lock);
    return rc;
}

/* One write per record with O_APPEND: a crash never leaves half a line from this process. A failed
 * or short write (a full disk) cuts the file back to where the record began, so no half line is
 * left, and stops the output for good: a later record must not follow a lost one as if none were
 * missing. The failure is said on stderr here, once; cb_output_close returns it, and the run exits
 * with code 4. Called with emit_lock held.
 *
 * Where the record began is known only after its bytes landed: O_APPEND puts every write at the end
 * of the file, after whatever another appender (a second commbench on the same file) wrote meanwhile,
 * and leaves the offset at the end of what it wrote. So a piece's start is the offset after it minus
 * its length; the record is cut back only where its pieces lie together and the file still ends with
 * them (fstat), never into someone else's record; otherwise its last line stays cut off, and the
 * message says so. (An appender between that fstat and the ftruncate remains possible: a window of
 * two system calls.) */
static void write_line(struct cb_json *j)
{
    if (output_fd < 0 || output_failed)
        return;
    char *p = j->buf;
    size_t len = j->len, done = 0;
    p[len++] = '\n'; /* put() always leaves room for the terminator */
    off_t start = -1, end = -1; /* where the record's bytes written so far lie (-1: unknown, as on a pipe) */
    int together = 1;           /* its pieces lie one after the other */
    while (done < len) {
        ssize_t n = write(output_fd, p + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            output_errno = n < 0 ? errno : EIO;
            break;
        }
        done += (size_t)n;
        if (done == len)
            return; /* the usual case, one whole write, costs no further call */
        off_t at = lseek(output_fd, 0, SEEK_CUR); /* a short write: where did this piece land? */
        if (at < (off_t)n)                        /* also -1: a pipe or FIFO */
            together = 0;
        else if (start < 0)
            start = at - (off_t)n;
        else if (at - (off_t)n != end)
            together = 0;
        end = at;
    }
    output_failed = 1;
    int cut = done == 0;
    struct stat st;
    if (!cut && together && start >= 0 && fstat(output_fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == end)
        cut = ftruncate(output_fd, start) == 0;
    fprintf(stderr, "commbench: writing --output %s failed: %s; no further records are written there%s\n", output_path,
            strerror(output_errno), cut ? "" : " (its last line is cut off)");
}

static const char *direction_name(enum cb_direction d)
{
    return d == CB_DIR_UNI ? "uni" : d == CB_DIR_BI ? "bi" : NULL;
}

static const char *host_memory_name(int space)
{
    return space == CB_HOST_PINNED ? "pinned" : space == CB_HOST_PAGEABLE ? "pageable" : NULL;
}

static const char *reason_name(enum cb_reason r)
{
    switch (r) {
    case CB_REASON_TIMEOUT: return "timeout";
    case CB_REASON_UNSUPPORTED: return "unsupported";
    case CB_REASON_VALIDATION: return "validation";
    case CB_REASON_RUNTIME: break;
    }
    return "runtime";
}

/* Called with emit_lock held, after cb_record_start. */
static void begin_record(struct cb_json *j, const char *kind, const char *op, const char *transport,
                         const struct cb_plan *plan, const struct cb_instance *inst)
{
    char stamp[40];
    cb_timestamp(stamp, sizeof stamp);
    cb_json_init(j);
    cb_json_begin_object(j);
    cb_json_kint(j, "schema_version", CB_SCHEMA_VERSION);
    cb_json_kstring(j, "kind", kind);
    cb_json_kstring(j, "commbench_version", CB_VERSION);
    cb_json_kstring(j, "timestamp", stamp);
    cb_json_kstring(j, "backend", rec_ctx->backend->name);
    cb_json_kstring(j, "op", op);
    cb_json_kstring(j, "transport", transport);
    if (plan) {
        cb_json_kint(j, "bytes", (long long)plan->bytes);
        cb_json_kint(j, "requested_bytes", (long long)plan->requested_bytes);
        cb_json_kint(j, "count", (long long)(plan->bytes / sizeof(float)));
        cb_json_kstring(j, "dtype", "float32");
    }
    if (inst) {
        if (inst->src >= 0) {
            cb_json_key(j, "pair");
            cb_json_begin_object(j);
            cb_json_kint(j, "src", inst->src);
            cb_json_kint(j, "dst", inst->dst);
            cb_json_end_object(j);
        }
        if (direction_name(inst->dir))
            cb_json_kstring(j, "direction", direction_name(inst->dir));
        if (host_memory_name(inst->host_memory))
            cb_json_kstring(j, "host_memory", host_memory_name(inst->host_memory));
    }
}

void cb_record_selection(const struct cb_selection_record *sel)
{
    pthread_mutex_lock(&emit_lock); /* the watchdog thread emits too */
    memset(&current_selection, 0, sizeof current_selection);
    if (sel) {
        current_sel = *sel->sel;
        current_selection = *sel;
        current_selection.sel = &current_sel;
        snprintf(current_reason, sizeof current_reason, "%s", sel->reason ? sel->reason : "");
        current_selection.reason = sel->reason ? current_reason : NULL;
        current_selection.nreported = sel->nreported < CB_MAX_REPORTED ? sel->nreported : CB_MAX_REPORTED;
        if (current_selection.nreported > 0)
            memcpy(current_reported, sel->reported, (size_t)current_selection.nreported * sizeof *current_reported);
        current_selection.reported = current_reported;
    }
    pthread_mutex_unlock(&emit_lock);
}

static const char *mechanism_name(enum cb_mechanism m)
{
    return m == CB_MECH_MPI_T ? "mpi_t" : m == CB_MECH_PLUGIN ? "plugin" : "process";
}

static void optional_int(struct cb_json *j, const char *key, int value)
{
    cb_json_key(j, key);
    if (value < 0)
        cb_json_null(j);
    else
        cb_json_int(j, value);
}

/* Called with emit_lock held. */
static void selection_json_locked(struct cb_json *j)
{
    const struct cb_selection *s = current_selection.sel;
    if (!s)
        return;
    cb_json_key(j, "selection");
    cb_json_begin_object(j);
    cb_json_kstring(j, "name", s->name);
    cb_json_kstring(j, "mechanism", mechanism_name(s->mechanism));
    cb_json_key(j, "cvar");
    if (s->cvar[0])
        cb_json_string(j, s->cvar);
    else
        cb_json_null(j);
    optional_int(j, "value", s->value);
    if (s->mechanism == CB_MECH_MPI_T)
        optional_int(j, "segsize", s->segsize);
    if (s->mechanism == CB_MECH_PLUGIN) {
        optional_int(j, "algorithm", s->algorithm);
        optional_int(j, "protocol", s->protocol);
        optional_int(j, "channels", s->channels);
    }
    if (current_selection.nreported > 0) {
        cb_json_key(j, "reported");
        cb_json_begin_object(j);
        for (int i = 0; i < current_selection.nreported; i++) {
            char *end;
            long long number = strtoll(current_reported[i].value, &end, 10);
            if (current_reported[i].value[0] && !*end)
                cb_json_kint(j, current_reported[i].key, number);
            else
                cb_json_kstring(j, current_reported[i].key, current_reported[i].value);
        }
        cb_json_end_object(j);
    }
    cb_json_kbool(j, "available", current_selection.available);
    if (current_selection.stopped_after > 0)
        cb_json_kint(j, "stopped_after", current_selection.stopped_after);
    cb_json_key(j, "reason");
    if (current_selection.reason)
        cb_json_string(j, current_selection.reason);
    else
        cb_json_null(j);
    cb_json_end_object(j);
}

/* Called with emit_lock held. */
static void end_record(struct cb_json *j)
{
    selection_json_locked(j);
    cb_json_kint(j, "ranks", rec_ctx->nranks);
    cb_json_kint(j, "nodes", rec_ctx->nnodes);
    cb_json_kraw(j, "hostnames", hostnames_json);
    cb_json_kraw(j, "mpi_library", mpi_library_json);
    if (devices_json) /* before cb_record_setup (a start-up timeout) they are not known yet */
        cb_json_kraw(j, "devices", devices_json);
    if (gpu_sharing_json)
        cb_json_kraw(j, "gpu_sharing", gpu_sharing_json);
    if (versions_json)
        cb_json_kraw(j, "versions", versions_json);
    cb_json_kraw(j, "env", env_json);
    if (slurm_job_json)
        cb_json_kraw(j, "slurm_job_id", slurm_job_json);
    cb_json_end_object(j);
}

static void table_header(void)
{
    if (table_header_done)
        return;
    table_header_done = 1;
    note_stdout(printf("# %-14s %-10s %12s %11s %-7s %-4s %-8s %11s %11s %11s %9s %9s %6s %s\n", "op", "transport",
                       "bytes", "count", "pair", "dir", "hostmem", "median_us", "min_us", "p95_us", "goodput", "busbw",
                       "wrong", "valid") < 0);
    note_stdout(printf("# %-14s %-10s %12s %11s %-7s %-4s %-8s %11s %11s %11s %9s %9s %6s\n", "", "", "(B)", "(elem)",
                       "", "", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "") < 0);
}

static void table_labels(const struct cb_instance *inst, char *pair, size_t len, const char **dir, const char **mem)
{
    snprintf(pair, len, "-");
    *dir = "-";
    *mem = "-";
    if (!inst)
        return;
    if (inst->src >= 0)
        snprintf(pair, len, "%d-%d", inst->src, inst->dst);
    if (direction_name(inst->dir))
        *dir = direction_name(inst->dir);
    if (host_memory_name(inst->host_memory))
        *mem = host_memory_name(inst->host_memory);
}

static void number_array(struct cb_json *j, const char *key, const double *values, int n)
{
    cb_json_key(j, key);
    cb_json_begin_array(j);
    for (int i = 0; i < n; i++)
        cb_json_number(j, values[i]);
    cb_json_end_array(j);
}

static void int_array(struct cb_json *j, const char *key, const int *values, int n)
{
    cb_json_key(j, key);
    cb_json_begin_array(j);
    for (int i = 0; i < n; i++)
        cb_json_int(j, values[i]);
    cb_json_end_array(j);
}

/* Per iteration the slowest rank and its excess over the median rank; per rank (hostnames[rank] is
 * its host) the median and p95 of its own time and how often it was the slowest. */
static void attribution_json(struct cb_json *j, const struct cb_rank_attribution *a)
{
    int_array(j, "slowest_rank", a->slowest_rank, a->iters);
    number_array(j, "slowest_excess_us", a->excess_us, a->iters);
    cb_json_key(j, "per_rank");
    cb_json_begin_object(j);
    number_array(j, "median_us", a->rank_median_us, a->nranks);
    number_array(j, "p95_us", a->rank_p95_us, a->nranks);
    int_array(j, "slowest_iterations", a->slowest_count, a->nranks);
    cb_json_end_object(j);
}

void cb_emit_result(const struct cb_result *r)
{
    struct cb_json j;
    int valid = !r->check || r->wrong == 0;
    pthread_mutex_lock(&emit_lock);
    if (!rec_ctx) {
        pthread_mutex_unlock(&emit_lock);
        return;
    }
    begin_record(&j, "result", r->op, r->transport, r->plan, r->inst);
    cb_json_kint(&j, "iters", r->iters);
    cb_json_kint(&j, "warmup", r->warmup);
    cb_json_kint(&j, "batch", r->batch);
    cb_json_key(&j, "samples_us");
    cb_json_begin_array(&j);
    for (int i = 0; i < r->iters; i++)
        cb_json_number(&j, r->samples_us[i]);
    cb_json_end_array(&j);
    cb_json_key(&j, "stats");
    cb_json_begin_object(&j);
    cb_json_knumber(&j, "min_us", r->stats.min);
    cb_json_knumber(&j, "median_us", r->stats.median);
    cb_json_knumber(&j, "mean_us", r->stats.mean);
    cb_json_knumber(&j, "p95_us", r->stats.p95);
    cb_json_knumber(&j, "max_us", r->stats.max);
    cb_json_knumber(&j, "stdev_us", r->stats.stdev);
    cb_json_end_object(&j);
    cb_json_knumber(&j, "latency_us", r->latency_us);
    cb_json_knumber(&j, "goodput_gbs", r->goodput_gbs);
    cb_json_knumber(&j, "algbw_gbs", r->algbw_gbs);
    cb_json_knumber(&j, "busbw_gbs", r->busbw_gbs);
    cb_json_knumber(&j, "busbw_factor", r->busbw_factor);
    if (r->inst && r->inst->dir == CB_DIR_BI)
        cb_json_knumber(&j, "aggregate_gbs", r->aggregate_gbs);
    cb_json_kbool(&j, "valid", valid);
    cb_json_kbool(&j, "check", r->check);
    cb_json_kint(&j, "wrong_elements", (long long)r->wrong);
    if (r->rounds) {
        cb_json_kint(&j, "rounds", r->rounds);
        cb_json_key(&j, "round_medians");
        cb_json_begin_array(&j);
        for (int i = 0; i < r->rounds; i++)
            cb_json_number(&j, r->round_medians[i]);
        cb_json_end_array(&j);
    }
    if (r->attribution)
        attribution_json(&j, r->attribution);
    cb_json_key(&j, "error");
    cb_json_null(&j);
    cb_json_key(&j, "reason");
    if (valid)
        cb_json_null(&j);
    else
        cb_json_string(&j, "validation");
    end_record(&j);

    char pair[32];
    const char *dir, *mem;
    table_labels(r->inst, pair, sizeof pair, &dir, &mem);
    write_line(&j);
    table_header();
    note_stdout(printf("  %-14s %-10s %12zu %11zu %-7s %-4s %-8s %11.2f %11.2f %11.2f %9.3f %9.3f %6llu %s%s%s\n",
                       r->op, r->transport, r->plan->bytes, r->plan->bytes / sizeof(float), pair, dir, mem,
                       r->stats.median, r->stats.min, r->stats.p95, r->goodput_gbs, r->busbw_gbs,
                       (unsigned long long)r->wrong,
                       !r->check ? "unchecked"
                       : valid   ? "ok"
                                 : "WRONG",
                       current_selection.sel ? " selection=" : "",
                       current_selection.sel ? current_selection.sel->name : "") < 0);
    note_stdout(fflush(stdout) != 0);
    pthread_mutex_unlock(&emit_lock);
    cb_json_free(&j);
}

void cb_emit_error(const char *op, const char *transport, const struct cb_plan *plan, const struct cb_instance *inst,
                   enum cb_reason reason, const char *message)
{
    struct cb_json j;
    pthread_mutex_lock(&emit_lock);
    if (!rec_ctx) { /* before cb_record_start (the watchdog during --list-cvars): stderr says it all */
        pthread_mutex_unlock(&emit_lock);
        return;
    }
    begin_record(&j, "error", op, transport, plan, inst);
    cb_json_kbool(&j, "valid", 0);
    cb_json_kstring(&j, "error", message);
    cb_json_kstring(&j, "reason", reason_name(reason));
    end_record(&j);

    char pair[32], bytes[24];
    const char *dir, *mem;
    table_labels(inst, pair, sizeof pair, &dir, &mem);
    if (plan)
        snprintf(bytes, sizeof bytes, "%zu", plan->bytes);
    else
        snprintf(bytes, sizeof bytes, "-");
    write_line(&j);
    table_header();
    note_stdout(printf("  %-14s %-10s %12s %11s %-7s %-4s %-8s ERROR (%s): %s\n", op, transport, bytes, "", pair, dir,
                       mem, reason_name(reason), message) < 0);
    note_stdout(fflush(stdout) != 0);
    pthread_mutex_unlock(&emit_lock);
    cb_json_free(&j);
}
