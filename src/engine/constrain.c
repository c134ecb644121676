/*
 * constrain.c - an output held to JSON or a GBNF grammar (constrain.h).
 *
 * The allowed tokens of a checker state are found by feeding every token's
 * text to a copy of the checker (a vocabulary pass: ~8 ms at 151k tokens
 * for JSON), so they are kept, a bit each, for the last CONS_KEPT states:
 * one state recurs token after token (inside a string, after a comma).
 */
#include "engine/constrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CONS_KEPT 4

struct lms_constraint {
    const lms_toktexts *tt;
    const lms_gbnf *grammar; /* NULL: JSON mode */
    lms_jschk jf;            /* JSON: the text so far */
    lms_gbnf_chk *gf;        /* grammar: the text so far */
    float *masked;           /* [n_vocab] the row with the refused tokens at -inf */
    uint64_t *bits;          /* [CONS_KEPT][words] allowed tokens of the kept states */
    lms_jschk jkey[CONS_KEPT];
    lms_gbnf_chk *gkey;      /* [CONS_KEPT] grammar states of bits */
    int n_kept, next;
};

/* ---- token texts ------------------------------------------------------------------ */

void lms_toktexts_destroy(lms_toktexts *t)
{
    if (!t)
        return;
    free(t->bytes);
    free(t->off);
    free(t->eog);
    free(t);
}

lms_toktexts *lms_toktexts_create(const lms_tokenizer *tok)
{
    lms_toktexts *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    const int32_t nv = lms_tokenizer_n_vocab(tok);
    char piece[256];
    size_t cap = (size_t)nv * 4 + 256, at = 0; /* grown as needed */
    t->n_vocab = nv;
    t->bytes = malloc(cap);
    t->off = malloc(((size_t)nv + 1) * sizeof *t->off);
    t->eog = malloc((size_t)nv * sizeof *t->eog);
    if (!t->bytes || !t->off || !t->eog) {
        lms_toktexts_destroy(t);
        return NULL;
    }
    for (int32_t i = 0; i < nv; i++) {
        int n = lms_token_to_piece(tok, i, false, piece, sizeof piece);
        t->off[i] = (uint32_t)at;
        t->eog[i] = lms_token_is_eog(tok, i);
        if (n <= 0)
            continue;
        if (at + (size_t)n > cap) {
            char *b = at + (size_t)n <= UINT32_MAX ? realloc(t->bytes, cap * 2) : NULL;
            if (!b) {
                lms_toktexts_destroy(t);
                return NULL;
            }
            t->bytes = b;
            cap *= 2;
        }
        memcpy(t->bytes + at, piece, (size_t)n);
        at += (size_t)n;
    }
    t->off[nv] = (uint32_t)at;
    return t;
}

/* ---- the checker ------------------------------------------------------------------- */

static size_t n_words(const lms_constraint *c)
{
    return ((size_t)c->tt->n_vocab + 63) / 64;
}

void lms_constraint_destroy(lms_constraint *c)
{
    if (!c)
        return;
    free(c->gf);
    free(c->gkey);
    free(c->masked);
    free(c->bits);
    free(c);
}

lms_constraint *lms_constraint_create(const lms_toktexts *tt, const lms_jschema *schema,
                                      const lms_gbnf *grammar)
{
    lms_constraint *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->tt = tt;
    c->grammar = grammar;
    c->masked = malloc((size_t)tt->n_vocab * sizeof *c->masked);
    c->bits = malloc(CONS_KEPT * n_words(c) * sizeof *c->bits);
    bool ok = c->masked && c->bits;
    if (ok && grammar) {
        c->gf = malloc(sizeof *c->gf);
        c->gkey = malloc(CONS_KEPT * sizeof *c->gkey);
        ok = c->gf && c->gkey && lms_gbnf_init(c->gf, grammar);
    } else if (ok) {
        lms_jschk_init(&c->jf, schema);
    }
    if (!ok) {
        lms_constraint_destroy(c);
        return NULL;
    }
    return c;
}

bool lms_constraint_allows(const lms_constraint *c, int32_t id)
{
    const lms_toktexts *tt = c->tt;
    if (id < 0 || id >= tt->n_vocab)
        return false;
    if (tt->eog[id])
        return c->grammar ? lms_gbnf_done(c->gf) : lms_jschk_done(&c->jf);
    const uint32_t a = tt->off[id], b = tt->off[id + 1];
    if (a == b)
        return false;
    if (c->grammar)
        return lms_gbnf_allows(c->gf, tt->bytes + a, b - a);
    lms_jschk k;
    lms_jschk_copy(&k, &c->jf);
    return lms_jschk_feed(&k, tt->bytes + a, b - a);
}

/* The allowed tokens of the current state, a bit each (kept, see above). */
static const uint64_t *allowed_bits(lms_constraint *c)
{
    const size_t nw = n_words(c);
    for (int k = 0; k < c->n_kept; k++)
        if (c->grammar ? lms_gbnf_same(&c->gkey[k], c->gf) : lms_jschk_same(&c->jkey[k], &c->jf))
            return c->bits + (size_t)k * nw;
    const int k = c->next;
    c->next = (k + 1) % CONS_KEPT;
    c->n_kept = c->n_kept < CONS_KEPT ? c->n_kept + 1 : CONS_KEPT;
    if (c->grammar)
        lms_gbnf_copy(&c->gkey[k], c->gf);
    else
        lms_jschk_copy(&c->jkey[k], &c->jf);
    uint64_t *bits = c->bits + (size_t)k * nw;
    memset(bits, 0, nw * sizeof *bits);
    for (int32_t i = 0; i < c->tt->n_vocab; i++)
        if (lms_constraint_allows(c, i))
            bits[i >> 6] |= (uint64_t)1 << (i & 63);
    return bits;
}

int32_t lms_constraint_sample(lms_constraint *c, lms_sampler *smp, const float *logits,
                              float *prob)
{
    int32_t tok = lms_sampler_sample(smp, logits, prob);
    if (lms_constraint_allows(c, tok))
        return tok;
    const uint64_t *bits = allowed_bits(c);
    bool any = false;
    for (int32_t i = 0; i < c->tt->n_vocab; i++) {
        const bool ok = (bits[i >> 6] >> (i & 63)) & 1;
        c->masked[i] = ok ? logits[i] : -INFINITY;
        any |= ok;
    }
    return any ? lms_sampler_sample(smp, c->masked, prob) : -1;
}

void lms_constraint_accept(lms_constraint *c, int32_t id)
{
    const lms_toktexts *tt = c->tt;
    if (id < 0 || id >= tt->n_vocab || tt->eog[id])
        return;
    const uint32_t a = tt->off[id], b = tt->off[id + 1];
    if (c->grammar)
        lms_gbnf_feed(c->gf, tt->bytes + a, b - a);
    else
        lms_jschk_feed(&c->jf, tt->bytes + a, b - a);
}
