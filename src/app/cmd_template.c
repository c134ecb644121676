/*
 * cmd_template.c - `lmserv template`: renders a conversation through a chat
 * template and prints the prompt byte for byte (no newline added), the way
 * the server would build it before tokenizing.
 *
 *   lmserv template [-m MODEL.gguf] --messages CONV.json [--template FILE|NAME]
 *                   [--no-generation-prompt] [--bos-token S] [--eos-token S]
 *                   [--tools TOOLS.json] [--var KEY=JSON]... [--now DATE]
 *                   [--now-text TEXT]
 *
 * CONV.json is a messages array or an object with "messages" (and optional
 * "tools"); "-" reads stdin. The template comes from --template, else from
 * the model's tokenizer.chat_template, else the built-in default; -m also
 * supplies bos_token/eos_token (the flags override them). --now fixes the
 * clock of strftime_now() (YYYY-MM-DD[THH:MM[:SS]] local time, or epoch
 * seconds); --now-text makes strftime_now() return TEXT whatever its
 * format, as the golden test data was made.
 *
 * Exit status: 0 rendered; 1 the template failed (a raise_exception()
 * message is printed alone on stderr); 2 usage or input error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "app/cli.h"
#include "app/prompt.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/template.h"
#include "model/tokenizer.h"

typedef struct tpl_opts {
    const char *model, *messages, *tools, *template_arg, *bos, *eos, *now_text;
    bool no_gen;
    int64_t now;
    json_t *extra; /* --var values */
} tpl_opts;

static int usage(void)
{
    fprintf(stderr,
            "usage: lmserv template [-m MODEL.gguf] --messages CONV.json [--template FILE|NAME]\n"
            "                       [--no-generation-prompt] [--bos-token S] [--eos-token S]\n"
            "                       [--tools TOOLS.json] [--var KEY=JSON]... [--now DATE]\n"
            "                       [--now-text TEXT]\n"
            "built-in templates:");
    for (const char *const *n = lms_template_builtin_names(); *n; n++)
        fprintf(stderr, " %s", *n);
    fprintf(stderr, " (default %s)\n", LMS_TEMPLATE_DEFAULT);
    return 2;
}

/* "2026-11-26", "2026-11-26T10:30[:00]" (local time) or epoch seconds. */
static bool parse_now(const char *s, int64_t *out)
{
    struct tm tm = {0};
    char tail;
    int n = sscanf(s, "%d-%d-%d%*[T ]%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec);
    if (n >= 3) {
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        tm.tm_isdst = -1;
        time_t t = mktime(&tm);
        *out = (int64_t)t;
        return t != (time_t)-1;
    }
    long long v;
    if (sscanf(s, "%lld%c", &v, &tail) == 1 && v > 0) {
        *out = v;
        return true;
    }
    return false;
}

/* --var KEY=JSON; a value that is not JSON is taken as a string. */
static bool add_var(json_t *extra, const char *kv)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        fprintf(stderr, "lmserv template: --var wants KEY=JSON, got '%s'\n", kv);
        return false;
    }
    char *key = strndup(kv, (size_t)(eq - kv));
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!v)
        v = json_string(eq + 1);
    bool ok = key && v && json_object_set_new(extra, key, v) == 0;
    free(key);
    return ok;
}

static int parse_args(int argc, char **argv, tpl_opts *o)
{
    static const char *const valued[] = {"-m",          "--messages",  "--tools",    "--template",
                                         "--bos-token", "--eos-token", "--now-text", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-generation-prompt")) {
            o->no_gen = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help") || i + 1 >= argc)
            return usage();
        const char *v = argv[++i];
        const char **slot[] = {&o->model, &o->messages, &o->tools,   &o->template_arg,
                               &o->bos,   &o->eos,      &o->now_text};
        size_t k = 0;
        while (valued[k] && strcmp(valued[k], a))
            k++;
        if (valued[k]) {
            *slot[k] = v;
        } else if (!strcmp(a, "--var")) {
            if (!add_var(o->extra, v))
                return 2;
        } else if (!strcmp(a, "--now")) {
            if (!parse_now(v, &o->now)) {
                fprintf(stderr, "lmserv template: --now: bad date '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "lmserv template: unknown option '%s'\n", a);
            return usage();
        }
    }
    return o->messages ? 0 : usage();
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, JSON_DECODE_ANY, &e)
                                   : json_load_file(path, JSON_DECODE_ANY, &e);
    if (!j)
        fprintf(stderr, "lmserv template: %s:%d:%d: %s\n", path, e.line, e.column, e.text);
    return j;
}

/* Template source and special tokens from the model file (vocab only). */
static int from_model(const char *path, char **tpl, char **bos, char **eos)
{
    char err[512];
    gguf_file *f = NULL;
    lms_tokenizer *tok = NULL;
    if (hf_open_any(path, HF_OPEN_NO_TENSORS, &f, err, sizeof err) < 0 ||
        lms_tokenizer_load(f, &tok, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv template: %s\n", err);
        gguf_close(f);
        return 2;
    }
    const char *src = NULL;
    if (gguf_get_str(f, "tokenizer.chat_template", &src) == 0 && src)
        *tpl = strdup(src);
    else
        fprintf(stderr, "lmserv template: %s has no chat template; using '%s'\n", path,
                LMS_TEMPLATE_DEFAULT);
    int32_t ids[2] = {lms_tokenizer_bos(tok), lms_tokenizer_eos(tok)};
    char **dst[2] = {bos, eos};
    for (int k = 0; k < 2; k++) {
        const char *text = ids[k] >= 0 ? lms_token_text(tok, ids[k]) : NULL;
        *dst[k] = text ? strdup(text) : NULL;
    }
    lms_tokenizer_destroy(tok);
    gguf_close(f);
    return 0;
}

static int render(const tpl_opts *o, const char *tpl, const json_t *conv, const json_t *tools,
                  const char *bos, const char *eos)
{
    const json_t *msgs = json_is_object(conv) ? json_object_get(conv, "messages") : conv;
    if (!json_is_array(msgs)) {
        fprintf(stderr, "lmserv template: %s: expected a messages array or {\"messages\": [...]}\n",
                o->messages);
        return 2;
    }
    if (!tools && json_is_object(conv))
        tools = json_object_get(conv, "tools");
    lms_template_vars vars = {
        .messages = msgs,
        .tools = tools,
        .add_generation_prompt = !o->no_gen,
        .bos_token = o->bos ? o->bos : bos,
        .eos_token = o->eos ? o->eos : eos,
        .extra = json_object_size(o->extra) ? o->extra : NULL,
        .now = o->now,
        .now_text = o->now_text,
    };
    char *out = NULL, err[1024];
    size_t n;
    int rc = lms_template_render(tpl, strlen(tpl), &vars, &out, &n, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    fwrite(out, 1, n, stdout);
    free(out);
    return fflush(stdout) == 0 ? 0 : 1;
}

int cmd_template(int argc, char **argv)
{
    tpl_opts o = {.extra = json_object()};
    char *tpl = NULL, *bos = NULL, *eos = NULL, err[512];
    json_t *conv = NULL, *tools = NULL;
    int rc = o.extra ? parse_args(argc, argv, &o) : 2;
    if (rc == 0 && o.model)
        rc = from_model(o.model, &tpl, &bos, &eos);
    if (rc == 0 && (o.template_arg || !tpl)) {
        free(tpl);
        tpl = app_chat_template(NULL, o.template_arg, err, sizeof err);
        if (!tpl) {
            fprintf(stderr, "lmserv template: %s\n", err);
            rc = 2;
        }
    }
    if (rc == 0 && !(conv = load_json(o.messages)))
        rc = 2;
    if (rc == 0 && o.tools && !(tools = load_json(o.tools)))
        rc = 2;
    if (rc == 0)
        rc = render(&o, tpl, conv, tools, bos, eos);
    json_decref(tools);
    json_decref(conv);
    json_decref(o.extra);
    free(tpl);
    free(bos);
    free(eos);
    return rc;
}
