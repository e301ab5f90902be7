/* Minimal streaming JSON writer into a growing buffer (one JSON Lines record at a time). */
#ifndef COMMBENCH_JSON_H
#define COMMBENCH_JSON_H

#include <stddef.h>
#include <stdint.h>

#define CB_JSON_MAX_DEPTH 16

struct cb_json {
    char *buf;
    size_t len, cap;
    int depth;
    unsigned char has_items[CB_JSON_MAX_DEPTH];
    int after_key;
};

void cb_json_init(struct cb_json *j);
void cb_json_free(struct cb_json *j);
void cb_json_begin_object(struct cb_json *j);
void cb_json_end_object(struct cb_json *j);
void cb_json_begin_array(struct cb_json *j);
void cb_json_end_array(struct cb_json *j);
void cb_json_key(struct cb_json *j, const char *key);
/* Escapes per RFC 8259; bytes that are not valid UTF-8 become U+FFFD. */
void cb_json_string(struct cb_json *j, const char *s);
void cb_json_number(struct cb_json *j, double v); /* non-finite values become null */
void cb_json_int(struct cb_json *j, long long v);
void cb_json_uint(struct cb_json *j, unsigned long long v);
void cb_json_bool(struct cb_json *j, int v);
void cb_json_null(struct cb_json *j);
/* key + value shorthands */
void cb_json_kstring(struct cb_json *j, const char *key, const char *s);
void cb_json_knumber(struct cb_json *j, const char *key, double v);
void cb_json_kint(struct cb_json *j, const char *key, long long v);
void cb_json_kbool(struct cb_json *j, const char *key, int v);
/* key + an already-serialised JSON value */
void cb_json_kraw(struct cb_json *j, const char *key, const char *json_value);

#endif
