/*
 * template_parse.c - recursive-descent parser from tokens to the AST
 * described in template_impl.h.
 *
 * Expression grammar, loosest binding first (as jinja2's parser):
 *
 *   tuple    := cond ("," cond)*                    (outputs, set, for)
 *   cond     := or ("if" or ("else" cond)?)*
 *   or       := and ("or" and)*
 *   and      := not ("and" not)*
 *   not      := "not" not | compare
 *   compare  := math1 (("=="|"!="|"<"|"<="|">"|">="|"in"|"not" "in") math1)*
 *   math1    := concat (("+"|"-") concat)*
 *   concat   := math2 ("~" math2)*
 *   math2    := pow (("*"|"/"|"//"|"%") pow)*
 *   pow      := unary ("**" unary)*
 *   unary    := ("-"|"+") unary_nofilter | primary postfix* filters*
 *   filters  := "|" name args? | "is" "not"? name (args | primary)? | args
 *   postfix  := "." name | "." int | "[" subscript "]" | "(" args ")"
 *
 * So filters and tests bind tighter than any operator:
 * `'a' + x | trim` is `'a' + (x|trim)`, `not x is defined` is
 * `not (x is defined)`, and `-x|abs` is `(-x)|abs`.
 *
 * Filter and test names are resolved here, but an unknown one is reported
 * only when evaluated (jinja2 accepts unknown filters in branches never
 * taken).
 */
#include "model/template_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"

#define TPL_MAX_NEST 128 /* nested expressions + blocks (stack safety) */

typedef struct parser {
    lms_template *t;
    const tpl_token *tok;
    size_t i, n;
    int nest;
    int loop_depth;        /* for break/continue */
    const tpl_token *open; /* keyword of the innermost open block */
    char *err;
    size_t errsz;
} parser;

/* ---- helpers -------------------------------------------------------------- */

static const tpl_token *cur(const parser *p) { return &p->tok[p->i < p->n ? p->i : p->n - 1]; }

static const tpl_token *peek(const parser *p, size_t k)
{
    size_t j = p->i + k;
    return &p->tok[j < p->n ? j : p->n - 1];
}

static void advance(parser *p)
{
    if (p->i + 1 < p->n)
        p->i++;
}

static bool tok_is(const tpl_token *t, int kind, const char *text)
{
    if (t->kind != kind)
        return false;
    if (!text)
        return true;
    return t->n && t->p[0] == text[0] && t->n == strlen(text) && memcmp(t->p, text, t->n) == 0;
}

static bool is_op(const parser *p, const char *op) { return tok_is(cur(p), TK_OP, op); }

static bool is_name(const parser *p, const char *name) { return tok_is(cur(p), TK_NAME, name); }

static const char *tok_desc(const tpl_token *t, char *buf, size_t n)
{
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STRING: return "string literal";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}

static int fail_at(parser *p, const tpl_token *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail_at(parser *p, const tpl_token *t, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lms_errf(p->err, p->errsz, LMS_ERR_FORMAT, "template:%d:%d: %s", t->line, t->col, msg);
}

static int unexpected(parser *p, const char *wanted)
{
    char buf[64];
    return fail_at(p, cur(p), "expected %s, got %s", wanted, tok_desc(cur(p), buf, sizeof buf));
}

static int nomem(parser *p)
{
    return lms_errf(p->err, p->errsz, LMS_ERR_NOMEM, "template: out of memory while parsing");
}

static tpl_node *node_at(parser *p, int kind, const tpl_token *t)
{
    tpl_node *n = tpl_alloc(&p->t->arena, sizeof *n);
    if (n) {
        n->kind = (uint8_t)kind;
        n->line = t->line;
        n->col = t->col;
    }
    return n;
}

static int set_name(parser *p, tpl_node *n, const tpl_token *t)
{
    char *s = tpl_strdup(&p->t->arena, t->p, t->n);
    if (!s)
        return nomem(p);
    n->name = s;
    n->name_n = t->n;
    return 0;
}

/* Appends kid to n->kids; capacity is the next power of two (min 4). */
static int add_kid(parser *p, tpl_node *n, tpl_node *kid)
{
    size_t k = n->n_kids;
    if (k == 0 || (k >= 4 && (k & (k - 1)) == 0)) {
        size_t cap = k < 4 ? 4 : k * 2;
        tpl_node **v = tpl_alloc(&p->t->arena, cap * sizeof *v);
        if (!v)
            return nomem(p);
        if (k)
            memcpy(v, n->kids, k * sizeof *v);
        n->kids = v;
    }
    n->kids[n->n_kids++] = kid;
    return 0;
}

static int expect_op(parser *p, const char *op)
{
    if (!is_op(p, op)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", op);
        return unexpected(p, want);
    }
    advance(p);
    return 0;
}

static int expect_block_end(parser *p)
{
    if (cur(p)->kind != TK_BLOCK_END)
        return unexpected(p, "'%}'");
    advance(p);
    return 0;
}

static int enter(parser *p)
{
    if (++p->nest > TPL_MAX_NEST)
        return fail_at(p, cur(p), "nesting deeper than %d levels", TPL_MAX_NEST);
    return 0;
}

/* ---- expressions ------------------------------------------------------------ */

static int parse_cond(parser *p, tpl_node **out);
static int parse_unary(parser *p, bool with_filter, tpl_node **out);
static int parse_tuple(parser *p, bool with_cond, tpl_node **out);

static int binary(parser *p, int kind, int op, const tpl_token *t, tpl_node *l, tpl_node *r,
                  tpl_node **out)
{
    tpl_node *n = node_at(p, kind, t);
    if (!n)
        return nomem(p);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    *out = n;
    return 0;
}

/* Arguments of a call, filter or test: "(" (expr | name "=" expr),* ")". */
static int parse_args(parser *p, tpl_node *call)
{
    TPL_TRY(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (call->n_kids)
            TPL_TRY(expect_op(p, ","));
        if (is_op(p, ")")) /* trailing comma */
            break;
        if (is_op(p, "*") || is_op(p, "**"))
            return fail_at(p, cur(p), "*args and **kwargs are not supported");
        tpl_node *arg = NULL;
        if (cur(p)->kind == TK_NAME && tok_is(peek(p, 1), TK_OP, "=")) {
            arg = node_at(p, N_KWARG, cur(p));
            if (!arg)
                return nomem(p);
            TPL_TRY(set_name(p, arg, cur(p)));
            advance(p);
            advance(p);
            TPL_TRY(parse_cond(p, &arg->a));
        } else {
            TPL_TRY(parse_cond(p, &arg));
        }
        TPL_TRY(add_kid(p, call, arg));
    }
    advance(p);
    return 0;
}

/* *node "(" args ")": the call replaces *node. */
static int parse_call(parser *p, tpl_node **node)
{
    tpl_node *n = node_at(p, N_CALL, cur(p));
    if (!n)
        return nomem(p);
    n->a = *node;
    TPL_TRY(parse_args(p, n));
    *node = n;
    return 0;
}

/* [ start : stop : step ] or [ key ], after the "[". */
static int parse_subscript(parser *p, const tpl_token *t, tpl_node *obj, tpl_node **out)
{
    tpl_node *first = NULL;
    if (!is_op(p, ":"))
        TPL_TRY(parse_cond(p, &first));
    if (is_op(p, "]")) {
        advance(p);
        if (!first)
            return unexpected(p, "an index");
        return binary(p, N_ITEM, OP_NONE, t, obj, first, out);
    }
    tpl_node *n = node_at(p, N_SLICE, t);
    if (!n)
        return nomem(p);
    n->a = obj;
    n->b = first;
    TPL_TRY(expect_op(p, ":"));
    if (!is_op(p, "]") && !is_op(p, ":"))
        TPL_TRY(parse_cond(p, &n->c));
    tpl_node *step = NULL;
    if (is_op(p, ":")) {
        advance(p);
        if (!is_op(p, "]"))
            TPL_TRY(parse_cond(p, &step));
    }
    TPL_TRY(add_kid(p, n, step));
    TPL_TRY(expect_op(p, "]"));
    *out = n;
    return 0;
}

static int parse_postfix(parser *p, tpl_node **node)
{
    for (;;) {
        const tpl_token *t = cur(p);
        if (tok_is(t, TK_OP, ".")) {
            advance(p);
            const tpl_token *nt = cur(p);
            if (nt->kind == TK_INT) {
                tpl_node *k = node_at(p, N_CONST, nt);
                if (!k)
                    return nomem(p);
                k->value = tpl_int(nt->i);
                advance(p);
                TPL_TRY(binary(p, N_ITEM, OP_NONE, t, *node, k, node));
                continue;
            }
            if (nt->kind != TK_NAME)
                return unexpected(p, "an attribute name");
            tpl_node *n = node_at(p, N_ATTR, nt);
            if (!n)
                return nomem(p);
            TPL_TRY(set_name(p, n, nt));
            n->a = *node;
            *node = n;
            advance(p);
        } else if (tok_is(t, TK_OP, "[")) {
            advance(p);
            TPL_TRY(parse_subscript(p, t, *node, node));
        } else if (tok_is(t, TK_OP, "(")) {
            TPL_TRY(parse_call(p, node));
        } else {
            return 0;
        }
    }
}

/* A filter or test node named by the current token, applied to *input;
 * its id (or -1 when unknown) goes in n->value. */
static int filter_or_test(parser *p, int kind, tpl_node *input, tpl_node **out)
{
    const tpl_token *t = cur(p);
    if (t->kind != TK_NAME)
        return unexpected(p, kind == N_FILTER ? "a filter name" : "a test name");
    tpl_node *n = node_at(p, kind, t);
    if (!n)
        return nomem(p);
    TPL_TRY(set_name(p, n, t));
    n->value = tpl_int(kind == N_FILTER ? tpl_filter_find(n->name) : tpl_test_find(n->name));
    n->a = input;
    advance(p);
    *out = n;
    return 0;
}

/* "|" name args? */
static int parse_filter(parser *p, tpl_node **node)
{
    tpl_node *n = NULL;
    TPL_TRY(filter_or_test(p, N_FILTER, *node, &n));
    if (is_op(p, "("))
        TPL_TRY(parse_args(p, n));
    *node = n;
    return 0;
}

/* "is" "not"? name (args | one primary argument)? */
static int parse_test(parser *p, tpl_node **node)
{
    bool negate = false;
    if (is_name(p, "not")) {
        negate = true;
        advance(p);
    }
    tpl_node *n = NULL;
    TPL_TRY(filter_or_test(p, N_TEST, *node, &n));
    n->op = negate;
    const tpl_token *a = cur(p);
    if (is_op(p, "(")) {
        TPL_TRY(parse_args(p, n));
    } else if (a->kind == TK_STRING || a->kind == TK_INT || a->kind == TK_FLOAT ||
               tok_is(a, TK_OP, "[") || tok_is(a, TK_OP, "{") ||
               (a->kind == TK_NAME && !tok_is(a, TK_NAME, "else") && !tok_is(a, TK_NAME, "or") &&
                !tok_is(a, TK_NAME, "and") && !tok_is(a, TK_NAME, "if") &&
                !tok_is(a, TK_NAME, "is"))) {
        tpl_node *arg = NULL;
        TPL_TRY(parse_unary(p, false, &arg));
        TPL_TRY(add_kid(p, n, arg));
    }
    *node = n;
    return 0;
}

static int parse_filters(parser *p, tpl_node **node)
{
    for (;;) {
        if (is_op(p, "|")) {
            advance(p);
            TPL_TRY(parse_filter(p, node));
        } else if (is_name(p, "is")) {
            advance(p);
            TPL_TRY(parse_test(p, node));
        } else if (is_op(p, "(")) {
            TPL_TRY(parse_call(p, node));
        } else {
            return 0;
        }
    }
}

/* [a, b] or {k: v} after the opening bracket; close is "]" or "}". */
static int parse_collection(parser *p, tpl_node *n, const char *close, bool is_dict)
{
    while (!is_op(p, close)) {
        if (n->n_kids)
            TPL_TRY(expect_op(p, ","));
        if (is_op(p, close))
            break;
        tpl_node *e = NULL;
        TPL_TRY(parse_cond(p, &e));
        TPL_TRY(add_kid(p, n, e));
        if (is_dict) {
            TPL_TRY(expect_op(p, ":"));
            TPL_TRY(parse_cond(p, &e));
            TPL_TRY(add_kid(p, n, e));
        }
    }
    advance(p);
    return 0;
}

static int parse_const_name(parser *p, const tpl_token *t, tpl_node **out)
{
    static const char *const names[] = {"true", "True", "false", "False", "none", "None"};
    for (size_t k = 0; k < 6; k++) {
        if (!tok_is(t, TK_NAME, names[k]))
            continue;
        tpl_node *n = node_at(p, N_CONST, t);
        if (!n)
            return nomem(p);
        n->value = k < 2 ? tpl_bool(true) : k < 4 ? tpl_bool(false) : tpl_none();
        *out = n;
        return 1;
    }
    return 0;
}

/* Adjacent string literals concatenate ('a' 'b' is 'ab'). */
static int parse_strings(parser *p, tpl_node *n)
{
    size_t total = 0, k = p->i;
    for (; k < p->n && p->tok[k].kind == TK_STRING; k++)
        total += p->tok[k].n;
    char *s = tpl_alloc(&p->t->arena, total + 1);
    if (!s)
        return nomem(p);
    size_t o = 0;
    for (; p->i < k; p->i++) {
        memcpy(s + o, p->tok[p->i].p, p->tok[p->i].n);
        o += p->tok[p->i].n;
    }
    n->value = tpl_str(s, total);
    return 0;
}

static int parse_primary(parser *p, tpl_node **out)
{
    const tpl_token *t = cur(p);
    tpl_node *n = NULL;
    if (t->kind == TK_NAME) {
        int rc = parse_const_name(p, t, out);
        if (rc != 0) {
            advance(p);
            return rc < 0 ? rc : 0;
        }
        if (!(n = node_at(p, N_NAME, t)))
            return nomem(p);
        TPL_TRY(set_name(p, n, t));
        advance(p);
    } else if (t->kind == TK_STRING) {
        if (!(n = node_at(p, N_CONST, t)))
            return nomem(p);
        TPL_TRY(parse_strings(p, n));
    } else if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        if (!(n = node_at(p, N_CONST, t)))
            return nomem(p);
        n->value = t->kind == TK_INT ? tpl_int(t->i) : tpl_float(t->f);
        advance(p);
    } else if (tok_is(t, TK_OP, "(")) {
        advance(p);
        if (is_op(p, ")")) { /* () is the empty tuple */
            if (!(n = node_at(p, N_TUPLE, t)))
                return nomem(p);
        } else {
            TPL_TRY(parse_tuple(p, true, &n));
        }
        TPL_TRY(expect_op(p, ")"));
    } else if (tok_is(t, TK_OP, "[") || tok_is(t, TK_OP, "{")) {
        bool is_dict = t->p[0] == '{';
        if (!(n = node_at(p, is_dict ? N_DICT : N_LIST, t)))
            return nomem(p);
        advance(p);
        TPL_TRY(parse_collection(p, n, is_dict ? "}" : "]", is_dict));
    } else {
        return unexpected(p, "an expression");
    }
    *out = n;
    return 0;
}

static int parse_unary(parser *p, bool with_filter, tpl_node **out)
{
    const tpl_token *t = cur(p);
    TPL_TRY(enter(p));
    if (tok_is(t, TK_OP, "-") || tok_is(t, TK_OP, "+")) {
        advance(p);
        tpl_node *operand = NULL;
        TPL_TRY(parse_unary(p, false, &operand));
        TPL_TRY(binary(p, N_UNARY, t->p[0] == '-' ? OP_NEG : OP_POS, t, operand, NULL, out));
    } else {
        TPL_TRY(parse_primary(p, out));
        TPL_TRY(parse_postfix(p, out));
    }
    if (with_filter)
        TPL_TRY(parse_filters(p, out));
    p->nest--;
    return 0;
}

/* One level of left-associative binary operators. */
typedef int (*parse_fn)(parser *p, tpl_node **out);

static int parse_binary_level(parser *p, parse_fn next, const char *const *ops, const int *codes,
                              tpl_node **out)
{
    TPL_TRY(next(p, out));
    for (;;) {
        size_t k = 0;
        while (ops[k] && !is_op(p, ops[k]))
            k++;
        if (!ops[k])
            return 0;
        const tpl_token *t = cur(p);
        advance(p);
        tpl_node *r = NULL;
        TPL_TRY(next(p, &r));
        TPL_TRY(binary(p, N_BINARY, codes[k], t, *out, r, out));
    }
}

static int parse_unary_f(parser *p, tpl_node **out) { return parse_unary(p, true, out); }

static int parse_pow(parser *p, tpl_node **out)
{
    static const char *const ops[] = {"**", NULL};
    static const int codes[] = {OP_POW};
    return parse_binary_level(p, parse_unary_f, ops, codes, out);
}

static int parse_math2(parser *p, tpl_node **out)
{
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    static const int codes[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return parse_binary_level(p, parse_pow, ops, codes, out);
}

static int parse_concat(parser *p, tpl_node **out)
{
    static const char *const ops[] = {"~", NULL};
    static const int codes[] = {OP_CONCAT};
    return parse_binary_level(p, parse_math2, ops, codes, out);
}

static int parse_math1(parser *p, tpl_node **out)
{
    static const char *const ops[] = {"+", "-", NULL};
    static const int codes[] = {OP_ADD, OP_SUB};
    return parse_binary_level(p, parse_concat, ops, codes, out);
}

/* The comparison operator at the cursor (consumed), or OP_NONE. */
static int compare_op(parser *p)
{
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    for (size_t k = 0; k < 6; k++) {
        if (is_op(p, ops[k])) {
            advance(p);
            return codes[k];
        }
    }
    if (is_name(p, "in")) {
        advance(p);
        return OP_IN;
    }
    if (is_name(p, "not") && tok_is(peek(p, 1), TK_NAME, "in")) {
        advance(p);
        advance(p);
        return OP_NOTIN;
    }
    return OP_NONE;
}

static int parse_compare(parser *p, tpl_node **out)
{
    tpl_node *first, *n = NULL;
    TPL_TRY(parse_math1(p, &first));
    for (;;) {
        const tpl_token *t = cur(p);
        int op = compare_op(p);
        if (op == OP_NONE)
            break;
        if (!n) {
            if (!(n = node_at(p, N_COMPARE, t)))
                return nomem(p);
            n->a = first;
        }
        tpl_node *cmp = node_at(p, N_CMPOP, t);
        if (!cmp)
            return nomem(p);
        cmp->op = (uint8_t)op;
        TPL_TRY(parse_math1(p, &cmp->a));
        TPL_TRY(add_kid(p, n, cmp));
    }
    *out = n ? n : first;
    return 0;
}

static int parse_not(parser *p, tpl_node **out)
{
    const tpl_token *t = cur(p);
    if (!tok_is(t, TK_NAME, "not"))
        return parse_compare(p, out);
    advance(p);
    TPL_TRY(enter(p));
    tpl_node *operand = NULL;
    TPL_TRY(parse_not(p, &operand));
    p->nest--;
    return binary(p, N_NOT, OP_NONE, t, operand, NULL, out);
}

static int parse_logic(parser *p, const char *word, int kind, parse_fn next, tpl_node **out)
{
    TPL_TRY(next(p, out));
    while (is_name(p, word)) {
        const tpl_token *t = cur(p);
        advance(p);
        tpl_node *r = NULL;
        TPL_TRY(next(p, &r));
        TPL_TRY(binary(p, kind, OP_NONE, t, *out, r, out));
    }
    return 0;
}

static int parse_and(parser *p, tpl_node **out)
{
    return parse_logic(p, "and", N_AND, parse_not, out);
}

static int parse_or(parser *p, tpl_node **out)
{
    return parse_logic(p, "or", N_OR, parse_and, out);
}

static int parse_cond(parser *p, tpl_node **out)
{
    TPL_TRY(enter(p));
    TPL_TRY(parse_or(p, out));
    while (is_name(p, "if")) {
        tpl_node *n = node_at(p, N_COND, cur(p));
        if (!n)
            return nomem(p);
        advance(p);
        n->a = *out;
        TPL_TRY(parse_or(p, &n->b));
        if (is_name(p, "else")) {
            advance(p);
            TPL_TRY(parse_cond(p, &n->c));
        }
        *out = n;
    }
    p->nest--;
    return 0;
}

/* expr ("," expr)* - a tuple when a comma appears. Without with_cond, an
 * "if" ends the expression (for-loop filters). */
static int parse_tuple(parser *p, bool with_cond, tpl_node **out)
{
    const tpl_token *t = cur(p);
    tpl_node *first = NULL;
    TPL_TRY(with_cond ? parse_cond(p, &first) : parse_or(p, &first));
    if (!is_op(p, ",")) {
        *out = first;
        return 0;
    }
    tpl_node *n = node_at(p, N_TUPLE, t);
    if (!n)
        return nomem(p);
    TPL_TRY(add_kid(p, n, first));
    while (is_op(p, ",")) {
        advance(p);
        if (cur(p)->kind == TK_VAR_END || cur(p)->kind == TK_BLOCK_END || is_op(p, ")") ||
            is_name(p, "if"))
            break;
        tpl_node *e = NULL;
        TPL_TRY(with_cond ? parse_cond(p, &e) : parse_or(p, &e));
        TPL_TRY(add_kid(p, n, e));
    }
    *out = n;
    return 0;
}

/* ---- statements ------------------------------------------------------------- */

static int parse_body(parser *p, const char *const *ends, const tpl_token *opener, tpl_node **out,
                      const char **which);

static int end_simple(parser *p) { return expect_block_end(p); }

/* A body ending with {% end %} (consumed, with its "%}"). */
static int body_until(parser *p, const tpl_token *kw, const char *end, tpl_node **body)
{
    const char *const ends[] = {end, NULL};
    const char *which = NULL;
    TPL_TRY(parse_body(p, ends, kw, body, &which));
    return end_simple(p);
}

static int parse_if(parser *p, const tpl_token *kw, tpl_node **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    tpl_node *n = node_at(p, N_IF, kw);
    if (!n)
        return nomem(p);
    *out = n;
    TPL_TRY(parse_cond(p, &n->a));
    TPL_TRY(expect_block_end(p));
    const char *which = NULL;
    TPL_TRY(parse_body(p, ends, kw, &n->b, &which));
    if (strcmp(which, "elif") == 0)
        return parse_if(p, &p->tok[p->i - 1], &n->c);
    if (strcmp(which, "else") == 0) {
        TPL_TRY(end_simple(p));
        return body_until(p, kw, "endif", &n->c);
    }
    return end_simple(p);
}

static int parse_target_names(parser *p, tpl_node *n, bool attrs);

/* One assignment target: a name, ns.attr (set only: attrs), or a
 * parenthesised tuple of targets. */
static int parse_target(parser *p, bool attrs, tpl_node **out)
{
    const tpl_token *t = cur(p);
    if (is_op(p, "(")) {
        if (++p->nest > TPL_MAX_NEST)
            return fail_at(p, t, "nesting deeper than %d levels", TPL_MAX_NEST);
        advance(p);
        tpl_node *tuple = node_at(p, N_TUPLE, t);
        if (!tuple)
            return nomem(p);
        TPL_TRY(parse_target_names(p, tuple, attrs));
        bool comma = tuple->n_kids == 1 && is_op(p, ","); /* "(a,)" */
        if (comma)
            advance(p);
        TPL_TRY(expect_op(p, ")"));
        p->nest--;
        *out = tuple->n_kids == 1 && !comma ? tuple->kids[0] : tuple;
        return 0;
    }
    if (t->kind != TK_NAME)
        return unexpected(p, attrs ? "a variable name" : "a loop variable name");
    tpl_node *name = node_at(p, N_NAME, t);
    if (!name)
        return nomem(p);
    TPL_TRY(set_name(p, name, t));
    advance(p);
    *out = name;
    if (!attrs || !is_op(p, "."))
        return 0;
    advance(p);
    if (cur(p)->kind != TK_NAME)
        return unexpected(p, "an attribute name");
    tpl_node *attr = node_at(p, N_ATTR, cur(p));
    if (!attr)
        return nomem(p);
    TPL_TRY(set_name(p, attr, cur(p)));
    attr->a = name;
    advance(p);
    *out = attr;
    return 0;
}

/* target, target, ... as kids of n */
static int parse_target_names(parser *p, tpl_node *n, bool attrs)
{
    bool first = true;
    do {
        if (!first)
            advance(p); /* the comma */
        first = false;
        tpl_node *t = NULL;
        TPL_TRY(parse_target(p, attrs, &t));
        TPL_TRY(add_kid(p, n, t));
    } while (is_op(p, ",") && !tok_is(peek(p, 1), TK_OP, ")"));
    return 0;
}

static int parse_for(parser *p, const tpl_token *kw, tpl_node **out)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    tpl_node *n = node_at(p, N_FOR, kw);
    if (!n)
        return nomem(p);
    *out = n;
    TPL_TRY(add_kid(p, n, NULL)); /* kids[0]: the loop filter */
    bool paren = is_op(p, "(");
    if (paren)
        advance(p);
    TPL_TRY(parse_target_names(p, n, false));
    if (paren)
        TPL_TRY(expect_op(p, ")"));
    if (!is_name(p, "in"))
        return unexpected(p, "'in'");
    advance(p);
    TPL_TRY(parse_tuple(p, false, &n->a));
    if (is_name(p, "if")) {
        advance(p);
        TPL_TRY(parse_cond(p, &n->kids[0]));
    }
    if (is_name(p, "recursive")) {
        advance(p);
        n->op = 1;
    }
    TPL_TRY(expect_block_end(p));
    const char *which = NULL;
    p->loop_depth++;
    TPL_TRY(parse_body(p, ends, kw, &n->b, &which));
    p->loop_depth--;
    if (strcmp(which, "else") == 0) {
        TPL_TRY(end_simple(p));
        return body_until(p, kw, "endfor", &n->c);
    }
    return end_simple(p);
}

/* Assignment target: name, name.attr, or name, name, ... */
static int parse_set_target(parser *p, tpl_node **out)
{
    tpl_node *tuple = node_at(p, N_TUPLE, cur(p));
    if (!tuple)
        return nomem(p);
    TPL_TRY(parse_target_names(p, tuple, true));
    *out = tuple->n_kids == 1 ? tuple->kids[0] : tuple;
    return 0;
}

/* Filters of a set block or filter block, applied to an N_HOLE. */
static int parse_filter_chain(parser *p, const tpl_token *at, bool need_one, tpl_node **out)
{
    tpl_node *hole = node_at(p, N_HOLE, at);
    if (!hole)
        return nomem(p);
    *out = hole;
    if (need_one) /* {% filter upper %}: the first filter has no "|" */
        TPL_TRY(parse_filter(p, out));
    return parse_filters(p, out);
}

static int parse_set(parser *p, const tpl_token *kw, tpl_node **out)
{
    tpl_node *target = NULL;
    TPL_TRY(parse_set_target(p, &target));
    if (is_op(p, "=")) {
        tpl_node *n = node_at(p, N_SET, kw);
        if (!n)
            return nomem(p);
        advance(p);
        n->b = target;
        TPL_TRY(parse_tuple(p, true, &n->a));
        *out = n;
        return expect_block_end(p);
    }
    tpl_node *n = node_at(p, N_SETBLOCK, kw);
    if (!n)
        return nomem(p);
    n->a = target;
    TPL_TRY(parse_filter_chain(p, kw, false, &n->c));
    TPL_TRY(expect_block_end(p));
    *out = n;
    return body_until(p, kw, "endset", &n->b);
}

static int parse_macro_params(parser *p, tpl_node *n)
{
    TPL_TRY(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (n->n_kids)
            TPL_TRY(expect_op(p, ","));
        if (cur(p)->kind != TK_NAME)
            return unexpected(p, "a parameter name");
        tpl_node *param = node_at(p, N_PARAM, cur(p));
        if (!param)
            return nomem(p);
        TPL_TRY(set_name(p, param, cur(p)));
        advance(p);
        if (is_op(p, "=")) {
            advance(p);
            TPL_TRY(parse_cond(p, &param->a));
        }
        TPL_TRY(add_kid(p, n, param));
    }
    advance(p);
    return 0;
}

/* Does the subtree at n read the variable `name`? */
static bool reads_name(const tpl_node *n, const char *name)
{
    if (!n)
        return false;
    if (n->kind == N_NAME && strcmp(n->name, name) == 0)
        return true;
    if (reads_name(n->a, name) || reads_name(n->b, name) || reads_name(n->c, name))
        return true;
    for (size_t k = 0; k < n->n_kids; k++)
        if (reads_name(n->kids[k], name))
            return true;
    return false;
}

static int macro_flags(const tpl_node *macro)
{
    return (reads_name(macro->b, "varargs") ? TPL_MACRO_VARARGS : 0) |
           (reads_name(macro->b, "kwargs") ? TPL_MACRO_KWARGS : 0) |
           (reads_name(macro->b, "caller") ? TPL_MACRO_CALLER : 0);
}

static int parse_macro(parser *p, const tpl_token *kw, tpl_node **out)
{
    if (cur(p)->kind != TK_NAME)
        return unexpected(p, "a macro name");
    tpl_node *n = node_at(p, N_MACRO, kw);
    if (!n)
        return nomem(p);
    TPL_TRY(set_name(p, n, cur(p)));
    advance(p);
    TPL_TRY(parse_macro_params(p, n));
    TPL_TRY(expect_block_end(p));
    int saved_loops = p->loop_depth;
    p->loop_depth = 0; /* no break/continue across a macro body */
    *out = n;
    TPL_TRY(body_until(p, kw, "endmacro", &n->b));
    p->loop_depth = saved_loops;
    n->op = macro_flags(n);
    return 0;
}

/* {% call [(params)] m(args) %}body{% endcall %}: the body becomes a macro
 * named caller, passed to m as the keyword argument `caller`. */
static int parse_call_block(parser *p, const tpl_token *kw, tpl_node **out)
{
    tpl_node *n = node_at(p, N_CALLBLOCK, kw), *caller = node_at(p, N_MACRO, kw);
    if (!n || !caller)
        return nomem(p);
    caller->name = "caller";
    caller->name_n = 6;
    if (is_op(p, "("))
        TPL_TRY(parse_macro_params(p, caller));
    const tpl_token *at = cur(p);
    TPL_TRY(parse_cond(p, &n->a));
    if (n->a->kind != N_CALL)
        return fail_at(p, at, "'{%% call %%}' wants a macro call");
    TPL_TRY(expect_block_end(p));
    int saved_loops = p->loop_depth;
    p->loop_depth = 0;
    *out = n;
    TPL_TRY(body_until(p, kw, "endcall", &caller->b));
    p->loop_depth = saved_loops;
    caller->op = macro_flags(caller);
    n->b = caller;
    return 0;
}

static int parse_filter_block(parser *p, const tpl_token *kw, tpl_node **out)
{
    tpl_node *n = node_at(p, N_FILTERBLK, kw);
    if (!n)
        return nomem(p);
    TPL_TRY(parse_filter_chain(p, kw, true, &n->a));
    TPL_TRY(expect_block_end(p));
    *out = n;
    return body_until(p, kw, "endfilter", &n->b);
}

static int parse_with(parser *p, const tpl_token *kw, tpl_node **out)
{
    tpl_node *n = node_at(p, N_WITH, kw);
    if (!n)
        return nomem(p);
    while (cur(p)->kind != TK_BLOCK_END) {
        if (n->n_kids)
            TPL_TRY(expect_op(p, ","));
        tpl_node *set = node_at(p, N_SET, cur(p));
        if (!set)
            return nomem(p);
        TPL_TRY(parse_set_target(p, &set->b));
        TPL_TRY(expect_op(p, "="));
        TPL_TRY(parse_cond(p, &set->a));
        TPL_TRY(add_kid(p, n, set));
    }
    advance(p);
    *out = n;
    return body_until(p, kw, "endwith", &n->b);
}

static int parse_loop_control(parser *p, const tpl_token *kw, tpl_node **out)
{
    bool is_break = tok_is(kw, TK_NAME, "break");
    if (p->loop_depth == 0)
        return fail_at(p, kw, "'%s' outside of a for loop", is_break ? "break" : "continue");
    if (!(*out = node_at(p, is_break ? N_BREAK : N_CONTINUE, kw)))
        return nomem(p);
    return expect_block_end(p);
}

/* {% generation %}...{% endgeneration %} (transformers' AssistantTracker)
 * marks assistant text for training masks; rendering just runs the body. */
static int parse_generation(parser *p, const tpl_token *kw, tpl_node **out)
{
    TPL_TRY(expect_block_end(p));
    return body_until(p, kw, "endgeneration", out);
}

typedef int (*stmt_fn)(parser *p, const tpl_token *kw, tpl_node **out);

static const struct {
    const char *name;
    stmt_fn fn;
} k_statements[] = {
    {"if", parse_if},
    {"for", parse_for},
    {"set", parse_set},
    {"macro", parse_macro},
    {"filter", parse_filter_block},
    {"with", parse_with},
    {"break", parse_loop_control},
    {"continue", parse_loop_control},
    {"generation", parse_generation},
    {"call", parse_call_block},
};

/* After "{%": one statement, up to and including its end tag. */
static int parse_statement(parser *p, tpl_node **out)
{
    const tpl_token *kw = cur(p);
    if (kw->kind != TK_NAME)
        return unexpected(p, "a tag name");
    advance(p);
    for (size_t k = 0; k < sizeof k_statements / sizeof k_statements[0]; k++)
        if (tok_is(kw, TK_NAME, k_statements[k].name))
            return k_statements[k].fn(p, kw, out);
    if ((kw->n >= 3 && memcmp(kw->p, "end", 3) == 0) || tok_is(kw, TK_NAME, "elif") ||
        tok_is(kw, TK_NAME, "else")) {
        char buf[64];
        if (!p->open)
            return fail_at(p, kw, "unexpected %s: no block is open", tok_desc(kw, buf, sizeof buf));
        char inner[64];
        snprintf(inner, sizeof inner, "'%.*s' opened at line %d",
                 (int)(p->open->n > 20 ? 20 : p->open->n), p->open->p, p->open->line);
        return fail_at(p, kw, "unexpected %s: the innermost open block is %s",
                       tok_desc(kw, buf, sizeof buf), inner);
    }
    static const char *const unsupported[] = {"include", "import", "from", "extends",
                                              "block",   NULL};
    for (size_t k = 0; unsupported[k]; k++)
        if (tok_is(kw, TK_NAME, unsupported[k]))
            return fail_at(p, kw, "'{%% %s %%}' is not supported", unsupported[k]);
    char buf[64];
    return fail_at(p, kw, "unknown tag %s", tok_desc(kw, buf, sizeof buf));
}

/* The closing tag of an end list ({"elif", "else", "endif"} -> "endif"). */
static const char *last_of(const char *const *names)
{
    size_t k = 0;
    while (names[k + 1])
        k++;
    return names[k];
}

static bool in_list(const tpl_token *t, const char *const *names)
{
    for (size_t k = 0; names && names[k]; k++)
        if (tok_is(t, TK_NAME, names[k]))
            return true;
    return false;
}

static int parse_output(parser *p, tpl_node *block)
{
    tpl_node *n = node_at(p, N_OUTPUT, cur(p));
    if (!n)
        return nomem(p);
    advance(p);
    TPL_TRY(parse_tuple(p, true, &n->a));
    if (cur(p)->kind != TK_VAR_END)
        return unexpected(p, "'}}'");
    advance(p);
    return add_kid(p, block, n);
}

static int parse_text(parser *p, tpl_node *block)
{
    tpl_node *n = node_at(p, N_TEXT, cur(p));
    if (!n)
        return nomem(p);
    n->value = tpl_str(cur(p)->p, cur(p)->n);
    advance(p);
    return add_kid(p, block, n);
}

static int parse_body(parser *p, const char *const *ends, const tpl_token *opener, tpl_node **out,
                      const char **which)
{
    TPL_TRY(enter(p));
    tpl_node *block = node_at(p, N_BLOCK, cur(p));
    if (!block)
        return nomem(p);
    *out = block;
    const tpl_token *outer = p->open;
    if (opener)
        p->open = opener;
    for (;;) {
        const tpl_token *t = cur(p);
        if (t->kind == TK_EOF) {
            if (!ends)
                break;
            char what[64];
            snprintf(what, sizeof what, "'%.*s'", (int)(opener->n > 20 ? 20 : opener->n),
                     opener->p);
            return lms_errf(p->err, p->errsz, LMS_ERR_FORMAT,
                            "template:%d:%d: unexpected end of template: %s opened at line %d "
                            "was never closed (expected '%s')",
                            t->line, t->col, what, opener->line, last_of(ends));
        }
        if (t->kind == TK_DATA) {
            TPL_TRY(parse_text(p, block));
        } else if (t->kind == TK_VAR_BEGIN) {
            TPL_TRY(parse_output(p, block));
        } else if (t->kind == TK_BLOCK_BEGIN) {
            if (in_list(peek(p, 1), ends)) {
                advance(p);
                *which = ends[0];
                for (size_t k = 0; ends[k]; k++)
                    if (tok_is(cur(p), TK_NAME, ends[k]))
                        *which = ends[k];
                advance(p);
                break;
            }
            advance(p);
            tpl_node *st = NULL;
            TPL_TRY(parse_statement(p, &st));
            TPL_TRY(add_kid(p, block, st));
        } else {
            char buf[64];
            return fail_at(p, t, "unexpected %s", tok_desc(t, buf, sizeof buf));
        }
    }
    p->open = outer;
    p->nest--;
    return 0;
}

int tpl_parse(lms_template *t, const tpl_tokens *toks, char *err, size_t errsz)
{
    parser p = {.t = t, .tok = toks->v, .n = toks->n, .err = err, .errsz = errsz};
    const char *which = NULL;
    return parse_body(&p, NULL, NULL, &t->root, &which);
}
