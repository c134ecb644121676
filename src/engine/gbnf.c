/*
 * gbnf.c - GBNF grammars: the parser (text to rules), the compiled block,
 * and the checker (gbnf.h).
 *
 * Compiled form: one array of elements; a rule is its alternatives one
 * after another, each a sequence of elements closed by GB_END, and the
 * rule closed by GB_RULE_END:
 *
 *     GB_CHAR  a = first range, b = range count | GB_NEG   one character
 *     GB_REF   a = the element where the rule's first alternative starts
 *     GB_END   the alternative is done: return to the rule that referred
 *
 * Groups and repetitions become rules of their own while parsing (x* is
 * r ::= x r | (empty); x{2,4} is x x r1, r1 ::= x r2 | (empty), r2 ::= x |
 * (empty)), so the checker sees only characters, references and ends.
 *
 * A checker state is a set of stacks of element positions; a stack's top
 * is the next element to read. Expanding a stack until its top is a
 * character (a reference replaced by each alternative of its rule, with
 * the position after the reference kept below; an end popped) gives the
 * stacks that can read the next character; an empty stack means the text
 * may end there. Left recursion would expand forever: the compiler
 * refuses it.
 */
#include "engine/gbnf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GB_END, GB_RULE_END, GB_CHAR, GB_REF };
#define GB_NEG 0x80000000u
#define GB_EXPAND_DEPTH 1024 /* nested expansions of one stack before it reads */
/* expansions of one step (a character, or the start): ambiguous grammars
 * (a ::= b | b, b ::= c | c, ...) reach the same stacks along exponentially
 * many paths; past this the step fails as on too many stacks */
#define GB_EXPAND_BUDGET 20000

typedef struct gb_el {
    uint32_t type, a, b;
} gb_el;

struct lms_gbnf {
    uint64_t size;     /* bytes of the block */
    uint32_t n_el;     /* elements */
    uint32_t n_rng;    /* ranges: pairs (lo, hi) after the elements */
    uint32_t root;     /* where root's first alternative starts */
    uint32_t pad;
    gb_el el[];
};

static inline const uint32_t *gb_ranges(const lms_gbnf *g)
{
    return (const uint32_t *)(g->el + g->n_el);
}

size_t lms_gbnf_size(const lms_gbnf *g)
{
    return (size_t)g->size;
}

/* ---- parser ------------------------------------------------------------------ */

typedef struct gb_vec {
    gb_el *v;
    size_t n, cap;
} gb_vec;

typedef struct gb_rule {
    char *name;
    gb_vec body;        /* alternatives, each closed by GB_END (a = rule index in GB_REF) */
    bool defined;
    const char *ref_at; /* first reference, for "never defined" */
} gb_rule;

typedef struct gb_parser {
    const char *text, *p, *end;
    gb_rule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *rng; /* pairs */
    size_t n_rng, cap_rng;
    size_t n_total; /* elements in all rules */
    char *err;
    size_t errsz;
    bool failed;
} gb_parser;

/* Records the first error, at `at` (line and column counted from 1). */
static bool perr(gb_parser *P, const char *at, const char *fmt, ...)
{
    if (P->failed)
        return false;
    P->failed = true;
    int line = 1, col = 1;
    for (const char *q = P->text; q < at && q < P->end; q++) {
        if (*q == '\n')
            line++, col = 1;
        else if (((unsigned char)*q & 0xC0) != 0x80)
            col++;
    }
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (P->err && P->errsz)
        snprintf(P->err, P->errsz, "grammar: line %d, column %d: %s", line, col, msg);
    return false;
}

static bool vec_push(gb_parser *P, gb_vec *v, gb_el e)
{
    if (P->n_total >= LMS_GBNF_ELEMS)
        return perr(P, P->p, "the grammar is too large (over %d elements)", LMS_GBNF_ELEMS);
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        gb_el *nv = realloc(v->v, cap * sizeof *nv);
        if (!nv)
            return perr(P, P->p, "out of memory");
        v->v = nv, v->cap = cap;
    }
    v->v[v->n++] = e;
    P->n_total++;
    return true;
}

static bool push_el(gb_parser *P, uint32_t rule, uint32_t type, uint32_t a, uint32_t b)
{
    return vec_push(P, &P->rules[rule].body, (gb_el){type, a, b});
}

/* A new rule (name taken, NULL for a synthesized one); its index, or -1. */
static int64_t new_rule(gb_parser *P, char *name)
{
    if (P->n_rules == P->cap_rules) {
        uint32_t cap = P->cap_rules ? P->cap_rules * 2 : 16;
        gb_rule *nr = realloc(P->rules, cap * sizeof *nr);
        if (!nr) {
            free(name);
            perr(P, P->p, "out of memory");
            return -1;
        }
        P->rules = nr, P->cap_rules = cap;
    }
    P->rules[P->n_rules] = (gb_rule){.name = name};
    return P->n_rules++;
}

/* The rule named [s, s + n), made (undefined) at its first mention. */
static int64_t rule_named(gb_parser *P, const char *s, size_t n)
{
    for (uint32_t i = 0; i < P->n_rules; i++)
        if (P->rules[i].name && strlen(P->rules[i].name) == n && !memcmp(P->rules[i].name, s, n))
            return i;
    char *name = malloc(n + 1);
    if (!name) {
        perr(P, s, "out of memory");
        return -1;
    }
    memcpy(name, s, n);
    name[n] = '\0';
    return new_rule(P, name);
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

/* Blanks and comments; newlines too where newline_ok. */
static void skip_space(gb_parser *P, bool newline_ok)
{
    while (P->p < P->end) {
        const char c = *P->p;
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r')))
            P->p++;
        else if (c == '#')
            while (P->p < P->end && *P->p != '\n' && *P->p != '\r')
                P->p++;
        else
            break;
    }
}

/* n hex digits at P->p */
static bool parse_hex(gb_parser *P, int n, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++, P->p++) {
        if (P->p >= P->end)
            return perr(P, P->p, "expected %d hex digits", n);
        const char c = *P->p;
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
        if (d < 0)
            return perr(P, P->p, "expected a hex digit, found '%c'", c);
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

/* One character of a literal or class: an escape or a UTF-8 sequence. */
static bool parse_char(gb_parser *P, uint32_t *cp)
{
    const char *at = P->p;
    if (P->p >= P->end)
        return perr(P, at, "unexpected end of the grammar");
    unsigned char c = (unsigned char)*P->p++;
    if (c == '\\') {
        if (P->p >= P->end)
            return perr(P, at, "unexpected end of the grammar after '\\'");
        const char e = *P->p++;
        switch (e) {
        case 'n': *cp = '\n'; return true;
        case 'r': *cp = '\r'; return true;
        case 't': *cp = '\t'; return true;
        case '\\': case '"': case '[': case ']': case '-': *cp = (uint32_t)e; return true;
        case 'x': return parse_hex(P, 2, cp);
        case 'u': return parse_hex(P, 4, cp);
        case 'U': return parse_hex(P, 8, cp) && (*cp <= 0x10FFFF || perr(P, at, "\\U%08X is past U+10FFFF", *cp));
        default: return perr(P, at, "unknown escape '\\%c'", e);
        }
    }
    int more = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (more < 0)
        return perr(P, at, "invalid UTF-8");
    uint32_t v = more ? c & (0x3F >> more) : c;
    for (int i = 0; i < more; i++) {
        if (P->p >= P->end || ((unsigned char)*P->p & 0xC0) != 0x80)
            return perr(P, at, "invalid UTF-8");
        v = v << 6 | ((unsigned char)*P->p++ & 0x3F);
    }
    *cp = v;
    return true;
}

static bool push_range(gb_parser *P, uint32_t lo, uint32_t hi)
{
    if (P->n_rng + 1 > P->cap_rng) {
        size_t cap = P->cap_rng ? P->cap_rng * 2 : 32;
        uint32_t *nr = realloc(P->rng, cap * 2 * sizeof *nr);
        if (!nr)
            return perr(P, P->p, "out of memory");
        P->rng = nr, P->cap_rng = cap;
    }
    P->rng[2 * P->n_rng] = lo;
    P->rng[2 * P->n_rng + 1] = hi;
    P->n_rng++;
    return true;
}

static bool parse_alternates(gb_parser *P, uint32_t rule, bool nested);

/* An unsigned number of a {m,n} bound */
static bool parse_bound(gb_parser *P, uint32_t *v)
{
    const char *at = P->p;
    uint64_t x = 0;
    while (P->p < P->end && *P->p >= '0' && *P->p <= '9' && x <= LMS_GBNF_REP_MAX)
        x = x * 10 + (uint64_t)(*P->p++ - '0');
    if (P->p == at)
        return perr(P, at, "expected a number in the repetition");
    if (x > LMS_GBNF_REP_MAX)
        return perr(P, at, "repetition bound over %d", LMS_GBNF_REP_MAX);
    *v = (uint32_t)x;
    return true;
}

/* Replaces the rule's elements from `from` (the last symbol) with that
 * symbol repeated min..max times (max UINT32_MAX: no maximum). */
static bool repeat(gb_parser *P, uint32_t rule, size_t from, uint32_t min, uint32_t max)
{
    const size_t len = P->rules[rule].body.n - from;
    gb_el *sym = malloc((len ? len : 1) * sizeof *sym);
    if (!sym)
        return perr(P, P->p, "out of memory");
    memcpy(sym, P->rules[rule].body.v + from, len * sizeof *sym);
    P->rules[rule].body.n = from;
    P->n_total -= len;
    bool ok = true;
    for (uint32_t i = 0; i < min && ok; i++)
        for (size_t k = 0; k < len && ok; k++)
            ok = vec_push(P, &P->rules[rule].body, sym[k]);
    /* the optional part: one rule per optional copy, each the copy then
     * the next (or itself, when open), or nothing */
    const uint32_t n_opt = max == UINT32_MAX ? 1 : max - min;
    int64_t prev = -1;
    for (uint32_t i = 0; i < n_opt && ok; i++) {
        const int64_t r = new_rule(P, NULL);
        if (r < 0) {
            ok = false;
            break;
        }
        for (size_t k = 0; k < len && ok; k++)
            ok = push_el(P, (uint32_t)r, sym[k].type, sym[k].a, sym[k].b);
        if (ok && max == UINT32_MAX)
            ok = push_el(P, (uint32_t)r, GB_REF, (uint32_t)r, 0);
        else if (ok && i + 1 < n_opt) /* filled in below: the next rule */
            ok = push_el(P, (uint32_t)r, GB_REF, UINT32_MAX, 0);
        ok = ok && push_el(P, (uint32_t)r, GB_END, 0, 0) && push_el(P, (uint32_t)r, GB_END, 0, 0);
        if (ok && prev >= 0) { /* prev's reference to the next copy */
            gb_vec *pv = &P->rules[prev].body;
            pv->v[pv->n - 3].a = (uint32_t)r;
        } else if (ok)
            ok = push_el(P, rule, GB_REF, (uint32_t)r, 0);
        prev = r;
    }
    free(sym);
    return ok;
}

/* A sequence into the rule; stops before '|', ')', the end of the line
 * (not nested) or anything that does not start a symbol. */
static bool parse_sequence(gb_parser *P, uint32_t rule, bool nested)
{
    size_t last = SIZE_MAX; /* where the last symbol's elements start */
    for (;;) {
        skip_space(P, nested);
        if (P->p >= P->end)
            return true;
        const char c = *P->p;
        const char *at = P->p;
        if (c == '"') {
            P->p++;
            last = P->rules[rule].body.n;
            while (P->p < P->end && *P->p != '"') {
                uint32_t cp;
                if (!parse_char(P, &cp) || !push_range(P, cp, cp) ||
                    !push_el(P, rule, GB_CHAR, (uint32_t)P->n_rng - 1, 1))
                    return false;
            }
            if (P->p >= P->end)
                return perr(P, at, "unterminated literal");
            P->p++;
            if (last == P->rules[rule].body.n)
                last = SIZE_MAX; /* "": nothing to repeat */
        } else if (c == '[') {
            P->p++;
            const bool neg = P->p < P->end && *P->p == '^';
            P->p += neg;
            const uint32_t first = (uint32_t)P->n_rng;
            while (P->p < P->end && *P->p != ']') {
                uint32_t lo, hi;
                if (!parse_char(P, &lo))
                    return false;
                hi = lo;
                if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
                    P->p++;
                    if (!parse_char(P, &hi))
                        return false;
                    if (hi < lo)
                        return perr(P, at, "a character range runs backwards");
                }
                if (!push_range(P, lo, hi))
                    return false;
            }
            if (P->p >= P->end)
                return perr(P, at, "unterminated character class");
            P->p++;
            last = P->rules[rule].body.n;
            if (!push_el(P, rule, GB_CHAR, first, ((uint32_t)P->n_rng - first) | (neg ? GB_NEG : 0)))
                return false;
        } else if (c == '.') {
            P->p++;
            last = P->rules[rule].body.n;
            if (!push_el(P, rule, GB_CHAR, 0, GB_NEG))
                return false;
        } else if (is_name_char(c)) {
            while (P->p < P->end && is_name_char(*P->p))
                P->p++;
            const int64_t r = rule_named(P, at, (size_t)(P->p - at));
            if (r < 0)
                return false;
            if (!P->rules[r].ref_at)
                P->rules[r].ref_at = at;
            last = P->rules[rule].body.n;
            if (!push_el(P, rule, GB_REF, (uint32_t)r, 0))
                return false;
        } else if (c == '(') {
            P->p++;
            skip_space(P, true);
            const int64_t r = new_rule(P, NULL);
            if (r < 0 || !parse_alternates(P, (uint32_t)r, true))
                return false;
            skip_space(P, true);
            if (P->p >= P->end || *P->p != ')')
                return perr(P, at, "unclosed '('");
            P->p++;
            last = P->rules[rule].body.n;
            if (!push_el(P, rule, GB_REF, (uint32_t)r, 0))
                return false;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == SIZE_MAX)
                return perr(P, at, "'%c' with nothing before it to repeat", c);
            P->p++;
            uint32_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : UINT32_MAX;
            if (c == '{') {
                skip_space(P, nested);
                if (!parse_bound(P, &min))
                    return false;
                max = min;
                skip_space(P, nested);
                if (P->p < P->end && *P->p == ',') {
                    P->p++;
                    skip_space(P, nested);
                    max = UINT32_MAX;
                    if (P->p < P->end && *P->p != '}' && !parse_bound(P, &max))
                        return false;
                    skip_space(P, nested);
                }
                if (P->p >= P->end || *P->p != '}')
                    return perr(P, at, "expected '}' to close the repetition");
                P->p++;
                if (max < min)
                    return perr(P, at, "repetition {%u,%u}: the maximum is below the minimum", min, max);
            }
            if (!repeat(P, rule, last, min, max))
                return false;
            last = SIZE_MAX;
        } else if (c == '<') {
            return perr(P, at, "token references (<...>) are not supported");
        } else {
            return true;
        }
    }
}

static bool parse_alternates(gb_parser *P, uint32_t rule, bool nested)
{
    for (;;) {
        if (!parse_sequence(P, rule, nested) || !push_el(P, rule, GB_END, 0, 0))
            return false;
        if (P->p < P->end && *P->p == '|') {
            P->p++;
            skip_space(P, true);
            continue;
        }
        if (nested && (P->p >= P->end || *P->p != ')'))
            return P->p >= P->end ? perr(P, P->p, "unclosed '('")
                                  : perr(P, P->p, "unexpected '%c'", *P->p);
        return true;
    }
}

static bool parse_grammar(gb_parser *P)
{
    skip_space(P, true);
    while (P->p < P->end) {
        const char *at = P->p;
        while (P->p < P->end && is_name_char(*P->p))
            P->p++;
        if (P->p == at)
            return perr(P, at, "expected a rule name, found '%c'", *at);
        const int64_t r = rule_named(P, at, (size_t)(P->p - at));
        if (r < 0)
            return false;
        if (P->rules[r].defined)
            return perr(P, at, "rule '%s' is defined twice", P->rules[r].name);
        P->rules[r].defined = true;
        skip_space(P, false);
        if (P->end - P->p < 3 || memcmp(P->p, "::=", 3))
            return perr(P, P->p, "expected '::=' after the rule name");
        P->p += 3;
        skip_space(P, true);
        if (!parse_alternates(P, (uint32_t)r, false))
            return false;
        skip_space(P, false);
        if (P->p < P->end && *P->p != '\n' && *P->p != '\r')
            return perr(P, P->p, "unexpected '%c'", *P->p);
        skip_space(P, true);
    }
    return true;
}

/* ---- checks: definitions, root, left recursion ---------------------------------- */

/* Whether each rule can produce the empty text (to a fixed point). */
static void find_nullable(const gb_parser *P, bool *nul)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < P->n_rules; r++) {
            if (nul[r])
                continue;
            const gb_vec *b = &P->rules[r].body;
            bool alt_ok = true;
            for (size_t i = 0; i < b->n && !nul[r]; i++) {
                const gb_el *e = &b->v[i];
                if (e->type == GB_END) {
                    if (alt_ok)
                        nul[r] = changed = true;
                    alt_ok = true;
                } else if (e->type == GB_CHAR || (e->type == GB_REF && !nul[e->a])) {
                    alt_ok = false;
                }
            }
        }
    }
}

/* Depth-first over "r can start with s" edges; true at a cycle, with
 * *named the first named rule on it (-1: only groups). state: 0 new, 1 on
 * the path (path[0..*depth)), 2 done. */
static bool left_cycle(const gb_parser *P, const bool *nul, uint8_t *state, uint32_t *path,
                       uint32_t *depth, uint32_t r, int64_t *named)
{
    state[r] = 1;
    path[(*depth)++] = r;
    const gb_vec *b = &P->rules[r].body;
    bool leading = true; /* still at the start of the alternative */
    for (size_t i = 0; i < b->n; i++) {
        const gb_el *e = &b->v[i];
        if (e->type == GB_END) {
            leading = true;
            continue;
        }
        if (!leading)
            continue;
        if (e->type == GB_CHAR) {
            leading = false;
            continue;
        }
        if (state[e->a] == 1) {
            uint32_t k = 0;
            while (path[k] != e->a)
                k++;
            for (*named = -1; k < *depth && *named < 0; k++)
                if (P->rules[path[k]].name)
                    *named = path[k];
            return true;
        }
        if (state[e->a] == 0 && left_cycle(P, nul, state, path, depth, e->a, named))
            return true;
        leading = nul[e->a];
    }
    state[r] = 2;
    (*depth)--;
    return false;
}

static bool check_rules(gb_parser *P, uint32_t *root)
{
    bool have_root = false;
    for (uint32_t r = 0; r < P->n_rules; r++) {
        if (P->rules[r].name && !P->rules[r].defined)
            return perr(P, P->rules[r].ref_at, "rule '%s' is never defined", P->rules[r].name);
        if (P->rules[r].name && !strcmp(P->rules[r].name, "root"))
            *root = r, have_root = true;
    }
    if (!have_root)
        return perr(P, P->end, "no 'root' rule");
    bool *nul = calloc(P->n_rules, sizeof *nul);
    uint8_t *state = calloc(P->n_rules, 1);
    uint32_t *path = calloc(P->n_rules, sizeof *path);
    bool ok = nul && state && path;
    if (!ok)
        perr(P, P->end, "out of memory");
    if (ok)
        find_nullable(P, nul);
    for (uint32_t r = 0; r < P->n_rules && ok; r++) {
        uint32_t depth = 0;
        int64_t named = -1;
        if (state[r] == 0 && left_cycle(P, nul, state, path, &depth, r, &named))
            ok = named >= 0
                     ? perr(P, P->rules[named].ref_at ? P->rules[named].ref_at : P->end,
                            "left recursion: rule '%s' can reach itself before reading a character",
                            P->rules[named].name)
                     : perr(P, P->end, "left recursion: a repeated group can repeat without "
                                       "reading a character");
    }
    free(path);
    free(nul);
    free(state);
    return ok;
}

/* ---- compile --------------------------------------------------------------------- */

static lms_gbnf *flatten(gb_parser *P, uint32_t root)
{
    uint32_t *start = malloc((P->n_rules ? P->n_rules : 1) * sizeof *start);
    if (!start)
        return NULL;
    size_t n_el = 0;
    for (uint32_t r = 0; r < P->n_rules; r++) {
        start[r] = (uint32_t)n_el;
        n_el += P->rules[r].body.n + 1;
    }
    const size_t bytes = sizeof(lms_gbnf) + n_el * sizeof(gb_el) + P->n_rng * 2 * sizeof(uint32_t);
    lms_gbnf *g = malloc(bytes);
    if (!g) {
        free(start);
        return NULL;
    }
    g->size = bytes;
    g->n_el = (uint32_t)n_el;
    g->n_rng = (uint32_t)P->n_rng;
    g->root = start[root];
    g->pad = 0;
    size_t k = 0;
    for (uint32_t r = 0; r < P->n_rules; r++) {
        const gb_vec *b = &P->rules[r].body;
        for (size_t i = 0; i < b->n; i++) {
            gb_el e = b->v[i];
            if (e.type == GB_REF)
                e.a = start[e.a];
            g->el[k++] = e;
        }
        g->el[k++] = (gb_el){GB_RULE_END, 0, 0};
    }
    if (P->n_rng)
        memcpy(g->el + n_el, P->rng, P->n_rng * 2 * sizeof(uint32_t));
    free(start);
    return g;
}

lms_gbnf *lms_gbnf_compile(const char *text, size_t n, char *err, size_t errsz)
{
    gb_parser P = {.text = text, .p = text, .end = text + n, .err = err, .errsz = errsz};
    uint32_t root = 0;
    lms_gbnf *g = NULL;
    if (parse_grammar(&P) && check_rules(&P, &root) && !(g = flatten(&P, root)))
        perr(&P, P.end, "out of memory");
    for (uint32_t r = 0; r < P.n_rules; r++) {
        free(P.rules[r].name);
        free(P.rules[r].body.v);
    }
    free(P.rules);
    free(P.rng);
    return g;
}

/* ---- checker --------------------------------------------------------------------- */

typedef struct gb_out {
    lms_gbnf_chk *d;
    bool full;      /* a stack did not fit, or the expansions ran out */
    uint32_t spent; /* expansions so far */
} gb_out;

/* Adds stack st[0..n) to the set unless it is there already. */
static void emit(gb_out *o, const uint32_t *st, uint32_t n)
{
    lms_gbnf_chk *d = o->d;
    for (uint32_t i = 0; i < d->n; i++)
        if ((uint32_t)(d->off[i + 1] - d->off[i]) == n && !memcmp(d->pool + d->off[i], st, n * sizeof *st))
            return;
    if (d->n == LMS_GBNF_STACKS || d->off[d->n] + n > LMS_GBNF_POOL) {
        o->full = true;
        return;
    }
    memcpy(d->pool + d->off[d->n], st, n * sizeof *st);
    d->off[d->n + 1] = (uint16_t)(d->off[d->n] + n);
    d->n++;
}

/* Expands stack st[0..n) (st has room for LMS_GBNF_POOL) until each
 * version's top is a character, adding those to the set. Writes past n
 * freely; restores st[0..n). */
static void expand(const lms_gbnf *g, gb_out *o, uint32_t *st, uint32_t n, int depth)
{
    if (o->full)
        return;
    if (depth > GB_EXPAND_DEPTH || ++o->spent > GB_EXPAND_BUDGET) {
        o->full = true;
        return;
    }
    if (n == 0) {
        emit(o, st, 0);
        return;
    }
    const uint32_t pos = st[n - 1];
    const gb_el *e = &g->el[pos];
    if (e->type == GB_END) {
        expand(g, o, st, n - 1, depth + 1);
        return;
    }
    if (e->type == GB_CHAR) {
        emit(o, st, n);
        return;
    }
    /* a reference: below it, where to go on after the rule (nothing when
     * the reference ends its alternative), then each alternative */
    uint32_t m = n - 1;
    if (g->el[pos + 1].type != GB_END)
        st[m++] = pos + 1;
    if (m >= LMS_GBNF_POOL) {
        o->full = true;
        st[n - 1] = pos;
        return;
    }
    for (uint32_t a = e->a; g->el[a].type != GB_RULE_END;) {
        st[m] = a;
        expand(g, o, st, m + 1, depth + 1);
        while (g->el[a].type != GB_END)
            a++;
        a++;
    }
    st[n - 1] = pos;
}

static bool class_has(const lms_gbnf *g, const gb_el *e, uint32_t c)
{
    const uint32_t *r = gb_ranges(g) + 2 * (size_t)e->a;
    const uint32_t nr = e->b & ~GB_NEG;
    bool in = false;
    for (uint32_t i = 0; i < nr && !in; i++)
        in = c >= r[2 * i] && c <= r[2 * i + 1];
    return (e->b & GB_NEG) ? !in : in;
}

/* Whether the class may hold a character in [lo, hi] (a character whose
 * first bytes alone are in). */
static bool class_may(const lms_gbnf *g, const gb_el *e, uint32_t lo, uint32_t hi)
{
    if (e->b & GB_NEG)
        return true;
    const uint32_t *r = gb_ranges(g) + 2 * (size_t)e->a;
    for (uint32_t i = 0; i < e->b; i++)
        if (r[2 * i] <= hi && r[2 * i + 1] >= lo)
            return true;
    return false;
}

static void chk_clear(lms_gbnf_chk *d, const lms_gbnf *g)
{
    d->g = g;
    d->n = 0;
    d->off[0] = 0;
    d->cp = 0;
    d->need = 0;
    d->len = 0;
}

/* dst = the stacks of src after reading character c; false when none. */
static bool step(const lms_gbnf_chk *src, uint32_t c, lms_gbnf_chk *dst)
{
    const lms_gbnf *g = src->g;
    chk_clear(dst, g);
    gb_out o = {dst, false, 0};
    uint32_t st[LMS_GBNF_POOL];
    for (uint32_t i = 0; i < src->n && !o.full; i++) {
        const uint32_t n = src->off[i + 1] - src->off[i];
        if (n == 0)
            continue;
        const uint32_t top = src->pool[src->off[i] + n - 1];
        if (!class_has(g, &g->el[top], c))
            continue;
        memcpy(st, src->pool + src->off[i], (n - 1) * sizeof *st);
        st[n - 1] = top + 1;
        expand(g, &o, st, n, 0);
    }
    return dst->n > 0 && !o.full;
}

bool lms_gbnf_init(lms_gbnf_chk *c, const lms_gbnf *g)
{
    chk_clear(c, g);
    gb_out o = {c, false, 0};
    uint32_t st[LMS_GBNF_POOL];
    for (uint32_t a = g->root; g->el[a].type != GB_RULE_END;) {
        st[0] = a;
        expand(g, &o, st, 1, 0);
        while (g->el[a].type != GB_END)
            a++;
        a++;
    }
    return !o.full && c->n > 0;
}

/* Reads n bytes from src's state; the result is *res (src itself when no
 * character completed, else one of a, b), its pending bytes in *cp,
 * *need. False when the bytes cannot continue. */
static bool run(const lms_gbnf_chk *src, const char *p, size_t n, lms_gbnf_chk *a,
                lms_gbnf_chk *b, const lms_gbnf_chk **res, uint32_t *cp_out, uint8_t *need_out,
                uint8_t *len_out)
{
    const lms_gbnf_chk *cur = src;
    lms_gbnf_chk *bufs[2] = {a, b};
    int k = 0;
    uint32_t cp = src->cp;
    uint8_t need = src->need, len = src->len;
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)p[i];
        if (need) {
            if ((ch & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (ch & 0x3F);
            if (--need)
                continue;
        } else if (ch < 0x80) {
            cp = ch;
        } else {
            const int more = ch >= 0xC2 && ch <= 0xDF ? 1 : ch >= 0xE0 && ch <= 0xEF ? 2 : ch >= 0xF0 && ch <= 0xF4 ? 3 : -1;
            if (more < 0)
                return false;
            cp = ch & (0x3F >> more);
            need = (uint8_t)more;
            len = (uint8_t)(more + 1);
            continue;
        }
        if (!step(cur, cp, bufs[k]))
            return false;
        cur = bufs[k];
        k ^= 1;
    }
    if (need) { /* a character not yet whole: some stack must be able to take it */
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000}; /* by length */
        uint32_t lo = cp << (6 * need);
        const uint32_t hi = lo | ((1u << (6 * need)) - 1);
        lo = lo < least[len] ? least[len] : lo;
        bool may = false;
        for (uint32_t i = 0; i < cur->n && !may; i++) {
            const uint32_t m = cur->off[i + 1] - cur->off[i];
            may = m > 0 && class_may(cur->g, &cur->g->el[cur->pool[cur->off[i] + m - 1]], lo, hi);
        }
        if (!may)
            return false;
    }
    *res = cur;
    *cp_out = cp;
    *need_out = need;
    *len_out = len;
    return true;
}

/* run's two buffers, per thread (a vocabulary pass calls lms_gbnf_allows
 * for every token) */
static _Thread_local lms_gbnf_chk gb_buf[2];

bool lms_gbnf_feed(lms_gbnf_chk *c, const char *p, size_t n)
{
    lms_gbnf_chk *buf = gb_buf;
    const lms_gbnf_chk *res;
    uint32_t cp;
    uint8_t need, len;
    const bool ok = run(c, p, n, buf, buf + 1, &res, &cp, &need, &len);
    if (ok) {
        if (res != c)
            lms_gbnf_copy(c, res);
        c->cp = cp;
        c->need = need;
        c->len = len;
    }
    return ok;
}

bool lms_gbnf_allows(const lms_gbnf_chk *c, const char *p, size_t n)
{
    /* most tokens fail on their first character: try that before
     * taking buffers */
    if (n && !c->need && (unsigned char)p[0] < 0x80) {
        bool any = false;
        for (uint32_t i = 0; i < c->n && !any; i++) {
            const uint32_t m = c->off[i + 1] - c->off[i];
            any = m > 0 && class_has(c->g, &c->g->el[c->pool[c->off[i] + m - 1]], (unsigned char)p[0]);
        }
        if (!any)
            return false;
    }
    const lms_gbnf_chk *res;
    uint32_t cp;
    uint8_t need, len;
    return run(c, p, n, gb_buf, gb_buf + 1, &res, &cp, &need, &len);
}

bool lms_gbnf_done(const lms_gbnf_chk *c)
{
    if (c->need)
        return false;
    for (uint32_t i = 0; i < c->n; i++)
        if (c->off[i + 1] == c->off[i])
            return true;
    return false;
}

bool lms_gbnf_closed(const lms_gbnf_chk *c)
{
    return lms_gbnf_done(c) && c->n == 1;
}

void lms_gbnf_copy(lms_gbnf_chk *dst, const lms_gbnf_chk *src)
{
    dst->g = src->g;
    dst->cp = src->cp;
    dst->need = src->need;
    dst->len = src->len;
    dst->n = src->n;
    memcpy(dst->off, src->off, (src->n + 1u) * sizeof *dst->off);
    memcpy(dst->pool, src->pool, src->off[src->n] * sizeof *dst->pool);
}

bool lms_gbnf_same(const lms_gbnf_chk *a, const lms_gbnf_chk *b)
{
    return a->g == b->g && a->cp == b->cp && a->need == b->need && a->len == b->len && a->n == b->n &&
           !memcmp(a->off, b->off, (a->n + 1u) * sizeof *a->off) &&
           !memcmp(a->pool, b->pool, a->off[a->n] * sizeof *a->pool);
}
