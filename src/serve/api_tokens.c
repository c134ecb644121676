/*
 * api_tokens.c - POST /tokenize and POST /detokenize, the way llama-server
 * offers them (clients count tokens or check a prompt's split with them):
 *
 *   /tokenize   {"content": "text", "add_special": false, "with_pieces": false}
 *               -> {"tokens": [ids]} or, with pieces, [{"id": 1, "piece": "a"}]
 *   /detokenize {"tokens": [ids]} -> {"content": "text"}
 *
 * Control tokens are parsed in the text and rendered in the output, as
 * the chat templates write them.
 */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"

/* Largest text or token list taken (the body limit bounds it too). */
#define MAX_TOKENS (1 << 22)

/* The tokenizer of the request's model (pick_expert); NULL with *rc the
 * handler's result when the request was parked (0) or refused. */
static const lms_tokenizer *ready_tokenizer(conn *c, json_t *body, pick_fn fn, int *rc)
{
    reqerr e;
    int picked = pick_expert(c, body, fn, &e);
    if (picked > 0)
        return c->x->model->tok;
    *rc = picked < 0 ? http_reply_err(c, &e) : 0;
    return NULL;
}

static json_t *piece_json(const lms_tokenizer *tok, int32_t id, char *buf, size_t cap)
{
    int n = lms_token_to_piece(tok, id, true, buf, cap);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "piece", json_string_lossy(buf, n > 0 ? (size_t)n : 0));
    return o;
}

int api_tokenize(conn *c, json_t *body)
{
    reqerr e;
    const char *text = NULL;
    bool add_special = false, pieces = false;
    int rc = 0;
    const lms_tokenizer *tok = ready_tokenizer(c, body, api_tokenize, &rc);
    if (!tok)
        return rc;
    if (reqparse_str(body, "content", &text, &e) < 0 ||
        reqparse_bool(body, "add_special", &add_special, &e) < 0 ||
        reqparse_bool(body, "with_pieces", &pieces, &e) < 0)
        return http_reply_err(c, &e);
    if (!text) {
        reqerr_set(&e, 400, "content", "'content' is required");
        return http_reply_err(c, &e);
    }
    size_t len = strlen(text);
    int64_t n = lms_tokenize(tok, text, len, add_special, true, NULL, 0);
    if (n < 0 || n > MAX_TOKENS) {
        reqerr_set(&e, n < 0 ? 400 : 413, "content", "cannot tokenize the text: %s",
                   n < 0 ? lms_strerror((int)n) : "too many tokens");
        return http_reply_err(c, &e);
    }
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    size_t cap = lms_tokenizer_max_piece(tok);
    char *buf = malloc(cap);
    if (!ids || !buf) {
        free(ids);
        free(buf);
        reqerr_set(&e, 503, NULL, "out of memory");
        return http_reply_err(c, &e);
    }
    lms_tokenize(tok, text, len, add_special, true, ids, n);
    json_t *arr = json_array();
    for (int64_t i = 0; i < n; i++)
        json_array_append_new(arr, pieces ? piece_json(tok, ids[i], buf, cap)
                                          : json_integer(ids[i]));
    free(ids);
    free(buf);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", arr);
    return http_reply_json(c, 200, o);
}

int api_detok_text(const lms_tokenizer *tok, const int32_t *ids, int32_t n, bool special,
                   const char *field, sbuf *out, reqerr *e)
{
    const int32_t n_vocab = lms_tokenizer_n_vocab(tok);
    const size_t cap = lms_detok_max_out(tok);
    char *buf = malloc(cap);
    if (!buf)
        return reqerr_set(e, 503, NULL, "out of memory");
    lms_detok d;
    lms_detok_init(&d, tok, lms_tokenizer_add_space_prefix(tok)); /* text as tokenized */
    d.special = special;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] >= n_vocab) {
            free(buf);
            return reqerr_set(e, 400, field, "%s[%d] = %d is not in the vocabulary (0..%d)", field,
                              i, ids[i], n_vocab - 1);
        }
        int k = lms_detok_push(&d, ids[i], buf, cap);
        if (k > 0)
            sbuf_add(out, buf, (size_t)k);
    }
    int k = lms_detok_flush(&d, buf, cap);
    if (k > 0)
        sbuf_add(out, buf, (size_t)k);
    free(buf);
    return out->oom ? reqerr_set(e, 503, NULL, "out of memory") : 0;
}

int api_detokenize(conn *c, json_t *body)
{
    reqerr e;
    int32_t *ids = NULL, n = 0;
    int rc = 0;
    const lms_tokenizer *tok = ready_tokenizer(c, body, api_detokenize, &rc);
    const json_t *a = json_object_get(body, "tokens");
    if (!tok)
        return rc;
    if (!json_is_array(a) || json_array_size(a) > MAX_TOKENS) {
        reqerr_set(&e, 400, "tokens", "'tokens' must be an array of at most %d token ids",
                   MAX_TOKENS);
        return http_reply_err(c, &e);
    }
    if (json_array_size(a) > 0 && reqparse_token_ids(a, "tokens", &ids, &n, &e) < 0)
        return http_reply_err(c, &e);
    sbuf out = {0};
    int ret;
    if (api_detok_text(tok, ids, n, true, "tokens", &out, &e) < 0) {
        ret = http_reply_err(c, &e);
    } else {
        json_t *o = json_object();
        json_object_set_new(o, "content", json_stringn(out.p ? out.p : "", out.n));
        ret = http_reply_json(c, 200, o);
    }
    sbuf_free(&out);
    free(ids);
    return ret;
}
