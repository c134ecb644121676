/*
 * registry.h - the expert models behind one server: one entry per expert
 * of the configuration, its state, and the loader thread that loads and
 * unloads models so that the event loop never waits on a disk or a KV
 * pool allocation.
 *
 * State of one expert (event-loop thread):
 *
 *   UNLOADED --want--> LOADING --ok--> READY --idle/LRU--> UNLOADING --> UNLOADED
 *      ^                  |                                    |
 *      |                  +--fails--> FAILED --want--> LOADING  +--wanted meanwhile--> LOADING
 *
 *   REMOTE: an expert served elsewhere ("endpoint", route/remote.h) is in
 *   this state from creation to the end: always usable, never loaded or
 *   unloaded, counted in neither max_loaded nor the memory threshold.
 *
 * Threads: every function here runs on the event-loop thread except the
 * hooks marked "loader thread". The loop hands a job (load or unload one
 * expert) to the loader thread's queue; the loader does the slow part
 * (lms_model_load, lms_sched_create, the serve layer's prepare hook; or
 * lms_sched_destroy, release, lms_model_free), puts the result on a done
 * queue and calls hooks.wake; the loop then calls lms_registry_poll, which
 * applies the results to the entries. Jobs run one at a time in order, so
 * an unload queued before a load has freed its memory before the load
 * starts.
 *
 * Limits, checked when a load starts (lms_registry_want): at most
 * max_loaded experts loading or ready, and the estimated bytes (model file
 * + KV pool) of those under memory_threshold * MemTotal. Either limit first
 * unloads idle experts (no live or waiting request), least recently used
 * first; when that cannot make room the load is refused at once with a
 * message (the server answers 503) rather than waiting for a busy expert.
 * A model loaded for the router alone (router.embedding_model as a file)
 * counts toward the memory threshold but not toward max_loaded, and is
 * never unloaded.
 */
#ifndef LMS_ROUTE_REGISTRY_H
#define LMS_ROUTE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sched.h"
#include "model/model.h"
#include "route/config.h"
#include "route/remote.h"

enum lms_expert_state {
    LMS_EXPERT_UNLOADED = 0,
    LMS_EXPERT_LOADING,
    LMS_EXPERT_READY,
    LMS_EXPERT_FAILED,
    LMS_EXPERT_UNLOADING,
    LMS_EXPERT_REMOTE,
};

const char *lms_expert_state_name(int state);

/* One expert. The first block is fixed at creation; the rest belongs to
 * the event-loop thread. */
typedef struct lms_expert {
    int index;                  /* in the configuration */
    const lms_expert_cfg *cfg;  /* id, path, domain, priority, examples */
    char base[160];             /* the model file's base name, ".gguf" stripped */
    uint64_t file_bytes;
    lms_remote *remote;         /* served elsewhere (state REMOTE), else NULL */
    /* event-loop thread */
    int state;                  /* enum lms_expert_state */
    lms_model *model;           /* READY: the loaded model */
    lms_sched *sched;           /* READY: its scheduler */
    void *attach;               /* READY: what hooks.prepare made (the chat template) */
    uint64_t kv_bytes;          /* KV pool: estimated from the file, exact once loaded */
    double t_used_ms;           /* last request start or end (LRU) */
    int n_live;                 /* requests in its scheduler */
    int n_waiting;              /* requests parked until it is ready */
    bool want;                  /* asked for while UNLOADING: load again afterwards */
    bool pinned;                /* a stalled scheduler was abandoned and may still read the
                                 * model: never unloaded */
    uint64_t n_loads, n_unloads, n_load_failures, n_requests, n_restarts;
    double load_ms;             /* duration of the last load */
    bool keep_set;              /* keep_ms holds (Ollama's keep_alive), else the
                                 * configuration's idle unload applies */
    double keep_ms;             /* unload this long after the last use (0: at once); < 0:
                                 * never */
    char error[384];            /* why the last load failed or was refused */
} lms_expert;

typedef struct lms_registry_hooks {
    /* Loader thread: after the model and its scheduler exist; makes the
     * serve layer's per-model object (*attach). It may read x's fixed
     * fields (index, cfg) only. < 0 fails the load. */
    int (*prepare)(void *ud, const lms_expert *x, lms_model *m, lms_sched *s, void **attach,
                   char *err, size_t errsz);
    /* Loader thread (or lms_registry_destroy): frees *attach. */
    void (*release)(void *ud, void *attach);
    /* Loader thread: results wait for lms_registry_poll (wake the loop). */
    void (*wake)(void *ud);
    void *ud;
} lms_registry_hooks;

typedef struct lms_registry lms_registry;

/* Takes cfg (freed by lms_registry_destroy; *cfg is cleared). sp: the
 * scheduler parameters of every model (n_ctx 0: the model's training
 * context, at most 4096). Starts the loader thread. */
int lms_registry_create(lms_route_cfg *cfg, const lms_sched_params *sp,
                        const lms_registry_hooks *hooks, lms_registry **out, char *err,
                        size_t errsz);
/* Stops the loader thread (after its current job) and frees every model,
 * scheduler and attachment. NULL is a no-op. */
void lms_registry_destroy(lms_registry *r);

const lms_route_cfg *lms_registry_cfg(const lms_registry *r);
/* The experts are lms_registry_at(0 .. count-1); a model loaded only for
 * the router (router.embedding_model given as a file) comes after them,
 * below count_all, and is listed nowhere. */
int lms_registry_count(const lms_registry *r);
int lms_registry_count_all(const lms_registry *r);
lms_expert *lms_registry_at(lms_registry *r, int i);
/* The entry whose model embeds texts for the router (an expert or the
 * router's own model, which is never unloaded), or NULL (lexical router). */
lms_expert *lms_registry_embedder(lms_registry *r);
/* The expert named id (expert id, file base name, model path or
 * general.name of a loaded model; "NAME:latest" as NAME), or NULL. */
lms_expert *lms_registry_find(lms_registry *r, const char *id);

/* Asks for x to be loaded. Returns 1 when READY or REMOTE (its LRU time is
 * touched), 0 when it is loading (or will load after an unload), < 0 when
 * the load is refused now (LMS_ERR_BUSY: max_loaded reached and every
 * loaded expert busy; LMS_ERR_LIMIT: over the memory threshold) with the
 * reason in err and in x->error. */
int lms_registry_want(lms_registry *r, lms_expert *x, char *err, size_t errsz);
/* Applies finished jobs; changed(ud, x) is called for each expert whose
 * state changed (READY, FAILED, UNLOADED). */
void lms_registry_poll(lms_registry *r, void (*changed)(void *ud, lms_expert *x), void *ud);
/* Starts unloading x now if it is loaded and idle (no request live or
 * waiting, not pinned): 1 when started, 0 when not loaded, LMS_ERR_BUSY
 * when it is in use or pinned. */
int lms_registry_unload(lms_registry *r, lms_expert *x, const char *reason);
/* Unloads experts idle for longer than unload_after_s (call every second). */
void lms_registry_tick(lms_registry *r, double now_ms);
/* Live request accounting (task start / end). */
/* How long x stays loaded once idle, until set again: set false gives it
 * back to the configuration (lazy_loading.auto_unload_after_s); ms < 0:
 * for good. Loop thread. */
void lms_registry_keep(lms_expert *x, bool set, double ms);
/* When x, loaded, would be unloaded for idleness (lms_now_ms clock), or a
 * negative value when it would not. */
double lms_registry_expiry(const lms_registry *r, const lms_expert *x, double now_ms);
void lms_registry_begin(lms_expert *x, double now_ms);
void lms_registry_end(lms_expert *x, double now_ms);
/* Replaces a stalled scheduler: its requests end with an error carrying
 * msg, a new one with the same parameters takes its place (the model is
 * pinned from then on). < 0 with err when the new one cannot be made. */
int lms_registry_restart(lms_registry *r, lms_expert *x, const char *msg, char *err,
                         size_t errsz);
/* Loaded (READY or LOADING) experts and their estimated bytes. */
int lms_registry_n_loaded(const lms_registry *r);
uint64_t lms_registry_loaded_bytes(const lms_registry *r);
/* The memory budget in bytes (0 = none). */
uint64_t lms_registry_budget(const lms_registry *r);

#endif
