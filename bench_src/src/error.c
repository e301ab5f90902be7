#include <stdarg.h>
#include <stdio.h>

#include "commbench.h"

static _Thread_local char last_error[CB_TEXT_MAX];

void cb_errorf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

const char *cb_last_error(void)
{
    return last_error[0] ? last_error : "unknown error";
}
