/*
 * err.c - error strings and the error-buffer helper.
 */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>

const char *lms_strerror(int err)
{
    switch (err) {
    case LMS_OK: return "ok";
    case LMS_ERR_NOMEM: return "out of memory";
    case LMS_ERR_INVAL: return "invalid argument";
    case LMS_ERR_FORMAT: return "malformed data";
    case LMS_ERR_IO: return "I/O error";
    case LMS_ERR_UNSUPPORTED: return "not supported";
    case LMS_ERR_LIMIT: return "limit exceeded";
    case LMS_ERR_BUSY: return "busy";
    case LMS_ERR_CANCELED: return "canceled";
    case LMS_ERR_DEVICE: return "device error";
    case LMS_ERR_NOTFOUND: return "not found";
    case LMS_ERR_RANGE: return "out of range";
    case LMS_ERR_ADAPTER: return "LoRA adapter does not fit in GPU memory";
    }
    return "unknown error";
}

int lms_errf(char *buf, size_t n, int code, const char *fmt, ...)
{
    if (buf && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, n, fmt, ap);
        va_end(ap);
    }
    return code;
}
