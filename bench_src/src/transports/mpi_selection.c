/* Selection sweep of the mpi transport through MPI_T control variables (mpit.h):
 * - Open MPI coll_tuned: coll_tuned_<coll>_algorithm, read when a communicator is created, so
 *   every selection runs on a fresh MPI_Comm_dup made while the variable holds its value; only
 *   honoured with coll_tuned_use_dynamic_rules=1, which MPI_T cannot set (scope readonly).
 * - MPICH: MPIR_CVAR_<COLL>_INTRA_ALGORITHM, read at every call; valid values are the items of
 *   the variable's enumeration, never anything else (an out-of-range value makes MPICH 4.0.2
 *   abort in src/mpi/coll/mpir_coll.c).
 * Value 0 is the library's own choice in both ("ignore" / "auto").
 * Open MPI's algorithms that take a segment size are also swept with a few segment sizes, through
 * coll_tuned_<coll>_algorithm_segmentsize (read with the algorithm when a communicator is created).
 * What the library reports it used: each variable's value read back right after the write. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm.h"
#include "../mpit.h"
#include "mpi.h"

struct library {
    const char *cvar_format; /* %s: the collective, in the library's spelling */
    int uppercase;
    int fresh_comm;
};

static const struct library open_mpi = {"coll_tuned_%s_algorithm", 0, 1};
static const struct library mpich = {"MPIR_CVAR_%s_INTRA_ALGORITHM", 1, 0};

/* The MPI collective the op calls (reduce_scatter: MPI_Reduce_scatter_block), or NULL. */
static const char *collective_of(const struct cb_op *op)
{
    switch (op->needs) {
    case CB_CAP_ALLREDUCE: return "allreduce";
    case CB_CAP_ALLGATHER: return "allgather";
    case CB_CAP_ALLTOALL: return "alltoall";
    case CB_CAP_BCAST: return "bcast";
    case CB_CAP_REDUCE_SCATTER: return "reduce_scatter_block";
    default: return NULL;
    }
}

static void cvar_name(const struct library *lib, const char *coll, char *out, size_t len)
{
    char spelled[64];
    size_t i = 0;
    for (; coll[i] && i + 1 < sizeof spelled; i++)
        spelled[i] = lib->uppercase ? (char)toupper((unsigned char)coll[i]) : coll[i];
    spelled[i] = '\0';
    snprintf(out, len, lib->cvar_format, spelled);
}

/* The library whose variable for op exists, with that variable; NULL + cb_errorf when none. */
static const struct library *find_library(const struct cb_op *op, struct cb_cvar *cvar)
{
    const char *coll = collective_of(op);
    if (!coll) {
        cb_errorf("op %s is not a collective", op->name);
        return NULL;
    }
    if (cb_mpit_init() != CB_OK)
        return NULL;
    const struct library *libs[] = {&open_mpi, &mpich};
    char names[2][CB_CVAR_NAME_MAX];
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        cvar_name(libs[i], coll, names[i], sizeof names[i]);
        if (cb_mpit_find(names[i], cvar) == CB_OK && cvar->nitems > 0)
            return libs[i];
    }
    cb_errorf("this MPI library has no MPI_T enumeration %s (Open MPI coll_tuned) or %s (MPICH)", names[0], names[1]);
    return NULL;
}

static int dynamic_rules_on(void)
{
    struct cb_cvar rules;
    int on = 0;
    if (cb_mpit_find("coll_tuned_use_dynamic_rules", &rules) != CB_OK || cb_mpit_read_int(&rules, &on) != CB_OK)
        return -1;
    return on;
}

/* Open MPI 4.1.4 coll_tuned algorithms that pass coll_tuned_<coll>_algorithm_segmentsize on
 * (the segsize argument of ompi_coll_tuned_<coll>_intra_do_this, coll_tuned_<coll>_decision.c at
 * v4.1.4); the alltoall, allgather and reduce_scatter_block algorithms ignore it. */
static const struct {
    const char *coll;
    const char *algorithms[9];
} segmented[] = {
    {"allreduce", {"segmented_ring"}},
    {"bcast", {"chain", "pipeline", "split_binary_tree", "binary_tree", "binomial", "knomial", "scatter_allgather",
               "scatter_allgather_ring"}},
};

/* Segment sizes (bytes) swept besides the variable's default 0 (no segmenting). */
static const int swept_segsizes[] = {8192, 32768, 131072};

static int takes_segsize(const char *coll, const char *algorithm)
{
    for (size_t i = 0; i < sizeof segmented / sizeof segmented[0]; i++)
        for (size_t k = 0; strcmp(segmented[i].coll, coll) == 0 && k < 9 && segmented[i].algorithms[k]; k++)
            if (strcmp(segmented[i].algorithms[k], algorithm) == 0)
                return 1;
    return 0;
}

/* The segment-size variable of an algorithm variable, when it can be written at run time. */
static int find_segsize_cvar(const struct cb_cvar *algorithm, struct cb_cvar *out)
{
    char name[CB_CVAR_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s_segmentsize", algorithm->name);
    return cb_mpit_find(name, out) == CB_OK && strcmp(out->type, "int") == 0 && strcmp(out->scope, "all") == 0 &&
                   !out->bound
               ? CB_OK
               : CB_UNSUPPORTED;
}

static void set_selection(struct cb_selection *s, const struct cb_cvar *cvar, const struct cb_cvar_item *item,
                          int segsize)
{
    memset(s, 0, sizeof *s);
    if (item->value == 0)
        snprintf(s->name, sizeof s->name, "own");
    else if (segsize >= 0)
        /* %.48s: a name, "/seg" and any int fit the 64 bytes (gcc 13 -Wformat-truncation; names are < 30) */
        snprintf(s->name, sizeof s->name, "%.48s/seg%d", item->name, segsize);
    else
        snprintf(s->name, sizeof s->name, "%s", item->name);
    s->mechanism = CB_MECH_MPI_T;
    snprintf(s->cvar, sizeof s->cvar, "%s", cvar->name);
    s->value = item->value;
    s->segsize = segsize;
    s->algorithm = s->protocol = s->channels = -1;
}

int cb_mpi_selections(void *state, const struct cb_op *op, struct cb_selection *out, int max)
{
    (void)state;
    struct cb_cvar cvar, segsize_cvar;
    const struct library *lib = find_library(op, &cvar);
    if (!lib)
        return 0;
    if (lib == &open_mpi && dynamic_rules_on() != 1) {
        cb_errorf("Open MPI applies %s at run time only with coll_tuned_use_dynamic_rules=1, which MPI_T cannot "
                  "set: export OMPI_MCA_coll_tuned_use_dynamic_rules=1 (mpirun -x) for --selections",
                  cvar.name);
        return -1;
    }
    if (!cb_cvar_accepts(&cvar, 0)) {
        cb_errorf("%s has no value 0 (the library's own choice) in its enumeration", cvar.name);
        return -1;
    }
    int segments = lib == &open_mpi && find_segsize_cvar(&cvar, &segsize_cvar) == CB_OK;
    int n = 0;
    for (int own = 1; own >= 0; own--) /* own first */
        for (int i = 0; i < cvar.nitems && n < max; i++) {
            if ((cvar.items[i].value == 0) != own)
                continue;
            set_selection(&out[n++], &cvar, &cvar.items[i], -1);
            if (!segments || own || !takes_segsize(collective_of(op), cvar.items[i].name))
                continue;
            for (size_t k = 0; k < sizeof swept_segsizes / sizeof swept_segsizes[0] && n < max; k++)
                set_selection(&out[n++], &cvar, &cvar.items[i], swept_segsizes[k]);
        }
    return n;
}

/* Writes value to cvar and reads it back into readback (key: what). */
static int write_read_back(const struct cb_cvar *cvar, int value, const char *what, struct cb_kv *readback)
{
    int now = -1;
    int rc = cb_mpit_write_int(cvar, value);
    if (rc == CB_OK)
        rc = cb_mpit_read_int(cvar, &now);
    if (rc == CB_OK && now != value) {
        cb_errorf("%s reads %d after writing %d", cvar->name, now, value);
        rc = CB_ERROR;
    }
    snprintf(readback->key, sizeof readback->key, "%s", what);
    snprintf(readback->value, sizeof readback->value, "%d", now);
    return rc;
}

/* The communicator of (cvar, value, segsize), made on first use: MPI_Comm_dup while the variables
 * hold the values, which go back to 0 right after (the forced choice lives on in that communicator
 * only). Kept until select(NULL), so rounds and sizes reuse it. */
static int selection_comm(struct cb_mpi_bufs *b, const struct cb_cvar *cvar, int value, int segsize)
{
    for (int i = 0; i < b->nselection_comms; i++) {
        struct cb_mpi_selection_comm *known = &b->selection_comms[i];
        if (known->value == value && known->segsize == segsize && strcmp(known->cvar, cvar->name) == 0) {
            b->comm = known->comm;
            memcpy(b->reported, known->readback, sizeof known->readback);
            b->nreported = known->nreadback;
            return CB_OK;
        }
    }
    struct cb_mpi_selection_comm *grown =
        realloc(b->selection_comms, (size_t)(b->nselection_comms + 1) * sizeof *grown);
    if (!grown) {
        cb_errorf("out of memory for selection communicators");
        return CB_ERROR;
    }
    b->selection_comms = grown;
    struct cb_mpi_selection_comm *made = &grown[b->nselection_comms];
    memset(made, 0, sizeof *made);
    struct cb_cvar segsize_cvar;
    int rc = write_read_back(cvar, value, "cvar_readback", &made->readback[made->nreadback++]);
    if (rc == CB_OK && segsize >= 0) {
        rc = find_segsize_cvar(cvar, &segsize_cvar);
        if (rc == CB_OK)
            rc = write_read_back(&segsize_cvar, segsize, "segsize_readback", &made->readback[made->nreadback++]);
    }
    if (rc == CB_OK)
        rc = cb_mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &made->comm), "MPI_Comm_dup");
    int back = cb_mpit_write_int(cvar, 0);
    if (segsize >= 0 && find_segsize_cvar(cvar, &segsize_cvar) == CB_OK && cb_mpit_write_int(&segsize_cvar, 0))
        back = CB_ERROR;
    /* A forced algorithm that does not apply returns MPI_ERR_UNSUPPORTED_OPERATION (Open MPI's
     * two_proc algorithms on more than 2 ranks): recorded as unavailable, not fatal. */
    if (rc == CB_OK)
        rc = cb_mpi_check(MPI_Comm_set_errhandler(made->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    rc = rc ? rc : back;
    if (rc != CB_OK)
        return rc;
    snprintf(made->cvar, sizeof made->cvar, "%s", cvar->name);
    made->value = value;
    made->segsize = segsize;
    b->nselection_comms++;
    b->comm = made->comm;
    memcpy(b->reported, made->readback, sizeof made->readback);
    b->nreported = made->nreadback;
    return CB_OK;
}

int cb_mpi_select(void *state, const struct cb_op *op, const struct cb_selection *sel)
{
    struct cb_mpi_bufs *b = state;
    b->comm = MPI_COMM_WORLD;
    b->nreported = 0;
    if (!sel) {
        for (int i = 0; i < b->nselection_comms; i++)
            MPI_Comm_free(&b->selection_comms[i].comm);
        free(b->selection_comms);
        b->selection_comms = NULL;
        b->nselection_comms = 0;
    }
    if (!op)
        return CB_OK;
    struct cb_cvar cvar;
    const struct library *lib = find_library(op, &cvar);
    if (!lib)
        return CB_ERROR;
    int value = sel ? sel->value : 0, segsize = sel ? sel->segsize : -1;
    if (lib->fresh_comm && value)
        return selection_comm(b, &cvar, value, segsize);
    int rc = write_read_back(&cvar, value, "cvar_readback", &b->reported[0]);
    b->nreported = 1;
    return rc;
}

int cb_mpi_reported(void *state, struct cb_kv *out, int max)
{
    const struct cb_mpi_bufs *b = state;
    int n = b->nreported < max ? b->nreported : max;
    memcpy(out, b->reported, (size_t)n * sizeof *out);
    return n;
}
