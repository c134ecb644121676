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
 */
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"

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
    const gguf_file *f;
    const lms_model *m;
    const char *file;        /* for messages */
    char *err;
    size_t errsz;
    int32_t *a_of, *b_of;    /* [n_slots] tensor index of each slot's A / B, -1 */
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

/* Sorts every tensor into its slot's A or B. */
static int map_tensors(lora_loader *L)
{
    const int32_t nl = L->m->hp.n_layer;
    char base[256];
    for (uint64_t i = 0; i < L->f->n_tensors; i++) {
        const gguf_tensor *t = &L->f->tensors[i];
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
    const gguf_tensor *ta = &L->f->tensors[L->a_of[slot]], *tb = &L->f->tensors[L->b_of[slot]];
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
    const gguf_tensor *ta = &L->f->tensors[L->a_of[slot]], *tb = &L->f->tensors[L->b_of[slot]];
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

static int load_all(lora_loader *L, lms_lora *l)
{
    const int32_t nl = L->m->hp.n_layer, ns = n_slots(nl);
    int rc = check_meta(L, l);
    if (rc < 0)
        return rc;
    l->slot = malloc((size_t)ns * sizeof *l->slot);
    L->a_of = malloc((size_t)ns * sizeof *L->a_of);
    L->b_of = malloc((size_t)ns * sizeof *L->b_of);
    if (!l->slot || !L->a_of || !L->b_of)
        return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", L->file);
    for (int32_t s = 0; s < ns; s++)
        l->slot[s] = L->a_of[s] = L->b_of[s] = -1;
    if ((rc = map_tensors(L)) < 0)
        return rc;
    int32_t n = 0;
    for (int32_t s = 0; s < ns; s++)
        n += L->a_of[s] >= 0 || L->b_of[s] >= 0;
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
    l->id = content_id(l);
    return 0;
}

/* Loads from an opened file; closes it. */
static int load_from(gguf_file *f, const char *file, const char *path, const lms_model *base,
                     lms_lora **out, char *err, size_t errsz)
{
    lms_lora *l = calloc(1, sizeof *l);
    char *p = strdup(path);
    if (!l || !p) {
        free(l);
        free(p);
        gguf_close(f);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "lora '%s': out of memory", file);
    }
    l->refs = 1;
    l->path = p;
    l->n_layer = base->hp.n_layer;
    snprintf(l->arch, sizeof l->arch, "%s", base->hp.arch);
    const char *slash = strrchr(file, '/');
    snprintf(l->name, sizeof l->name, "%s", slash ? slash + 1 : file);
    lora_loader L = {.f = f, .m = base, .file = file, .err = err, .errsz = errsz};
    int rc = load_all(&L, l);
    free(L.a_of);
    free(L.b_of);
    gguf_close(f);
    if (rc < 0) {
        lora_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int lms_lora_load(const char *path, const lms_model *base, lms_lora **out, char *err, size_t errsz)
{
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
