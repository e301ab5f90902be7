#include "mpit.h"

#include <ctype.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "commbench.h"
#include "json.h"

static int mpit_ready;

static int mpit_check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return CB_OK;
    cb_errorf("%s failed (MPI_T error %d)", what, rc);
    return CB_ERROR;
}

int cb_mpit_init(void)
{
    int provided;
    if (mpit_ready)
        return CB_OK;
    int rc = mpit_check(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), "MPI_T_init_thread");
    mpit_ready = rc == CB_OK;
    return rc;
}

void cb_mpit_finalize(void)
{
    if (mpit_ready)
        MPI_T_finalize();
    mpit_ready = 0;
}

int cb_mpit_count(void)
{
    int n = 0;
    if (MPI_T_cvar_get_num(&n) != MPI_SUCCESS)
        return 0;
    return n;
}

static const char *type_name(MPI_Datatype t)
{
    if (t == MPI_INT)
        return "int";
    if (t == MPI_UNSIGNED)
        return "unsigned";
    if (t == MPI_UNSIGNED_LONG)
        return "unsigned_long";
    if (t == MPI_UNSIGNED_LONG_LONG)
        return "unsigned_long_long";
    if (t == MPI_COUNT)
        return "count";
    if (t == MPI_CHAR)
        return "char";
    if (t == MPI_DOUBLE)
        return "double";
    if (t == MPI_C_BOOL)
        return "bool";
    return "other";
}

static const char *scope_name(int scope)
{
    switch (scope) {
    case MPI_T_SCOPE_CONSTANT: return "constant";
    case MPI_T_SCOPE_READONLY: return "readonly";
    case MPI_T_SCOPE_LOCAL: return "local";
    case MPI_T_SCOPE_GROUP: return "group";
    case MPI_T_SCOPE_GROUP_EQ: return "group_eq";
    case MPI_T_SCOPE_ALL: return "all";
    case MPI_T_SCOPE_ALL_EQ: return "all_eq";
    default: return "other";
    }
}

static int describe_enum(MPI_T_enum enumtype, struct cb_cvar *out)
{
    char ename[64];
    int n = 0, len = (int)sizeof ename;
    if (mpit_check(MPI_T_enum_get_info(enumtype, &n, ename, &len), "MPI_T_enum_get_info"))
        return CB_ERROR;
    if (n > CB_CVAR_ENUM_MAX) {
        cb_errorf("%s: %d enum items, more than %d", out->name, n, CB_CVAR_ENUM_MAX);
        return CB_ERROR;
    }
    for (int i = 0; i < n; i++) {
        struct cb_cvar_item *item = &out->items[i];
        len = (int)sizeof item->name;
        if (mpit_check(MPI_T_enum_get_item(enumtype, i, &item->value, item->name, &len), "MPI_T_enum_get_item"))
            return CB_ERROR;
    }
    out->nitems = n;
    out->items_from = "mpi_t";
    return CB_OK;
}

static int name_char(char c)
{
    return islower((unsigned char)c) || isdigit((unsigned char)c) || c == '_';
}

/* MPICH 4.0 generates its enum cvars (MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM, ...) from a description
 * "Variable to select ...\n<name><pad> - <text>\n...": the C enum's values are the names' order,
 * from 0 (e.g. mpich-4.0.2 src/include/mpir_cvars.h, enum ALLREDUCE_INTRA_ALGORITHM_choice). MPI_T
 * returns that description with the newlines removed, so each name is glued to the text before
 * it. The names are padded to one width, which tells where each begins: width = the smallest
 * (name characters + blanks) before a " - " among the items padded with 2 or more blanks (the
 * longest name has 1 blank and may be glued), except a first item "auto" with 1 blank: the
 * library's own choice, which MPICH does not pad. Anything else that does not fit gives no items: never a guess. */
static void describe_items_from_text(const char *desc, struct cb_cvar *out)
{
    int n = 0, token_len[CB_CVAR_ENUM_MAX], blanks[CB_CVAR_ENUM_MAX], width = 0;
    const char *token[CB_CVAR_ENUM_MAX];
    for (const char *p = strstr(desc, " - "); p; p = strstr(p + 3, " - ")) {
        const char *end = p + 1;
        while (end > desc && end[-1] == ' ')
            end--;
        const char *start = end;
        while (start > desc && name_char(start[-1]))
            start--;
        if (start == end || n == CB_CVAR_ENUM_MAX)
            return;
        token[n] = start;
        token_len[n] = (int)(end - start);
        blanks[n] = (int)(p + 1 - end);
        if (blanks[n] >= 2 && (!width || token_len[n] + blanks[n] < width))
            width = token_len[n] + blanks[n];
        n++;
    }
    if (n < 2 || !width)
        return;
    for (int i = 0; i < n; i++) {
        int len = width - blanks[i];
        if (i == 0 && blanks[0] == 1 && token_len[0] >= 4 && strncmp(token[0] + token_len[0] - 4, "auto", 4) == 0)
            len = 4;
        else if (len > token_len[i] || len <= 0)
            return;
        const char *name = token[i] + token_len[i] - len;
        out->items[i].value = i;
        snprintf(out->items[i].name, sizeof out->items[i].name, "%.*s", len, name);
    }
    out->nitems = n;
    out->items_from = "description";
}

int cb_mpit_describe(int index, struct cb_cvar *out)
{
    int name_len = CB_CVAR_NAME_MAX, desc_len = 8192, verbosity, bind, scope;
    char desc[8192] = "";
    MPI_Datatype type;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    memset(out, 0, sizeof *out);
    out->index = index;
    int rc = MPI_T_cvar_get_info(index, out->name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len, &bind,
                                 &scope);
    if (rc == MPI_T_ERR_INVALID_INDEX) { /* Open MPI keeps the indices of variables it deregistered */
        cb_errorf("control variable %d no longer exists", index);
        return CB_UNSUPPORTED;
    }
    if (mpit_check(rc, "MPI_T_cvar_get_info"))
        return CB_ERROR;
    out->type = type_name(type);
    out->scope = scope_name(scope);
    out->bound = bind != MPI_T_BIND_NO_OBJECT;
    if (enumtype != MPI_T_ENUM_NULL)
        return describe_enum(enumtype, out);
    if (type == MPI_INT && strncmp(out->name, "MPIR_CVAR_", 10) == 0)
        describe_items_from_text(desc, out);
    return CB_OK;
}

int cb_mpit_find(const char *name, struct cb_cvar *out)
{
    int index;
    if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS) {
        cb_errorf("this MPI library has no control variable %s", name);
        return CB_UNSUPPORTED;
    }
    return cb_mpit_describe(index, out);
}

static int is_integer(const struct cb_cvar *cvar)
{
    return strcmp(cvar->type, "int") == 0 || strcmp(cvar->type, "unsigned") == 0 || strcmp(cvar->type, "bool") == 0;
}

/* Runs op (read or write) on an integer, unbound variable through a temporary handle. */
static int access_int(const struct cb_cvar *cvar, int *value, int write)
{
    if (!is_integer(cvar) || cvar->bound) {
        cb_errorf("%s is not an unbound integer control variable (type %s)", cvar->name, cvar->type);
        return CB_ERROR;
    }
    MPI_T_cvar_handle handle;
    int count = 0;
    if (mpit_check(MPI_T_cvar_handle_alloc(cvar->index, NULL, &handle, &count), "MPI_T_cvar_handle_alloc"))
        return CB_ERROR;
    int rc;
    if (strcmp(cvar->type, "bool") == 0) {
        bool flag = *value != 0;
        rc = write ? MPI_T_cvar_write(handle, &flag) : MPI_T_cvar_read(handle, &flag);
        *value = flag;
    } else {
        rc = write ? MPI_T_cvar_write(handle, value) : MPI_T_cvar_read(handle, value);
    }
    MPI_T_cvar_handle_free(&handle);
    if (rc != MPI_SUCCESS) {
        cb_errorf("MPI_T_cvar_%s %s failed (MPI_T error %d%s)", write ? "write" : "read", cvar->name, rc,
                  rc == MPI_T_ERR_CVAR_SET_NEVER ? ": cannot be set at run time" : "");
        return CB_ERROR;
    }
    return CB_OK;
}

int cb_mpit_read_int(const struct cb_cvar *cvar, int *value)
{
    return access_int(cvar, value, 0);
}

int cb_mpit_write_int(const struct cb_cvar *cvar, int value)
{
    if (!cb_cvar_accepts(cvar, value)) {
        cb_errorf("%d is not a value of %s's enumeration", value, cvar->name);
        return CB_ERROR;
    }
    return access_int(cvar, &value, 1);
}

int cb_cvar_accepts(const struct cb_cvar *cvar, int value)
{
    for (int i = 0; i < cvar->nitems; i++)
        if (cvar->items[i].value == value)
            return 1;
    return cvar->nitems == 0;
}

/* The current value as JSON, or null where it cannot be read without an MPI object. */
static void value_json(struct cb_json *j, const struct cb_cvar *cvar)
{
    MPI_T_cvar_handle handle;
    int count = 0;
    union {
        int i;
        unsigned u;
        unsigned long ul;
        unsigned long long ull;
        MPI_Count c;
        double d;
        bool b;
        char text[4096];
    } v;
    memset(&v, 0, sizeof v);
    if (cvar->bound || strcmp(cvar->type, "other") == 0 ||
        MPI_T_cvar_handle_alloc(cvar->index, NULL, &handle, &count) != MPI_SUCCESS) {
        cb_json_null(j);
        return;
    }
    int ok = (strcmp(cvar->type, "char") == 0 ? count < (int)sizeof v.text : count == 1) &&
             MPI_T_cvar_read(handle, &v) == MPI_SUCCESS;
    MPI_T_cvar_handle_free(&handle);
    if (!ok)
        cb_json_null(j);
    else if (strcmp(cvar->type, "int") == 0)
        cb_json_int(j, v.i);
    else if (strcmp(cvar->type, "unsigned") == 0)
        cb_json_uint(j, v.u);
    else if (strcmp(cvar->type, "unsigned_long") == 0)
        cb_json_uint(j, v.ul);
    else if (strcmp(cvar->type, "unsigned_long_long") == 0)
        cb_json_uint(j, v.ull);
    else if (strcmp(cvar->type, "count") == 0)
        cb_json_int(j, (long long)v.c); /* MPI_Count is signed */
    else if (strcmp(cvar->type, "double") == 0)
        cb_json_number(j, v.d);
    else if (strcmp(cvar->type, "bool") == 0)
        cb_json_bool(j, v.b);
    else
        cb_json_string(j, v.text);
}

int cb_mpit_list_json(const char *prefix, FILE *out)
{
    int n = cb_mpit_count();
    for (int i = 0; i < n; i++) {
        struct cb_cvar cvar;
        int rc = cb_mpit_describe(i, &cvar);
        if (rc == CB_UNSUPPORTED)
            continue;
        if (rc != CB_OK)
            return CB_ERROR;
        if (prefix && strncmp(cvar.name, prefix, strlen(prefix)) != 0)
            continue;
        struct cb_json j;
        cb_json_init(&j);
        cb_json_begin_object(&j);
        cb_json_kstring(&j, "name", cvar.name);
        cb_json_kstring(&j, "type", cvar.type);
        cb_json_kstring(&j, "scope", cvar.scope);
        cb_json_kbool(&j, "bound", cvar.bound);
        cb_json_key(&j, "enum_from");
        if (cvar.items_from)
            cb_json_string(&j, cvar.items_from);
        else
            cb_json_null(&j);
        cb_json_key(&j, "enum");
        if (cvar.nitems) {
            cb_json_begin_array(&j);
            for (int k = 0; k < cvar.nitems; k++) {
                cb_json_begin_object(&j);
                cb_json_kint(&j, "value", cvar.items[k].value);
                cb_json_kstring(&j, "name", cvar.items[k].name);
                cb_json_end_object(&j);
            }
            cb_json_end_array(&j);
        } else {
            cb_json_null(&j);
        }
        cb_json_key(&j, "value");
        value_json(&j, &cvar);
        cb_json_end_object(&j);
        fprintf(out, "%s\n", j.buf);
        cb_json_free(&j);
    }
    return CB_OK;
}
