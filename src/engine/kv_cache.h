/*
 * kv_cache.h - the paged K/V cache: one pool of fixed-size blocks reserved
 * at start, and per-sequence block tables.
 *
 * Cell layout (f16): k[layer][block][slot][n_kv_head * head_dim], v alike.
 * Position p of a sequence lives in block seq->blocks[p / LMS_KV_BLOCK],
 * slot p % LMS_KV_BLOCK. Blocks are reference counted so that sequences can
 * share full blocks of a common prefix (the prefix cache builds on this).
 *
 * Owner: the scheduler thread of one model (no locking inside).
 */
#ifndef LMS_KV_CACHE_H
#define LMS_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMS_KV_BLOCK 16

typedef struct lms_kv_cache {
    int32_t n_layer;
    int32_t n_kv_dim;      /* n_head_kv * head_dim */
    int32_t n_blocks;
    size_t layer_stride;   /* elements per layer: n_blocks * BLOCK * n_kv_dim */
    uint16_t *k;           /* [n_layer][n_blocks][BLOCK][n_kv_dim] f16 */
    uint16_t *v;           /* same layout */
    int32_t *refcnt;       /* [n_blocks]; 0 = free */
    int32_t *free_list;    /* stack of free block ids */
    int32_t n_free;
} lms_kv_cache;

typedef struct lms_kv_seq {
    int32_t *blocks;       /* block table */
    int32_t n_blocks;      /* blocks held */
    int32_t cap;           /* capacity of `blocks` */
    int32_t n_pos;         /* positions whose K/V are written */
} lms_kv_seq;

int lms_kv_cache_init(lms_kv_cache *c, int32_t n_layer, int32_t n_kv_dim, int32_t n_blocks);
void lms_kv_cache_deinit(lms_kv_cache *c);

/* Makes seq able to hold n_pos positions, taking blocks from the pool.
 * LMS_ERR_LIMIT (nothing taken) when the pool lacks blocks. */
int lms_kv_seq_reserve(lms_kv_cache *c, lms_kv_seq *s, int32_t n_pos);
/* Returns all of seq's blocks to the pool (drops its references). */
void lms_kv_seq_release(lms_kv_cache *c, lms_kv_seq *s);

/* Pointer to the K (or V) row of position pos of seq in layer il. */
static inline uint16_t *lms_kv_k(const lms_kv_cache *c, const lms_kv_seq *s, int il, int32_t pos)
{
    size_t cell = (size_t)s->blocks[pos / LMS_KV_BLOCK] * LMS_KV_BLOCK + (size_t)(pos % LMS_KV_BLOCK);
    return c->k + (size_t)il * c->layer_stride + cell * (size_t)c->n_kv_dim;
}

static inline uint16_t *lms_kv_v(const lms_kv_cache *c, const lms_kv_seq *s, int il, int32_t pos)
{
    size_t cell = (size_t)s->blocks[pos / LMS_KV_BLOCK] * LMS_KV_BLOCK + (size_t)(pos % LMS_KV_BLOCK);
    return c->v + (size_t)il * c->layer_stride + cell * (size_t)c->n_kv_dim;
}

#endif
