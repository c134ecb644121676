/*
 * router.c - lexical semantic router (router.h): TF-IDF vectors of word
 * tokens and character trigrams, cosine similarity, best document per
 * expert.
 *
 * Terms are 64-bit FNV-1a hashes of a kind tag plus the bytes ("w" + word,
 * "t" + trigram); a collision merges two terms, harmless at these sizes. A
 * vector is a sorted array of (hash, weight), so a dot product is a merge.
 * Weights are sublinear: kind * (1 + ln count) * idf, with
 * idf = ln(1 + N / df) over the N documents; a term that no document
 * has gets the largest idf (it makes the text less like every expert).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "route/router.h"

#define MAX_TEXT_BYTES 16384 /* of a request's text: enough to tell a topic */
#define TRIGRAM_WEIGHT 0.5f
#define TIE_EPS 1e-9

typedef struct term {
    uint64_t h;
    float count;  /* occurrences in the text */
    float kind;   /* 1 for words, TRIGRAM_WEIGHT for trigrams */
    float w;      /* final weight (normalized) */
} term;

typedef struct vec {
    term *t;
    int n;
} vec;

typedef struct dfent {
    uint64_t h;
    int df;
} dfent;

struct lms_router {
    const lms_route_cfg *cfg;
    vec *docs;          /* [n_docs] */
    const char **doc_text; /* [n_docs], borrowed from cfg */
    int *doc_expert;    /* [n_docs] */
    int n_docs;
    dfent *df;          /* sorted by h */
    int n_df;
    int def;            /* default expert */
};

/* ---- terms ------------------------------------------------------------------------ */

static uint64_t fnv(char tag, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    h = (h ^ (unsigned char)tag) * 1099511628211ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static bool word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c >= 0x80;
}

static int add_term(vec *v, int *cap, uint64_t h, float kind)
{
    if (v->n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        term *nt = realloc(v->t, (size_t)nc * sizeof *nt);
        if (!nt)
            return -1;
        v->t = nt;
        *cap = nc;
    }
    v->t[v->n++] = (term){h, 1, kind, 0};
    return 0;
}

static int cmp_term(const void *a, const void *b)
{
    uint64_t x = ((const term *)a)->h, y = ((const term *)b)->h;
    return x < y ? -1 : x > y;
}

/* Words and their boundary-marked trigrams ("^py", "pyt", ..., "on$"),
 * sorted by hash with repeats merged into counts. */
static int terms_of(const char *s, size_t n, vec *out)
{
    vec v = {0};
    int cap = 0;
    char w[66];
    if (n > MAX_TEXT_BYTES)
        n = MAX_TEXT_BYTES;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c - 'A' + 'a');
        if (!word_byte(c)) {
            i++;
            continue;
        }
        size_t k = 1;
        w[0] = '^';
        for (; i < n; i++) {
            c = (unsigned char)s[i];
            if (c >= 'A' && c <= 'Z')
                c = (unsigned char)(c - 'A' + 'a');
            if (!word_byte(c))
                break;
            if (k < 64)
                w[k++] = (char)c;
        }
        w[k] = '$';
        if (add_term(&v, &cap, fnv('w', w + 1, k - 1), 1.0f) < 0)
            goto oom;
        for (size_t j = 0; j + 3 <= k + 1; j++)
            if (add_term(&v, &cap, fnv('t', w + j, 3), TRIGRAM_WEIGHT) < 0)
                goto oom;
    }
    if (v.n)
        qsort(v.t, (size_t)v.n, sizeof *v.t, cmp_term);
    int m = 0;
    for (int i = 0; i < v.n; i++) {
        if (m > 0 && v.t[m - 1].h == v.t[i].h)
            v.t[m - 1].count += 1;
        else
            v.t[m++] = v.t[i];
    }
    v.n = m;
    *out = v;
    return 0;
oom:
    free(v.t);
    return -1;
}

/* ---- weights ----------------------------------------------------------------------- */

static int df_of(const lms_router *r, uint64_t h)
{
    int lo = 0, hi = r->n_df - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (r->df[mid].h == h)
            return r->df[mid].df;
        if (r->df[mid].h < h)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

static void weigh(const lms_router *r, vec *v)
{
    double norm = 0;
    double n_docs = r->n_docs > 0 ? r->n_docs : 1;
    for (int i = 0; i < v->n; i++) {
        term *t = &v->t[i];
        int df = df_of(r, t->h);
        double idf = log(1.0 + n_docs / (df > 0 ? df : 1));
        double w = t->kind * (1.0 + log(t->count)) * idf;
        t->w = (float)w;
        norm += w * w;
    }
    norm = sqrt(norm);
    for (int i = 0; i < v->n && norm > 0; i++)
        v->t[i].w = (float)(v->t[i].w / norm);
}

static double dot(const vec *a, const vec *b)
{
    double s = 0;
    int i = 0, j = 0;
    while (i < a->n && j < b->n) {
        if (a->t[i].h == b->t[j].h)
            s += (double)a->t[i++].w * b->t[j++].w;
        else if (a->t[i].h < b->t[j].h)
            i++;
        else
            j++;
    }
    return s;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Document frequencies: every document's distinct terms, counted. */
static int build_df(lms_router *r)
{
    size_t total = 0;
    for (int d = 0; d < r->n_docs; d++)
        total += (size_t)r->docs[d].n;
    uint64_t *all = malloc((total ? total : 1) * sizeof *all);
    r->df = malloc((total ? total : 1) * sizeof *r->df);
    if (!all || !r->df) {
        free(all);
        return -1;
    }
    size_t k = 0;
    for (int d = 0; d < r->n_docs; d++)
        for (int i = 0; i < r->docs[d].n; i++)
            all[k++] = r->docs[d].t[i].h;
    qsort(all, total, sizeof *all, cmp_u64);
    for (size_t i = 0; i < total; i++) {
        if (r->n_df > 0 && r->df[r->n_df - 1].h == all[i])
            r->df[r->n_df - 1].df++;
        else
            r->df[r->n_df++] = (dfent){all[i], 1};
    }
    free(all);
    return 0;
}

/* ---- router ------------------------------------------------------------------------ */

static int pick_default(const lms_route_cfg *c)
{
    int d = c->default_id ? lms_route_cfg_find(c, c->default_id) : -1;
    if (d >= 0)
        return d;
    d = 0;
    for (int i = 1; i < c->n_experts; i++)
        if (c->experts[i].priority > c->experts[d].priority)
            d = i;
    return d;
}

int lms_router_create(const lms_route_cfg *cfg, lms_router **out)
{
    lms_router *r = calloc(1, sizeof *r);
    if (!r)
        return LMS_ERR_NOMEM;
    r->cfg = cfg;
    r->def = pick_default(cfg);
    int cap = 0;
    for (int i = 0; i < cfg->n_experts; i++)
        cap += cfg->experts[i].n_examples + (cfg->experts[i].domain ? 1 : 0);
    r->docs = calloc((size_t)(cap ? cap : 1), sizeof *r->docs);
    r->doc_expert = calloc((size_t)(cap ? cap : 1), sizeof *r->doc_expert);
    r->doc_text = calloc((size_t)(cap ? cap : 1), sizeof *r->doc_text);
    if (!r->docs || !r->doc_expert || !r->doc_text)
        goto oom;
    for (int i = 0; i < cfg->n_experts; i++) {
        const lms_expert_cfg *e = &cfg->experts[i];
        for (int k = -1; k < e->n_examples; k++) {
            const char *s = k < 0 ? e->domain : e->examples[k];
            if (!s)
                continue;
            if (terms_of(s, strlen(s), &r->docs[r->n_docs]) < 0)
                goto oom;
            r->doc_text[r->n_docs] = s;
            r->doc_expert[r->n_docs++] = i;
        }
    }
    if (build_df(r) < 0)
        goto oom;
    for (int d = 0; d < r->n_docs; d++)
        weigh(r, &r->docs[d]);
    *out = r;
    return 0;
oom:
    lms_router_destroy(r);
    return LMS_ERR_NOMEM;
}

void lms_router_destroy(lms_router *r)
{
    if (!r)
        return;
    for (int d = 0; d < r->n_docs; d++)
        free(r->docs[d].t);
    free(r->docs);
    free(r->doc_expert);
    free(r->doc_text);
    free(r->df);
    free(r);
}

int lms_router_default(const lms_router *r)
{
    return r->def;
}

/* The best expert given each document's similarity (the best document per
 * expert; ties to the higher priority, then the earlier expert), and the
 * threshold and default rules. */
static lms_route_pick choose(const lms_router *r, const double *doc_score)
{
    const lms_route_cfg *c = r->cfg;
    lms_route_pick p = {.expert = r->def, .score = 0, .best = -1, .fallback = true};
    double best = -1;
    for (int i = 0; i < c->n_experts; i++) {
        double s = 0;
        for (int d = 0; d < r->n_docs; d++)
            if (r->doc_expert[d] == i && doc_score[d] > s)
                s = doc_score[d];
        bool better = s > best + TIE_EPS ||
                      (s > best - TIE_EPS && p.best >= 0 &&
                       c->experts[i].priority > c->experts[p.best].priority);
        if (p.best < 0 || better) {
            best = s;
            p.best = i;
        }
    }
    p.score = best > 0 ? best : 0;
    if (p.best >= 0 && p.score > 0 && p.score >= c->threshold) {
        p.expert = p.best;
        p.fallback = false;
    }
    return p;
}

lms_route_pick lms_router_pick(const lms_router *r, const char *text, size_t n)
{
    lms_route_pick none = {.expert = r->def, .score = 0, .best = -1, .fallback = true};
    vec q;
    double *score = malloc((size_t)(r->n_docs > 0 ? r->n_docs : 1) * sizeof *score);
    if (!score || !text || terms_of(text, n, &q) < 0) {
        free(score);
        return none;
    }
    weigh(r, &q);
    for (int d = 0; d < r->n_docs; d++)
        score[d] = dot(&q, &r->docs[d]);
    free(q.t);
    lms_route_pick p = choose(r, score);
    free(score);
    return p;
}

int lms_router_n_docs(const lms_router *r)
{
    return r->n_docs;
}

const char *lms_router_doc_text(const lms_router *r, int i)
{
    return i >= 0 && i < r->n_docs ? r->doc_text[i] : NULL;
}

lms_route_pick lms_router_pick_vec(const lms_router *r, const float *docs, int n_embd,
                                   const float *q)
{
    lms_route_pick none = {.expert = r->def, .score = 0, .best = -1, .fallback = true};
    double *score = malloc((size_t)(r->n_docs > 0 ? r->n_docs : 1) * sizeof *score);
    if (!score)
        return none;
    double qn = 0;
    for (int k = 0; k < n_embd; k++)
        qn += (double)q[k] * q[k];
    qn = qn > 0 ? sqrt(qn) : 1;
    for (int d = 0; d < r->n_docs; d++) {
        const float *v = docs + (size_t)d * (size_t)n_embd;
        double s = 0;
        for (int k = 0; k < n_embd; k++)
            s += (double)v[k] * q[k];
        score[d] = isfinite(s) ? s / qn : 0;
    }
    lms_route_pick p = choose(r, score);
    free(score);
    return p;
}
