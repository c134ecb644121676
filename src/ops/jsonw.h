/*
 * jsonw.h - a bounded text buffer with a JSON string escaper.
 *
 * The ops layer must stay free of JSON libraries (base and ops sit under
 * everything), yet log lines, the GPU snapshot rendering and the Prometheus
 * text all need to build text safely. lms_jsonw is that one small tool:
 *
 *   - it writes into a caller's buffer and may grow onto the heap up to a
 *     hard `limit` (bytes, including the terminating NUL);
 *   - every append either fits whole or leaves the buffer unchanged and sets
 *     `overflow` - except lms_jsonw_str, which cuts an over-long string at a
 *     character boundary and still closes the quote, so the text stays valid
 *     JSON (overflow is set then too);
 *   - lms_jsonw_str accepts any bytes: control characters are escaped,
 *     invalid UTF-8 (bad lead or continuation bytes, overlong forms,
 *     surrogates, values above U+10FFFF) becomes U+FFFD, so the output is
 *     always valid UTF-8 JSON.
 *
 * Not thread-safe: a writer belongs to the thread that built it.
 */
#ifndef LMS_OPS_JSONW_H
#define LMS_OPS_JSONW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lms_jsonw {
    char *p;       /* text so far, always NUL-terminated */
    size_t len;    /* bytes of text, excluding the NUL */
    size_t cap;    /* bytes available at p */
    size_t limit;  /* most bytes p may ever hold (>= cap); may be lowered and
                      raised again between appends (see log.c) */
    bool heap;     /* p was malloc'd here (freed by lms_jsonw_deinit) */
    bool overflow; /* an append did not fit (or allocation failed) */
} lms_jsonw;

/* Starts a writer on the caller's buffer buf[cap] (cap >= 1); the writer may
 * move to the heap while the text stays under `limit` bytes (limit <= cap
 * means: never grow). */
void lms_jsonw_init(lms_jsonw *w, char *buf, size_t cap, size_t limit);

/* Frees the heap copy, if any. The caller's buffer is untouched. */
void lms_jsonw_deinit(lms_jsonw *w);

/* Appends n raw bytes (no escaping). Returns false (nothing appended) when
 * they do not fit. */
bool lms_jsonw_raw(lms_jsonw *w, const char *s, size_t n);

/* Appends a NUL-terminated string without escaping. */
bool lms_jsonw_cstr(lms_jsonw *w, const char *s);

/* Appends printf output, whole or not at all. */
bool lms_jsonw_printf(lms_jsonw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends s[0..n) as a quoted, escaped JSON string (see the file comment).
 * Returns false when the string had to be cut to fit the limit, or when not
 * even the two quotes fit (then nothing is appended). */
bool lms_jsonw_str(lms_jsonw *w, const char *s, size_t n);

/* Appends a double as a JSON number, or null for NaN and infinities (JSON
 * has neither). Up to 15 significant digits, no exponent for everyday
 * magnitudes. */
bool lms_jsonw_f64(lms_jsonw *w, double v);

/* For a writer on a fixed caller buffer: the length written, or
 * LMS_ERR_LIMIT (leaving an empty string) when anything did not fit. */
int lms_jsonw_result(lms_jsonw *w);

/* Decodes one UTF-8 character at s[0..n) (n >= 1). Returns the number of
 * bytes it occupies and sets *cp; an invalid sequence yields 1 byte and
 * *cp = 0xFFFD. Shared by the escaper and the Prometheus label quoting. */
size_t lms_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

#endif
