/*
 * err.h - the one error vocabulary of lmserv.
 *
 * Fallible functions return int: >= 0 on success, one of these negative
 * codes on failure. Parsers of untrusted data also fill a caller's message
 * buffer (see lms_errf) naming the object and the bad value.
 */
#ifndef LMS_ERR_H
#define LMS_ERR_H

#include <stddef.h>

enum lms_err {
    LMS_OK = 0,
    LMS_ERR_NOMEM = -1,       /* allocation failed */
    LMS_ERR_INVAL = -2,       /* bad argument or parameter */
    LMS_ERR_FORMAT = -3,      /* malformed input data (file, JSON, template) */
    LMS_ERR_IO = -4,          /* read/write/open/mmap failed */
    LMS_ERR_UNSUPPORTED = -5, /* valid but not implemented (arch, type) */
    LMS_ERR_LIMIT = -6,       /* a size or count limit was exceeded */
    LMS_ERR_BUSY = -7,        /* queue full / resource busy */
    LMS_ERR_CANCELED = -8,    /* aborted by the caller */
    LMS_ERR_DEVICE = -9,      /* accelerator failure */
    LMS_ERR_NOTFOUND = -10,   /* key, tensor, model or file not found */
    LMS_ERR_RANGE = -11,      /* value out of range (e.g. token id) */
    LMS_ERR_ADAPTER = -12,    /* a step's LoRA adapters found no room on the device; the
                                 step ran nothing */
};

/* Static string describing an error code. */
const char *lms_strerror(int err);

/* printf into a caller's error buffer (no-op when buf is NULL or n is 0);
 * returns `code` so a parser can write `return lms_errf(err, n, LMS_ERR_FORMAT, ...)`. */
int lms_errf(char *buf, size_t n, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
