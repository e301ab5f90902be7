/* MPI tool information interface (MPI_T) control variables: the one place commbench reads,
 * writes and lists them (--list-cvars, --selections). --list-cvars lists before MPI_Init, when Open MPI
 * has every component's variables registered; MPI_Init deregisters those of the components it closes. */
#ifndef COMMBENCH_MPIT_H
#define COMMBENCH_MPIT_H

#include <stdio.h>

#define CB_CVAR_NAME_MAX 128
#define CB_CVAR_ENUM_MAX 32

struct cb_cvar_item {
    int value;
    char name[64];
};

/* One control variable as MPI_T describes it. */
struct cb_cvar {
    int index;
    char name[CB_CVAR_NAME_MAX];
    const char *type;  /* "int", "unsigned", "unsigned_long", "unsigned_long_long", "count", "char", "double", ... */
    const char *scope; /* "constant", "readonly", "local", "group", "group_eq", "all", "all_eq" */
    int bound;         /* bound to an MPI object: no value without one */
    int nitems;        /* enum items; 0 when the variable is not an enumeration */
    struct cb_cvar_item items[CB_CVAR_ENUM_MAX];
    /* Where the items come from: "mpi_t" (MPI_T_enum_get_item), "description" (MPICH registers
     * its enumerations as plain ints and lists the choices, value 0, 1, ... in order, in the
     * variable's description), or NULL (not an enumeration). */
    const char *items_from;
};

/* MPI_T_init_thread once per process; CB_OK or CB_ERROR + cb_errorf. */
int cb_mpit_init(void);
void cb_mpit_finalize(void);
int cb_mpit_count(void);
/* Describes variable index; CB_OK or CB_ERROR + cb_errorf. */
int cb_mpit_describe(int index, struct cb_cvar *out);
/* Looks a variable up by exact name; CB_OK, or CB_UNSUPPORTED when this library has none. */
int cb_mpit_find(const char *name, struct cb_cvar *out);
/* Integer-valued (int/unsigned/enum), unbound variables only; CB_OK or CB_ERROR + cb_errorf. */
int cb_mpit_read_int(const struct cb_cvar *cvar, int *value);
int cb_mpit_write_int(const struct cb_cvar *cvar, int value);
/* 1 when value is one of the variable's enum items (always 1 for non-enums). */
int cb_cvar_accepts(const struct cb_cvar *cvar, int value);
/* One JSON object per line for every variable whose name starts with prefix (NULL: all):
 * name, type, scope, bound, enum (value/name items or null), value (current, or null). */
int cb_mpit_list_json(const char *prefix, FILE *out);

#endif
