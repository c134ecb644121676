/*
 * lora.c - LoRA adapters from GGUF (see lora.h for the format facts and
 * the lifetime rules).
 *
 * Loading: gguf.c parses and bounds-checks the file; here the metadata is
 * checked, every tensor name is mapped to a slot (layer x target, token
 * embedding, output head), each slot must get exactly one lora_a and one
 * lora_b whose shapes fit the base weight, and the values are converted to
 * f32 (B transposed). The file is closed before returning: the adapter
 * owns plain memory only.
 *
 * PEFT adapters (safetensors.c reads the tensors) are first translated to
 * the GGUF names and layout (lora.h's table) and then go through the same
 * checks and conversion, so both forms of one adapter load to the same
 * values.
 */
#include "model/lora.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/safetensors.h"

#define LORA_MAX_RANK 8192

struct lms_lora {
    int refs;               /* atomic */
    uint64_t id;            /* content hash, never 0 */
    char name[128];
    char *path;             /* owned ("" for memory files) */
    char arch[32];
    float alpha;
    int32_t max_rank;
    int32_t n_layer;        /* of the base model */
    int32_t n_pairs;
    size_t bytes;
    lms_lora_pair *pairs;   /* [n_pairs] */
    int32_t *slot;          /* [n_slots] index into pairs, -1 = none */
};

static const char *const target_names[LMS_LORA_N_TARGETS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

const char *lms_lora_target_name(int target)
{
    return target >= 0 && target < LMS_LORA_N_TARGETS ? target_names[target] : "?";
}

/* Slots: il * N_TARGETS + target for the layers, then token_embd, output. */
static int32_t n_slots(int32_t n_layer) { return n_layer * LMS_LORA_N_TARGETS + 2; }
static int32_t slot_embd(int32_t n_layer) { return n_layer * LMS_LORA_N_TARGETS; }
static int32_t slot_output(int32_t n_layer) { return n_layer * LMS_LORA_N_TARGETS + 1; }

/* ---- lifetime and getters ---------------------------------------------------- */

static void lora_free(lms_lora *l)
{
    for (int32_t i = 0; i < l->n_pairs; i++) {
        free(l->pairs[i].a);
        free(l->pairs[i].bt);
    }
    free(l->pairs);
    free(l->slot);
    free(l->path);
    free(l);
}

lms_lora *lms_lora_retain(lms_lora *l)
{
    __atomic_add_fetch(&l->refs, 1, __ATOMIC_RELAXED);
    return l;
}

void lms_lora_release(lms_lora *l)
{
    if (l && __atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL) == 0)
        lora_free(l);
}

uint64_t lms_lora_id(const lms_lora *l) { return l->id; }
const char *lms_lora_name(const lms_lora *l) { return l->name; }
const char *lms_lora_path(const lms_lora *l) { return l->path; }
int32_t lms_lora_rank(const lms_lora *l) { return l->max_rank; }
float lms_lora_alpha(const lms_lora *l) { return l->alpha; }
int32_t lms_lora_n_tensors(const lms_lora *l) { return l->n_pairs; }
size_t lms_lora_bytes(const lms_lora *l) { return l->bytes; }

static const lms_lora_pair *pair_at(const lms_lora *l, int32_t slot)
{
    int32_t i = l->slot[slot];
    return i >= 0 ? &l->pairs[i] : NULL;
}

const lms_lora_pair *lms_lora_layer_pair(const lms_lora *l, int il, int target)
{
    if (il < 0 || il >= l->n_layer || target < 0 || target >= LMS_LORA_N_TARGETS)
        return NULL;
    return pair_at(l, il * LMS_LORA_N_TARGETS + target);
}

const lms_lora_pair *lms_lora_embd_pair(const lms_lora *l) { return pair_at(l, slot_embd(l->n_layer)); }
const lms_lora_pair *lms_lora_output_pair(const lms_lora *l) { return pair_at(l, slot_output(l->n_layer)); }

/* ---- names and shapes ------------------------------------------------------------ */

/* The slot a base tensor name maps to, or -1 when the name is not one an
 * adapter can target in a model of n_layer layers. */
static int32_t slot_of(const char *name, int32_t n_layer)
{
    if (!strcmp(name, "token_embd.weight"))
        return slot_embd(n_layer);
    if (!strcmp(name, "output.weight"))
        return slot_output(n_layer);
    int il = -1, len = 0;
    char stem[32];
    if (sscanf(name, "blk.%d.%31[a-z_].weight%n", &il, stem, &len) != 2 || name[len] != 0 ||
        il < 0 || il >= n_layer)
        return -1;
    char canon[96]; /* rejects "blk.01", "blk.+1", ... */
    for (int t = 0; t < LMS_LORA_N_TARGETS; t++) {
        snprintf(canon, sizeof canon, "blk.%d.%s.weight", il, target_names[t]);
        if (!strcmp(canon, name))
            return il * LMS_LORA_N_TARGETS + t;
    }
    return -1;
}

/* The base weight of a slot (for output: NULL when the head is tied to
 * the token embedding, which an adapter then cannot target apart). */
static const lms_weight *base_weight(const lms_model *m, int32_t slot)
{
    const int32_t nl = m->hp.n_layer;
    if (slot == slot_embd(nl))
        return &m->tok_embd;
    if (slot == slot_output(nl))
        return m->output.data != m->tok_embd.data ? &m->output : NULL;
    const lms_layer *l = &m->layers[slot / LMS_LORA_N_TARGETS];
    const lms_weight *ws[LMS_LORA_N_TARGETS] = {&l->wq, &l->wk, &l->wv, &l->wo,
                                                 &l->w_gate, &l->w_up, &l->w_down};
    return ws[slot % LMS_LORA_N_TARGETS];
}

static void slot_name(int32_t slot, int32_t n_layer, char *buf, size_t n)
{
    if (slot == slot_embd(n_layer))
        snprintf(buf, n, "token_embd.weight");
    else if (slot == slot_output(n_layer))
        snprintf(buf, n, "output.weight");
    else
        snprintf(buf, n, "blk.%d.%s.weight", (int)(slot / LMS_LORA_N_TARGETS),
                 target_names[slot % LMS_LORA_N_TARGETS]);
}

/* The (A, B) shapes a slot's pair of rank r must have. A regular weight
 * W [n_in, n_out]: A [n_in, r], B [r, n_out]. token_embd [n_embd, n_vocab]
 * (looked up by row): A [r, n_vocab], B [r, n_embd]. */
static void want_shapes(const lms_weight *w, bool embd, int64_t r, int64_t a[2], int64_t b[2])
{
    if (embd) {
        a[0] = r, a[1] = w->ne[1];
        b[0] = r, b[1] = w->ne[0];
    } else {
        a[0] = w->ne[0], a[1] = r;
        b[0] = r, b[1] = w->ne[1];
    }
}

/* ---- loading ------------------------------------------------------------------------ */

typedef struct lora_loader {
    const gguf_file *f;      /* GGUF metadata; NULL for PEFT adapters */
    const gguf_tensor *ts;   /* the adapter's tensors, GGUF names and layout */
    uint64_t n_ts;
    const lms_model *m;
    const char *file;        /* for messages */
    char *err;
    size_t errsz;
    int32_t *a_of, *b_of;    /* [n_slots] tensor index of each slot's A / B, -1 */
    int32_t *fa_of, *fb_of;  /* [n_layer * 2] the same for fused matrices (fused_of) */
} lora_loader;

static int check_meta(lora_loader *L, lms_lora *l)
{
    const gguf_file *f = L->f;
    const char *s = NULL;
    int rc = gguf_get_str(f, "general.type", &s);
    if (rc < 0 || strcmp(s, "adapter") != 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "lora '%s': general.type is %s%s%s, expected \"adapter\"", L->file,
                        rc < 0 ? "missing" : "\"", rc < 0 ? "" : s, rc < 0 ? "" : "\"");
    rc = gguf_get_str(f, "adapter.type", &s);
    if (rc < 0 || strcmp(s, "lora") != 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "lora '%s': adapter.type is %s%s%s, expected \"lora\"", L->file,
                        rc < 0 ? "missing" : "\"", rc < 0 ? "" : s, rc < 0 ? "" : "\"");
    rc = gguf_get_str(f, "general.architecture", &s);
    if (rc < 0 || strcmp(s, L->m->hp.arch) != 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_INVAL,
                        "lora '%s': general.architecture is %s%s%s, the base model's is \"%s\"",
                        L->file, rc < 0 ? "missing" : "\"", rc < 0 ? "" : s, rc < 0 ? "" : "\"",
                        L->m->hp.arch);
    if (gguf_find_kv(f, "adapter.alora.invocation_tokens")) /* active only after those tokens */
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "lora '%s': adapter.alora.invocation_tokens: activated LoRA (aLoRA) "
                        "adapters are not supported", L->file);
    float alpha = 0.0f;
    rc = gguf_get_f32(f, "adapter.lora.alpha", &alpha);
    if (rc < 0 && rc != LMS_ERR_NOTFOUND)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "lora '%s': adapter.lora.alpha is not a number", L->file);
    if (!isfinite(alpha))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "lora '%s': adapter.lora.alpha is not finite", L->file);
    l->alpha = alpha;
    if (gguf_get_str(f, "general.name", &s) == 0 && s[0])
        snprintf(l->name, sizeof l->name, "%s", s);
    return 0;
}

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/*
 * phi3's fused matrices: blk.N.attn_qkv.weight holds the q, k and v rows,
 * a fused blk.N.ffn_up.weight the gate rows then the up rows (model.c
 * binds the parts as row ranges). An adapter of a fused matrix (A
 * [n_embd, r], B [r, all its rows], as llama.cpp's converter writes for
 * phi3) is split into one pair per part, sharing A and each taking its
 * rows of B: y_part += s B_part (A x) is the fused product's part. An
 * ffn_up pair whose B has only the up rows is the up part's own (an
 * adapter written per part: ffn_gate + ffn_up, attn_q/k/v).
 */
enum { FUSED_QKV, FUSED_GATE_UP, FUSED_KINDS };

/* The fused kind of base tensor name (and its layer), or -1. */
static int fused_of(const lms_model *m, const char *name, int32_t *il_out)
{
    int il = -1, len = 0;
    char stem[32], canon[96];
    if (sscanf(name, "blk.%d.%31[a-z_].weight%n", &il, stem, &len) != 2 || name[len] != 0 ||
        il < 0 || il >= m->hp.n_layer)
        return -1;
    snprintf(canon, sizeof canon, "blk.%d.%s.weight", il, stem);
    if (strcmp(canon, name) != 0)
        return -1;
    const lms_layer *l = &m->layers[il];
    *il_out = il;
    if (!strcmp(stem, "attn_qkv") && gguf_find_tensor(m->gguf, name))
        return FUSED_QKV;
    snprintf(canon, sizeof canon, "blk.%d.ffn_gate.weight", il);
    const uint8_t *gate_end = l->w_gate.data ? (const uint8_t *)l->w_gate.data +
                                                   lms_row_size(l->w_gate.type, l->w_gate.ne[0]) *
                                                       (size_t)l->w_gate.ne[1]
                                             : NULL;
    if (!strcmp(stem, "ffn_up") && gate_end && (const void *)gate_end == l->w_up.data &&
        !gguf_find_tensor(m->gguf, canon))
        return FUSED_GATE_UP;
    return -1;
}

/* The parts of fused kind k of layer l: their targets and base weights. */
static int fused_parts(const lms_layer *l, int k, int *targets, const lms_weight **ws)
{
    if (k == FUSED_QKV) {
        targets[0] = LMS_LORA_Q, targets[1] = LMS_LORA_K, targets[2] = LMS_LORA_V;
        ws[0] = &l->wq, ws[1] = &l->wk, ws[2] = &l->wv;
        return 3;
    }
    targets[0] = LMS_LORA_GATE, targets[1] = LMS_LORA_UP;
    ws[0] = &l->w_gate, ws[1] = &l->w_up;
    return 2;
}

/* Sorts every tensor into its slot's A or B. */
static int map_tensors(lora_loader *L)
{
    const int32_t nl = L->m->hp.n_layer;
    char base[256];
    for (uint64_t i = 0; i < L->n_ts; i++) {
        const gguf_tensor *t = &L->ts[i];
        const char *name = t->name.p;
        const size_t n = t->name.n;
        bool is_a = ends_with(name, n, ".lora_a"), is_b = ends_with(name, n, ".lora_b");
        if (!is_a && !is_b) {
            if (ends_with(name, n, "_norm.weight"))
                continue; /* norm vectors (mergekit): ignored, as llama.cpp does */
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                            "lora '%s': tensor '%s' is neither a .lora_a nor a .lora_b tensor",
                            L->file, name);
        }
        if (n - 7 >= sizeof base || strlen(name) != n)
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "lora '%s': tensor name '%.64s...' "
                            "is too long", L->file, name);
        memcpy(base, name, n - 7);
        base[n - 7] = 0;
        int32_t il;
        const int fk = fused_of(L->m, base, &il);
        if (fk >= 0) {
            int32_t *at = is_a ? &L->fa_of[il * FUSED_KINDS + fk] : &L->fb_of[il * FUSED_KINDS + fk];
            if (*at >= 0)
                return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                                "lora '%s': duplicate tensor '%s'", L->file, name);
            *at = (int32_t)i;
            continue;
        }
        int32_t slot = slot_of(base, nl);
        if (slot >= 0 && !base_weight(L->m, slot))
            slot = -1;
        if (slot < 0) {
            if (gguf_find_tensor(L->m->gguf, base))
                return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                                "lora '%s': tensor '%s' targets '%s', which LoRA cannot adapt here "
                                "(attention and FFN matrices, token_embd and an untied output only)",
                                L->file, name, base);
            return lms_errf(L->err, L->errsz, LMS_ERR_INVAL,
                            "lora '%s': tensor '%s' targets '%s', which the base model does not "
                            "have (wrong base model?)", L->file, name, base);
        }
        int32_t *at = is_a ? &L->a_of[slot] : &L->b_of[slot];
        if (*at >= 0)
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "lora '%s': duplicate tensor '%s'",
                            L->file, name);
        *at = (int32_t)i;
    }
    return 0;
}

/* Checks a slot's two tensors against the base weight; sets *rank. */
static int check_pair(lora_loader *L, int32_t slot, int32_t *rank)
{
    const int32_t nl = L->m->hp.n_layer;
    char wname[96];
    slot_name(slot, nl, wname, sizeof wname);
    if (L->a_of[slot] < 0 || L->b_of[slot] < 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "lora '%s': tensor '%s.%s' is missing (its pair '%s.%s' is present)",
                        L->file, wname, L->a_of[slot] < 0 ? "lora_a" : "lora_b", wname,
                        L->a_of[slot] < 0 ? "lora_b" : "lora_a");
    const gguf_tensor *ta = &L->ts[L->a_of[slot]], *tb = &L->ts[L->b_of[slot]];
    const lms_weight *w = base_weight(L->m, slot);
    const bool embd = slot == slot_embd(nl);
    const int64_t r = tb->ne[0];
    int64_t wa[2], wb[2];
    want_shapes(w, embd, r, wa, wb);
    const gguf_tensor *ts[2] = {ta, tb};
    const int64_t *want[2] = {wa, wb};
    for (int k = 0; k < 2; k++) {
        const gguf_tensor *t = ts[k];
        if (t->n_dims != 2 || t->ne[0] != want[k][0] || t->ne[1] != want[k][1])
            return lms_errf(L->err, L->errsz, LMS_ERR_INVAL,
                            "lora '%s': tensor '%s' has shape [%lld, %lld, %lld, %lld]; base weight "
                            "'%s' [%lld, %lld] needs %s [%lld, %lld] at the rank %lld of its "
                            "lora_b", L->file, t->name.p, (long long)t->ne[0], (long long)t->ne[1],
                            (long long)t->ne[2], (long long)t->ne[3], wname, (long long)w->ne[0],
                            (long long)w->ne[1], k ? "lora_b" : "lora_a", (long long)want[k][0],
                            (long long)want[k][1], (long long)r);
        const lms_type_traits *tt = lms_type_get(t->type);
        const lms_kernel_table *kt = lms_kernels_get();
        const int vt = tt ? tt->vec_dot_type : -1;
        if (!tt || !kt->to_float[t->type] || lms_row_size(t->type, t->ne[0]) == 0 || vt < 0 ||
            !kt->from_float[vt] || !kt->to_float[vt] || lms_row_size(vt, t->ne[0]) == 0)
            return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                            "lora '%s': tensor '%s' has type %s, which cannot be read",
                            L->file, t->name.p, tt ? tt->name : "?");
    }
    if (r < 1 || r > LORA_MAX_RANK)
        return lms_errf(L->err, L->errsz, LMS_ERR_LIMIT,
                        "lora '%s': tensor '%s' has rank %lld, not in [1, %d]", L->file,
                        tb->name.p, (long long)r, LORA_MAX_RANK);
    *rank = (int32_t)r;
    return 0;
}

/* Rows of a tensor as f32 into out ([ne1][ne0]); rejects non-finite values. */
static int to_f32(lora_loader *L, const gguf_tensor *t, float *out)
{
    const lms_to_float_fn conv = lms_kernels_get()->to_float[t->type];
    const size_t rb = lms_row_size(t->type, t->ne[0]);
    const uint8_t *p = t->data;
    for (int64_t row = 0; row < t->ne[1]; row++)
        conv(p + (size_t)row * rb, out + (size_t)row * (size_t)t->ne[0], t->ne[0]);
    const size_t n = (size_t)t->ne[0] * (size_t)t->ne[1];
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i]))
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                            "lora '%s': tensor '%s' has a non-finite value at element %zu", L->file,
                            t->name.p, i);
    return 0;
}

/* Fills pair p of slot from its tensors (rank already checked). */
static int load_pair(lora_loader *L, lms_lora *l, int32_t slot, int32_t rank, lms_lora_pair *p)
{
    const gguf_tensor *ta = &L->ts[L->a_of[slot]], *tb = &L->ts[L->b_of[slot]];
    const lms_weight *w = base_weight(L->m, slot);
    const bool embd = slot == slot_embd(L->m->hp.n_layer);
    p->rank = rank;
    p->n_in = embd ? w->ne[1] : w->ne[0];
    p->n_out = embd ? w->ne[0] : w->ne[1];
    p->factor = l->alpha != 0.0f ? l->alpha / (float)rank : 1.0f;
    p->a_vt = lms_type_get(ta->type)->vec_dot_type;
    p->b_vt = lms_type_get(tb->type)->vec_dot_type;
    const size_t na = (size_t)ta->ne[0] * (size_t)ta->ne[1], nb = (size_t)tb->ne[0] * (size_t)tb->ne[1];
    p->a = malloc(na * sizeof *p->a);
    p->bt = malloc(nb * sizeof *p->bt);
    float *b = malloc(nb * sizeof *b); /* [n_out][rank] as stored */
    int rc = p->a && p->bt && b ? 0 : LMS_ERR_NOMEM;
    if (rc < 0)
        lms_errf(L->err, L->errsz, rc, "lora '%s': out of memory", L->file);
    if (rc == 0)
        rc = to_f32(L, ta, p->a);
    if (rc == 0)
        rc = to_f32(L, tb, b);
    if (rc == 0)
        for (int64_t o = 0; o < p->n_out; o++)
            for (int32_t r = 0; r < rank; r++)
                p->bt[(size_t)r * (size_t)p->n_out + (size_t)o] = b[(size_t)o * (size_t)rank + (size_t)r];
    free(b);
    l->bytes += (na + nb) * sizeof(float);
    return rc;
}

/* 64-bit mixing (splitmix64's finalizer). */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_floats(uint64_t h, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        h = (h ^ u) * 0x100000001B3ull;
    }
    return mix64(h);
}

/* The content id: alpha, and each pair's slot, rank and values. */
static uint64_t content_id(const lms_lora *l)
{
    uint64_t h = mix64(0x6C6F7261ull);
    h = hash_floats(h, &l->alpha, 1);
    for (int32_t s = 0; s < n_slots(l->n_layer); s++) {
        const lms_lora_pair *p = pair_at(l, s);
        if (!p)
            continue;
        h = mix64(h ^ ((uint64_t)s << 32 | (uint32_t)p->rank));
        h = hash_floats(h, p->a, (size_t)p->rank * (size_t)p->n_in);
        h = hash_floats(h, p->bt, (size_t)p->rank * (size_t)p->n_out);
    }
    return h ? h : 1;
}

/* The pairs of fused matrix k of layer il (see fused_of): A and B
 * checked against the fused weight, then one pair per part. */
static int load_fused(lora_loader *L, lms_lora *l, int32_t il, int k)
{
    const lms_layer *ly = &L->m->layers[il];
    const int32_t ia = L->fa_of[il * FUSED_KINDS + k], ib = L->fb_of[il * FUSED_KINDS + k];
    char wname[96];
    snprintf(wname, sizeof wname, "blk.%d.%s.weight", (int)il, k == FUSED_QKV ? "attn_qkv" : "ffn_up");
    if (ia < 0 || ib < 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "lora '%s': tensor '%s.%s' is missing (its pair '%s.%s' is present)",
                        L->file, wname, ia < 0 ? "lora_a" : "lora_b", wname,
                        ia < 0 ? "lora_b" : "lora_a");
    int targets[3];
    const lms_weight *ws[3];
    const int np = fused_parts(ly, k, targets, ws);
    int64_t rows = 0;
    for (int i = 0; i < np; i++)
        rows += ws[i]->ne[1];
    const gguf_tensor *ta = &L->ts[ia], *tb = &L->ts[ib];
    const int64_t r = tb->ne[0], n_in = ws[0]->ne[0];
    const gguf_tensor *ts[2] = {ta, tb};
    const int64_t want[2][2] = {{n_in, r}, {r, rows}};
    for (int i = 0; i < 2; i++) {
        const gguf_tensor *t = ts[i];
        if (t->n_dims != 2 || t->ne[0] != want[i][0] || t->ne[1] != want[i][1])
            return lms_errf(L->err, L->errsz, LMS_ERR_INVAL,
                            "lora '%s': tensor '%s' has shape [%lld, %lld, %lld, %lld]; fused base "
                            "weight '%s' [%lld, %lld] needs %s [%lld, %lld] at the rank %lld of its "
                            "lora_b", L->file, t->name.p, (long long)t->ne[0], (long long)t->ne[1],
                            (long long)t->ne[2], (long long)t->ne[3], wname, (long long)n_in,
                            (long long)rows, i ? "lora_b" : "lora_a", (long long)want[i][0],
                            (long long)want[i][1], (long long)r);
        const lms_type_traits *tt = lms_type_get(t->type);
        if (!tt || !lms_kernels_get()->to_float[t->type] || lms_row_size(t->type, t->ne[0]) == 0)
            return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                            "lora '%s': tensor '%s' has type %s, which cannot be read", L->file,
                            t->name.p, tt ? tt->name : "?");
    }
    if (r < 1 || r > LORA_MAX_RANK)
        return lms_errf(L->err, L->errsz, LMS_ERR_LIMIT,
                        "lora '%s': tensor '%s' has rank %lld, not in [1, %d]", L->file,
                        tb->name.p, (long long)r, LORA_MAX_RANK);
    const size_t na = (size_t)n_in * (size_t)r;
    float *a = malloc(na * sizeof *a), *b = malloc((size_t)rows * (size_t)r * sizeof *b);
    int rc = a && b ? 0 : lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory",
                                   L->file);
    if (rc == 0)
        rc = to_f32(L, ta, a);
    if (rc == 0)
        rc = to_f32(L, tb, b);
    int64_t row0 = 0;
    for (int i = 0; i < np && rc == 0; row0 += ws[i]->ne[1], i++) {
        const int32_t slot = il * LMS_LORA_N_TARGETS + targets[i];
        if (l->slot[slot] >= 0) {
            rc = lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                          "lora '%s': '%s' is adapted both fused ('%s') and on its own", L->file,
                          target_names[targets[i]], wname);
            break;
        }
        lms_lora_pair *p = &l->pairs[l->n_pairs];
        p->rank = (int32_t)r;
        p->n_in = n_in;
        p->n_out = ws[i]->ne[1];
        p->factor = l->alpha != 0.0f ? l->alpha / (float)r : 1.0f;
        p->a_vt = lms_type_get(ta->type)->vec_dot_type;
        p->b_vt = lms_type_get(tb->type)->vec_dot_type;
        p->a = malloc(na * sizeof *p->a);
        p->bt = malloc((size_t)r * (size_t)p->n_out * sizeof *p->bt);
        l->slot[slot] = l->n_pairs++; /* freed with the adapter even if incomplete */
        if (!p->a || !p->bt) {
            rc = lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", L->file);
            break;
        }
        memcpy(p->a, a, na * sizeof *a);
        for (int64_t o = 0; o < p->n_out; o++)
            for (int64_t j = 0; j < r; j++)
                p->bt[(size_t)j * (size_t)p->n_out + (size_t)o] = b[(size_t)(row0 + o) * (size_t)r + (size_t)j];
        l->bytes += (na + (size_t)r * (size_t)p->n_out) * sizeof(float);
        l->max_rank = (int32_t)r > l->max_rank ? (int32_t)r : l->max_rank;
    }
    free(a);
    free(b);
    return rc;
}

static int load_all(lora_loader *L, lms_lora *l)
{
    const int32_t nl = L->m->hp.n_layer, ns = n_slots(nl);
    int rc = L->f ? check_meta(L, l) : 0;
    if (rc < 0)
        return rc;
    const int32_t nf = nl * FUSED_KINDS;
    l->slot = malloc((size_t)ns * sizeof *l->slot);
    L->a_of = malloc((size_t)ns * sizeof *L->a_of);
    L->b_of = malloc((size_t)ns * sizeof *L->b_of);
    L->fa_of = malloc((size_t)nf * sizeof *L->fa_of);
    L->fb_of = malloc((size_t)nf * sizeof *L->fb_of);
    if (!l->slot || !L->a_of || !L->b_of || !L->fa_of || !L->fb_of)
        return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", L->file);
    for (int32_t s = 0; s < ns; s++)
        l->slot[s] = L->a_of[s] = L->b_of[s] = -1;
    for (int32_t f = 0; f < nf; f++)
        L->fa_of[f] = L->fb_of[f] = -1;
    if ((rc = map_tensors(L)) < 0)
        return rc;
    /* an ffn_up pair whose B has the up part's rows (not gate + up) is
     * the up part's own pair, not the fused matrix's */
    for (int32_t il = 0; il < nl; il++) {
        int32_t *fa = &L->fa_of[il * FUSED_KINDS + FUSED_GATE_UP];
        int32_t *fb = &L->fb_of[il * FUSED_KINDS + FUSED_GATE_UP];
        const int32_t up = il * LMS_LORA_N_TARGETS + LMS_LORA_UP;
        if (*fb >= 0 && L->ts[*fb].ne[1] == L->m->layers[il].w_up.ne[1]) {
            L->a_of[up] = *fa, L->b_of[up] = *fb;
            *fa = *fb = -1;
        }
    }
    int32_t n = 0;
    for (int32_t s = 0; s < ns; s++)
        n += L->a_of[s] >= 0 || L->b_of[s] >= 0;
    for (int32_t f = 0; f < nf; f++)
        n += L->fa_of[f] >= 0 || L->fb_of[f] >= 0 ? (f % FUSED_KINDS == FUSED_QKV ? 3 : 2) : 0;
    if (n == 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "lora '%s': no lora_a/lora_b tensors",
                        L->file);
    l->pairs = calloc((size_t)n, sizeof *l->pairs);
    if (!l->pairs)
        return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", L->file);
    for (int32_t s = 0; s < ns; s++) {
        if (L->a_of[s] < 0 && L->b_of[s] < 0)
            continue;
        int32_t rank = 0;
        if ((rc = check_pair(L, s, &rank)) < 0)
            return rc;
        l->slot[s] = l->n_pairs;
        if ((rc = load_pair(L, l, s, rank, &l->pairs[l->n_pairs++])) < 0)
            return rc;
        l->max_rank = rank > l->max_rank ? rank : l->max_rank;
    }
    for (int32_t f = 0; f < nf; f++)
        if ((L->fa_of[f] >= 0 || L->fb_of[f] >= 0) &&
            (rc = load_fused(L, l, f / FUSED_KINDS, f % FUSED_KINDS)) < 0)
            return rc;
    l->id = content_id(l);
    return 0;
}

/* Loads the tensors L->ts (GGUF names and layout; with L->f, the GGUF
 * file's metadata is checked too, else alpha is the caller's) into a new
 * adapter named after file. */
static int load_core(lora_loader *L, const char *path, float alpha, lms_lora **out)
{
    lms_lora *l = calloc(1, sizeof *l);
    char *p = strdup(path);
    if (!l || !p) {
        free(l);
        free(p);
        return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", L->file);
    }
    l->refs = 1;
    l->path = p;
    l->alpha = alpha;
    l->n_layer = L->m->hp.n_layer;
    snprintf(l->arch, sizeof l->arch, "%s", L->m->hp.arch);
    size_t n = strlen(L->file);
    while (n > 1 && L->file[n - 1] == '/') /* "dir/adapter/": named "adapter" */
        n--;
    size_t b = n;
    while (b > 0 && L->file[b - 1] != '/')
        b--;
    snprintf(l->name, sizeof l->name, "%.*s", (int)(n - b), L->file + b);
    int rc = load_all(L, l);
    free(L->a_of);
    free(L->b_of);
    free(L->fa_of);
    free(L->fb_of);
    if (rc < 0) {
        lora_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* Loads from an opened GGUF file; closes it. */
static int load_from(gguf_file *f, const char *file, const char *path, const lms_model *base,
                     lms_lora **out, char *err, size_t errsz)
{
    lora_loader L = {.f = f, .ts = f->tensors, .n_ts = f->n_tensors, .m = base, .file = file,
                     .err = err, .errsz = errsz};
    int rc = load_core(&L, path, 0.0f, out);
    gguf_close(f);
    return rc;
}

/* ---- PEFT adapters (adapter_model.safetensors + adapter_config.json) ------------ */

/* PEFT module names, the first LMS_LORA_N_TARGETS in target order; then
 * Phi-3's fused qkv_proj and gate_up_proj (the GGUF attn_qkv and ffn_up
 * that fused_of splits). */
enum { PM_LM_HEAD = LMS_LORA_N_TARGETS, PM_EMBED, PM_QKV, PM_GATE_UP, PM_N };
static const char *const peft_modules[PM_N] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "lm_head", "embed_tokens", "qkv_proj", "gate_up_proj",
};

typedef struct peft_config {
    int32_t r;
    float alpha;        /* as lora.c uses it: factor = alpha / r */
    unsigned targets;   /* bit per peft_modules entry */
} peft_config;

static int cfg_err(lora_loader *L, int code, const char *what, const char *detail)
{
    return lms_errf(L->err, L->errsz, code, "lora '%s': adapter_config.json: %s%s", L->file,
                    what, detail);
}

/* A module name of target_modules to its bits (0: unknown). */
static unsigned module_bits(const char *s)
{
    if (!strcmp(s, "all-linear")) /* PEFT: every linear layer but the output head */
        return ((1u << LMS_LORA_N_TARGETS) - 1) | 1u << PM_QKV | 1u << PM_GATE_UP;
    for (int k = 0; k < PM_N; k++)
        if (!strcmp(s, peft_modules[k]))
            return 1u << k;
    return 0;
}

/* Reads and checks adapter_config.json. */
static int read_config(lora_loader *L, const char *path, peft_config *c)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        char d[512];
        if (je.line > 0) /* a parse error; else jansson's text names the file */
            snprintf(d, sizeof d, "%.160s (line %d, column %d)", je.text, je.line, je.column);
        else
            snprintf(d, sizeof d, "%.160s", je.text);
        return cfg_err(L, LMS_ERR_FORMAT, "cannot read: ", d);
    }
    int rc = 0;
    const json_t *v;
    char d[256];
    if (!json_is_object(j)) {
        rc = cfg_err(L, LMS_ERR_FORMAT, "not a JSON object", "");
        goto out;
    }
    v = json_object_get(j, "peft_type");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0)) {
        rc = cfg_err(L, LMS_ERR_UNSUPPORTED, "peft_type is not \"LORA\"", "");
        goto out;
    }
    v = json_object_get(j, "r");
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > LORA_MAX_RANK) {
        snprintf(d, sizeof d, "%d]", LORA_MAX_RANK);
        rc = cfg_err(L, LMS_ERR_FORMAT, "r is missing or not an integer in [1, ", d);
        goto out;
    }
    c->r = (int32_t)json_integer_value(v);
    v = json_object_get(j, "lora_alpha");
    double alpha = json_number_value(v);
    if (!json_is_number(v) || !(alpha > 0.0) || !isfinite((float)alpha)) {
        rc = cfg_err(L, LMS_ERR_FORMAT, "lora_alpha is missing or not a positive number", "");
        goto out;
    }
    /* rsLoRA scales by alpha / sqrt(r): the same as alpha * sqrt(r) / r */
    c->alpha = json_is_true(json_object_get(j, "use_rslora")) ? (float)(alpha * sqrt(c->r))
                                                                 : (float)alpha;
    static const char *const refused[][2] = {
        {"fan_in_fan_out", "fan_in_fan_out = true (Conv1D-style weights) is not supported"},
        {"use_dora", "use_dora = true (DoRA) is not supported"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        if (json_is_true(json_object_get(j, refused[k][0]))) {
            rc = cfg_err(L, LMS_ERR_UNSUPPORTED, refused[k][1], "");
            goto out;
        }
    static const char *const nonempty[] = {"rank_pattern", "alpha_pattern", "modules_to_save"};
    for (size_t k = 0; k < sizeof nonempty / sizeof nonempty[0]; k++) {
        v = json_object_get(j, nonempty[k]);
        if ((json_is_object(v) && json_object_size(v)) || (json_is_array(v) && json_array_size(v))) {
            rc = cfg_err(L, LMS_ERR_UNSUPPORTED, nonempty[k], " is not supported (must be empty)");
            goto out;
        }
    }
    v = json_object_get(j, "target_modules");
    if (!v || json_is_null(v)) {
        c->targets = (1u << PM_N) - 1; /* not stated: the tensors decide */
    } else if (json_is_string(v) && module_bits(json_string_value(v))) {
        c->targets = module_bits(json_string_value(v));
    } else if (json_is_array(v)) {
        size_t k;
        json_t *e;
        json_array_foreach(v, k, e) {
            unsigned bits = json_is_string(e) ? module_bits(json_string_value(e)) : 0;
            if (!bits) {
                snprintf(d, sizeof d, "\"%.64s\" is not supported (q_proj, k_proj, v_proj, o_proj, "
                         "gate_proj, up_proj, down_proj, lm_head, embed_tokens, qkv_proj, "
                         "gate_up_proj)",
                         json_is_string(e) ? json_string_value(e) : "?");
                rc = cfg_err(L, LMS_ERR_UNSUPPORTED, "target_modules entry ", d);
                goto out;
            }
            c->targets |= bits;
        }
    } else {
        rc = cfg_err(L, LMS_ERR_UNSUPPORTED, "target_modules is not a list of module names "
                     "(regular expressions are not supported)", "");
    }
out:
    json_decref(j);
    return rc;
}

/* Parses "<digits>." at *s (canonical: no sign, no leading zero). */
static bool eat_index(const char **s, int *out)
{
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return false;
    long v = 0;
    while (*p >= '0' && *p <= '9' && v < 1000000)
        v = v * 10 + (*p++ - '0');
    if (*p != '.')
        return false;
    *s = p + 1;
    *out = (int)v;
    return true;
}

static bool eat(const char **s, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(*s, prefix, n) != 0)
        return false;
    *s += n;
    return true;
}

/* Maps a PEFT tensor name to its module (peft_modules index), whether it
 * is lora_A, and the GGUF base weight name; -1 when it is not a LoRA
 * tensor name PEFT writes for a llama-like model. */
static int peft_name(const char *name, bool *is_a, char *gname, size_t n)
{
    const char *s = name;
    if (!eat(&s, "base_model.model."))
        return -1;
    if (eat(&s, "model.embed_tokens.lora_embedding_")) {
        if ((s[0] != 'A' && s[0] != 'B') || s[1])
            return -1;
        *is_a = s[0] == 'A';
        snprintf(gname, n, "token_embd.weight");
        return PM_EMBED;
    }
    int il = -1, mod = -1;
    if (eat(&s, "lm_head.")) {
        mod = PM_LM_HEAD;
        snprintf(gname, n, "output.weight");
    } else if (eat(&s, "model.layers.") && eat_index(&s, &il)) {
        static const int mods[] = {LMS_LORA_Q,    LMS_LORA_K,  LMS_LORA_V,    LMS_LORA_O,
                                   LMS_LORA_GATE, LMS_LORA_UP, LMS_LORA_DOWN, PM_QKV,
                                   PM_GATE_UP};
        for (size_t i = 0; i < sizeof mods / sizeof mods[0] && mod < 0; i++) {
            const int k = mods[i];
            const bool attn = k < LMS_LORA_GATE || k == PM_QKV;
            const char *t = s;
            if (eat(&t, attn ? "self_attn." : "mlp.") && eat(&t, peft_modules[k]) && *t == '.') {
                mod = k, s = t + 1;
                snprintf(gname, n, "blk.%d.%s.weight", il,
                         k == PM_QKV ? "attn_qkv" : k == PM_GATE_UP ? "ffn_up" : target_names[k]);
            }
        }
    }
    if (mod < 0 || !eat(&s, "lora_") || (s[0] != 'A' && s[0] != 'B') || strcmp(s + 1, ".weight"))
        return -1;
    *is_a = s[0] == 'A';
    return mod;
}

/* What load_peft allocates (freed together). */
typedef struct peft_tmp {
    gguf_tensor *ts;
    char (*names)[128];
    void **copies;
    int32_t n;
} peft_tmp;

/* Converts the safetensors tensors to GGUF-named, GGUF-laid-out tensors. */
static int peft_tensors(lora_loader *L, const lms_st_file *sf, const peft_config *c, peft_tmp *T)
{
    const lms_model *m = L->m;
    T->ts = calloc((size_t)sf->n_tensors + 1, sizeof *T->ts);
    T->names = calloc((size_t)sf->n_tensors + 1, sizeof *T->names);
    T->copies = calloc((size_t)sf->n_tensors + 1, sizeof *T->copies);
    if (!T->ts || !T->names || !T->copies)
        return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", L->file);
    for (int32_t i = 0; i < sf->n_tensors; i++) {
        const lms_st_tensor *st = &sf->tensors[i];
        bool is_a = false;
        char gname[96];
        int mod = peft_name(st->name, &is_a, gname, sizeof gname);
        if (mod < 0)
            return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                            "lora '%s': tensor '%s' is not a LoRA tensor this loader knows "
                            "(base_model.model.model.layers.N.{self_attn,mlp}.*_proj.lora_A/B.weight, "
                            "lm_head.lora_A/B.weight, model.embed_tokens.lora_embedding_A/B)",
                            L->file, st->name);
        if (!(c->targets >> mod & 1))
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                            "lora '%s': tensor '%s': module '%s' is not in adapter_config.json "
                            "target_modules", L->file, st->name, peft_modules[mod]);
        if (mod == PM_LM_HEAD && m->output.data == m->tok_embd.data)
            return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                            "lora '%s': tensor '%s': the base model's lm_head is tied to "
                            "embed_tokens, so it cannot be adapted apart", L->file, st->name);
        if (st->n_dims != 2)
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                            "lora '%s': tensor '%s' has %d dimensions, not 2", L->file, st->name,
                            st->n_dims);
        /* lora_A [r, n_in] (embedding: [r, n_vocab]); lora_B [n_out, r] */
        const int64_t rank = is_a ? st->shape[0] : st->shape[1];
        if (rank != c->r)
            return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                            "lora '%s': tensor '%s' has rank %lld, but adapter_config.json has "
                            "r = %d", L->file, st->name, (long long)rank, (int)c->r);
        gguf_tensor *t = &T->ts[T->n];
        snprintf(T->names[T->n], sizeof T->names[T->n], "%s.lora_%c", gname, is_a ? 'a' : 'b');
        t->name.p = T->names[T->n];
        t->name.n = strlen(t->name.p);
        t->type = st->type;
        t->n_dims = 2;
        t->ne[0] = st->shape[1], t->ne[1] = st->shape[0], t->ne[2] = t->ne[3] = 1;
        t->n_bytes = st->n_bytes;
        t->data = st->data;
        /* token_embd's lora_a is looked up by row: [n_vocab][r] */
        const bool transpose = mod == PM_EMBED && is_a;
        /* llama.cpp permutes q/k rows for RoPE on adjacent pairs (llama,
         * mistral); lora_b holds the output rows */
        int32_t n_h = 0;
        if (!is_a && m->hp.rope_type == LMS_ROPE_NORM && (mod == LMS_LORA_Q || mod == LMS_LORA_K))
            n_h = mod == LMS_LORA_Q ? m->hp.n_head : m->hp.n_head_kv;
        if (n_h > 0 && st->shape[0] % (2 * (int64_t)n_h) != 0)
            return lms_errf(L->err, L->errsz, LMS_ERR_INVAL,
                            "lora '%s': tensor '%s' has %lld rows, not a whole number of "
                            "%d heads of even size", L->file, st->name, (long long)st->shape[0],
                            (int)n_h);
        if (transpose || n_h > 0) {
            void *p = lms_st_reorder(st, transpose, n_h);
            if (!p)
                return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory",
                                L->file);
            T->copies[T->n] = p;
            t->data = p;
            if (transpose)
                t->ne[0] = st->shape[0], t->ne[1] = st->shape[1];
        }
        T->n++;
    }
    return 0;
}

/* Loads a PEFT adapter: st_path, and the adapter_config.json at cfg_path. */
static int load_peft(const char *path, const char *st_path, const char *cfg_path,
                     const lms_model *base, lms_lora **out, char *err, size_t errsz)
{
    lora_loader L = {.m = base, .file = path, .err = err, .errsz = errsz};
    peft_config c = {0};
    int rc = read_config(&L, cfg_path, &c);
    if (rc < 0)
        return rc;
    lms_st_file *sf;
    char serr[384];
    if ((rc = lms_st_open(st_path, &sf, serr, sizeof serr)) < 0)
        return lms_errf(err, errsz, rc, "lora '%s': %s", path, serr);
    peft_tmp T = {0};
    rc = peft_tensors(&L, sf, &c, &T);
    if (rc == 0) {
        L.ts = T.ts;
        L.n_ts = (uint64_t)T.n;
        rc = load_core(&L, path, c.alpha, out);
    }
    for (int32_t i = 0; T.copies && i < T.n; i++)
        free(T.copies[i]);
    free(T.copies);
    free(T.names);
    free(T.ts);
    lms_st_close(sf);
    return rc;
}

/* 1 with the two file paths when path is a PEFT adapter (a directory, or
 * a .safetensors file with adapter_config.json beside it); else 0. */
static int peft_paths(const char *path, char *st, char *cfg, size_t n)
{
    struct stat sb;
    size_t len = strlen(path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        const char *sep = len && path[len - 1] == '/' ? "" : "/";
        snprintf(st, n, "%s%sadapter_model.safetensors", path, sep);
        snprintf(cfg, n, "%s%sadapter_config.json", path, sep);
        return 1;
    }
    if (!ends_with(path, len, ".safetensors"))
        return 0;
    snprintf(st, n, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(cfg, n, "%.*sadapter_config.json", (int)(slash + 1 - path), path);
    else
        snprintf(cfg, n, "adapter_config.json");
    return 1;
}

int lms_lora_load(const char *path, const lms_model *base, lms_lora **out, char *err, size_t errsz)
{
    char st[4096], cfg[4096];
    if (strlen(path) < sizeof st - 32 && peft_paths(path, st, cfg, sizeof st))
        return load_peft(path, st, cfg, base, out, err, errsz);
    gguf_file *f;
    char gerr[384];
    int rc = gguf_open(path, &f, gerr, sizeof gerr);
    if (rc < 0)
        return lms_errf(err, errsz, rc, "lora '%s': %s", path, gerr);
    return load_from(f, path, path, base, out, err, errsz);
}

int lms_lora_load_mem(const void *buf, size_t n, const char *name, const lms_model *base,
                      lms_lora **out, char *err, size_t errsz)
{
    gguf_file *f;
    char gerr[384];
    int rc = gguf_open_mem(buf, n, &f, gerr, sizeof gerr);
    if (rc < 0)
        return lms_errf(err, errsz, rc, "lora '%s': %s", name, gerr);
    return load_from(f, name, "", base, out, err, errsz);
}

/* ---- checks and sets -------------------------------------------------------------- */

int lms_lora_check(const lms_lora *l, const lms_model *m, char *err, size_t errsz)
{
    if (strcmp(l->arch, m->hp.arch) != 0 || l->n_layer != m->hp.n_layer)
        return lms_errf(err, errsz, LMS_ERR_INVAL,
                        "adapter '%s' was loaded for a %s model of %d layers, not this %s model "
                        "of %d", l->name, l->arch, l->n_layer, m->hp.arch, m->hp.n_layer);
    for (int32_t s = 0; s < n_slots(l->n_layer); s++) {
        const lms_lora_pair *p = pair_at(l, s);
        if (!p)
            continue;
        const lms_weight *w = base_weight(m, s);
        const bool embd = s == slot_embd(l->n_layer);
        char wname[96];
        slot_name(s, l->n_layer, wname, sizeof wname);
        if (!w || p->n_in != (embd ? w->ne[1] : w->ne[0]) || p->n_out != (embd ? w->ne[0] : w->ne[1]))
            return lms_errf(err, errsz, LMS_ERR_INVAL,
                            "adapter '%s' does not fit this model's '%s'", l->name, wname);
    }
    return 0;
}

uint64_t lms_lora_set_id(const lms_lora_set *s)
{
    if (s->n == 0)
        return 0;
    uint64_t h = mix64(0x5345545Full + (uint64_t)s->n);
    for (int32_t i = 0; i < s->n; i++) {
        uint32_t u;
        memcpy(&u, &s->use[i].scale, sizeof u);
        h = mix64(h ^ s->use[i].lora->id);
        h = mix64(h ^ u);
    }
    return h ? h : 1;
}

int lms_lora_set_make(lms_lora_set *s, const lms_lora_use *uses, int n, char *err, size_t errsz)
{
    if (n < 0 || n > LMS_LORA_MAX || (n > 0 && !uses))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "at most %d LoRA adapters per request", LMS_LORA_MAX);
    lms_lora_set t = {0};
    for (int i = 0; i < n; i++) {
        if (!uses[i].lora)
            return lms_errf(err, errsz, LMS_ERR_INVAL, "LoRA adapter %d is NULL", i);
        if (!isfinite(uses[i].scale))
            return lms_errf(err, errsz, LMS_ERR_INVAL, "LoRA adapter '%s': scale is not finite",
                            uses[i].lora->name);
        int k = 0; /* an adapter named twice: one use with the summed scale */
        while (k < t.n && t.use[k].lora != uses[i].lora)
            k++;
        if (k == t.n)
            t.use[t.n++] = uses[i];
        else
            t.use[k].scale += uses[i].scale;
    }
    int32_t m = 0; /* drop scale 0, then insertion sort by (id, scale) */
    for (int32_t i = 0; i < t.n; i++) {
        lms_lora_use u = t.use[i];
        if (u.scale == 0.0f)
            continue;
        int32_t k = m++;
        while (k > 0 && (t.use[k - 1].lora->id > u.lora->id ||
                         (t.use[k - 1].lora->id == u.lora->id && t.use[k - 1].scale > u.scale))) {
            t.use[k] = t.use[k - 1];
            k--;
        }
        t.use[k] = u;
    }
    t.n = m;
    t.id = lms_lora_set_id(&t);
    *s = t;
    return 0;
}
