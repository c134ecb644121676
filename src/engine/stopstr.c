/*
 * stopstr.c - stop-string matching over streamed text (see stopstr.h).
 */
#include "engine/stopstr.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int lms_stopstr_init(lms_stopstr *m, const char *const *stop, int n_stop)
{
    memset(m, 0, sizeof *m);
    if (n_stop < 0 || n_stop > LMS_MAX_STOP)
        return LMS_ERR_LIMIT;
    for (int i = 0; i < n_stop; i++) {
        size_t n = strlen(stop[i]);
        if (n == 0)
            continue;
        if (n > 1024 || !(m->stop[m->n_stop] = strdup(stop[i]))) {
            lms_stopstr_deinit(m);
            return n > 1024 ? LMS_ERR_LIMIT : LMS_ERR_NOMEM;
        }
        m->index[m->n_stop++] = (signed char)i;
        m->max_len = n > m->max_len ? n : m->max_len;
    }
    return 0;
}

void lms_stopstr_deinit(lms_stopstr *m)
{
    for (int i = 0; i < m->n_stop; i++)
        free(m->stop[i]);
    free(m->held);
    memset(m, 0, sizeof *m);
}

/* Length of the longest tail of held that is a proper prefix of a stop. */
static size_t partial_tail(const lms_stopstr *m)
{
    size_t best = 0;
    for (int i = 0; i < m->n_stop; i++) {
        size_t sl = strlen(m->stop[i]);
        size_t lim = sl - 1 < m->n_held ? sl - 1 : m->n_held;
        for (size_t k = lim; k > best; k--)
            if (memcmp(m->held + m->n_held - k, m->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Appends text to held after dropping what the last call emitted. */
static int hold(lms_stopstr *m, const char *text, size_t n)
{
    if (m->shift) {
        memmove(m->held, m->held + m->shift, m->n_held - m->shift);
        m->n_held -= m->shift;
        m->shift = 0;
    }
    if (m->cap_held - m->n_held < n + 1) {
        size_t cap = (m->n_held + n + 1) * 2;
        char *nh = realloc(m->held, cap);
        if (!nh)
            return LMS_ERR_NOMEM;
        m->held = nh;
        m->cap_held = cap;
    }
    memcpy(m->held + m->n_held, text, n);
    m->n_held += n;
    m->held[m->n_held] = 0;
    return 0;
}

bool lms_stopstr_feed(lms_stopstr *m, const char *text, size_t n, const char **out, size_t *n_out)
{
    *out = text;
    *n_out = 0;
    if (m->hit)
        return true;
    if (m->n_stop == 0 || hold(m, text, n) < 0) {
        *n_out = n; /* nothing to match (or no memory to buffer): pass through */
        return false;
    }
    size_t cut = m->n_held;
    for (int i = 0; i < m->n_stop; i++) {
        const char *hit = memmem(m->held, m->n_held, m->stop[i], strlen(m->stop[i]));
        if (hit && (size_t)(hit - m->held) < cut) {
            cut = (size_t)(hit - m->held);
            m->hit_index = m->index[i];
        }
    }
    *out = m->held;
    if (cut < m->n_held) {
        m->hit = true;
        *n_out = cut;
        m->shift = m->n_held; /* nothing more is released */
        return true;
    }
    *n_out = m->n_held - partial_tail(m);
    m->shift = *n_out;
    return false;
}

void lms_stopstr_flush(lms_stopstr *m, const char **out, size_t *n_out)
{
    *out = m->held ? m->held + m->shift : "";
    *n_out = m->hit || !m->held ? 0 : m->n_held - m->shift;
    m->shift = m->n_held;
}

char *lms_stopstr_finish(lms_stopstr *m, const char *tail, size_t n_tail, size_t *n)
{
    const char *a, *b;
    size_t na, nb;
    lms_stopstr_feed(m, tail, n_tail, &a, &na);
    char *buf = malloc(na + m->n_held + 1);
    if (!buf)
        return NULL;
    memcpy(buf, a, na);
    lms_stopstr_flush(m, &b, &nb);
    memcpy(buf + na, b, nb);
    buf[na + nb] = 0;
    *n = na + nb;
    return buf;
}
