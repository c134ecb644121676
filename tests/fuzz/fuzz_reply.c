/*
 * fuzz_reply.c - libFuzzer target: a model's reply cut into thoughts,
 * content and calls (serve/reply.h). The first byte picks the setting
 * (thoughts taken apart, the prompt opened them, calls searched for, the
 * request's function names known) and how the rest arrives when streamed
 * (pieces of 1 to 8 bytes); the rest is
 * the reply. The streamed pieces must add up to what the whole reply
 * gives at once, and the calls read at the end must be the same.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/reply.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Appends text[p.X_from, + p.X_n) of each part to its buffer. */
static void take(const char *text, const reply_part *p, char *th, size_t *n_th, char *ct,
                 size_t *n_ct)
{
    memcpy(th + *n_th, text + p->r_from, p->r_n);
    *n_th += p->r_n;
    memcpy(ct + *n_ct, text + p->c_from, p->c_n);
    *n_ct += p->c_n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t mode = data[0];
    const bool thoughts = mode & 1, open = mode & 2, tools = mode & 4;
    const size_t step = 1 + ((mode >> 3) & 7);
    static const char *const fn_names[] = {"f", "get_weather", NULL};
    const char *const *names = mode & 64 ? fn_names : NULL;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    char *buf = malloc(n + 1), *th = malloc(n + 1), *ct = malloc(n + 1);
    char *wth = malloc(n + 1), *wct = malloc(n + 1);
    if (!buf || !th || !ct || !wth || !wct)
        abort();
    memcpy(buf, text, n); /* a copy that grows, as the reply does */
    /* whole */
    reply_cut w;
    reply_part p;
    toolcalls wtc, stc;
    size_t n_wth = 0, n_wct = 0, n_th = 0, n_ct = 0;
    reply_cut_init(&w, thoughts, open, tools, names);
    reply_cut_next(&w, buf, n, &p, &wtc);
    take(buf, &p, wth, &n_wth, wct, &n_wct);
    /* streamed */
    reply_cut s;
    reply_cut_init(&s, thoughts, open, tools, names);
    for (size_t len = 0; len < n; len += step) {
        reply_cut_next(&s, buf, len, &p, NULL);
        take(buf, &p, th, &n_th, ct, &n_ct);
    }
    reply_cut_next(&s, buf, n, &p, &stc);
    take(buf, &p, th, &n_th, ct, &n_ct);
    if (n_th != n_wth || memcmp(th, wth, n_th) || n_ct != n_wct || memcmp(ct, wct, n_ct))
        abort(); /* the stream said something the whole reply does not */
    if (stc.n != wtc.n || stc.content_len != wtc.content_len)
        abort();
    for (int i = 0; i < stc.n; i++)
        if (strcmp(stc.v[i].name, wtc.v[i].name) || strcmp(stc.v[i].arguments, wtc.v[i].arguments))
            abort();
    reply_part whole;
    reply_cut_whole(&s, n, &whole);
    if (whole.r_n != n_wth || whole.c_n != n_wct)
        abort();
    toolcalls_free(&wtc);
    toolcalls_free(&stc);
    free(buf);
    free(th);
    free(ct);
    free(wth);
    free(wct);
    return 0;
}
