/*
 * prompt.c - see prompt.h.
 */
#include "app/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/common.h"
#include "base/err.h"
#include "model/template.h"
#include "model/tokenizer.h"
#include "serve/reasoning.h"

int app_tokenize(const lms_model *m, const char *text, size_t len, bool add_special,
                 bool parse_special, int32_t **out, int32_t *n_out, char *err, size_t errsz)
{
    int64_t n = lms_tokenize(m->tok, text, len, add_special, parse_special, NULL, 0);
    if (n < 0)
        return lms_errf(err, errsz, (int)n, "cannot tokenize the prompt: %s", lms_strerror((int)n));
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory for %lld tokens", (long long)n);
    lms_tokenize(m->tok, text, len, add_special, parse_special, v, n);
    *out = v;
    *n_out = (int32_t)n;
    return 0;
}

char *app_chat_template(const lms_model *m, const char *override, char *err, size_t errsz)
{
    const char *src = NULL;
    if (override) {
        src = lms_template_builtin(override);
        if (!src) {
            char *file = app_read_file(override, NULL);
            if (!file)
                lms_errf(err, errsz, LMS_ERR_NOTFOUND,
                         "template '%s' is neither a built-in name nor a readable file", override);
            return file;
        }
    } else if (!m || gguf_get_str(m->gguf, "tokenizer.chat_template", &src) < 0) {
        src = lms_template_builtin(LMS_TEMPLATE_DEFAULT);
    }
    char *copy = src ? strdup(src) : NULL;
    if (!copy)
        lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    return copy;
}

static const char *special_text(const lms_model *m, int32_t id)
{
    return id >= 0 ? lms_token_text(m->tok, id) : NULL;
}

int app_chat_tokens(const lms_model *m, const char *tpl, const json_t *messages,
                    const json_t *kwargs, int32_t **out, int32_t *n_out, bool *open, char *err,
                    size_t errsz)
{
    const char *bos = special_text(m, lms_tokenizer_bos(m->tok));
    lms_template_vars vars = {
        .messages = messages,
        .add_generation_prompt = true,
        .bos_token = bos,
        .eos_token = special_text(m, lms_tokenizer_eos(m->tok)),
        .extra = kwargs,
    };
    char *text;
    size_t len;
    int rc = lms_template_render(tpl, strlen(tpl), &vars, &text, &len, err, errsz);
    if (rc < 0)
        return rc;
    if (open)
        *open = reasoning_prompt_open(text, len);
    /* add BOS unless the template already wrote it */
    bool add = lms_tokenizer_add_bos(m->tok) && bos && strncmp(text, bos, strlen(bos)) != 0;
    rc = app_tokenize(m, text, len, add, true, out, n_out, err, errsz);
    free(text);
    return rc;
}

int app_prompt_tokens(const lms_model *m, const char *text, const char *system, bool chat,
                      bool add_bos, const char *tpl_name, const json_t *kwargs, int32_t **out,
                      int32_t *n_out, bool *open, char *err, size_t errsz)
{
    if (open)
        *open = false;
    if (!chat)
        return app_tokenize(m, text, strlen(text), add_bos, false, out, n_out, err, errsz);
    json_t *msgs = json_array();
    if (system)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", text));
    char *tpl = app_chat_template(m, tpl_name, err, errsz);
    int rc = tpl ? app_chat_tokens(m, tpl, msgs, kwargs, out, n_out, open, err, errsz) : LMS_ERR_NOMEM;
    free(tpl);
    json_decref(msgs);
    return rc;
}
