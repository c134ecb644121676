/*
 * log.c - JSON-lines logging with size-based rotation; see log.h.
 *
 * A line is built on the caller's stack (lms_log_rec, growing onto the heap
 * only past 1 KiB) without any lock; only the write takes the sink mutex.
 * The sink is process-wide state:
 *
 *   fd    path   meaning
 *   ----  -----  -----------------------------------------------------
 *   2     NULL   stderr (the default; never rotated or reopened)
 *   >= 0  set    the log file, opened O_APPEND; `size` tracks its length
 *   -1    set    the file could not be opened: lines go to stderr and the
 *                open is retried at most once a second
 */
#include "ops/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timeutil.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "lms_log_reopen must be async-signal-safe");

#define TAIL_RESERVE 32 /* room kept for ,"truncated":true}\n and the NUL */
#define PATH_MAX_LEN 4000
#define RETRY_MS 1000.0

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_level = LMS_LOG_INFO;
static atomic_int g_reopen;

static struct {
    int fd;             /* see the table above */
    char *path;         /* owned; NULL for stderr */
    uint64_t max_bytes; /* 0: no rotation */
    int keep;
    uint64_t size;      /* bytes in the current file */
    double retry_at_ms; /* monotonic time of the next open attempt (fd -1) */
} g_sink = {.fd = STDERR_FILENO};

/* ---- the sink (all under g_mu) ------------------------------------------ */

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        p += k;
        n -= (size_t)k;
    }
}

static int open_log_file(const char *path, uint64_t *size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return -1;
    struct stat st;
    *size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    return fd;
}

static void sink_reopen(void)
{
    if (g_sink.fd >= 0)
        close(g_sink.fd);
    g_sink.fd = open_log_file(g_sink.path, &g_sink.size);
    if (g_sink.fd < 0)
        g_sink.retry_at_ms = lms_now_ms() + RETRY_MS;
}

/* lmserv.log.(keep-1) -> .keep, ..., lmserv.log -> .1, then a fresh file. */
static void sink_rotate(void)
{
    char from[PATH_MAX_LEN + 16], to[PATH_MAX_LEN + 16];
    close(g_sink.fd);
    g_sink.fd = -1;
    if (g_sink.keep == 0) {
        g_sink.fd = open(g_sink.path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
        g_sink.size = 0;
        if (g_sink.fd < 0)
            g_sink.retry_at_ms = lms_now_ms() + RETRY_MS;
        return;
    }
    for (int i = g_sink.keep - 1; i >= 1; i--) {
        snprintf(from, sizeof from, "%s.%d", g_sink.path, i);
        snprintf(to, sizeof to, "%s.%d", g_sink.path, i + 1);
        rename(from, to); /* a missing one is fine: fewer files so far */
    }
    snprintf(to, sizeof to, "%s.1", g_sink.path);
    rename(g_sink.path, to);
    sink_reopen();
}

static void sink_write(const char *line, size_t n)
{
    pthread_mutex_lock(&g_mu);
    if (g_sink.path) {
        if (atomic_exchange(&g_reopen, 0))
            sink_reopen();
        else if (g_sink.fd < 0 && lms_now_ms() >= g_sink.retry_at_ms)
            sink_reopen();
        if (g_sink.fd >= 0 && g_sink.max_bytes && g_sink.size > 0 &&
            g_sink.size + n > g_sink.max_bytes)
            sink_rotate();
    }
    if (g_sink.path && g_sink.fd >= 0) {
        write_all(g_sink.fd, line, n);
        g_sink.size += n;
    } else {
        write_all(STDERR_FILENO, line, n);
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- configuration ------------------------------------------------------ */

/* Replaces the sink, closing the old file; takes ownership of path. */
static void sink_install(int fd, char *path, uint64_t size, uint64_t max_bytes, int keep)
{
    pthread_mutex_lock(&g_mu);
    if (g_sink.path && g_sink.fd >= 0)
        close(g_sink.fd);
    free(g_sink.path);
    g_sink.fd = fd;
    g_sink.path = path;
    g_sink.size = size;
    g_sink.max_bytes = max_bytes;
    g_sink.keep = keep;
    atomic_store(&g_reopen, 0);
    pthread_mutex_unlock(&g_mu);
}

int lms_log_open(const lms_log_config *cfg)
{
    if (!cfg || cfg->level < LMS_LOG_DEBUG || cfg->level > LMS_LOG_OFF || cfg->keep < 0 ||
        cfg->keep > 1000 || (cfg->path && (!cfg->path[0] || strlen(cfg->path) > PATH_MAX_LEN)))
        return LMS_ERR_INVAL;
    char *path = NULL;
    int fd = STDERR_FILENO;
    uint64_t size = 0;
    if (cfg->path) {
        path = strdup(cfg->path);
        if (!path)
            return LMS_ERR_NOMEM;
        fd = open_log_file(path, &size);
        if (fd < 0) {
            free(path);
            return LMS_ERR_IO;
        }
    }
    sink_install(fd, path, size, cfg->max_bytes, cfg->keep);
    lms_log_set_level(cfg->level);
    return LMS_OK;
}

void lms_log_close(void)
{
    sink_install(STDERR_FILENO, NULL, 0, 0, 0);
}

void lms_log_reopen(void)
{
    atomic_store(&g_reopen, 1);
}

void lms_log_set_level(lms_log_level level)
{
    atomic_store(&g_level, (int)level);
}

lms_log_level lms_log_get_level(void)
{
    return (lms_log_level)atomic_load(&g_level);
}

bool lms_log_enabled(lms_log_level level)
{
    return level < LMS_LOG_OFF &&
           (int)level >= atomic_load_explicit(&g_level, memory_order_relaxed);
}

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

const char *lms_log_level_name(lms_log_level level)
{
    if (level < LMS_LOG_DEBUG || level > LMS_LOG_OFF)
        return "?";
    return level_names[level];
}

int lms_log_level_parse(const char *s, lms_log_level *out)
{
    if (!s)
        return LMS_ERR_INVAL;
    for (int i = LMS_LOG_DEBUG; i <= LMS_LOG_OFF; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (lms_log_level)i;
            return LMS_OK;
        }
    }
    if (strcmp(s, "warning") == 0) {
        *out = LMS_LOG_WARN;
        return LMS_OK;
    }
    return LMS_ERR_INVAL;
}

/* ---- building lines ----------------------------------------------------- */

/* "2026-11-26T01:02:03.456Z" */
static void format_ts(char out[48])
{
    struct timespec ts;
    struct tm tm;
    char date[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 48, "%s.%03dZ", date, (int)(ts.tv_nsec / 1000000));
}

bool lms_log_begin(lms_log_rec *r, lms_log_level level, const char *event)
{
    r->active = lms_log_enabled(level);
    if (!r->active)
        return false;
    r->level = level;
    lms_jsonw_init(&r->w, r->buf, sizeof r->buf, LMS_LOG_LINE_MAX - TAIL_RESERVE);
    char ts[48];
    format_ts(ts);
    lms_jsonw_printf(&r->w, "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":", ts,
                     lms_log_level_name(level));
    const char *ev = event ? event : "";
    lms_jsonw_str(&r->w, ev, strlen(ev));
    return true;
}

static bool put_value(lms_jsonw *w, lms_log_val v)
{
    switch (v.type) {
    case LMS_LOG_T_STR:
        if (!v.v.s)
            return lms_jsonw_raw(w, "null", 4);
        lms_jsonw_str(w, v.v.s, v.n == SIZE_MAX ? strlen(v.v.s) : v.n);
        return true; /* a cut string is still worth keeping */
    case LMS_LOG_T_I64: return lms_jsonw_printf(w, "%lld", (long long)v.v.i);
    case LMS_LOG_T_U64: return lms_jsonw_printf(w, "%llu", (unsigned long long)v.v.u);
    case LMS_LOG_T_F64: return lms_jsonw_f64(w, v.v.f);
    case LMS_LOG_T_BOOL: return lms_jsonw_cstr(w, v.v.b ? "true" : "false");
    }
    return lms_jsonw_raw(w, "null", 4);
}

void lms_log_add(lms_log_rec *r, const char *key, lms_log_val val)
{
    if (!r->active || !key)
        return;
    size_t mark = r->w.len;
    bool ok = lms_jsonw_raw(&r->w, ",", 1) && lms_jsonw_str(&r->w, key, strlen(key)) &&
              lms_jsonw_raw(&r->w, ":", 1) && put_value(&r->w, val);
    if (!ok) { /* drop the whole field; overflow marks the line truncated */
        r->w.len = mark;
        r->w.p[mark] = '\0';
    }
}

void lms_log_addf(lms_log_rec *r, const char *key, const char *fmt, ...)
{
    if (!r->active)
        return;
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        lms_log_add(r, key, LMS_LOG_STRN(small, (size_t)n));
        return;
    }
    size_t cap = (size_t)n < LMS_LOG_LINE_MAX ? (size_t)n + 1 : LMS_LOG_LINE_MAX;
    char *big = malloc(cap);
    if (!big) {
        r->w.overflow = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, cap, fmt, ap);
    va_end(ap);
    lms_log_add(r, key, LMS_LOG_STRN(big, strlen(big)));
    free(big);
}

void lms_log_end(lms_log_rec *r)
{
    if (!r->active)
        return;
    r->w.limit = LMS_LOG_LINE_MAX; /* release the tail reserve */
    if (r->w.overflow)
        lms_jsonw_cstr(&r->w, ",\"truncated\":true");
    lms_jsonw_raw(&r->w, "}\n", 2);
    sink_write(r->w.p, r->w.len);
    lms_jsonw_deinit(&r->w);
    r->active = false;
}

void lms_log_event(lms_log_level level, const char *event, ...)
{
    lms_log_rec r;
    if (!lms_log_begin(&r, level, event))
        return;
    va_list ap;
    va_start(ap, event);
    for (const char *key; (key = va_arg(ap, const char *)) != NULL;)
        lms_log_add(&r, key, va_arg(ap, lms_log_val));
    va_end(ap);
    lms_log_end(&r);
}
