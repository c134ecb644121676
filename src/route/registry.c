/*
 * registry.c - expert entries, the loader thread and the load / unload
 * policy (registry.h).
 *
 * Jobs cross threads through two lists under `mu`: todo (loop -> loader)
 * and done (loader -> loop). A job carries everything the loader needs
 * (the path, the scheduler parameters) or frees (model, scheduler,
 * attachment), so the loader never reads an entry's loop-owned fields.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "ops/log.h"
#include "route/registry.h"

enum { JOB_LOAD = 1, JOB_UNLOAD = 2 };

typedef struct job {
    int kind;
    lms_expert *x;              /* identifies the entry; the loader reads no field of it */
    char *path;                 /* LOAD: a copy of the model path */
    lms_model *model;           /* LOAD: result; UNLOAD: to free */
    lms_sched *sched;
    void *attach;
    int rc;
    uint64_t kv_bytes;
    double ms;
    char err[384];
    struct job *next;
} job;

struct lms_registry {
    lms_route_cfg cfg;
    lms_sched_params sp;
    lms_registry_hooks h;
    lms_expert *x;              /* [n_all]: the experts, then the router's own model */
    int n, n_all;
    lms_expert *embedder;       /* NULL: lexical router */
    uint64_t budget;            /* memory_threshold * MemTotal; 0 = none */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *todo, *todo_tail;      /* mu */
    job *done, *done_tail;      /* mu */
    bool stop;                  /* mu */
    bool started;
    pthread_t th;
};

const char *lms_expert_state_name(int state)
{
    static const char *const names[] = {"unloaded", "loading", "ready", "failed", "unloading",
                                        "remote"};
    return state >= 0 && state <= LMS_EXPERT_REMOTE ? names[state] : "?";
}

/* ---- sizes -------------------------------------------------------------------------- */

/* Bytes of one K (or V) cell of n values in the cache type. */
static uint64_t cell_bytes(int kv_type, int64_t n)
{
    return (uint64_t)lms_row_size(kv_type ? kv_type : LMS_TYPE_F16, n);
}

/* The model's context under these parameters (what the loader uses). */
static int32_t ctx_of(const lms_sched_params *sp, int32_t n_ctx_train)
{
    if (sp->n_ctx > 0)
        return sp->n_ctx;
    return n_ctx_train > 0 && n_ctx_train < 4096 ? n_ctx_train : 4096;
}

static uint64_t kv_bytes_of(const lms_sched_params *sp, int32_t n_layer, int64_t kv_dim,
                            int32_t n_ctx_train)
{
    uint64_t per_pos = 2 * (uint64_t)n_layer * cell_bytes(sp->kv_type, kv_dim);
    if (sp->kv_budget_bytes > 0)
        return (uint64_t)sp->kv_budget_bytes;
    return per_pos * (uint64_t)ctx_of(sp, n_ctx_train) * (uint64_t)sp->n_parallel;
}

/* Before a first load: the KV pool from the GGUF header (0 when unreadable;
 * the load then reports the problem). */
static uint64_t estimate_kv(const lms_sched_params *sp, const char *path)
{
    gguf_file *f = NULL;
    char err[256], key[160];
    const char *arch = NULL;
    uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, ctx = 0;
    if (hf_open_any(path, HF_OPEN_NO_TENSORS | HF_OPEN_NO_TOKENIZER, &f, err, sizeof err) < 0)
        return 0;
    if (gguf_get_str(f, "general.architecture", &arch) < 0 || strlen(arch) > 64) {
        gguf_close(f);
        return 0;
    }
    snprintf(key, sizeof key, "%s.block_count", arch);
    gguf_get_u32(f, key, &n_layer);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    gguf_get_u32(f, key, &n_embd);
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    gguf_get_u32(f, key, &n_head);
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    if (gguf_get_u32(f, key, &n_head_kv) < 0)
        n_head_kv = n_head;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    if (gguf_get_u32(f, key, &head_dim) < 0 && n_head > 0)
        head_dim = n_embd / n_head;
    snprintf(key, sizeof key, "%s.context_length", arch);
    gguf_get_u32(f, key, &ctx);
    gguf_close(f);
    if (n_layer == 0 || n_layer > 4096 || n_head_kv > 4096 || head_dim > 65536)
        return 0;
    return kv_bytes_of(sp, (int32_t)n_layer, (int64_t)n_head_kv * head_dim,
                       ctx > (1u << 30) ? 1 << 30 : (int32_t)ctx);
}

static uint64_t est_bytes(const lms_expert *x)
{
    return x->file_bytes + x->kv_bytes;
}

static uint64_t mem_total(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* ---- loader thread ------------------------------------------------------------------ */

static void debug_delay(void)
{
    const char *d = getenv("LMSERV_DEBUG_LOAD_DELAY_MS"); /* tests: observe "loading" */
    long ms = d ? atol(d) : 0;
    if (ms > 0 && ms < 600000) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void run_load(lms_registry *r, job *j)
{
    char err[320];
    double t0 = lms_now_ms();
    debug_delay();
    int rc = lms_model_load(j->path, &j->model, err, sizeof err);
    if (rc == 0) {
        lms_sched_params sp = r->sp;
        sp.n_ctx = ctx_of(&r->sp, j->model->hp.n_ctx_train);
        if (j->x->cfg->draft) { /* the expert's own draft model ("draft") */
            sp.spec.mode = LMS_SPEC_DRAFT;
            sp.draft_model = j->x->cfg->draft;
            rc = lms_spec_params_fix(&sp.spec, err, sizeof err);
        }
        if (rc == 0)
            rc = lms_sched_create(j->model, &sp, &j->sched, err, sizeof err);
        j->kv_bytes = kv_bytes_of(&sp, j->model->hp.n_layer,
                                  (int64_t)j->model->hp.n_head_kv * j->model->hp.head_dim,
                                  j->model->hp.n_ctx_train);
    }
    if (rc == 0 && r->h.prepare)
        rc = r->h.prepare(r->h.ud, j->x, j->model, j->sched, &j->attach, err, sizeof err);
    if (rc < 0) {
        lms_sched_destroy(j->sched);
        lms_model_free(j->model);
        j->sched = NULL;
        j->model = NULL;
        if (r->cfg.single)
            snprintf(j->err, sizeof j->err, "cannot serve '%s': %s", j->path, err);
        else
            snprintf(j->err, sizeof j->err, "cannot load expert '%s' from '%s': %s",
                     j->x->cfg->id, j->path, err);
    }
    j->rc = rc;
    j->ms = lms_now_ms() - t0;
}

static void free_loaded(lms_registry *r, lms_model *m, lms_sched *s, void *attach)
{
    lms_sched_destroy(s);
    if (attach && r->h.release)
        r->h.release(r->h.ud, attach);
    lms_model_free(m);
}

/* Appends j to the job list head..tail (mu held): the loader's todo and
 * done lists are both first in, first out. */
static void job_append(job **head, job **tail, job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void *loader_main(void *arg)
{
    lms_registry *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->stop && !r->todo)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        job *j = r->todo;
        r->todo = j->next;
        if (!r->todo)
            r->todo_tail = NULL;
        pthread_mutex_unlock(&r->mu);

        double t0 = lms_now_ms();
        if (j->kind == JOB_LOAD)
            run_load(r, j);
        else {
            free_loaded(r, j->model, j->sched, j->attach);
            j->model = NULL, j->sched = NULL, j->attach = NULL;
            j->ms = lms_now_ms() - t0;
        }
        pthread_mutex_lock(&r->mu);
        job_append(&r->done, &r->done_tail, j);
        pthread_mutex_unlock(&r->mu);
        if (r->h.wake)
            r->h.wake(r->h.ud);
    }
}

static int post(lms_registry *r, job *j)
{
    pthread_mutex_lock(&r->mu);
    job_append(&r->todo, &r->todo_tail, j);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- policy (loop thread) --------------------------------------------------------- */

static bool holds_memory(const lms_expert *x)
{
    return x->state == LMS_EXPERT_LOADING || x->state == LMS_EXPERT_READY;
}

static bool idle(const lms_expert *x)
{
    return x->state == LMS_EXPERT_READY && x->n_live == 0 && x->n_waiting == 0 && !x->pinned;
}

static void start_unload(lms_registry *r, lms_expert *x, const char *reason)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return; /* out of memory: it stays loaded */
    j->kind = JOB_UNLOAD;
    j->x = x;
    j->model = x->model;
    j->sched = x->sched;
    j->attach = x->attach;
    x->model = NULL;
    x->sched = NULL;
    x->attach = NULL;
    x->state = LMS_EXPERT_UNLOADING;
    lms_log(LMS_LOG_INFO, "model_unloading", "model", LMS_LOG_STR(x->cfg->id), "reason",
            LMS_LOG_STR(reason));
    post(r, j);
}

int lms_registry_unload(lms_registry *r, lms_expert *x, const char *reason)
{
    if (x->state != LMS_EXPERT_READY)
        return 0;
    if (!idle(x))
        return LMS_ERR_BUSY;
    start_unload(r, x, reason);
    return x->state == LMS_EXPERT_UNLOADING ? 1 : LMS_ERR_NOMEM;
}

static int cmp_lru(const void *a, const void *b)
{
    const lms_expert *x = *(lms_expert *const *)a, *y = *(lms_expert *const *)b;
    return x->t_used_ms < y->t_used_ms ? -1 : x->t_used_ms > y->t_used_ms;
}

#define MIB(b) ((unsigned long long)((b) >> 20))

/* Unloads idle experts (least recently used first) until x fits both
 * limits; refuses without unloading anything when it cannot fit. */
static int make_room(lms_registry *r, lms_expert *x, char *err, size_t errsz)
{
    lms_expert **cand = malloc((size_t)r->n_all * sizeof *cand);
    if (!cand)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    int n_cand = 0, n_loaded = 0;
    uint64_t used = 0, need = est_bytes(x);
    for (int i = 0; i < r->n_all; i++) {
        lms_expert *e = &r->x[i];
        if (e == x || !holds_memory(e))
            continue;
        n_loaded += i < r->n; /* the router's own model is no expert */
        used += est_bytes(e);
        if (idle(e))
            cand[n_cand++] = e;
    }
    qsort(cand, (size_t)n_cand, sizeof *cand, cmp_lru);
    int k = 0, max = x->index < r->n ? r->cfg.max_loaded : 0;
    uint64_t freed = 0;
    int rc = 0;
    if (r->budget && need > r->budget)
        rc = lms_errf(err, errsz, LMS_ERR_LIMIT,
                      "cannot load expert '%s': it needs about %llu MiB (model file + KV cache), "
                      "more than the %llu MiB allowed (memory_threshold %.2f of MemTotal)",
                      x->cfg->id, MIB(need), MIB(r->budget), r->cfg.mem_threshold);
    while (rc == 0 && ((max > 0 && n_loaded - k >= max) ||
                       (r->budget && used - freed + need > r->budget))) {
        if (k < n_cand) {
            freed += est_bytes(cand[k++]);
            continue;
        }
        if (max > 0 && n_loaded - k >= max)
            rc = lms_errf(err, errsz, LMS_ERR_BUSY,
                          "cannot load expert '%s' now: max_loaded_experts is %d and every "
                          "loaded expert is busy; retry later", x->cfg->id, max);
        else
            rc = lms_errf(err, errsz, LMS_ERR_LIMIT,
                          "cannot load expert '%s' now: it needs about %llu MiB and the loaded "
                          "experts use %llu MiB of the %llu MiB allowed (memory_threshold %.2f "
                          "of MemTotal), none of them idle; retry later",
                          x->cfg->id, MIB(need), MIB(used), MIB(r->budget), r->cfg.mem_threshold);
    }
    for (int i = 0; rc == 0 && i < k; i++)
        start_unload(r, cand[i], max > 0 && n_loaded - i >= max ? "max_loaded_experts"
                                                                : "memory_threshold");
    free(cand);
    return rc;
}

static int start_load(lms_registry *r, lms_expert *x, char *err, size_t errsz)
{
    job *j = calloc(1, sizeof *j);
    if (j)
        j->path = strdup(x->cfg->path);
    if (!j || !j->path) {
        free(j);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    j->kind = JOB_LOAD;
    j->x = x;
    x->state = LMS_EXPERT_LOADING;
    x->error[0] = '\0';
    lms_log(LMS_LOG_INFO, "model_loading", "model", LMS_LOG_STR(x->cfg->id), "path",
            LMS_LOG_STR(x->cfg->path), "estimated_mib", LMS_LOG_U64(MIB(est_bytes(x))));
    return post(r, j);
}

int lms_registry_want(lms_registry *r, lms_expert *x, char *err, size_t errsz)
{
    switch (x->state) {
    case LMS_EXPERT_READY:
    case LMS_EXPERT_REMOTE:
        x->t_used_ms = lms_now_ms();
        return 1;
    case LMS_EXPERT_LOADING:
        return 0;
    case LMS_EXPERT_UNLOADING:
        x->want = true;
        return 0;
    default:
        break;
    }
    char msg[384];
    int rc = make_room(r, x, msg, sizeof msg);
    if (rc == 0)
        rc = start_load(r, x, msg, sizeof msg);
    if (rc < 0) {
        snprintf(x->error, sizeof x->error, "%s", msg);
        lms_log(LMS_LOG_WARN, "model_load_refused", "model", LMS_LOG_STR(x->cfg->id), "error",
                LMS_LOG_STR(msg));
        return lms_errf(err, errsz, rc, "%s", msg);
    }
    return 0;
}

static void apply(lms_registry *r, job *j)
{
    lms_expert *x = j->x;
    if (j->kind == JOB_UNLOAD) {
        x->state = LMS_EXPERT_UNLOADED;
        x->n_unloads++;
        lms_log(LMS_LOG_INFO, "model_unloaded", "model", LMS_LOG_STR(x->cfg->id), "ms",
                LMS_LOG_F64(j->ms));
        if (x->want) {
            char err[384];
            x->want = false;
            if (lms_registry_want(r, x, err, sizeof err) < 0)
                x->state = LMS_EXPERT_FAILED;
        }
        return;
    }
    x->load_ms = j->ms;
    if (j->rc < 0) {
        x->state = LMS_EXPERT_FAILED;
        x->n_load_failures++;
        snprintf(x->error, sizeof x->error, "%s", j->err);
        lms_log(LMS_LOG_ERROR, "model_load_failed", "model", LMS_LOG_STR(x->cfg->id), "error",
                LMS_LOG_STR(j->err));
        return;
    }
    x->model = j->model;
    x->sched = j->sched;
    x->attach = j->attach;
    x->kv_bytes = j->kv_bytes;
    x->state = LMS_EXPERT_READY;
    x->t_used_ms = lms_now_ms();
    x->n_loads++;
    const lms_sched_params *sp = lms_sched_params_of(x->sched);
    lms_log(LMS_LOG_INFO, "model_ready", "model", LMS_LOG_STR(x->cfg->id), "ms",
            LMS_LOG_F64(j->ms), "n_ctx", LMS_LOG_I64(sp->n_ctx), "n_parallel",
            LMS_LOG_I64(sp->n_parallel), "mib", LMS_LOG_U64(MIB(est_bytes(x))));
}

void lms_registry_poll(lms_registry *r, void (*changed)(void *ud, lms_expert *x), void *ud)
{
    pthread_mutex_lock(&r->mu);
    job *j = r->done;
    r->done = r->done_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    while (j) {
        job *next = j->next;
        apply(r, j);
        if (changed)
            changed(ud, j->x);
        free(j->path);
        free(j);
        j = next;
    }
}

void lms_registry_keep(lms_expert *x, bool set, double ms)
{
    x->keep_set = set;
    x->keep_ms = set ? ms : 0;
}

/* How long x may stay idle: its own keep_alive, else the configuration's
 * (0 there: for good); < 0: for good. */
static double keep_after(const lms_registry *r, const lms_expert *x)
{
    if (x->keep_set)
        return x->keep_ms;
    return r->cfg.unload_after_s > 0 ? r->cfg.unload_after_s * 1000.0 : -1.0;
}

double lms_registry_expiry(const lms_registry *r, const lms_expert *x, double now_ms)
{
    const double after = keep_after(r, x);
    if (after < 0 || x->state != LMS_EXPERT_READY)
        return -1.0;
    return (x->n_live > 0 || x->n_waiting > 0 ? now_ms : x->t_used_ms) + after;
}

void lms_registry_tick(lms_registry *r, double now_ms)
{
    for (int i = 0; i < r->n_all; i++) {
        const double after = keep_after(r, &r->x[i]);
        if (after >= 0 && idle(&r->x[i]) && now_ms - r->x[i].t_used_ms >= after)
            start_unload(r, &r->x[i], r->x[i].keep_set ? "keep_alive" : "idle");
    }
}

void lms_registry_begin(lms_expert *x, double now_ms)
{
    x->n_live++;
    x->n_requests++;
    x->t_used_ms = now_ms;
}

void lms_registry_end(lms_expert *x, double now_ms)
{
    if (x->n_live > 0)
        x->n_live--;
    x->t_used_ms = now_ms;
}

int lms_registry_restart(lms_registry *r, lms_expert *x, const char *msg, char *err,
                         size_t errsz)
{
    (void)r;
    if (x->state != LMS_EXPERT_READY || !x->sched)
        return 0;
    lms_sched_params p = *lms_sched_params_of(x->sched);
    lms_sched_abandon(x->sched, msg);
    x->sched = NULL;
    x->pinned = true; /* the abandoned thread may still read the weights */
    int rc = lms_sched_create(x->model, &p, &x->sched, err, errsz);
    if (rc < 0) {
        x->state = LMS_EXPERT_FAILED;
        snprintf(x->error, sizeof x->error, "engine restart failed: %s", err);
        return rc;
    }
    x->n_restarts++;
    return 0;
}

/* ---- queries ---------------------------------------------------------------------------- */

const lms_route_cfg *lms_registry_cfg(const lms_registry *r)
{
    return &r->cfg;
}

int lms_registry_count(const lms_registry *r)
{
    return r->n;
}

int lms_registry_count_all(const lms_registry *r)
{
    return r->n_all;
}

lms_expert *lms_registry_at(lms_registry *r, int i)
{
    return i >= 0 && i < r->n_all ? &r->x[i] : NULL;
}

static lms_expert *find_exact(lms_registry *r, const char *id)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->x[i].cfg->id, id))
            return &r->x[i];
    for (int i = 0; i < r->n; i++) {
        const lms_expert *x = &r->x[i];
        if ((x->base[0] && !strcmp(x->base, id)) || (x->cfg->path && !strcmp(x->cfg->path, id)) ||
            (x->model && x->model->name[0] && !strcmp(x->model->name, id)))
            return &r->x[i];
    }
    return NULL;
}

lms_expert *lms_registry_find(lms_registry *r, const char *id)
{
    static const char tag[] = ":latest"; /* Ollama clients add it */
    lms_expert *x = find_exact(r, id);
    size_t n = strlen(id), t = sizeof tag - 1;
    char base[LMS_EXPERT_ID_MAX + 8];
    if (x || n <= t || n - t >= sizeof base || strcmp(id + n - t, tag) != 0)
        return x;
    memcpy(base, id, n - t);
    base[n - t] = '\0';
    return find_exact(r, base);
}

int lms_registry_n_loaded(const lms_registry *r)
{
    int n = 0;
    for (int i = 0; i < r->n_all; i++)
        n += holds_memory(&r->x[i]);
    return n;
}

uint64_t lms_registry_loaded_bytes(const lms_registry *r)
{
    uint64_t b = 0;
    for (int i = 0; i < r->n_all; i++)
        if (holds_memory(&r->x[i]))
            b += est_bytes(&r->x[i]);
    return b;
}

lms_expert *lms_registry_embedder(lms_registry *r)
{
    return r->embedder;
}

uint64_t lms_registry_budget(const lms_registry *r)
{
    return r->budget;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static void base_name(char *dst, size_t n, const char *path)
{
    const char *b = strrchr(path, '/');
    snprintf(dst, n, "%s", b ? b + 1 : path);
    size_t k = strlen(dst);
    if (k > 5 && !strcmp(dst + k - 5, ".gguf"))
        dst[k - 5] = '\0';
}

int lms_registry_create(lms_route_cfg *cfg, const lms_sched_params *sp,
                        const lms_registry_hooks *hooks, lms_registry **out, char *err,
                        size_t errsz)
{
    lms_registry *r = calloc(1, sizeof *r);
    if (r)
        r->x = calloc((size_t)cfg->n_experts + 1, sizeof *r->x);
    if (!r || !r->x) {
        free(r);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    r->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    r->sp = *sp;
    r->h = *hooks;
    r->n = r->cfg.n_experts;
    r->n_all = r->n + (r->cfg.embedder.id ? 1 : 0);
    if (r->cfg.mem_threshold > 0)
        r->budget = (uint64_t)(r->cfg.mem_threshold * (double)mem_total());
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    for (int i = 0; i < r->n_all; i++) {
        lms_expert *x = &r->x[i];
        struct stat st;
        x->index = i;
        x->cfg = i < r->n ? &r->cfg.experts[i] : &r->cfg.embedder;
        x->pinned = i >= r->n; /* the router's own model stays */
        if (x->cfg->endpoint) {
            x->state = LMS_EXPERT_REMOTE;
            int rc = lms_remote_create(x->cfg, &x->remote, err, errsz);
            if (rc < 0) {
                r->n_all = i; /* the experts made so far are freed */
                lms_registry_destroy(r);
                return rc;
            }
            lms_log(LMS_LOG_INFO, "model_remote", "model", LMS_LOG_STR(x->cfg->id), "endpoint",
                    LMS_LOG_STR(x->cfg->endpoint), "remote_model",
                    LMS_LOG_STR(x->cfg->remote_model), "auth",
                    LMS_LOG_BOOL(x->cfg->api_key != NULL));
            continue;
        }
        base_name(x->base, sizeof x->base, x->cfg->path);
        x->file_bytes = stat(x->cfg->path, &st) == 0 ? (uint64_t)st.st_size : 0;
        x->kv_bytes = estimate_kv(&r->sp, x->cfg->path);
    }
    r->embedder = r->cfg.embed_expert >= 0 ? &r->x[r->cfg.embed_expert]
                  : r->n_all > r->n       ? &r->x[r->n]
                                          : NULL;
    if (pthread_create(&r->th, NULL, loader_main, r) != 0) {
        lms_registry_destroy(r);
        return lms_errf(err, errsz, LMS_ERR_IO, "cannot start the loader thread");
    }
    r->started = true;
    *out = r;
    return 0;
}

static void free_jobs(lms_registry *r, job *j)
{
    while (j) {
        job *next = j->next;
        if (j->kind == JOB_UNLOAD || j->rc == 0)
            free_loaded(r, j->model, j->sched, j->attach);
        free(j->path);
        free(j);
        j = next;
    }
}

void lms_registry_destroy(lms_registry *r)
{
    if (!r)
        return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->th, NULL);
    }
    free_jobs(r, r->todo);
    free_jobs(r, r->done);
    for (int i = 0; i < r->n_all; i++) {
        lms_remote_destroy(r->x[i].remote);
        free_loaded(r, r->x[i].model, r->x[i].sched, r->x[i].attach);
    }
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    lms_route_cfg_free(&r->cfg);
    free(r->x);
    free(r);
}
