/*
 * template_lex.c - splits Jinja source into tokens: literal text (DATA) and
 * the contents of {{ ... }} / {% ... %} tags; {# comments #} vanish.
 *
 * Whitespace control is applied here, to the DATA tokens, as jinja2 does it
 * with trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False:
 *
 *   marker          effect on the text around the tag
 *   --------------  -------------------------------------------------------
 *   {%-  {{-  {#-   strip all whitespace (newlines too) before the tag
 *   -%}  -}}  -#}   strip all whitespace after the tag
 *   %}  #}          trim_blocks: drop one newline right after a block tag
 *                   or comment (not after }})
 *   {%  {#          lstrip_blocks: drop spaces/tabs between the start of
 *                   the line and a block tag or comment (not {{)
 *   {%+  +%}        turn lstrip_blocks / trim_blocks off for this tag
 *
 * Before lexing, line ends are normalised to "\n" and one trailing newline
 * of the source is dropped. Inside tags, brackets are counted so that a "}}"
 * closing a nested dict literal does not end the tag (as in jinja2).
 * {% raw %}...{% endraw %} becomes one DATA token.
 */
#include "model/template_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

#define TPL_LEX_MAX_BRACKETS 256

typedef struct lexer {
    tpl_arena *a;  /* decoded string literals go here */
    const char *s; /* normalised source */
    size_t n;
    size_t pos;
    int line;          /* line of line_pos */
    size_t line_pos;   /* position whose line is known */
    size_t line_start; /* start of that line */
    tpl_tokens *out;
    int depth;                       /* open brackets inside the current tag */
    char open[TPL_LEX_MAX_BRACKETS]; /* their closing characters */
    char *err;
    size_t errsz;
} lexer;

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Line and column (1-based, bytes) of position pos, moving forward only. */
static void lx_where(lexer *lx, size_t pos, int *line, int *col)
{
    if (pos < lx->line_pos) { /* rare: restart from the top */
        lx->line = 1;
        lx->line_pos = lx->line_start = 0;
    }
    for (size_t i = lx->line_pos; i < pos && i < lx->n; i++) {
        if (lx->s[i] == '\n') {
            lx->line++;
            lx->line_start = i + 1;
        }
    }
    lx->line_pos = pos;
    *line = lx->line;
    *col = (int)(pos - lx->line_start) + 1;
}

static int lx_fail(lexer *lx, size_t pos, const char *msg, const char *detail)
{
    int line, col;
    lx_where(lx, pos, &line, &col);
    return lms_errf(lx->err, lx->errsz, LMS_ERR_FORMAT, "template:%d:%d: %s%s", line, col, msg,
                    detail ? detail : "");
}

static int lx_push(lexer *lx, int kind, size_t pos, const char *p, size_t n, tpl_token **tok)
{
    tpl_tokens *t = lx->out;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        tpl_token *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return lms_errf(lx->err, lx->errsz, LMS_ERR_NOMEM, "template: out of memory");
        t->v = v;
        t->cap = cap;
    }
    tpl_token *k = &t->v[t->n++];
    memset(k, 0, sizeof *k);
    k->kind = (uint8_t)kind;
    k->p = p;
    k->n = n;
    lx_where(lx, pos, &k->line, &k->col);
    if (tok)
        *tok = k;
    return 0;
}

/* ---- string literals --------------------------------------------------------- */

/* Reads up to max hex digits at p[0..n); returns how many were read. */
static size_t read_hex(const char *p, size_t n, size_t max, uint32_t *cp)
{
    size_t k = 0;
    uint32_t v = 0;
    for (; k < max && k < n; k++) {
        char c = p[k];
        int d = is_digit(c)              ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0)
            break;
        v = v * 16 + (uint32_t)d;
    }
    *cp = v;
    return k;
}

/* Decodes one escape starting after the backslash at r[0]; writes to o.
 * Returns bytes consumed from r (>= 1) and sets *wrote. Python semantics:
 * unknown escapes keep their backslash. */
static size_t decode_escape(const char *r, size_t left, char *o, size_t *wrote)
{
    static const char simple_in[] = "\\'\"abfnrtv", simple_out[] = "\\'\"\a\b\f\n\r\t\v";
    const char *hit = memchr(simple_in, r[0], sizeof simple_in - 1);
    uint32_t cp;
    if (hit) {
        *o = simple_out[hit - simple_in];
        *wrote = 1;
        return 1;
    }
    if (r[0] == '\n') { /* line continuation */
        *wrote = 0;
        return 1;
    }
    if (r[0] >= '0' && r[0] <= '7') {
        size_t k = 0;
        cp = 0;
        while (k < 3 && k < left && r[k] >= '0' && r[k] <= '7')
            cp = cp * 8 + (uint32_t)(r[k++] - '0');
        *wrote = tpl_utf8_put(o, cp);
        return k;
    }
    size_t want = r[0] == 'x' ? 2 : r[0] == 'u' ? 4 : r[0] == 'U' ? 8 : 0;
    if (want && read_hex(r + 1, left - 1, want, &cp) == want && cp <= 0x10FFFF) {
        *wrote = tpl_utf8_put(o, cp);
        return 1 + want;
    }
    o[0] = '\\';
    o[1] = r[0];
    *wrote = 2;
    return 1;
}

static int lex_string(lexer *lx, size_t start)
{
    char q = lx->s[start];
    size_t i = start + 1;
    while (i < lx->n && lx->s[i] != q)
        i += lx->s[i] == '\\' && i + 1 < lx->n ? 2 : 1;
    if (i >= lx->n)
        return lx_fail(lx, start, "unterminated string literal", NULL);
    const char *r = lx->s + start + 1;
    size_t rn = i - start - 1;
    /* Decoded text is never longer than the source (an escape of k >= 2
     * bytes yields at most k bytes of UTF-8). */
    char *o = tpl_alloc(lx->a, rn + 1);
    if (!o)
        return lms_errf(lx->err, lx->errsz, LMS_ERR_NOMEM, "template: out of memory");
    size_t on = 0;
    for (size_t k = 0; k < rn;) {
        if (r[k] != '\\') {
            o[on++] = r[k++];
            continue;
        }
        size_t wrote;
        k += 1 + decode_escape(r + k + 1, rn - k - 1, o + on, &wrote);
        on += wrote;
    }
    lx->pos = i + 1;
    return lx_push(lx, TK_STRING, start, o, on, NULL);
}

/* ---- numbers, names, operators ---------------------------------------------- */

/* Digits with optional single underscores between them; returns the end. */
static size_t scan_digits(const char *s, size_t n, size_t i)
{
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1]))))
        i++;
    return i;
}

static int lex_number(lexer *lx, size_t start, bool after_dot)
{
    const char *s = lx->s;
    size_t i = scan_digits(s, lx->n, start);
    bool is_float = false;
    if (!after_dot && i + 1 < lx->n && s[i] == '.' && is_digit(s[i + 1])) {
        i = scan_digits(s, lx->n, i + 1);
        is_float = true;
    }
    if (!after_dot && i < lx->n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->n && (s[j] == '+' || s[j] == '-'))
            j++;
        if (j < lx->n && is_digit(s[j])) {
            i = scan_digits(s, lx->n, j);
            is_float = true;
        }
    }
    char buf[64];
    size_t bn = 0;
    for (size_t k = start; k < i; k++)
        if (s[k] != '_' && bn < sizeof buf - 1)
            buf[bn++] = s[k];
    buf[bn] = 0;
    if (i - start >= sizeof buf)
        return lx_fail(lx, start, "number literal too long", NULL);
    tpl_token *t = NULL;
    int rc = lx_push(lx, is_float ? TK_FLOAT : TK_INT, start, s + start, i - start, &t);
    if (rc < 0)
        return rc;
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno)
            return lx_fail(lx, start, "integer literal too large", NULL);
        t->i = v;
    }
    lx->pos = i;
    return 0;
}

/* Operator spelling at p, longest first; 0 when none. */
static size_t op_len(const char *p, size_t left)
{
    static const char *const two[] = {"//", "**", "==", "!=", "<=", ">="};
    if (left >= 2)
        for (size_t k = 0; k < sizeof two / sizeof two[0]; k++)
            if (p[0] == two[k][0] && p[1] == two[k][1])
                return 2;
    return strchr("+-*/%~<>=()[]{},.:|;", p[0]) && p[0] ? 1 : 0;
}

/* Checks for the closing delimiter of the current tag at pos. Returns its
 * length (0 when not there) and the whitespace modifier ('-', '+' or 0). */
static size_t tag_end_at(const lexer *lx, size_t pos, char kind, char *mod)
{
    const char *p = lx->s + pos;
    size_t left = lx->n - pos;
    char close = kind == '{' ? '}' : '%';
    *mod = 0;
    if (left >= 3 && (p[0] == '-' || (p[0] == '+' && kind == '%')) && p[1] == close &&
        p[2] == '}') {
        *mod = p[0];
        return 3;
    }
    if (left >= 2 && p[0] == close && p[1] == '}')
        return 2;
    return 0;
}

/* Lexes the inside of a {{ }} or {% %} tag (kind '{' or '%') from lx->pos
 * up to and including its end. Sets *end_mod to the end's modifier. */
static int lex_tag_body(lexer *lx, char kind, size_t tag_pos, char *end_mod)
{
    lx->depth = 0;
    for (;;) {
        while (lx->pos < lx->n && is_space(lx->s[lx->pos]))
            lx->pos++;
        if (lx->pos >= lx->n)
            return lx_fail(lx, tag_pos, "unexpected end of template: tag not closed", NULL);
        size_t len = lx->depth == 0 ? tag_end_at(lx, lx->pos, kind, end_mod) : 0;
        if (len) {
            int rc = lx_push(lx, kind == '{' ? TK_VAR_END : TK_BLOCK_END, lx->pos, NULL, 0, NULL);
            lx->pos += len;
            return rc;
        }
        size_t p = lx->pos;
        char c = lx->s[p];
        int rc;
        if (is_name_start(c)) {
            size_t e = p;
            while (e < lx->n && (is_name_start(lx->s[e]) || is_digit(lx->s[e])))
                e++;
            rc = lx_push(lx, TK_NAME, p, lx->s + p, e - p, NULL);
            lx->pos = e;
        } else if (is_digit(c)) {
            const tpl_tokens *t = lx->out;
            bool after_dot = t->n && t->v[t->n - 1].kind == TK_OP && t->v[t->n - 1].p[0] == '.';
            rc = lex_number(lx, p, after_dot);
        } else if (c == '\'' || c == '"') {
            rc = lex_string(lx, p);
        } else if ((len = op_len(lx->s + p, lx->n - p)) != 0) {
            if (c == '(' || c == '[' || c == '{') {
                if (lx->depth == TPL_LEX_MAX_BRACKETS)
                    return lx_fail(lx, p, "brackets nested too deeply", NULL);
                lx->open[lx->depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                char what[32];
                if (lx->depth == 0 || lx->open[lx->depth - 1] != c) {
                    snprintf(what, sizeof what, "%c'%s%c%s", c, lx->depth ? ", expected '" : "",
                             lx->depth ? lx->open[lx->depth - 1] : ' ', lx->depth ? "'" : "");
                    return lx_fail(lx, p, "unexpected '", what);
                }
                lx->depth--;
            }
            rc = lx_push(lx, TK_OP, p, lx->s + p, len, NULL);
            lx->pos = p + len;
        } else {
            char what[8] = {c, '\'', 0};
            return lx_fail(lx, p, "unexpected character '", what);
        }
        if (rc < 0)
            return rc;
    }
}

/* ---- text and whitespace control --------------------------------------------- */

/* Applies the begin-side whitespace rules of a tag to the text [b, *e). */
static void strip_before_tag(const lexer *lx, size_t b, size_t *e, char kind, char mod)
{
    if (mod == '-') {
        while (*e > b && is_space(lx->s[*e - 1]))
            (*e)--;
        return;
    }
    if (mod == '+' || kind == '{')
        return;
    /* lstrip_blocks: only spaces/tabs since the last newline (or since the
     * start of the text when it starts a line). */
    size_t l = *e;
    while (l > b && (lx->s[l - 1] == ' ' || lx->s[l - 1] == '\t'))
        l--;
    bool at_line_start = l > b ? lx->s[l - 1] == '\n' : (b == 0 || lx->s[b - 1] == '\n');
    if (at_line_start)
        *e = l;
}

static int emit_text(lexer *lx, size_t b, size_t e)
{
    return e > b ? lx_push(lx, TK_DATA, b, lx->s + b, e - b, NULL) : 0;
}

/* After a tag: apply its end modifier / trim_blocks to what follows. */
static void after_tag(lexer *lx, char end_mod, bool is_block, bool *strip_next)
{
    *strip_next = end_mod == '-';
    if (!*strip_next && end_mod != '+' && is_block && lx->pos < lx->n && lx->s[lx->pos] == '\n')
        lx->pos++;
}

static int lex_comment(lexer *lx, size_t tag_pos, bool *strip_next)
{
    const char *s = lx->s;
    size_t i = tag_pos + 2;
    while (i + 1 < lx->n && !(s[i] == '#' && s[i + 1] == '}'))
        i++;
    if (i + 1 >= lx->n)
        return lx_fail(lx, tag_pos, "unterminated comment", NULL);
    char mod = i > tag_pos + 2 && (s[i - 1] == '-' || s[i - 1] == '+') ? s[i - 1] : 0;
    lx->pos = i + 2;
    after_tag(lx, mod, true, strip_next);
    return 0;
}

/* If the block tag at lx->pos (just after "{%" and its modifier) is
 * "raw", consumes through {% endraw %} and emits the body as text. */
static int try_raw(lexer *lx, size_t tag_pos, bool *handled, bool *strip_next)
{
    const char *s = lx->s;
    size_t i = lx->pos;
    *handled = false;
    while (i < lx->n && is_space(s[i]))
        i++;
    if (lx->n - i < 3 || memcmp(s + i, "raw", 3) != 0)
        return 0;
    i += 3;
    while (i < lx->n && is_space(s[i]))
        i++;
    char mod;
    size_t len = tag_end_at(lx, i, '%', &mod);
    if (!len)
        return 0;
    *handled = true;
    size_t body = i + len;
    if (mod == '-')
        while (body < lx->n && is_space(s[body]))
            body++;
    for (size_t k = body; k + 1 < lx->n; k++) {
        if (s[k] != '{' || s[k + 1] != '%')
            continue;
        size_t j = k + 2 + (k + 2 < lx->n && (s[k + 2] == '-' || s[k + 2] == '+'));
        while (j < lx->n && is_space(s[j]))
            j++;
        if (lx->n - j < 6 || memcmp(s + j, "endraw", 6) != 0)
            continue;
        j += 6;
        while (j < lx->n && is_space(s[j]))
            j++;
        if (!(len = tag_end_at(lx, j, '%', &mod)))
            continue;
        size_t e = k;
        strip_before_tag(lx, body, &e, '%', s[k + 2] == '-' ? '-' : 0);
        int rc = emit_text(lx, body, e);
        lx->pos = j + len;
        after_tag(lx, mod, true, strip_next);
        return rc;
    }
    return lx_fail(lx, tag_pos, "unterminated {% raw %} block", NULL);
}

/* Copies src with "\r\n" and "\r" turned into "\n", minus one final "\n". */
static char *normalise(tpl_arena *a, const char *src, size_t n, size_t *out_n)
{
    char *s = tpl_alloc(a, n + 1);
    if (!s)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n')
                i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k && s[k - 1] == '\n')
        k--;
    s[k] = 0;
    *out_n = k;
    return s;
}

static int lex_tag(lexer *lx, size_t t, bool *strip_next)
{
    char kind = lx->s[t + 1];
    char mod = t + 2 < lx->n ? lx->s[t + 2] : 0;
    if (kind == '#')
        return lex_comment(lx, t, strip_next);
    lx->pos = t + 2 + (mod == '-' || (mod == '+' && kind == '%'));
    if (kind == '%') {
        bool handled;
        int rc = try_raw(lx, t, &handled, strip_next);
        if (rc < 0 || handled)
            return rc;
    }
    int rc = lx_push(lx, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, t, NULL, 0, NULL);
    char end_mod;
    if (rc == 0)
        rc = lex_tag_body(lx, kind, t, &end_mod);
    if (rc == 0)
        after_tag(lx, end_mod, kind == '%', strip_next);
    return rc;
}

int tpl_lex(tpl_arena *a, const char *src, size_t n, tpl_tokens *out, char *err, size_t errsz)
{
    lexer lx = {.a = a, .out = out, .line = 1, .err = err, .errsz = errsz};
    lx.s = normalise(a, src, n, &lx.n);
    if (!lx.s)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "template: out of memory");
    bool strip_next = false;
    while (lx.pos < lx.n) {
        size_t b = lx.pos, t = b;
        if (strip_next)
            while (b < lx.n && is_space(lx.s[b]))
                b++;
        t = b;
        while (t + 1 < lx.n && !(lx.s[t] == '{' && lx.s[t + 1] && strchr("{%#", lx.s[t + 1])))
            t++;
        if (t + 1 >= lx.n) { /* no more tags */
            int rc = emit_text(&lx, b, lx.n);
            if (rc < 0)
                return rc;
            break;
        }
        size_t e = t;
        char kind = lx.s[t + 1], mod = t + 2 < lx.n ? lx.s[t + 2] : 0;
        strip_before_tag(&lx, b, &e, kind, mod);
        int rc = emit_text(&lx, b, e);
        if (rc == 0)
            rc = lex_tag(&lx, t, &strip_next);
        if (rc < 0)
            return rc;
    }
    return lx_push(&lx, TK_EOF, lx.n, NULL, 0, NULL);
}
