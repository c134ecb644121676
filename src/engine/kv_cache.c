/*
 * kv_cache.c - block pool and block tables (see kv_cache.h).
 */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/ckd.h"
#include "base/err.h"

int lms_kv_cache_init(lms_kv_cache *c, int32_t n_layer, int32_t n_kv_dim, int32_t n_blocks)
{
    memset(c, 0, sizeof *c);
    size_t per_layer, total, bytes;
    if (n_layer <= 0 || n_kv_dim <= 0 || n_blocks <= 0 ||
        lms_ckd_mul(&per_layer, (size_t)n_blocks * LMS_KV_BLOCK, (size_t)n_kv_dim) ||
        lms_ckd_mul(&total, per_layer, (size_t)n_layer) || lms_ckd_mul(&bytes, total, sizeof(uint16_t)))
        return LMS_ERR_INVAL;
    c->n_layer = n_layer;
    c->n_kv_dim = n_kv_dim;
    c->n_blocks = n_blocks;
    c->layer_stride = per_layer;
    c->k = malloc(bytes);
    c->v = malloc(bytes);
    c->refcnt = calloc((size_t)n_blocks, sizeof *c->refcnt);
    c->free_list = malloc((size_t)n_blocks * sizeof *c->free_list);
    if (!c->k || !c->v || !c->refcnt || !c->free_list) {
        lms_kv_cache_deinit(c);
        return LMS_ERR_NOMEM;
    }
    /* low ids on top of the stack: a short run touches little memory */
    for (int32_t i = 0; i < n_blocks; i++)
        c->free_list[i] = n_blocks - 1 - i;
    c->n_free = n_blocks;
    return 0;
}

void lms_kv_cache_deinit(lms_kv_cache *c)
{
    free(c->k);
    free(c->v);
    free(c->refcnt);
    free(c->free_list);
    memset(c, 0, sizeof *c);
}

int lms_kv_seq_reserve(lms_kv_cache *c, lms_kv_seq *s, int32_t n_pos)
{
    int32_t need = (n_pos + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK;
    if (need <= s->n_blocks)
        return 0;
    if (need - s->n_blocks > c->n_free)
        return LMS_ERR_LIMIT;
    if (need > s->cap) {
        int32_t cap = s->cap ? s->cap : 8;
        while (cap < need)
            cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb)
            return LMS_ERR_NOMEM;
        s->blocks = nb;
        s->cap = cap;
    }
    while (s->n_blocks < need) {
        int32_t b = c->free_list[--c->n_free];
        c->refcnt[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return 0;
}

void lms_kv_seq_release(lms_kv_cache *c, lms_kv_seq *s)
{
    for (int32_t i = 0; i < s->n_blocks; i++) {
        int32_t b = s->blocks[i];
        if (--c->refcnt[b] == 0)
            c->free_list[c->n_free++] = b;
    }
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
