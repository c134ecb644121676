/*
 * test_router.c - the multi-model configuration and the semantic router
 * (src/route/config.c, router.c) without a server: texts near an expert's
 * examples go to it, unrelated ones to the default, ties to the higher
 * priority; configuration errors name the file and the field exactly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "route/config.h"
#include "route/router.h"
#include "testutil.h"

static char g_dir[256];

/* A scratch directory with two (empty) model files and a sub folder. */
static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/lms-router-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    static const char *const files[] = {"a.gguf", "b.gguf", "sub/c.gguf"};
    char p[512];
    snprintf(p, sizeof p, "%s/sub", g_dir);
    mkdir(p, 0755);
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, files[i]);
        FILE *f = fopen(p, "wb");
        if (!f)
            return -1;
        fputs("GGUF", f);
        fclose(f);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int parse(const char *text, lms_route_cfg *c, char *err, size_t errsz)
{
    return lms_route_cfg_parse(text, strlen(text), "cfg.json", g_dir, c, err, errsz);
}

static void parse_ok(const char *text, lms_route_cfg *c)
{
    char err[512] = "";
    int rc = parse(text, c, err, sizeof err);
    if (rc < 0)
        fail_msg("unexpected error: %s", err);
}

static void expect_err(const char *text, const char *want)
{
    lms_route_cfg c;
    char err[512] = "";
    assert_true(parse(text, &c, err, sizeof err) < 0);
    if (strcmp(err, want) != 0)
        fail_msg("got '%s'\nwant '%s'", err, want);
}

/* ---- configuration ------------------------------------------------------------------- */

static void test_config_ok(void **state)
{
    (void)state;
    lms_route_cfg c;
    parse_ok("{\"experts\":[{\"expert_id\":\"code\",\"model_path\":\"a.gguf\","
             "\"domain\":\"coding\","
             "\"priority\":2,\"examples\":[\"write a function\"]},"
             "{\"expert_id\":\"chat\",\"model_path\":\"sub/c.gguf\"}],"
             "\"lazy_loading\":{\"enabled\":true,\"warmup_pool_size\":1,\"max_loaded_experts\":2,"
             "\"memory_threshold\":0.5,\"auto_unload_after_s\":30},"
             "\"router\":{\"default\":\"chat\",\"embedding_model\":null}}", &c);
    assert_int_equal(c.n_experts, 2);
    assert_string_equal(c.experts[0].id, "code");
    assert_int_equal(c.experts[0].priority, 2);
    assert_int_equal(c.experts[0].n_examples, 1);
    assert_string_equal(c.experts[0].domain, "coding");
    assert_non_null(strstr(c.experts[1].path, "/sub/c.gguf"));
    assert_true(c.experts[1].path[0] == '/');
    assert_null(c.experts[1].domain);
    assert_true(c.lazy);
    assert_int_equal(c.warmup, 1);
    assert_int_equal(c.max_loaded, 2);
    assert_true(c.mem_threshold == 0.5);
    assert_true(c.unload_after_s == 30);
    assert_string_equal(c.default_id, "chat");
    assert_int_equal(lms_route_cfg_find(&c, "chat"), 1);
    assert_int_equal(lms_route_cfg_find(&c, "nope"), -1);
    lms_route_cfg_free(&c);
}

static void test_config_errors(void **state)
{
    (void)state;
    expect_err("{\"experts\":[{\"model_path\":\"a.gguf\"}]}",
               "cfg.json: experts[0].expert_id: is missing");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\","
               "\"priority\":\"high\"}]}",
               "cfg.json: experts[0].priority: must be an integer");
    expect_err("{\"experts\":[{\"expert_id\":7,\"model_path\":\"a.gguf\"}]}",
               "cfg.json: experts[0].expert_id: must be a string");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"},"
               "{\"expert_id\":\"a\",\"model_path\":\"b.gguf\"}]}",
               "cfg.json: experts[1].expert_id: 'a' is used by an earlier expert");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"nope.gguf\"}]}",
               "cfg.json: experts[0].model_path: 'nope.gguf' does not exist or cannot be reached");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"sub\"}]}",
               "cfg.json: experts[0].model_path: 'sub' is not a regular file");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\\u0000x\"}]}",
               "cfg.json: experts[0].model_path: contains a NUL character");
    expect_err("{\"experts\":[{\"expert_id\":\"a b\",\"model_path\":\"a.gguf\"}]}",
               "cfg.json: experts[0].expert_id: 'a b' may only hold letters, digits and . _ - :");
    expect_err("{\"experts\":[]}", "cfg.json: experts: must hold 1 to 256 experts");
    expect_err("{\"experts\":{}}", "cfg.json: experts: must be an array of objects");
    expect_err("{}", "cfg.json: experts: is missing");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\","
               "\"examples\":[\"x\",3]}]}",
               "cfg.json: experts[0].examples[1]: must be a string");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
               "\"lazy_loading\":{\"max_loaded_expert\":1}}",
               "cfg.json: lazy_loading.max_loaded_expert: is not a known setting");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
               "\"lazy_loading\":{\"memory_threshold\":1.5}}",
               "cfg.json: lazy_loading.memory_threshold: must be between 0 and 1");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
               "\"lazy_loading\":{\"enabled\":\"yes\"}}",
               "cfg.json: lazy_loading.enabled: must be true or false");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
               "\"router\":{\"default\":\"b\"}}",
               "cfg.json: router.default: 'b' is not an expert_id");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],\n"
               "  \"router\": {,}}",
               "cfg.json: invalid JSON at line 2, column 14: string or '}' expected near ','");
}

/* A relative path may not climb out of the config file's folder; with
 * model_dirs every model must lie inside one of them. */
static void test_config_paths(void **state)
{
    (void)state;
    char text[1024], want[1024];
    lms_route_cfg c;
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"../../etc/hostname\"}]}",
               "cfg.json: experts[0].model_path: '../../etc/hostname' leads outside the config "
               "file's directory");
    snprintf(text, sizeof text, "{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"%s/a.gguf\"}],"
             "\"model_dirs\":[\"sub\"]}", g_dir);
    snprintf(want, sizeof want, "cfg.json: experts[0].model_path: '%s/a.gguf' is not inside any "
             "of model_dirs", g_dir);
    expect_err(text, want);
    snprintf(text, sizeof text, "{\"experts\":[{\"expert_id\":\"a\","
             "\"model_path\":\"sub/c.gguf\"}],"
             "\"model_dirs\":[\"sub\"]}");
    parse_ok(text, &c);
    lms_route_cfg_free(&c);
    snprintf(text, sizeof text, "{\"experts\":[{\"expert_id\":\"a\","
             "\"model_path\":\"/etc/hostname\"}],"
             "\"model_dirs\":[\"%s\"]}", g_dir);
    expect_err(text, "cfg.json: experts[0].model_path: '/etc/hostname' is not inside any of "
                     "model_dirs");
}

/* ---- router --------------------------------------------------------------------------- */

static const char *const three =
    "{\"experts\":["
    "{\"expert_id\":\"coder\",\"model_path\":\"a.gguf\",\"domain\":\"programming and source code\","
    "\"priority\":2,\"examples\":[\"write a python function\",\"fix this javascript bug\","
    "\"why does my C program segfault\"]},"
    "{\"expert_id\":\"chef\",\"model_path\":\"b.gguf\",\"domain\":\"cooking and recipes\","
    "\"priority\":1,\"examples\":[\"how do I bake sourdough bread\",\"a recipe for tomato soup\","
    "\"how long should I boil an egg\"]},"
    "{\"expert_id\":\"general\",\"model_path\":\"sub/c.gguf\",\"domain\":\"small talk\","
    "\"examples\":[\"hello how are you today\"]}],"
    "\"router\":{\"default\":\"general\",\"threshold\":0.15}}";

static int route(const lms_router *r, const char *text)
{
    return lms_router_pick(r, text, strlen(text)).expert;
}

static void test_router_picks(void **state)
{
    (void)state;
    lms_route_cfg c;
    lms_router *r;
    parse_ok(three, &c);
    assert_int_equal(lms_router_create(&c, &r), 0);
    assert_int_equal(route(r, "Please write a Python function that reverses a list"), 0);
    assert_int_equal(route(r, "my javascript has a bug, can you fix it?"), 0);
    assert_int_equal(route(r, "What is a good recipe for a creamy tomato soup?"), 1);
    assert_int_equal(route(r, "bread baking: my sourdough is flat"), 1);
    assert_int_equal(route(r, "Hello! How are you?"), 2);
    /* nothing alike: the default, flagged as a fallback */
    lms_route_pick p = lms_router_pick(r, "zxq vvw", 7);
    assert_int_equal(p.expert, 2);
    assert_true(p.fallback);
    assert_int_equal(route(r, ""), 2);
    assert_int_equal(lms_router_pick(r, NULL, 0).expert, 2);
    p = lms_router_pick(r, "boil an egg", 11);
    assert_false(p.fallback);
    assert_true(p.score > 0.15 && p.score <= 1.0 + 1e-6);
    /* hostile bytes: no crash, some expert */
    char junk[3000];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(i * 131 + 7);
    p = lms_router_pick(r, junk, sizeof junk);
    assert_true(p.expert >= 0 && p.expert < 3);
    lms_router_destroy(r);
    lms_route_cfg_free(&c);
}

/* Equal scores go to the higher priority; without router.default the
 * highest-priority expert is the default. */
static void test_router_ties(void **state)
{
    (void)state;
    lms_route_cfg c;
    lms_router *r;
    parse_ok("{\"experts\":["
             "{\"expert_id\":\"low\",\"model_path\":\"a.gguf\",\"priority\":1,"
             "\"examples\":[\"translate this sentence\"]},"
             "{\"expert_id\":\"high\",\"model_path\":\"b.gguf\",\"priority\":5,"
             "\"examples\":[\"translate this sentence\"]},"
             "{\"expert_id\":\"other\",\"model_path\":\"sub/c.gguf\",\"priority\":3,"
             "\"examples\":[\"weather forecast tomorrow\"]}]}", &c);
    assert_int_equal(lms_router_create(&c, &r), 0);
    assert_int_equal(route(r, "translate this sentence please"), 1);
    assert_int_equal(lms_router_default(r), 1);
    assert_int_equal(route(r, "weather tomorrow?"), 2);
    lms_route_pick p = lms_router_pick(r, "quantum chromodynamics", 22);
    assert_true(p.fallback);
    assert_int_equal(p.expert, 1);
    lms_router_destroy(r);
    lms_route_cfg_free(&c);
}

/* The threshold decides between the best expert and the default. */
static void test_router_threshold(void **state)
{
    (void)state;
    lms_route_cfg c;
    lms_router *r;
    parse_ok("{\"experts\":["
             "{\"expert_id\":\"code\",\"model_path\":\"a.gguf\",\"examples\":[\"python code\"]},"
             "{\"expert_id\":\"chat\",\"model_path\":\"b.gguf\"}],"
             "\"router\":{\"default\":\"chat\",\"threshold\":0.99}}", &c);
    assert_int_equal(lms_router_create(&c, &r), 0);
    lms_route_pick p = lms_router_pick(r, "some python code and many other words here", 42);
    assert_int_equal(p.best, 0);
    assert_true(p.fallback);
    assert_int_equal(p.expert, 1);
    assert_int_equal(route(r, "python code"), 0); /* identical text: similarity 1 */
    lms_router_destroy(r);
    lms_route_cfg_free(&c);
}

/* router.embedding_model: an expert id, or a model file checked like
 * model_path. */
static void test_config_embedding_model(void **state)
{
    (void)state;
    lms_route_cfg c;
    parse_ok("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"},"
             "{\"expert_id\":\"b\",\"model_path\":\"b.gguf\"}],"
             "\"router\":{\"embedding_model\":\"b\"}}", &c);
    assert_int_equal(c.embed_expert, 1);
    assert_null(c.embedder.id);
    lms_route_cfg_free(&c);
    parse_ok("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
             "\"router\":{\"embedding_model\":\"sub/c.gguf\"}}", &c);
    assert_int_equal(c.embed_expert, -1);
    assert_string_equal(c.embedder.id, "router-embedding");
    assert_non_null(strstr(c.embedder.path, "/sub/c.gguf"));
    lms_route_cfg_free(&c);
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
               "\"router\":{\"embedding_model\":\"e.gguf\"}}",
               "cfg.json: router.embedding_model: 'e.gguf' does not exist or cannot be reached");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"a.gguf\"}],"
               "\"router\":{\"embedding_model\":3}}",
               "cfg.json: router.embedding_model: must be a string");
}

/* Embedding mode: cosine of given vectors, the same rules. Documents in
 * router order: coder's domain, its examples, chef's ..., general's. */
static void test_router_vectors(void **state)
{
    (void)state;
    lms_route_cfg c;
    lms_router *r;
    parse_ok(three, &c);
    assert_int_equal(lms_router_create(&c, &r), 0);
    int n = lms_router_n_docs(r);
    assert_int_equal(n, 4 + 4 + 2);
    assert_string_equal(lms_router_doc_text(r, 0), "programming and source code");
    assert_string_equal(lms_router_doc_text(r, 6), "a recipe for tomato soup");
    assert_null(lms_router_doc_text(r, n));
    enum { D = 4 };
    float docs[10][D] = {{0}};
    for (int d = 0; d < n; d++)
        docs[d][d < 4 ? 0 : d < 8 ? 1 : 2] = 1; /* one axis per expert */
    float q_chef[D] = {0.1f, 0.9f, 0.1f, 0}, q_none[D] = {0, 0, 0, 1}, q_tie[D] = {1, 1, 0, 0};
    lms_route_pick p = lms_router_pick_vec(r, &docs[0][0], D, q_chef);
    assert_int_equal(p.expert, 1);
    assert_false(p.fallback);
    assert_true(p.score > 0.9);
    p = lms_router_pick_vec(r, &docs[0][0], D, q_none); /* orthogonal: the default */
    assert_int_equal(p.expert, 2);
    assert_true(p.fallback);
    p = lms_router_pick_vec(r, &docs[0][0], D, q_tie); /* coder (priority 2) over chef (1) */
    assert_int_equal(p.expert, 0);
    lms_router_destroy(r);
    lms_route_cfg_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_ok),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_paths),
        cmocka_unit_test(test_router_picks),
        cmocka_unit_test(test_router_ties),
        cmocka_unit_test(test_router_threshold),
        cmocka_unit_test(test_config_embedding_model),
        cmocka_unit_test(test_router_vectors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
