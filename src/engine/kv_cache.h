/*
 * kv_cache.h - the paged K/V cache: one pool of fixed-size blocks reserved
 * at start, per-sequence block tables, and a prefix cache over full blocks.
 *
 * Cell layout: k[layer][block][slot][row], v alike, where a row holds the
 * n_kv_head * head_dim values of one position in the cache type: F16
 * (default), Q8_0 (34 bytes per 32 values: 53% of F16) or Q4_0 (18 bytes
 * per 32 values: 28% of F16); in the quantized types each head's values
 * are whole blocks.
 * Position p of a sequence lives in block seq->blocks[p / LMS_KV_BLOCK],
 * slot p % LMS_KV_BLOCK.
 *
 * Q4_0's K rows are tiled within each block (a layer's BLOCK rows, the
 * same bytes): for each 32-value block g of a row, a tile of
 * LMS_KV_Q4_TILE bytes at g * LMS_KV_Q4_TILE holding the BLOCK slots'
 * scales (f16, slot i's at 2 i), then four vectors of the slots' 4-byte
 * words of qs (word w of slot i at 32 + 64 w + 4 i). The attention's
 * scores take 16 positions a vector from there, with no horizontal sums
 * (attention.c). A head's tiles follow each other, 16 * (its byte offset
 * in a row) from the block's start. V rows stay whole.
 *
 * Block states:
 *
 *   refcnt > 0              in use by that many sequences
 *   refcnt == 0, hash set   free but "cached": still holds the K/V of a
 *                           known prefix and can be mapped again by lookup
 *   refcnt == 0, no hash    free and empty
 *
 * Free blocks (cached or not) sit on one LRU list; allocation takes the
 * least recently freed one, dropping whatever prefix it held. A full block
 * is identified by a hash chained over (parent block hash, its 16 token ids,
 * adapter id); the tokens are stored too, so a hash collision can never map
 * the wrong block.
 *
 * Owner: the scheduler thread of one model (no locking inside).
 */
#ifndef LMS_KV_CACHE_H
#define LMS_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define LMS_KV_BLOCK 16

typedef struct lms_kv_block_meta {
    int32_t refcnt;
    int32_t prev, next;           /* LRU free-list links (-1 = none) */
    bool on_free_list;
    bool has_hash;
    uint64_t hash;                /* chained prefix hash when has_hash */
    uint64_t parent;              /* hash of the block before it (0 = first) */
    int32_t tokens[LMS_KV_BLOCK]; /* token ids it holds when has_hash */
} lms_kv_block_meta;

typedef struct lms_kv_cache {
    int32_t n_layer;
    int32_t n_kv_dim;      /* n_head_kv * head_dim */
    int32_t n_blocks;
    int type;              /* LMS_TYPE_F16, LMS_TYPE_Q8_0 or LMS_TYPE_Q4_0 */
    size_t row_bytes;      /* one position's K (or V) row */
    size_t layer_stride;   /* bytes per layer: n_blocks * BLOCK * row_bytes */
    uint8_t *k;            /* [n_layer][n_blocks][BLOCK][row] */
    uint8_t *v;            /* same layout */
    lms_kv_block_meta *meta; /* [n_blocks] */
    int32_t lru_head, lru_tail; /* free list: head = least recently freed */
    int32_t n_free;        /* blocks with refcnt 0 */
    int32_t n_cached;      /* of which holding a prefix */
    int32_t *table;        /* open-addressing hash -> block, -1 empty */
    uint32_t table_mask;
    struct kv_bgfault *bg; /* the pool's pre-fault thread while it runs (kv_cache.c) */
} lms_kv_cache;

typedef struct lms_kv_seq {
    int32_t *blocks;       /* block table */
    int32_t n_blocks;      /* blocks held */
    int32_t cap;           /* capacity of `blocks` */
    int32_t n_pos;         /* positions whose K/V are written */
} lms_kv_seq;

/* Whether the cache holds `type` for rows of n values (a head, or a whole
 * row of heads): LMS_TYPE_F16 always, LMS_TYPE_Q8_0 and LMS_TYPE_Q4_0 when
 * the values are whole blocks (n a multiple of 32). */
bool lms_kv_type_ok(int type, int64_t n);

/* type: one that lms_kv_type_ok takes for n_kv_dim. */
int lms_kv_cache_init(lms_kv_cache *c, int32_t n_layer, int32_t n_kv_dim, int32_t n_blocks,
                      int type);
void lms_kv_cache_deinit(lms_kv_cache *c);
/* Whether the pool is still being faulted in behind the scenes (tests). */
bool lms_kv_prefault_busy(const lms_kv_cache *c);

/* The function that writes a row of n floats into the cache type: f16 and
 * q8_0 the kernels' from_float; q4_0 round to nearest with the block's
 * largest value as scale (fast, unlike the kernels' least-squares weight
 * quantizer). */
lms_from_float_fn lms_kv_row_writer(int type);

/* Makes seq able to hold n_pos positions, taking blocks from the pool.
 * LMS_ERR_LIMIT (nothing taken) when the pool lacks blocks. */
int lms_kv_seq_reserve(lms_kv_cache *c, lms_kv_seq *s, int32_t n_pos);
/* Drops seq's references to all its blocks (they stay cached if hashed)
 * and frees its table. */
void lms_kv_seq_release(lms_kv_cache *c, lms_kv_seq *s);

/* ---- prefix cache ---------------------------------------------------------- */

/* Hash of a full block given its parent's hash (0 for the first block). */
uint64_t lms_kv_block_hash(uint64_t parent, const int32_t *tokens, uint64_t adapter);
/* Appends to seq the cached blocks that hold tokens[0 .. k*BLOCK) for the
 * largest k <= max_blocks found; returns k. seq must hold no blocks yet. */
int32_t lms_kv_prefix_map(lms_kv_cache *c, lms_kv_seq *s, const int32_t *tokens,
                          int32_t max_blocks, uint64_t adapter);
/* Records that block i of seq (full) holds tokens[i*BLOCK ..]; parent is the
 * hash of block i-1 (0 for i = 0). Returns the block's hash. */
uint64_t lms_kv_prefix_register(lms_kv_cache *c, const lms_kv_seq *s, int32_t i, uint64_t parent,
                                const int32_t *tokens, uint64_t adapter);
/* Replaces block i of seq by a private copy when it is shared, so that
 * positions in it can be rewritten. */
int lms_kv_make_private(lms_kv_cache *c, lms_kv_seq *s, int32_t i);

/* The bytes of a tile of Q4_0 K values (see the top) */
#define LMS_KV_Q4_TILE (LMS_KV_BLOCK * sizeof(lms_block_q4_0))

/* Whether the K rows of a cache of this type are tiled. */
static inline bool lms_kv_k_tiled(int type)
{
    return type == LMS_TYPE_Q4_0;
}

/* Writes position pos's K row (n_kv_dim floats) of seq in layer il, in
 * the cache's type and layout. */
void lms_kv_put_k(lms_kv_cache *c, const lms_kv_seq *s, int il, int32_t pos, const float *k);

/* Tiled K (Q4_0): puts block g of slot `slot`'s row into the block's
 * region `blk`, or reads it back. */
void lms_kv_tile_put(uint8_t *blk, int slot, int g, const lms_block_q4_0 *b);
void lms_kv_tile_get(const uint8_t *blk, int slot, int g, lms_block_q4_0 *b);

/* Blocks referenced by at least one sequence. */
static inline int32_t lms_kv_used(const lms_kv_cache *c)
{
    return c->n_blocks - c->n_free;
}

/* Pointer to the K (or V) row of position pos of seq in layer il (K:
 * not for a tiled cache, whose K rows lms_kv_put_k writes). */
static inline uint8_t *lms_kv_k(const lms_kv_cache *c, const lms_kv_seq *s, int il, int32_t pos)
{
    size_t cell = (size_t)s->blocks[pos / LMS_KV_BLOCK] * LMS_KV_BLOCK + (size_t)(pos % LMS_KV_BLOCK);
    return c->k + (size_t)il * c->layer_stride + cell * c->row_bytes;
}

/* The start of the K bytes of the block holding position pos (tiled K). */
static inline uint8_t *lms_kv_k_block(const lms_kv_cache *c, const lms_kv_seq *s, int il,
                                      int32_t pos)
{
    return c->k + (size_t)il * c->layer_stride +
           (size_t)s->blocks[pos / LMS_KV_BLOCK] * LMS_KV_BLOCK * c->row_bytes;
}

static inline uint8_t *lms_kv_v(const lms_kv_cache *c, const lms_kv_seq *s, int il, int32_t pos)
{
    size_t cell = (size_t)s->blocks[pos / LMS_KV_BLOCK] * LMS_KV_BLOCK + (size_t)(pos % LMS_KV_BLOCK);
    return c->v + (size_t)il * c->layer_stride + cell * c->row_bytes;
}

#endif
