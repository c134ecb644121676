/*
 * sched.h - the serving engine of one model: a request queue, continuous
 * batching over the paged KV cache with prefix reuse, and events back to
 * whoever submitted the work.
 *
 * Threads: lms_sched_create starts one scheduler thread that owns the
 * model's context (KV cache, scratch) and runs the step loop; it sleeps on
 * a condition variable when there is no work. submit / abort / stats may
 * be called from any thread. Events are delivered by calling the request's
 * callback *on the scheduler thread*; the callback must not block (the
 * server pushes the event to its own queue and wakes its event loop).
 *
 * Request lifecycle:
 *
 *   submit -> QUEUED -> PREFILLING -> DECODING -> END (stop | length)
 *                 \          \            \-----> END (abort)  on abort()
 *                  \          \-----------------> ERROR        on failure
 *                   \---------------------------> END (abort) / ERROR
 *
 * Every accepted request receives exactly one terminal event (LMS_EV_END
 * or LMS_EV_ERROR), after which the scheduler never touches its callback
 * or user pointer again. A request refused by submit gets no event.
 */
#ifndef LMS_SCHED_H
#define LMS_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/stopstr.h"
#include "model/lora.h"
#include "model/model.h"
#include "ops/thermal.h"
#include "ops/watchdog.h"

#define LMS_MAX_LOGPROBS 20

typedef struct lms_sched lms_sched;

typedef struct lms_sched_params {
    int32_t n_ctx;            /* max positions of one sequence (prompt + output) */
    int32_t n_parallel;       /* max sequences decoding at once */
    int32_t n_batch;          /* token budget of one step (prompt chunks + decodes) */
    int32_t max_queue;        /* queued requests before submit refuses (LMS_ERR_BUSY) */
    int64_t kv_budget_bytes;  /* KV pool size; 0 = n_ctx * n_parallel cells */
    int32_t n_threads;        /* compute threads; 0 = all cores */
    bool no_prefix_cache;     /* disable prefix reuse */
    int kv_type;              /* KV cache type: 0 = F16, LMS_TYPE_Q8_0 or LMS_TYPE_Q4_0 */
    int32_t gpu_layers;       /* GPU placement, as lms_ctx_params (0 = CPU only) */
    int32_t vram_margin_mb, vram_budget_mb;
    lms_thermal *thermal;     /* borrowed: slow down / pause steps when hot (NULL: off) */
    lms_watchdog *watchdog;   /* borrowed: report steps that stall (NULL: off) */
    int stall_ms;             /* a step longer than this is a stall (0: 60000) */
    /* Called on the watchdog thread when a step stalls; must not block (post a
     * restart: lms_sched_abandon then a new scheduler). */
    void (*on_stall)(void *ud, lms_sched *s);
    void *stall_ud;
    /* Speculative decoding (spec.h): spec.mode LMS_SPEC_NGRAM, or
     * LMS_SPEC_DRAFT with the draft model at draft_model (loaded at create,
     * vocabulary checked; its layers on the GPU by draft_gpu_layers when
     * draft_gpu_set, else by gpu_layers). Every decoding sequence's next
     * token and its proposals are one step's rows, within the token budget;
     * a request may lower n_max / change n_min, p_min (lms_request). */
    lms_spec_params spec;
    const char *draft_model;
    int32_t draft_gpu_layers;
    bool draft_gpu_set;
} lms_sched_params;

enum lms_event_type {
    LMS_EV_TOKEN = 1, /* a piece of generated text */
    LMS_EV_END = 2,   /* terminal: finished, with stats */
    LMS_EV_ERROR = 3, /* terminal: failed, with a message */
    LMS_EV_EMBD = 4,  /* embedding vector (then LMS_EV_END) */
    LMS_EV_PROMPT = 5, /* a prompt token's log-probability (prompt_logprobs) */
};

/* How a decoder's embedding request pools its prompt's final-normed
 * states: their mean, the last token's, the first token's, or (a
 * reranker, hp.pooling LMS_POOLING_RANK) the last token's through the
 * classification head: hp.n_cls_out scores (lms_rank_scores), not
 * normalized. The others come out of unit length. */
enum lms_pooling {
    LMS_POOL_MEAN = 0,
    LMS_POOL_LAST = 1,
    LMS_POOL_FIRST = 2,
    LMS_POOL_RANK = 3,
};

typedef struct lms_req_stats {
    int32_t n_prompt;      /* prompt tokens */
    int32_t n_cached;      /* prompt tokens reused from the prefix cache */
    int32_t n_gen;         /* generated tokens */
    int32_t n_think;       /* of which thoughts: between a <think> the reply (or, with
                            * lms_request.think_open, the prompt) opened and its </think> */
    double queue_ms;       /* submit to first scheduled step */
    double ttft_ms;        /* submit to first token */
    double total_ms;       /* submit to end */
    double tps;            /* generated tokens per second after the first */
    const char *finish;    /* "stop", "length", "abort", "deadline" (static) */
    bool stop_word;        /* "stop" came from one of the request's stop strings (not EOS) */
    int stop_index;        /* then which: its index in lms_request.stop */
    int32_t n_drafted;     /* speculative decoding: tokens proposed */
    int32_t n_accepted;    /* of which the target took */
} lms_req_stats;

typedef struct lms_event {
    int type;                  /* enum lms_event_type */
    uint64_t id;               /* request id from submit */
    void *user;                /* the request's user pointer */
    /* LMS_EV_TOKEN: text is valid UTF-8 (may be empty when a character is
     * incomplete or a stop string may be starting). LMS_EV_PROMPT: no
     * text; token is prompt token i (i = 1 .. n - 1, in order, before any
     * LMS_EV_TOKEN), logprob and top its model log-probabilities given
     * tokens 0 .. i - 1 (no sampling settings applied). */
    char *text;
    size_t text_len;
    int32_t token;             /* -1 for text released at the end */
    float prob;                /* probability of token */
    float logprob;
    int n_top;                 /* top alternatives when logprobs were asked */
    lms_token_prob top[LMS_MAX_LOGPROBS];
    /* LMS_EV_EMBD */
    float *embd;
    int32_t n_embd;
    /* LMS_EV_END */
    lms_req_stats stats;
    /* LMS_EV_ERROR */
    int err;                   /* negative lms_err */
    char message[256];
} lms_event;

/* Receives an event on the scheduler thread and owns it from then on
 * (release with lms_event_free). */
typedef void (*lms_event_fn)(void *user, lms_event *ev);

void lms_event_free(lms_event *ev);

typedef struct lms_request {
    const int32_t *tokens;     /* prompt, copied by submit */
    int32_t n_tokens;
    lms_sampler_params sp;
    int32_t max_tokens;        /* < 0: until the context is full */
    const char *const *stop;   /* stop strings, copied */
    int n_stop;
    bool ignore_eos;
    bool json;                 /* JSON mode: the output is held to one JSON object
                                * (engine/jsonfsm.h); the end-of-generation token
                                * only once it is closed */
    const struct lms_jschema *schema; /* JSON mode held to this compiled schema
                                * (engine/jsonschema.h), copied; implies json */
    const struct lms_gbnf *grammar; /* the output held to this compiled GBNF
                                * grammar (engine/gbnf.h), copied; the
                                * end-of-generation token only where the
                                * grammar's text may end; not with json */
    int n_logprobs;            /* 0..LMS_MAX_LOGPROBS alternatives per token */
    bool prompt_logprobs;      /* LMS_EV_PROMPT for every prompt token after the first; the
                                * prompt is computed whole (no prefix cache); max_tokens
                                * may then be 0 (no generation) */
    double timeout_ms;         /* deadline from submit; 0 = none */
    /* LoRA adapters for this sequence (up to LMS_LORA_MAX, each loaded for
     * this model: lms_lora_load). Submit takes a reference to each (the
     * caller may release its own at once: an adapter unloaded while in use
     * lives until its requests end); uses with scale 0 are dropped. The
     * prefix cache keys blocks by the set's id, so sequences share cached
     * blocks only with the same adapters and scales. */
    const lms_lora_use *loras;
    int n_loras;
    bool embedding;            /* compute a pooled embedding instead */
    int pooling;               /* enum lms_pooling */
    /* Speculative decoding for this request, over the scheduler's: n_max
     * (at most the scheduler's; 0: the scheduler's, < 0: off), n_min (0:
     * the scheduler's, < 0: none), p_min (0: the scheduler's, < 0: none). */
    int32_t spec_n_max, spec_n_min;
    float spec_p_min;
    /* Thinking models (<think> ... </think>): think_open says the prompt
     * opened the thoughts (else they start where the reply opens with
     * "<think>"); their tokens are counted (lms_req_stats.n_think).
     * Reasoning budget: with
     * think_close set (n_think_close tokens, copied), once think_budget
     * tokens of thoughts are drawn the next ones are think_close (e.g. the
     * tokens of "\n</think>\n\n"), ending the thoughts; then sampling goes on.
     * The thoughts start with the reply when think_open (the prompt opened
     * them), else where the reply opens with "<think>"; they end at the
     * first "</think>". NULL: no budget. Not with json or grammar. */
    const int32_t *think_close;
    int32_t n_think_close, think_budget;
    bool think_open;
    lms_event_fn cb;
    void *user;
} lms_request;

typedef struct lms_sched_stats {
    int32_t n_running;         /* sequences prefilling or decoding */
    int32_t n_queued;
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;    /* referenced by a sequence */
    int32_t kv_blocks_cached;  /* free but holding a reusable prefix */
    uint64_t prefix_queries;   /* prompt tokens looked up in the prefix cache */
    uint64_t prefix_hits;      /* of which found */
    uint64_t prompt_tokens;    /* evaluated + cached, since start */
    uint64_t gen_tokens;
    uint64_t n_requests;       /* finished requests by outcome */
    uint64_t n_aborted, n_failed;
    uint64_t n_steps;
    uint64_t spec_drafted;     /* speculative decoding: tokens proposed */
    uint64_t spec_accepted;    /* of which the target took */
    int32_t draft_blocks_used; /* blocks of the draft model's pool held */
    double last_tps;           /* decode tokens/s of the last finished request */
    double last_ttft_ms;
    bool busy;                 /* a step is running */
} lms_sched_stats;

/* Creates the context (KV pool) and starts the scheduler thread. The model
 * is borrowed and must outlive the scheduler. */
int lms_sched_create(lms_model *m, const lms_sched_params *p, lms_sched **out, char *err,
                     size_t errsz);
/* Stops the thread; queued and running requests end with LMS_EV_END
 * (finish "abort") first. NULL is a no-op. */
void lms_sched_destroy(lms_sched *s);

/* Queues a request. Returns 0 and the id, or < 0 without queuing:
 * LMS_ERR_BUSY (queue full), LMS_ERR_LIMIT (prompt + max_tokens do not
 * fit the context), LMS_ERR_RANGE (bad token id), LMS_ERR_INVAL (bad
 * parameters), with a message in err. */
int lms_sched_submit(lms_sched *s, const lms_request *r, uint64_t *id, char *err, size_t errsz);
/* Asks for a request to stop before the next step; its blocks are freed
 * then and it ends with finish "abort". Unknown or finished ids are
 * ignored. */
void lms_sched_abort(lms_sched *s, uint64_t id);
void lms_sched_get_stats(lms_sched *s, lms_sched_stats *out);
const lms_model *lms_sched_model(const lms_sched *s);
/* Gives up on a stalled scheduler: every queued and running request ends
 * now with LMS_EV_ERROR carrying msg, and the scheduler thread frees
 * everything and exits on its own whenever its stuck step returns. The
 * caller must not use s afterwards (create a new scheduler instead). */
void lms_sched_abandon(lms_sched *s, const char *msg);
const lms_sched_params *lms_sched_params_of(const lms_sched *s);

/* Gives back the calling thread's OpenMP team (its parked workers), as an
 * idle scheduler thread does: libgomp counts every team's threads, parked
 * or not, and once they outnumber the CPUs the workers of every team sleep
 * in the kernel between parallel regions instead of spinning. The thread's
 * next parallel region starts a new team. */
void lms_release_omp_team(void);

#endif
