/*
 * kv_cache.c - block pool, block tables and the prefix cache (see
 * kv_cache.h for the block states).
 */
#include "engine/kv_cache.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#endif

#include "base/ckd.h"
#include "base/err.h"
#include "base/fp16.h"
#include "kernels/kernels.h"

/* A K or V pool: 2 MiB aligned and, on Linux, on transparent huge pages
 * where the system allows them (madvise mode). Attention reads a head's
 * short slice of each row, rows a few KiB apart: with 4 KiB pages nearly
 * every row is a TLB miss. Freed with free(). */
static void *pool_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge)
        return malloc(bytes);
    size_t n = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p)
        madvise(p, n, MADV_HUGEPAGE); /* a hint: failure only costs speed */
#endif
    return p;
}

/* ---- row writers -------------------------------------------------------------- */

/*
 * q4_0 rows by the format's own rounding rule: the block's value of largest
 * magnitude m maps to code 0 (scale d = m / -8), every value to the code
 * nearest x / d + 8 (halves up), at most 15. The kernels' from_float for
 * q4_0 is the weight quantizer, a least-squares fit of each block's scale:
 * about 59 us a 1024-value row (this AMD EPYC), 3.3 ms of every
 * Qwen3-0.6B token for its 56 rows; this takes about 1 us. Its error is a
 * little larger (no fitted scale): at most half a step, a whole step for
 * values of the sign opposite to the largest that round past code 15.
 */
static void kv_q4_0_row(const float *x, void *y, int64_t n)
{
    lms_block_q4_0 *b = y;
    for (int64_t i = 0; i < n / LMS_QK4_0; i++) {
        const float *xb = x + i * LMS_QK4_0;
        float m = 0.0f, am = 0.0f;
        for (int j = 0; j < LMS_QK4_0; j++)
            if (fabsf(xb[j]) > am) {
                am = fabsf(xb[j]);
                m = xb[j];
            }
        const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = lms_f32_to_f16(d);
        for (int j = 0; j < LMS_QK4_0 / 2; j++) {
            const float lo = xb[j] * id + 8.5f, hi = xb[j + LMS_QK4_0 / 2] * id + 8.5f;
            /* in [0.5, 16.5] (NaN: code 0) */
            const int ql = lo >= 0.0f ? (lo < 15.0f ? (int)lo : 15) : 0;
            const int qh = hi >= 0.0f ? (hi < 15.0f ? (int)hi : 15) : 0;
            b[i].qs[j] = (uint8_t)(ql | qh << 4);
        }
    }
}

bool lms_kv_type_ok(int type, int64_t n)
{
    return type == LMS_TYPE_F16 ||
           ((type == LMS_TYPE_Q8_0 || type == LMS_TYPE_Q4_0) && n % LMS_QK8_0 == 0);
}

lms_from_float_fn lms_kv_row_writer(int type)
{
    return type == LMS_TYPE_Q4_0 ? kv_q4_0_row : lms_kernels_get()->from_float[type];
}

void lms_kv_tile_put(uint8_t *blk, int slot, int g, const lms_block_q4_0 *b)
{
    uint8_t *t = blk + (size_t)g * LMS_KV_Q4_TILE;
    memcpy(t + 2 * slot, &b->d, sizeof b->d);
    for (int w = 0; w < 4; w++)
        memcpy(t + 2 * LMS_KV_BLOCK + 64 * w + 4 * slot, b->qs + 4 * w, 4);
}

void lms_kv_tile_get(const uint8_t *blk, int slot, int g, lms_block_q4_0 *b)
{
    const uint8_t *t = blk + (size_t)g * LMS_KV_Q4_TILE;
    memcpy(&b->d, t + 2 * slot, sizeof b->d);
    for (int w = 0; w < 4; w++)
        memcpy(b->qs + 4 * w, t + 2 * LMS_KV_BLOCK + 64 * w + 4 * slot, 4);
}

void lms_kv_put_k(lms_kv_cache *c, const lms_kv_seq *s, int il, int32_t pos, const float *k)
{
    const lms_from_float_fn put = lms_kv_row_writer(c->type);
    if (!lms_kv_k_tiled(c->type)) {
        put(k, lms_kv_k(c, s, il, pos), c->n_kv_dim);
        return;
    }
    uint8_t *blk = lms_kv_k_block(c, s, il, pos);
    for (int g = 0; g < c->n_kv_dim / LMS_QK4_0; g++) {
        lms_block_q4_0 b;
        put(k + (size_t)g * LMS_QK4_0, &b, LMS_QK4_0);
        lms_kv_tile_put(blk, pos % LMS_KV_BLOCK, g, &b);
    }
}

/* Bytes of the K and V pools, together, faulted in at reservation. A
 * fresh page is zeroed by the kernel on its first write, inside the step
 * that writes it (a 2 MiB huge page: 100-400 us). Blocks are handed out
 * lowest index first (the free list starts in index order), so the first
 * blocks of every layer are the first written: those are faulted in now,
 * up to this many bytes; the rest of a large pool (--kv-budget) is faulted
 * in by a background thread (below), so a big pool does not slow the start
 * (64 MiB: 6-130 ms, up to ~150 ms while the kernel has to compact memory
 * for huge pages). */
#define KV_PREFAULT_BYTES ((size_t)64 << 20)

/* Faults in the first n bytes of each of n_layer regions `stride` bytes
 * apart from p, writable: MADV_POPULATE_WRITE (Linux 5.14+), which leaves
 * the contents alone, else a write to each page (the pool holds nothing
 * yet). */
/* Faults in bytes [lo, lo + n) writable, contents untouched
 * (MADV_POPULATE_WRITE); false where the kernel cannot. */
static bool populate(uint8_t *lo, size_t n)
{
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *a = (uint8_t *)((uintptr_t)lo & ~(uintptr_t)(page - 1));
    return madvise(a, (size_t)(lo + n - a), MADV_POPULATE_WRITE) == 0;
#else
    (void)lo, (void)n;
    return false;
#endif
}

static void pool_prefault(uint8_t *p, size_t stride, int32_t n_layer, size_t n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int32_t il = 0; il < n_layer && n > 0; il++) {
        uint8_t *lo = p + (size_t)il * stride;
        if (populate(lo, n))
            continue;
        for (size_t o = 0; o < n; o += page)
            ((volatile uint8_t *)lo)[o] = 0;
    }
}

/*
 * The rest of a large pool is faulted in behind the scenes: one thread,
 * at the lowest priority, walks every layer's K and V regions in the order
 * blocks are handed out, KV_BG_CHUNK bytes of each per round with a pause
 * between rounds, so the first requests beyond the first 64 MiB do not pay
 * the kernel's page zeroing inside their steps. Only MADV_POPULATE_WRITE,
 * which leaves the contents alone, is used (the scheduler may write rows
 * meanwhile); where the kernel lacks it the pool faults in on first use,
 * as before. The thread ends when done: an idle server uses no CPU.
 */
#define KV_BG_CHUNK ((size_t)256 << 10)
#define KV_BG_PAUSE_NS 1000000L /* between rounds (a round: ~n_layer MiB) */

struct kv_bgfault {
    uint8_t *pools[2];
    size_t stride, from, to; /* each layer's region: bytes [from, to) */
    int32_t n_layer;
    atomic_bool stop, done;
    pthread_t thread;
};

static void *bgfault_main(void *arg)
{
    struct kv_bgfault *b = arg;
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    bool ok = true;
    for (size_t o = b->from; ok && o < b->to && !atomic_load(&b->stop); o += KV_BG_CHUNK) {
        const size_t n = b->to - o < KV_BG_CHUNK ? b->to - o : KV_BG_CHUNK;
        for (int32_t il = 0; ok && il < b->n_layer; il++)
            for (int k = 0; k < 2 && ok; k++)
                ok = populate(b->pools[k] + (size_t)il * b->stride + o, n);
        nanosleep(&(struct timespec){0, KV_BG_PAUSE_NS}, NULL);
    }
#endif
    atomic_store(&b->done, true);
    return NULL;
}

/* Starts the thread for bytes [from, to) of each layer's regions. */
static void bgfault_start(lms_kv_cache *c, size_t from, size_t to)
{
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    if (to <= from)
        return;
    struct kv_bgfault *b = calloc(1, sizeof *b);
    if (!b)
        return;
    b->pools[0] = c->k;
    b->pools[1] = c->v;
    b->stride = c->layer_stride;
    b->from = from;
    b->to = to;
    b->n_layer = c->n_layer;
    atomic_init(&b->stop, false);
    atomic_init(&b->done, false);
    if (pthread_create(&b->thread, NULL, bgfault_main, b) != 0) {
        free(b);
        return;
    }
    c->bg = b;
#else
    (void)c, (void)from, (void)to;
#endif
}

static void bgfault_stop(lms_kv_cache *c)
{
    if (!c->bg)
        return;
    atomic_store(&c->bg->stop, true);
    pthread_join(c->bg->thread, NULL);
    free(c->bg);
    c->bg = NULL;
}

bool lms_kv_prefault_busy(const lms_kv_cache *c)
{
    return c->bg && !atomic_load(&c->bg->done);
}

/* ---- LRU free list ----------------------------------------------------------- */

static void lru_remove(lms_kv_cache *c, int32_t b)
{
    lms_kv_block_meta *m = &c->meta[b];
    if (m->prev >= 0)
        c->meta[m->prev].next = m->next;
    else
        c->lru_head = m->next;
    if (m->next >= 0)
        c->meta[m->next].prev = m->prev;
    else
        c->lru_tail = m->prev;
    m->prev = m->next = -1;
    m->on_free_list = false;
    c->n_free--;
}

static void lru_push_tail(lms_kv_cache *c, int32_t b)
{
    lms_kv_block_meta *m = &c->meta[b];
    m->prev = c->lru_tail;
    m->next = -1;
    if (c->lru_tail >= 0)
        c->meta[c->lru_tail].next = b;
    else
        c->lru_head = b;
    c->lru_tail = b;
    m->on_free_list = true;
    c->n_free++;
}

/* ---- hash table ------------------------------------------------------------- */

static uint32_t slot_of(const lms_kv_cache *c, uint64_t h)
{
    return (uint32_t)(h ^ (h >> 29)) & c->table_mask;
}

static int32_t table_find(const lms_kv_cache *c, uint64_t h, uint64_t parent, const int32_t *toks)
{
    for (uint32_t i = slot_of(c, h);; i = (i + 1) & c->table_mask) {
        int32_t b = c->table[i];
        if (b == -1)
            return -1;
        const lms_kv_block_meta *m = &c->meta[b];
        if (b >= 0 && m->hash == h && m->parent == parent &&
            memcmp(m->tokens, toks, sizeof m->tokens) == 0)
            return b;
    }
}

static void table_insert(lms_kv_cache *c, int32_t b)
{
    uint32_t i = slot_of(c, c->meta[b].hash);
    while (c->table[i] >= 0)
        i = (i + 1) & c->table_mask;
    c->table[i] = b;
}

/* Removes block b's entry; re-inserts the rest of its probe run so lookups
 * never stop early (no tombstones). */
static void table_erase(lms_kv_cache *c, int32_t b)
{
    uint32_t i = slot_of(c, c->meta[b].hash);
    while (c->table[i] != b) {
        if (c->table[i] == -1)
            return;
        i = (i + 1) & c->table_mask;
    }
    c->table[i] = -1;
    for (i = (i + 1) & c->table_mask; c->table[i] != -1; i = (i + 1) & c->table_mask) {
        int32_t moved = c->table[i];
        c->table[i] = -1;
        table_insert(c, moved);
    }
}

static void drop_hash(lms_kv_cache *c, int32_t b)
{
    if (!c->meta[b].has_hash)
        return;
    table_erase(c, b);
    c->meta[b].has_hash = false;
    if (c->meta[b].refcnt == 0)
        c->n_cached--;
}

/* ---- pool -------------------------------------------------------------------- */

int lms_kv_cache_init(lms_kv_cache *c, int32_t n_layer, int32_t n_kv_dim, int32_t n_blocks,
                      int type)
{
    memset(c, 0, sizeof *c);
    size_t row = lms_kv_type_ok(type, n_kv_dim) ? lms_row_size(type, n_kv_dim) : 0;
    size_t per_layer, bytes;
    if (n_layer <= 0 || n_kv_dim <= 0 || n_blocks <= 0 || n_blocks > (1 << 24) || row == 0 ||
        lms_ckd_mul(&per_layer, (size_t)n_blocks * LMS_KV_BLOCK, row) ||
        lms_ckd_mul(&bytes, per_layer, (size_t)n_layer))
        return LMS_ERR_INVAL;
    c->n_layer = n_layer;
    c->n_kv_dim = n_kv_dim;
    c->n_blocks = n_blocks;
    c->type = type;
    c->row_bytes = row;
    c->layer_stride = per_layer;
    uint32_t tsize = 16;
    while (tsize < (uint32_t)n_blocks * 2)
        tsize *= 2;
    c->table_mask = tsize - 1;
    c->k = pool_alloc(bytes);
    c->v = pool_alloc(bytes);
    c->meta = calloc((size_t)n_blocks, sizeof *c->meta);
    c->table = malloc(tsize * sizeof *c->table);
    if (!c->k || !c->v || !c->meta || !c->table) {
        lms_kv_cache_deinit(c);
        return LMS_ERR_NOMEM;
    }
    size_t first = KV_PREFAULT_BYTES / 2 / (size_t)n_layer;
    first = first < per_layer ? first : per_layer;
    pool_prefault(c->k, per_layer, n_layer, first);
    pool_prefault(c->v, per_layer, n_layer, first);
    bgfault_start(c, first, per_layer);
    memset(c->table, 0xff, tsize * sizeof *c->table);
    c->lru_head = c->lru_tail = -1;
    for (int32_t b = 0; b < n_blocks; b++)
        lru_push_tail(c, b);
    return 0;
}

void lms_kv_cache_deinit(lms_kv_cache *c)
{
    bgfault_stop(c);
    free(c->k);
    free(c->v);
    free(c->meta);
    free(c->table);
    memset(c, 0, sizeof *c);
}

/* Takes the least recently freed block, forgetting its prefix. */
static int32_t take_block(lms_kv_cache *c)
{
    int32_t b = c->lru_head;
    drop_hash(c, b);
    lru_remove(c, b);
    c->meta[b].refcnt = 1;
    return b;
}

static void unref_block(lms_kv_cache *c, int32_t b)
{
    if (--c->meta[b].refcnt > 0)
        return;
    lru_push_tail(c, b);
    if (c->meta[b].has_hash)
        c->n_cached++;
}

static int grow_table(lms_kv_seq *s, int32_t need)
{
    if (need <= s->cap)
        return 0;
    int32_t cap = s->cap ? s->cap : 8;
    while (cap < need)
        cap *= 2;
    int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
    if (!nb)
        return LMS_ERR_NOMEM;
    s->blocks = nb;
    s->cap = cap;
    return 0;
}

int lms_kv_seq_reserve(lms_kv_cache *c, lms_kv_seq *s, int32_t n_pos)
{
    int32_t need = (n_pos + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK;
    if (need <= s->n_blocks)
        return 0;
    if (need - s->n_blocks > c->n_free)
        return LMS_ERR_LIMIT;
    int rc = grow_table(s, need);
    if (rc < 0)
        return rc;
    while (s->n_blocks < need)
        s->blocks[s->n_blocks++] = take_block(c);
    return 0;
}

void lms_kv_seq_release(lms_kv_cache *c, lms_kv_seq *s)
{
    for (int32_t i = 0; i < s->n_blocks; i++)
        unref_block(c, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

/* ---- prefix cache --------------------------------------------------------------- */

uint64_t lms_kv_block_hash(uint64_t parent, const int32_t *tokens, uint64_t adapter)
{
    uint64_t h = parent ^ 0x9E3779B97F4A7C15ull ^ (adapter * 0xD6E8FEB86659FD93ull);
    for (int i = 0; i < LMS_KV_BLOCK; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i];
        h *= 0x100000001B3ull;
        h ^= h >> 32;
    }
    return h ? h : 1;
}

int32_t lms_kv_prefix_map(lms_kv_cache *c, lms_kv_seq *s, const int32_t *tokens,
                          int32_t max_blocks, uint64_t adapter)
{
    uint64_t parent = 0;
    int32_t k = 0;
    if (s->n_blocks != 0 || grow_table(s, max_blocks) < 0)
        return 0;
    for (; k < max_blocks; k++) {
        const int32_t *t = tokens + (size_t)k * LMS_KV_BLOCK;
        uint64_t h = lms_kv_block_hash(parent, t, adapter);
        int32_t b = table_find(c, h, parent, t);
        if (b < 0)
            break;
        if (c->meta[b].refcnt++ == 0) {
            lru_remove(c, b);
            c->n_cached--;
        }
        s->blocks[s->n_blocks++] = b;
        parent = h;
    }
    return k;
}

uint64_t lms_kv_prefix_register(lms_kv_cache *c, const lms_kv_seq *s, int32_t i, uint64_t parent,
                                const int32_t *tokens, uint64_t adapter)
{
    int32_t b = s->blocks[i];
    const int32_t *t = tokens + (size_t)i * LMS_KV_BLOCK;
    uint64_t h = lms_kv_block_hash(parent, t, adapter);
    lms_kv_block_meta *m = &c->meta[b];
    if (m->has_hash && m->hash == h)
        return h;
    if (table_find(c, h, parent, t) >= 0) /* another block holds it already */
        return h;
    drop_hash(c, b);
    m->hash = h;
    m->parent = parent;
    memcpy(m->tokens, t, sizeof m->tokens);
    m->has_hash = true;
    table_insert(c, b);
    return h;
}

int lms_kv_make_private(lms_kv_cache *c, lms_kv_seq *s, int32_t i)
{
    int32_t old = s->blocks[i];
    if (c->meta[old].refcnt <= 1) {
        drop_hash(c, old); /* its content is about to change */
        return 0;
    }
    if (c->n_free == 0)
        return LMS_ERR_LIMIT;
    int32_t nb = take_block(c);
    size_t bb = (size_t)LMS_KV_BLOCK * c->row_bytes; /* bytes of one block in one layer */
    for (int32_t il = 0; il < c->n_layer; il++) {
        size_t base = (size_t)il * c->layer_stride;
        memcpy(c->k + base + (size_t)nb * bb, c->k + base + (size_t)old * bb, bb);
        memcpy(c->v + base + (size_t)nb * bb, c->v + base + (size_t)old * bb, bb);
    }
    s->blocks[i] = nb;
    unref_block(c, old);
    return 0;
}
