#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cb_json_init(struct cb_json *j)
{
    memset(j, 0, sizeof *j);
}

void cb_json_free(struct cb_json *j)
{
    free(j->buf);
    memset(j, 0, sizeof *j);
}

static void put(struct cb_json *j, const char *s, size_t n)
{
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 1024;
        while (cap < j->len + n + 1)
            cap *= 2;
        char *grown = realloc(j->buf, cap);
        if (!grown)
            abort(); /* a record is a few KiB; out of memory here is not recoverable */
        j->buf = grown;
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static void puts_(struct cb_json *j, const char *s)
{
    put(j, s, strlen(s));
}

/* Separator before a value or key in the current container. */
static void begin_item(struct cb_json *j)
{
    if (j->after_key) {
        j->after_key = 0;
        return;
    }
    if (j->depth > 0) {
        if (j->has_items[j->depth - 1])
            put(j, ",", 1);
        j->has_items[j->depth - 1] = 1;
    }
}

static void open_container(struct cb_json *j, const char *bracket)
{
    begin_item(j);
    puts_(j, bracket);
    if (j->depth == CB_JSON_MAX_DEPTH)
        abort();
    j->has_items[j->depth++] = 0;
}

void cb_json_begin_object(struct cb_json *j)
{
    open_container(j, "{");
}
void cb_json_begin_array(struct cb_json *j)
{
    open_container(j, "[");
}

void cb_json_end_object(struct cb_json *j)
{
    j->depth--;
    puts_(j, "}");
}

void cb_json_end_array(struct cb_json *j)
{
    j->depth--;
    puts_(j, "]");
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static size_t utf8_sequence(const unsigned char *s)
{
    unsigned char c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0) {
        n = 2;
        cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        n = 3;
        cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        n = 4;
        cp = c & 0x07;
    } else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0; /* overlong, out of range, or a surrogate */
    return n;
}

void cb_json_string(struct cb_json *j, const char *s)
{
    begin_item(j);
    put(j, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char c = *p;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(j, esc, 2);
            p++;
        } else if (c < 0x20) {
            const char *named = c == '\n'   ? "\\n"
                                : c == '\t' ? "\\t"
                                : c == '\r' ? "\\r"
                                : c == '\b' ? "\\b"
                                : c == '\f' ? "\\f"
                                            : NULL;
            if (named)
                puts_(j, named);
            else {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                puts_(j, esc);
            }
            p++;
        } else {
            size_t n = utf8_sequence(p);
            if (n) {
                put(j, (const char *)p, n);
                p += n;
            } else {
                puts_(j, "\\ufffd");
                p++;
            }
        }
    }
    put(j, "\"", 1);
}

void cb_json_key(struct cb_json *j, const char *key)
{
    cb_json_string(j, key);
    put(j, ":", 1);
    j->after_key = 1;
}

void cb_json_number(struct cb_json *j, double v)
{
    char text[32];
    begin_item(j);
    if (!isfinite(v)) {
        puts_(j, "null");
        return;
    }
    snprintf(text, sizeof text, "%.9g", v);
    puts_(j, text);
}

void cb_json_int(struct cb_json *j, long long v)
{
    char text[32];
    begin_item(j);
    snprintf(text, sizeof text, "%lld", v);
    puts_(j, text);
}

void cb_json_uint(struct cb_json *j, unsigned long long v)
{
    char text[32];
    begin_item(j);
    snprintf(text, sizeof text, "%llu", v);
    puts_(j, text);
}

void cb_json_bool(struct cb_json *j, int v)
{
    begin_item(j);
    puts_(j, v ? "true" : "false");
}

void cb_json_null(struct cb_json *j)
{
    begin_item(j);
    puts_(j, "null");
}

void cb_json_kstring(struct cb_json *j, const char *key, const char *s)
{
    cb_json_key(j, key);
    cb_json_string(j, s);
}

void cb_json_knumber(struct cb_json *j, const char *key, double v)
{
    cb_json_key(j, key);
    cb_json_number(j, v);
}

void cb_json_kint(struct cb_json *j, const char *key, long long v)
{
    cb_json_key(j, key);
    cb_json_int(j, v);
}

void cb_json_kbool(struct cb_json *j, const char *key, int v)
{
    cb_json_key(j, key);
    cb_json_bool(j, v);
}

void cb_json_kraw(struct cb_json *j, const char *key, const char *json_value)
{
    cb_json_key(j, key);
    begin_item(j);
    puts_(j, json_value);
}
