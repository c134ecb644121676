/*
 * test_lora_room_cuda.c - a LoRA adapter that finds no room on the GPU
 * fails its own requests only.
 *
 * The scheduler runs llama-synth Q4_K_M with every layer on the GPU and the
 * adapters' device memory capped at 1 MiB (LMS_CUDA_LORA_MAX_MB=1). Three
 * greedy requests share its steps: one without adapters, one with a rank-4
 * adapter (~0.16 MiB of pairs on the GPU: fits), one with a rank-64 adapter
 * (~2.4 MiB: does not). The third must end with an error naming the
 * adapters and the GPU's memory; the other two must finish, the first with
 * exactly the tokens it gets alone, the second with as many tokens as
 * asked, though the step that failed held all three. Before this, a step
 * whose adapter did not fit failed every running request.
 *
 * Exits 77 (skipped) without a CUDA build or without a device.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/sampler.h"
#include "engine/sched.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"
#include "cuda/cuda_test.h"

#define N_GEN 16

typedef struct outcome {
    int32_t toks[N_GEN];
    int n;
    bool done, failed;
    char message[256];
} outcome;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void on_event(void *user, lms_event *ev)
{
    outcome *o = user;
    pthread_mutex_lock(&mu);
    if (ev->type == LMS_EV_TOKEN && ev->token >= 0 && o->n < N_GEN)
        o->toks[o->n++] = ev->token;
    if (ev->type == LMS_EV_END || ev->type == LMS_EV_ERROR) {
        o->done = true;
        o->failed = ev->type == LMS_EV_ERROR;
        snprintf(o->message, sizeof o->message, "%s", ev->message);
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    lms_event_free(ev);
}

static lms_lora *make_lora(const char *model_path, const lms_model *m, int rank)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "/tmp/lms_test_lora_room_%d_%d.gguf", (int)getpid(), rank);
    lms_synth_lora_params p = {.rank = rank, .alpha = (float)rank, .type = "f32",
                               .seed = 7 + (uint64_t)rank};
    if (lms_synth_lora_write(model_path, &p, path, err, sizeof err) < 0)
        fail_msg("synth lora rank %d: %s", rank, err);
    lms_lora *l;
    int rc = lms_lora_load(path, m, &l, err, sizeof err);
    unlink(path);
    if (rc < 0)
        fail_msg("load lora rank %d: %s", rank, err);
    return l;
}

static void submit(lms_sched *s, const lms_lora_use *use, outcome *o)
{
    static const int32_t prompt[6] = {1, 400, 30, 291, 29, 10};
    lms_request q = {.tokens = prompt, .n_tokens = 6, .max_tokens = N_GEN,
                     .sp = lms_sampler_defaults(), .ignore_eos = true, .cb = on_event, .user = o,
                     .loras = use, .n_loras = use ? 1 : 0};
    q.sp.temperature = 0;
    uint64_t id;
    char err[256];
    if (lms_sched_submit(s, &q, &id, err, sizeof err) < 0)
        fail_msg("submit: %s", err);
}

static void wait_all(outcome *o, int n)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n; i++)
        while (!o[i].done)
            pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void test_no_room(void **state)
{
    (void)state;
    setenv("LMS_CUDA_LORA_MAX_MB", "1", 1);
    const char *path = tu_data_path("models/llama-synth-q4_k_m.gguf");
    char err[512];
    lms_model *m = NULL;
    if (lms_model_load(path, &m, err, sizeof err) < 0)
        fail_msg("%s", err);
    lms_lora *small = make_lora(path, m, 4), *big = make_lora(path, m, 64);
    lms_sched_params p = {.n_ctx = 128, .n_parallel = 3, .n_batch = 64, .max_queue = 8,
                          .gpu_layers = LMS_GPU_LAYERS_ALL};
    lms_sched *s = NULL;
    if (lms_sched_create(m, &p, &s, err, sizeof err) < 0)
        fail_msg("scheduler: %s", err);
    outcome alone = {0};
    submit(s, NULL, &alone);
    wait_all(&alone, 1);
    assert_false(alone.failed);
    outcome o[3];
    memset(o, 0, sizeof o);
    const lms_lora_use su = {small, 1.0f}, bu = {big, 1.0f};
    submit(s, NULL, &o[0]);
    submit(s, &su, &o[1]);
    submit(s, &bu, &o[2]);
    wait_all(o, 3);
    printf("cuda lora room: plain %s (%d tokens), rank 4 %s (%d tokens), rank 64 %s: %s\n",
           o[0].failed ? "failed" : "done", o[0].n, o[1].failed ? "failed" : "done", o[1].n,
           o[2].failed ? "failed" : "done", o[2].message);
    assert_false(o[0].failed);
    assert_int_equal(o[0].n, N_GEN);
    assert_memory_equal(o[0].toks, alone.toks, sizeof alone.toks);
    assert_false(o[1].failed);
    assert_int_equal(o[1].n, N_GEN);
    assert_true(o[2].failed);
    if (!strstr(o[2].message, "LoRA") || !strstr(o[2].message, "GPU"))
        fail_msg("the failed request's message names neither: %s", o[2].message);
    lms_sched_destroy(s);
    lms_lora_release(small);
    lms_lora_release(big);
    lms_model_free(m);
    unsetenv("LMS_CUDA_LORA_MAX_MB");
}

int main(void)
{
    cuda_test_need_device();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_room)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
