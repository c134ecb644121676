/*
 * log.h - structured logging: one JSON object per line.
 *
 *   {"ts":"2026-11-26T01:02:03.456Z","level":"info","event":"request_end",
 *    "req_id":42,"ttft_ms":45.2,"model":"qwen"}
 *
 * `ts` is UTC wall time with milliseconds, `level` one of debug, info, warn,
 * error; `event` a short snake_case name; then the caller's key/value pairs
 * in order. Values of any bytes are escaped (control characters as \uXXXX,
 * invalid UTF-8 as U+FFFD), so every line parses as JSON.
 *
 * Two ways to write a line:
 *
 *   lms_log(LMS_LOG_INFO, "request_end",
 *           "req_id", LMS_LOG_U64(id), "ttft_ms", LMS_LOG_F64(ttft),
 *           "model", LMS_LOG_STR(name));          // NULL sentinel added
 *
 *   lms_log_rec r;                                // fields built in a loop
 *   if (lms_log_begin(&r, LMS_LOG_DEBUG, "batch")) {
 *       for (...) lms_log_add(&r, key, LMS_LOG_I64(v));
 *       lms_log_end(&r);
 *   }
 *
 * Lines are at most LMS_LOG_LINE_MAX bytes: a longer value is cut and the
 * line gets "truncated":true. Nothing here allocates for lines under 1 KiB.
 *
 * Sink: stderr until lms_log_open() names a file. A file sink rotates by
 * size: before a line would push the file past max_bytes, lmserv.log is
 * renamed lmserv.log.1 (.1 to .2, ... up to .keep, the oldest dropped) and a
 * fresh lmserv.log is started, so at most keep + 1 files exist and each
 * stays under max_bytes (a single line longer than max_bytes goes alone in
 * a file). keep = 0 truncates the file instead of keeping old ones.
 *
 * Threads: every function may be called from any thread. Lines are written
 * under one mutex with one write(2) each, so lines never interleave, also
 * with other processes appending to the same file (O_APPEND).
 * lms_log_reopen() only sets a flag and is async-signal-safe: call it from
 * a SIGHUP handler; the file is reopened before the next line is written.
 * Write errors are swallowed (there is nowhere to report them); while the
 * file cannot be (re)opened, lines go to stderr and the open is retried at
 * most once a second.
 */
#ifndef LMS_OPS_LOG_H
#define LMS_OPS_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/jsonw.h"

typedef enum lms_log_level {
    LMS_LOG_DEBUG = 0,
    LMS_LOG_INFO = 1,
    LMS_LOG_WARN = 2,
    LMS_LOG_ERROR = 3,
    LMS_LOG_OFF = 4, /* as a filter level: log nothing */
} lms_log_level;

#define LMS_LOG_LINE_MAX 65536 /* bytes per line, newline included */

/* ---- values ------------------------------------------------------------- */

enum lms_log_type {
    LMS_LOG_T_STR, /* s: NUL-terminated, or n bytes when n != SIZE_MAX; NULL -> null */
    LMS_LOG_T_I64,
    LMS_LOG_T_U64,
    LMS_LOG_T_F64, /* NaN and infinities -> null */
    LMS_LOG_T_BOOL,
};

typedef struct lms_log_val {
    enum lms_log_type type;
    size_t n; /* LMS_LOG_T_STR: byte count, SIZE_MAX for NUL-terminated */
    union {
        const char *s;
        int64_t i;
        uint64_t u;
        double f;
        bool b;
    } v;
} lms_log_val;

#define LMS_LOG_STR(x) ((lms_log_val){.type = LMS_LOG_T_STR, .n = SIZE_MAX, .v.s = (x)})
#define LMS_LOG_STRN(x, len) ((lms_log_val){.type = LMS_LOG_T_STR, .n = (len), .v.s = (x)})
#define LMS_LOG_I64(x) ((lms_log_val){.type = LMS_LOG_T_I64, .v.i = (int64_t)(x)})
#define LMS_LOG_U64(x) ((lms_log_val){.type = LMS_LOG_T_U64, .v.u = (uint64_t)(x)})
#define LMS_LOG_F64(x) ((lms_log_val){.type = LMS_LOG_T_F64, .v.f = (double)(x)})
#define LMS_LOG_BOOL(x) ((lms_log_val){.type = LMS_LOG_T_BOOL, .v.b = (x)})

/* ---- writing lines ------------------------------------------------------ */

/* One line from (const char *key, lms_log_val value) pairs ended by NULL.
 * Every value must be one of the LMS_LOG_* constructors above. */
void lms_log_event(lms_log_level level, const char *event, ...) __attribute__((sentinel));

/* lms_log_event with the NULL sentinel supplied. */
#define lms_log(level, event, ...) lms_log_event((level), (event), ##__VA_ARGS__, NULL)

/* Builder for lines whose fields are not known at compile time. Lives on
 * the caller's stack; begin returns false when the level is filtered out (the
 * other calls are then no-ops, end included, so calling them is harmless). */
typedef struct lms_log_rec {
    lms_jsonw w;
    bool active;
    lms_log_level level;
    char buf[1024];
} lms_log_rec;

bool lms_log_begin(lms_log_rec *r, lms_log_level level, const char *event);
void lms_log_add(lms_log_rec *r, const char *key, lms_log_val val);
void lms_log_addf(lms_log_rec *r, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void lms_log_end(lms_log_rec *r); /* writes the line and releases r */

/* ---- configuration ------------------------------------------------------ */

typedef struct lms_log_config {
    lms_log_level level; /* lines below this level are dropped */
    const char *path;    /* NULL: stderr; else the file (copied) */
    uint64_t max_bytes;  /* rotate before the file passes this; 0: never */
    int keep;            /* rotated files kept: path.1 .. path.keep */
} lms_log_config;

/* Switches the sink (and the level). On failure (LMS_ERR_IO, LMS_ERR_INVAL)
 * the previous sink stays. */
int lms_log_open(const lms_log_config *cfg);

/* Closes a file sink; later lines go to stderr. */
void lms_log_close(void);

/* Async-signal-safe: asks for the file to be reopened before the next line
 * (after logrotate or an operator moved it away). No-op for stderr. */
void lms_log_reopen(void);

void lms_log_set_level(lms_log_level level);
lms_log_level lms_log_get_level(void);
bool lms_log_enabled(lms_log_level level); /* cheap: one atomic load */

/* "debug", "info", "warn", "error", "off" and back. parse accepts "warning"
 * too; returns LMS_ERR_INVAL for anything else, leaving *out untouched. */
const char *lms_log_level_name(lms_log_level level);
int lms_log_level_parse(const char *s, lms_log_level *out);

#endif
