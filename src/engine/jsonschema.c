/*
 * jsonschema.c - JSON schemas for JSON mode (jsonschema.h): the compiler
 * (jansson -> one block) and the checker, a schema layer over the syntax
 * checker of jsonfsm.c.
 *
 * The block:
 *
 *   lms_jschema   size, counts, the root node
 *   js_node[]     per node: the kinds of value it allows, and per kind the
 *                 alternative that describes such a value (anyOf); object:
 *                 its properties (or the node of a map's values); array:
 *                 items, min and max; enum: its values' texts
 *   js_prop[]     name (compact JSON text without the quotes), node, required
 *   js_text[]     enum / const values as compact JSON text
 *   bytes         the texts
 *
 * The checker feeds each byte to the syntax checker, then reads what the
 * byte did from the coarse phase before and after it (a value began, a key
 * byte, a key ended, a scalar ended, a container closed, a comma) and
 * applies the schema's rule for that event.
 */
#include "engine/jsonschema.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_OBJ = 1, K_ARR = 2, K_STR = 4, K_NUM = 8, K_INT = 16, K_BOOL = 32, K_NULL = 64 };
#define K_ALL 127
#define N_KINDS 7
#define MAX_NODES 512
#define MAX_PROPS 64
#define MAX_ENUM 4096 /* enum values: a range of their sorted texts (enum_range) */
#define MAX_COMPILE_DEPTH 32
#define NONE (-1)

typedef struct js_node {
    uint8_t kinds;
    bool any;               /* no constraint: any value of the kinds */
    int16_t alt[N_KINDS];   /* per kind bit: the node of such a value (anyOf), NONE: this */
    uint16_t n_props;
    uint32_t props;         /* first in the property table */
    int16_t map;            /* an object of any keys with values of this node, or NONE */
    int16_t items;          /* array: node of every item, NONE: any */
    uint16_t min_items, max_items;
    uint16_t min_props, max_props; /* object: members */
    uint16_t n_enum;
    uint32_t enums;         /* first in the text table */
    uint32_t min_len, max_len; /* string characters */
    uint8_t bounds;         /* B_* flags: which of lo, hi apply, and how */
    double lo, hi;
    int16_t pattern;        /* string: index of its compiled pattern (patterns[]), or NONE */
    bool pat_anchored;      /* the pattern starts with ^: prefixes are checked as they come */
} js_node;

enum { B_LO = 1, B_HI = 2, B_LO_EXCL = 4, B_HI_EXCL = 8 };

typedef struct js_text {
    uint32_t off, len;
} js_text;

typedef struct js_prop {
    js_text name;
    int16_t node;
    bool required;
} js_prop;

struct lms_jschema {
    uint32_t size;
    uint16_t n_nodes, root;
    uint32_t n_props, n_texts;
};

static const js_node *nodes_of(const lms_jschema *s)
{
    return (const js_node *)(s + 1);
}
static const js_prop *props_of(const lms_jschema *s)
{
    return (const js_prop *)(nodes_of(s) + s->n_nodes);
}
static const js_text *texts_of(const lms_jschema *s)
{
    return (const js_text *)(props_of(s) + s->n_props);
}
static const char *bytes_of(const lms_jschema *s)
{
    return (const char *)(texts_of(s) + s->n_texts);
}

size_t lms_jschema_size(const lms_jschema *s)
{
    return s->size;
}

/* ---- compiler ------------------------------------------------------------ */

typedef struct builder {
    js_node nodes[MAX_NODES];
    int n_nodes;
    js_prop *props;
    int n_props, cap_props;
    js_text *texts;
    int n_texts, cap_texts;
    char *bytes;
    size_t n_bytes, cap_bytes;
    const json_t *root;     /* for $ref */
    const json_t *ref_from[MAX_NODES];
    int16_t ref_node[MAX_NODES];
    int n_refs;
    char *err;
    size_t errsz;
} builder;

static int fail(builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(builder *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, b->errsz, fmt, ap);
    va_end(ap);
    return NONE;
}

static bool grow(void **p, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return true;
    int c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

/* The text, into the byte pool. */
/* Texts in byte order, a prefix before what extends it (qsort_r over a
 * builder's texts). */
static int text_cmp(const void *x, const void *y, void *arg)
{
    const builder *b = arg;
    const js_text *s = x, *t = y;
    const uint32_t n = s->len < t->len ? s->len : t->len;
    const int c = memcmp(b->bytes + s->off, b->bytes + t->off, n);
    return c ? c : (s->len > t->len) - (s->len < t->len);
}

static int add_bytes(builder *b, const char *p, size_t n, js_text *t)
{
    if (b->n_bytes + n > b->cap_bytes) {
        size_t c = b->cap_bytes ? b->cap_bytes * 2 : 256;
        while (c < b->n_bytes + n)
            c *= 2;
        char *q = realloc(b->bytes, c);
        if (!q)
            return fail(b, "out of memory");
        b->bytes = q;
        b->cap_bytes = c;
    }
    if (n) /* (an empty name: no pool yet, perhaps) */
        memcpy(b->bytes + b->n_bytes, p, n);
    *t = (js_text){(uint32_t)b->n_bytes, (uint32_t)n};
    b->n_bytes += n;
    return 0;
}

static int new_node(builder *b)
{
    if (b->n_nodes >= MAX_NODES)
        return fail(b, "the schema has more than %d parts", MAX_NODES);
    js_node *n = &b->nodes[b->n_nodes];
    memset(n, 0, sizeof *n);
    for (int k = 0; k < N_KINDS; k++)
        n->alt[k] = NONE;
    n->map = n->items = NONE;
    n->max_items = UINT16_MAX;
    n->max_props = UINT16_MAX;
    n->max_len = UINT32_MAX;
    n->pattern = NONE;
    return b->n_nodes++;
}

static int kind_of_name(const char *t)
{
    static const char *const names[N_KINDS] = {"object", "array",   "string", "number",
                                               "integer", "boolean", "null"};
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(t, names[k]))
            return 1 << k;
    return 0;
}

static int kind_of_value(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return K_STR;
    case JSON_INTEGER: case JSON_REAL: return K_NUM;
    case JSON_TRUE: case JSON_FALSE: return K_BOOL;
    case JSON_NULL: return K_NULL;
    default: return 0;
    }
}

static int compile(builder *b, const json_t *sch, int depth);

static int compile_ref(builder *b, const char *ref, int depth)
{
    const char *name = NULL;
    const json_t *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8))
        defs = json_object_get(b->root, "$defs"), name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14))
        defs = json_object_get(b->root, "definitions"), name = ref + 14;
    const json_t *target = defs && name ? json_object_get(defs, name) : NULL;
    if (!strcmp(ref, "#"))
        target = b->root;
    if (!target)
        return fail(b, "$ref '%.100s' does not lead to a definition of the schema", ref);
    for (int i = 0; i < b->n_refs; i++)
        if (b->ref_from[i] == target)
            return b->ref_node[i];
    return compile(b, target, depth);
}

/* Merges alternative node a into dispatch node d (anyOf / oneOf). */
static int add_alternative(builder *b, int d, int a)
{
    for (int k = 0; k < N_KINDS; k++) {
        if (!(b->nodes[a].kinds & (1 << k)))
            continue;
        if (b->nodes[d].kinds & (1 << k))
            return fail(b, "anyOf / oneOf alternatives must start differently (two allow the same "
                           "kind of value)");
        b->nodes[d].kinds |= (uint8_t)(1 << k);
        b->nodes[d].alt[k] = (int16_t)a;
    }
    return 0;
}

static int compile_object(builder *b, int id, const json_t *sch, int depth)
{
    const json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required");
    const json_t *extra = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(b, "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail(b, "'required' must be an array");
    if (json_object_size(props) > MAX_PROPS)
        return fail(b, "an object may have at most %d properties here", MAX_PROPS);
    if (json_object_size(props) == 0 && !json_is_false(extra)) {
        /* a map: any keys, values of additionalProperties' schema (any
         * value when it is absent or true) */
        int m = compile(b, json_is_object(extra) ? extra : json_true(), depth + 1);
        if (m < 0)
            return NONE;
        b->nodes[id].map = (int16_t)m;
        return 0;
    }
    /* the properties first, contiguous; their schemas after (which may add
     * properties of their own) */
    const uint32_t first = (uint32_t)b->n_props;
    b->nodes[id].props = first;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v)
    {
        if (!grow((void **)&b->props, &b->cap_props, b->n_props + 1, sizeof *b->props))
            return fail(b, "out of memory");
        js_prop *p = &b->props[b->n_props];
        json_t *ks = json_string(key);
        char *t = ks ? json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!t)
            return fail(b, "out of memory");
        int rc = add_bytes(b, t + 1, strlen(t) - 2, &p->name); /* without the quotes */
        free(t);
        if (rc < 0)
            return NONE;
        p->node = NONE;
        p->required = false;
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r) if (json_is_string(r) && !strcmp(json_string_value(r), key))
            p->required = true;
        b->n_props++;
        b->nodes[id].n_props++;
    }
    uint32_t i = first;
    json_object_foreach((json_t *)props, key, v)
    {
        int n = compile(b, v, depth + 1);
        if (n < 0)
            return NONE;
        b->props[i++].node = (int16_t)n;
    }
    return 0;
}

/*
 * Compiled patterns, shared by every schema of the process: a schema's
 * node keeps an index. Patterns are compiled once (PCRE2, JIT when
 * available) and kept for the process's life, so a schema block can be
 * copied freely; the table is append-only under a mutex, and an index
 * reaches the scheduler thread through the request queue's lock. The
 * checker runs each with its own match data.
 */
#define MAX_PATTERNS 1024
#define MAX_PATTERN_BYTES 512
static struct {
    pthread_mutex_t mu;
    int n;
    pcre2_code *code[MAX_PATTERNS];
    char *text[MAX_PATTERNS];
    pcre2_match_context *mctx; /* a bound on backtracking: a pathological pattern on a
                                * 128-byte string fails instead of taking seconds */
} patterns = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The index of pattern text t (compiled on first use); NONE with a message. */
static int pattern_index(builder *b, const char *t, size_t n)
{
    pthread_mutex_lock(&patterns.mu);
    int found = NONE;
    for (int i = 0; i < patterns.n && found == NONE; i++)
        if (strlen(patterns.text[i]) == n && !memcmp(patterns.text[i], t, n))
            found = i;
    if (!patterns.mctx && (patterns.mctx = pcre2_match_context_create(NULL)) != NULL) {
        pcre2_set_match_limit(patterns.mctx, 200000);
        pcre2_set_depth_limit(patterns.mctx, 10000);
    }
    if (found == NONE && patterns.n < MAX_PATTERNS) {
        int code;
        PCRE2_SIZE at;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)t, n, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &code,
                                       &at, NULL);
        char *copy = re ? strndup(t, n) : NULL;
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof msg);
            pthread_mutex_unlock(&patterns.mu);
            return fail(b, "'pattern' does not compile at offset %zu: %s", (size_t)at, (char *)msg);
        }
        if (!copy) {
            pcre2_code_free(re);
            pthread_mutex_unlock(&patterns.mu);
            return fail(b, "out of memory");
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
        patterns.code[patterns.n] = re;
        patterns.text[patterns.n] = copy;
        found = patterns.n++;
    }
    pthread_mutex_unlock(&patterns.mu);
    if (found == NONE)
        return fail(b, "more than %d different patterns are in use", MAX_PATTERNS);
    return found;
}

static pcre2_code *pattern_code(int i, pcre2_match_context **mctx)
{
    pthread_mutex_lock(&patterns.mu);
    pcre2_code *c = patterns.code[i];
    *mctx = patterns.mctx;
    pthread_mutex_unlock(&patterns.mu);
    return c;
}

/* minLength / maxLength and the numeric bounds of node id. A node with a
 * limit is no longer "any" value of its kinds. */
static int compile_limits(builder *b, int id, const json_t *sch)
{
    js_node *n = &b->nodes[id];
    const json_t *mnl = json_object_get(sch, "minLength"), *mxl = json_object_get(sch, "maxLength");
    if ((mnl && (!json_is_integer(mnl) || json_integer_value(mnl) < 0 ||
                 json_integer_value(mnl) > UINT32_MAX - 1)) ||
        (mxl && (!json_is_integer(mxl) || json_integer_value(mxl) < 0 ||
                 json_integer_value(mxl) > UINT32_MAX - 1)))
        return fail(b, "'minLength' / 'maxLength' must be integers from 0");
    if (mnl)
        n->min_len = (uint32_t)json_integer_value(mnl);
    if (mxl)
        n->max_len = (uint32_t)json_integer_value(mxl);
    if (n->min_len > n->max_len)
        return fail(b, "'minLength' is above 'maxLength'");
    const json_t *pat = json_object_get(sch, "pattern");
    if (pat) {
        if (!json_is_string(pat) || json_string_length(pat) > MAX_PATTERN_BYTES ||
            strlen(json_string_value(pat)) != json_string_length(pat))
            return fail(b, "'pattern' must be a string of at most %d bytes, without NUL",
                        MAX_PATTERN_BYTES);
        const int pi = pattern_index(b, json_string_value(pat), json_string_length(pat));
        if (pi < 0)
            return NONE;
        b->nodes[id].pattern = (int16_t)pi;
        b->nodes[id].pat_anchored =
            json_string_value(pat)[0] == '^' && !strchr(json_string_value(pat), '|');
        n = &b->nodes[id];
    }
    static const struct {
        const char *key;
        uint8_t flag;
    } bk[] = {{"minimum", B_LO}, {"maximum", B_HI}, {"exclusiveMinimum", B_LO | B_LO_EXCL},
              {"exclusiveMaximum", B_HI | B_HI_EXCL}};
    for (size_t i = 0; i < sizeof bk / sizeof bk[0]; i++) {
        const json_t *v = json_object_get(sch, bk[i].key);
        if (!v)
            continue;
        if (json_is_boolean(v) && (bk[i].flag & (B_LO_EXCL | B_HI_EXCL))) {
            /* draft 4: a flag on minimum / maximum */
            if (json_is_true(v))
                n->bounds |= bk[i].flag & (B_LO_EXCL | B_HI_EXCL);
            continue;
        }
        if (!json_is_number(v))
            return fail(b, "'%s' must be a number", bk[i].key);
        const double x = json_number_value(v);
        const bool lo = bk[i].flag & B_LO;
        /* the tighter of minimum and exclusiveMinimum (maximum likewise) */
        if (!(n->bounds & (lo ? B_LO : B_HI)) || (lo ? x >= n->lo : x <= n->hi)) {
            const uint8_t excl = lo ? B_LO_EXCL : B_HI_EXCL;
            if ((n->bounds & (lo ? B_LO : B_HI)) && x == (lo ? n->lo : n->hi))
                n->bounds |= bk[i].flag & excl;
            else
                n->bounds = (uint8_t)((n->bounds & ~excl) | bk[i].flag);
            if (lo)
                n->lo = x;
            else
                n->hi = x;
        }
    }
    if ((n->bounds & (B_LO | B_HI)) == (B_LO | B_HI) &&
        (n->lo > n->hi || (n->lo == n->hi && (n->bounds & (B_LO_EXCL | B_HI_EXCL)))))
        return fail(b, "the bounds leave no number");
    if ((n->bounds || mnl || mxl || pat) && n->any)
        n->any = false;
    return 0;
}

/* minProperties / maxProperties of an object node. With named properties
 * (no map) minProperties must be reachable: at most their number. */
static int compile_member_counts(builder *b, int id, const json_t *sch)
{
    const json_t *mn = json_object_get(sch, "minProperties"), *mx = json_object_get(sch, "maxProperties");
    if (!mn && !mx)
        return 0;
    js_node *n = &b->nodes[id];
    const json_int_t lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : UINT16_MAX;
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || lo < 0 || hi > UINT16_MAX ||
        lo > hi)
        return fail(b, "'minProperties' / 'maxProperties' must be integers in 0..65535, min <= max");
    if (n->any) {
        if (lo > 0 || mx) /* an object of anything: keep it an object node to count its members */
            return fail(b, "'minProperties' / 'maxProperties' need 'type': 'object'");
        return 0;
    }
    if (n->map == NONE && lo > n->n_props)
        return fail(b, "'minProperties' %lld is more than the %d properties allowed", (long long)lo,
                    n->n_props);
    n->min_props = (uint16_t)lo;
    n->max_props = (uint16_t)hi;
    return 0;
}

static int compile(builder *b, const json_t *sch, int depth)
{
    if (depth > MAX_COMPILE_DEPTH)
        return fail(b, "the schema nests deeper than %d", MAX_COMPILE_DEPTH);
    if (json_is_true(sch) || (json_is_object(sch) && json_object_size(sch) == 0)) {
        int id = new_node(b);
        if (id >= 0)
            b->nodes[id].kinds = K_ALL, b->nodes[id].any = true;
        return id;
    }
    if (!json_is_object(sch))
        return fail(b, "a schema must be an object");
    static const char *const refused[] = {
        "patternProperties", "multipleOf", "not", "if", "then", "else",
        "prefixItems", "contains", "minContains", "maxContains", "uniqueItems", "propertyNames",
        "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (json_object_get(sch, refused[i]))
            return fail(b, "schema keyword '%s' is not supported", refused[i]);
    const json_t *all = json_object_get(sch, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            return fail(b, "schema keyword 'allOf' is supported with one schema only");
        static const char *const beside[] = {"type", "properties", "items", "enum", "const",
                                             "anyOf", "oneOf", "$ref"};
        for (size_t i = 0; i < sizeof beside / sizeof beside[0]; i++)
            if (json_object_get(sch, beside[i]))
                return fail(b, "'allOf' beside '%s' is not supported", beside[i]);
        return compile(b, json_array_get(all, 0), depth + 1);
    }
    const json_t *ref = json_object_get(sch, "$ref");
    if (ref) {
        if (!json_is_string(ref))
            return fail(b, "'$ref' must be a string");
        return compile_ref(b, json_string_value(ref), depth + 1);
    }
    int id = new_node(b);
    if (id < 0)
        return NONE;
    if (b->n_refs < MAX_NODES) { /* a $ref to this schema, compiled further in, finds it */
        b->ref_from[b->n_refs] = sch;
        b->ref_node[b->n_refs++] = (int16_t)id;
    }
    const json_t *alts = json_object_get(sch, "anyOf");
    alts = alts ? alts : json_object_get(sch, "oneOf");
    if (alts) {
        if (!json_is_array(alts) || json_array_size(alts) == 0)
            return fail(b, "'anyOf' / 'oneOf' must be a non-empty array");
        size_t i;
        const json_t *a;
        json_array_foreach(alts, i, a)
        {
            int n = compile(b, a, depth + 1);
            if (n < 0 || add_alternative(b, id, n) < 0)
                return NONE;
        }
        return id;
    }
    js_node *node = &b->nodes[id];
    const json_t *type = json_object_get(sch, "type");
    if (json_is_string(type)) {
        node->kinds = (uint8_t)kind_of_name(json_string_value(type));
        if (!node->kinds)
            return fail(b, "unknown type '%.40s'", json_string_value(type));
    } else if (json_is_array(type)) {
        size_t i;
        const json_t *t;
        json_array_foreach(type, i, t)
        {
            int k = json_is_string(t) ? kind_of_name(json_string_value(t)) : 0;
            if (!k)
                return fail(b, "'type' lists an unknown type");
            node->kinds |= (uint8_t)k;
        }
    } else if (type) {
        return fail(b, "'type' must be a string or an array of strings");
    }
    const json_t *en = json_object_get(sch, "enum"), *cst = json_object_get(sch, "const");
    if (en || cst) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0 ||
                   json_array_size(en) > MAX_ENUM))
            return fail(b, "'enum' must be an array of 1 to %d values", MAX_ENUM);
        json_t *vals = en ? json_incref((json_t *)en) : json_pack("[O]", cst);
        node->enums = (uint32_t)b->n_texts;
        uint8_t kinds = 0;
        size_t i;
        const json_t *v;
        int rc = 0;
        json_array_foreach(vals, i, v)
        {
            int k = kind_of_value(v);
            char *t = k ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            if (!k)
                rc = fail(b, "'enum' / 'const' values must be strings, numbers, booleans or null");
            else if (!t || !grow((void **)&b->texts, &b->cap_texts, b->n_texts + 1, sizeof *b->texts))
                rc = fail(b, "out of memory");
            else
                rc = add_bytes(b, t, strlen(t), &b->texts[b->n_texts++]);
            free(t);
            if (rc < 0)
                break;
            kinds |= (uint8_t)k;
            node->n_enum++;
        }
        json_decref(vals);
        if (rc < 0)
            return NONE;
        qsort_r(b->texts + node->enums, (size_t)node->n_enum, sizeof *b->texts, text_cmp, b);
        node->kinds = kinds; /* an enum's values say which kinds */
        return id;
    }
    if (!node->kinds) {
        if (json_object_get(sch, "properties") || json_object_get(sch, "additionalProperties"))
            node->kinds = K_OBJ;
        else if (json_object_get(sch, "items"))
            node->kinds = K_ARR;
        else
            node->kinds = K_ALL, node->any = true;
    }
    if (compile_limits(b, id, sch) < 0)
        return NONE;
    if ((node->kinds & K_OBJ) && !node->any && compile_object(b, id, sch, depth) < 0)
        return NONE;
    if ((b->nodes[id].kinds & K_OBJ) && compile_member_counts(b, id, sch) < 0)
        return NONE;
    if (node->kinds & K_ARR) {
        const json_t *it = json_object_get(sch, "items");
        int64_t mn = json_integer_value(json_object_get(sch, "minItems"));
        const json_t *mx = json_object_get(sch, "maxItems");
        if (it) {
            int n = compile(b, it, depth + 1);
            if (n < 0)
                return NONE;
            b->nodes[id].items = (int16_t)n;
        }
        if (mn < 0 || mn > UINT16_MAX || (mx && (json_integer_value(mx) < mn ||
                                                json_integer_value(mx) > UINT16_MAX)))
            return fail(b, "'minItems' / 'maxItems' must be in 0..65535, min <= max");
        b->nodes[id].min_items = (uint16_t)mn;
        if (mx)
            b->nodes[id].max_items = (uint16_t)json_integer_value(mx);
    }
    return id;
}

lms_jschema *lms_jschema_compile(const char *text, size_t n, char *err, size_t errsz)
{
    json_error_t je;
    json_t *root = json_loadb(text, n, 0, &je);
    if (!root) {
        snprintf(err, errsz, "the schema is not JSON: %s", je.text);
        return NULL;
    }
    lms_jschema *s = lms_jschema_from_json(root, err, errsz);
    json_decref(root);
    return s;
}

lms_jschema *lms_jschema_from_json(const json_t *root, char *err, size_t errsz)
{
    builder *b = calloc(1, sizeof *b);
    lms_jschema *s = NULL;
    if (!b) {
        snprintf(err, errsz, "out of memory");
        return NULL;
    }
    b->root = root;
    b->err = err;
    b->errsz = errsz;
    int top = compile(b, root, 0);
    if (top >= 0 && !(b->nodes[top].kinds & K_OBJ))
        top = fail(b, "the schema's top-level value must be an object");
    if (top >= 0) {
        size_t size = sizeof *s + (size_t)b->n_nodes * sizeof(js_node) +
                      (size_t)b->n_props * sizeof(js_prop) + (size_t)b->n_texts * sizeof(js_text) +
                      b->n_bytes;
        s = size <= UINT32_MAX ? malloc(size) : NULL;
        if (s) {
            *s = (lms_jschema){(uint32_t)size, (uint16_t)b->n_nodes, (uint16_t)top,
                               (uint32_t)b->n_props, (uint32_t)b->n_texts};
            memcpy((void *)nodes_of(s), b->nodes, (size_t)b->n_nodes * sizeof(js_node));
            if (b->n_props) /* (empty tables are NULL) */
                memcpy((void *)props_of(s), b->props, (size_t)b->n_props * sizeof(js_prop));
            if (b->n_texts)
                memcpy((void *)texts_of(s), b->texts, (size_t)b->n_texts * sizeof(js_text));
            if (b->n_bytes)
                memcpy((void *)bytes_of(s), b->bytes, b->n_bytes);
        } else {
            snprintf(err, errsz, "out of memory");
        }
    }
    free(b->props);
    free(b->texts);
    free(b->bytes);
    free(b);
    return s;
}

/* ---- checker ------------------------------------------------------------- */

/*
 * The enum values a scalar being read may still be: the texts are sorted
 * at compile time (text_cmp), so those that begin with the bytes read so
 * far are a run [lo, hi) of them, kept in k->vcand as lo | hi << 32. The
 * next byte c narrows the run to the texts whose byte at pos is c (a text
 * that ends at pos sorts first and drops out); the value may end where
 * the run's first text ends there.
 */
static uint64_t enum_range(uint32_t lo, uint32_t hi)
{
    return (uint64_t)lo | (uint64_t)hi << 32;
}

/* Rank of text t at byte pos: 0 where it ends before, else the byte + 1
 * (nondecreasing over a run of texts that share their first pos bytes). */
static int text_rank(const lms_jschema *sc, const js_text *t, uint16_t pos)
{
    return t->len <= pos ? 0 : (unsigned char)bytes_of(sc)[t->off + pos] + 1;
}

static uint64_t enum_narrow(const lms_jschema *sc, uint64_t cand, const js_text *t, uint16_t pos,
                            unsigned char c)
{
    uint32_t lo = (uint32_t)cand, hi = (uint32_t)(cand >> 32);
    const int want = c + 1;
    uint32_t a = lo, z = hi; /* first of rank >= want */
    while (a < z) {
        const uint32_t m = a + (z - a) / 2;
        if (text_rank(sc, &t[m], pos) < want)
            a = m + 1;
        else
            z = m;
    }
    lo = a;
    z = hi; /* first of rank > want */
    while (a < z) {
        const uint32_t m = a + (z - a) / 2;
        if (text_rank(sc, &t[m], pos) <= want)
            a = m + 1;
        else
            z = m;
    }
    return enum_range(lo, a);
}

void lms_jschk_init(lms_jschk *k, const lms_jschema *sc)
{
    memset(k, 0, sizeof *k);
    lms_jsonfsm_init(&k->f);
    k->sc = sc;
    k->vnode = NONE;
}

bool lms_jschk_done(const lms_jschk *k)
{
    return lms_jsonfsm_done(&k->f);
}

void lms_jschk_copy(lms_jschk *dst, const lms_jschk *src)
{
    memcpy(dst, src, offsetof(lms_jschk, fr) + (size_t)src->depth * sizeof src->fr[0]);
}

bool lms_jschk_same(const lms_jschk *a, const lms_jschk *b)
{
    if (!lms_jsonfsm_same(&a->f, &b->f) || a->depth != b->depth || a->vnode != b->vnode ||
        a->vpos != b->vpos || a->vcand != b->vcand || a->vint != b->vint ||
        a->vlen != b->vlen || a->vesc != b->vesc || a->vhi != b->vhi || a->vhex != b->vhex ||
        a->vneg != b->vneg || a->vni != b->vni || a->vnf != b->vnf || a->vval != b->vval ||
        a->vkind != b->vkind || a->vslen != b->vslen || a->vhigh != b->vhigh ||
        memcmp(a->vs, b->vs, a->vslen) != 0)
        return false;
    for (int i = 0; i < a->depth; i++) {
        const lms_jsframe *x = &a->fr[i], *y = &b->fr[i];
        if (x->node != y->node || x->count != y->count || x->pos != y->pos || x->next != y->next ||
            x->cur != y->cur || x->cand != y->cand || x->obj != y->obj)
            return false;
    }
    return true;
}

static int kind_bit(int kind)
{
    int k = 0;
    while (!(kind & (1 << k)))
        k++;
    return k;
}

/* The node a value at the current place must follow; NONE: anything. */
static int expected_node(const lms_jschk *k)
{
    if (k->depth == 0)
        return k->sc->root;
    const lms_jsframe *fr = &k->fr[k->depth - 1];
    if (fr->node == NONE)
        return NONE;
    const js_node *n = &nodes_of(k->sc)[fr->node];
    if (!fr->obj)
        return n->items;
    if (n->map != NONE)
        return n->map;
    return fr->cur < n->n_props ? props_of(k->sc)[n->props + fr->cur].node : NONE;
}

/* A value begins with byte c. */
static bool value_begins(lms_jschk *k, unsigned char c, bool container)
{
    int kind = c == '{' ? K_OBJ : c == '[' ? K_ARR : c == '"' ? K_STR : c == 't' || c == 'f' ? K_BOOL
               : c == 'n' ? K_NULL : K_NUM;
    int id = expected_node(k);
    if (id != NONE) {
        const js_node *n = &nodes_of(k->sc)[id];
        const int want = kind == K_NUM ? (K_NUM | K_INT) : kind;
        if (!(n->kinds & want))
            return false;
        int a = n->alt[kind_bit(kind == K_NUM && !(n->kinds & K_NUM) ? K_INT : kind)];
        if (a != NONE)
            id = a, n = &nodes_of(k->sc)[id];
        if (n->any)
            id = NONE;
    }
    if (container) {
        if (k->depth >= LMS_JS_DEPTH)
            return false;
        k->fr[k->depth++] = (lms_jsframe){0, (int16_t)id, 0, 0, 0, 0xff, c == '{'};
        return true;
    }
    k->vnode = (int16_t)id;
    k->vpos = 0;
    k->vint = false;
    k->vcand = 0;
    k->vlen = 0;
    k->vesc = 0;
    k->vhi = false;
    k->vhex = 0;
    k->vneg = false;
    k->vkind = (uint8_t)kind;
    k->vslen = 0;
    k->vpat_dirty = false;
    k->vhigh = 0;
    k->vni = 0;
    k->vnf = 0xff;
    k->vval = 0.0;
    if (id != NONE) {
        const js_node *n = &nodes_of(k->sc)[id];
        k->vint = kind == K_NUM && !(n->kinds & K_NUM);
        k->vcand = enum_range(0, (uint32_t)n->n_enum);
    }
    return true;
}

/* cand without the texts (t[i], or the names of props p[i]) whose byte
 * pos is not c */
static uint64_t narrow(const lms_jschema *sc, uint64_t cand, const js_text *t, const js_prop *p,
                       int n, uint16_t pos, unsigned char c)
{
    for (int i = 0; i < n; i++) {
        const js_text *x = t ? &t[i] : &p[i].name;
        if ((cand >> i & 1) && (x->len <= pos || (unsigned char)bytes_of(sc)[x->off + pos] != c))
            cand &= ~((uint64_t)1 << i);
    }
    return cand;
}

/* One more character of a string held to at most n->max_len. */
static bool str_char(lms_jschk *k, const js_node *n)
{
    if (k->vlen >= n->max_len)
        return false;
    k->vlen++;
    return true;
}

/* Appends n bytes of decoded text to a pattern string's buffer. */
static bool pat_put(lms_jschk *k, const js_node *n, const char *p, int len)
{
    if (n->pattern == NONE)
        return true;
    if (k->vslen + len > LMS_JS_PATTERN_TEXT)
        return false;
    memcpy(k->vs + k->vslen, p, (size_t)len);
    k->vslen = (uint8_t)(k->vslen + len);
    k->vpat_dirty = true;
    return true;
}

/* Code point cp as UTF-8 into the pattern buffer. */
static bool pat_put_cp(lms_jschk *k, const js_node *n, uint32_t cp)
{
    char u[4];
    int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (len == 1)
        u[0] = (char)cp;
    else {
        for (int i = len - 1; i > 0; i--, cp >>= 6)
            u[i] = (char)(0x80 | (cp & 0x3F));
        u[0] = (char)((len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0) | cp);
    }
    return pat_put(k, n, u, len);
}

/* Whether the pattern string read so far matches (whole: at its closing
 * quote) or can still be extended to match (a prefix; anchored patterns
 * only: an unanchored one can always end with a match). */
static bool pattern_ok(lms_jschk *k, const js_node *n, bool whole)
{
    k->vpat_dirty = false;
    if (!whole && !n->pat_anchored)
        return true;
    size_t len = k->vslen;
    if (!whole) { /* leave out a character whose UTF-8 bytes have not all come */
        for (size_t back = 1; back <= 3 && back <= len; back++) {
            const unsigned char b = (unsigned char)k->vs[len - back];
            if ((b & 0xC0) == 0x80)
                continue;
            const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
            if (need > back)
                len -= back;
            break;
        }
    }
    pcre2_match_context *mctx;
    pcre2_code *re = pattern_code(n->pattern, &mctx);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return false;
    const int rc = pcre2_match(re, (PCRE2_SPTR)k->vs, len, 0, whole ? 0 : PCRE2_PARTIAL_HARD, md,
                               mctx);
    pcre2_match_data_free(md);
    return rc >= 0 || (!whole && rc == PCRE2_ERROR_PARTIAL);
}

/* A byte of a string (its quotes included) under length limits or a
 * pattern. */
static bool string_byte(lms_jschk *k, const js_node *n, unsigned char c)
{
    if (k->vpos == 0) /* the opening quote */
        return true;
    if (k->vesc == 1) { /* after a backslash */
        k->vesc = c == 'u' ? 2 : 0;
        k->vhex = 0;
        if (c == 'u')
            return true;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = strchr(from, c);
        k->vhi = false;
        return str_char(k, n) && pat_put(k, n, e ? &to[e - from] : (const char *)&c, 1);
    }
    if (k->vesc >= 2) { /* a \u digit (the syntax checker saw it is hex) */
        const int d = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
        k->vhex = (uint16_t)(k->vhex * 16 + d);
        if (++k->vesc < 6)
            return true;
        k->vesc = 0;
        const bool low = k->vhex >= 0xDC00 && k->vhex <= 0xDFFF;
        if (low && k->vhi) { /* ends the pair its high half counted */
            k->vhi = false;
            return pat_put_cp(k, n, 0x10000 + (((uint32_t)k->vhigh - 0xD800) << 10) +
                                        (k->vhex - 0xDC00));
        }
        k->vhi = k->vhex >= 0xD800 && k->vhex <= 0xDBFF;
        k->vhigh = k->vhex;
        if (!str_char(k, n))
            return false;
        /* a high half waits for its low half; a lone half becomes U+FFFD */
        return k->vhi || pat_put_cp(k, n, low ? 0xFFFD : k->vhex);
    }
    if (c == '\\') {
        k->vesc = 1;
        /* at the limit only the low half of a pair may follow */
        return k->vlen < n->max_len || k->vhi;
    }
    if (c == '"') /* the closing quote */
        return k->vlen >= n->min_len && (n->pattern == NONE || pattern_ok(k, n, true));
    if ((c & 0xC0) == 0x80) /* a UTF-8 continuation byte */
        return pat_put(k, n, (const char *)&c, 1);
    k->vhi = false;
    return str_char(k, n) && pat_put(k, n, (const char *)&c, 1);
}

/* Whether some number between a and b (each end included when its flag
 * says) meets n's bounds; integers only when whole. */
static bool range_meets(const js_node *n, double a, bool a_in, double b, bool b_in, bool whole)
{
    double lo = -INFINITY, hi = INFINITY;
    bool lo_in = true, hi_in = true;
    if (n->bounds & B_LO)
        lo = n->lo, lo_in = !(n->bounds & B_LO_EXCL);
    if (n->bounds & B_HI)
        hi = n->hi, hi_in = !(n->bounds & B_HI_EXCL);
    if (whole) { /* the first and last integers of each set */
        const double f1 = ceil(a) + (!a_in && ceil(a) == a), l1 = floor(b) - (!b_in && floor(b) == b);
        const double f2 = ceil(lo) + (!lo_in && ceil(lo) == lo),
                     l2 = floor(hi) - (!hi_in && floor(hi) == hi);
        return fmax(f1, f2) <= fmin(l1, l2);
    }
    const double x = fmax(a, lo), y = fmin(b, hi);
    const bool x_in = a > lo ? a_in : a < lo ? lo_in : a_in && lo_in;
    const bool y_in = b < hi ? b_in : b > hi ? hi_in : b_in && hi_in;
    return x < y || (x == y && x_in && y_in);
}

#define NUM_DIGITS 15 /* significant digits a bounded number may have (exact in a double) */

/* Whether the number read so far can still end within n's bounds. Its
 * completions: with a fraction begun, [v, v + 10^-digits); before the
 * point, for each count c of integer digits still to come, [i 10^c,
 * (i + 1) 10^c) (the point and a fraction may follow); mirrored when
 * negative. */
static bool number_feasible(const lms_jschk *k, const js_node *n)
{
    if (k->vni == 0) /* "-" alone */
        return range_meets(n, -INFINITY, false, 0.0, true, k->vint);
    if (k->vnf != 0xff) {
        const double v = k->vval / pow(10.0, k->vnf), w = pow(10.0, -(double)k->vnf);
        return k->vneg ? range_meets(n, -(v + w), false, -v, true, false)
                       : range_meets(n, v, true, v + w, false, false);
    }
    const int more_max = k->vval == 0.0 ? 0 : NUM_DIGITS - k->vni; /* no digit after a leading 0 */
    double scale = 1.0;
    for (int more = 0; more <= more_max; more++, scale *= 10.0) {
        const double a = k->vval * scale, b = (k->vval + 1.0) * scale;
        if (k->vneg ? range_meets(n, -b, false, -a, true, k->vint)
                    : range_meets(n, a, true, b, false, k->vint))
            return true;
        if (k->vneg ? (n->bounds & B_LO) && -a < n->lo : (n->bounds & B_HI) && a > n->hi)
            break; /* more digits only go further out */
    }
    return false;
}

/* A byte of a number under bounds (written without an exponent then). */
static bool number_byte(lms_jschk *k, const js_node *n, unsigned char c)
{
    if (c == 'e' || c == 'E')
        return false;
    if (c == '-') {
        k->vneg = true;
        return number_feasible(k, n);
    }
    if (c == '.') {
        k->vnf = 0;
        return number_feasible(k, n);
    }
    if (k->vni + (k->vnf == 0xff ? 0 : k->vnf) >= NUM_DIGITS)
        return false;
    k->vval = k->vval * 10.0 + (c - '0');
    if (k->vnf != 0xff)
        k->vnf++;
    else
        k->vni++;
    return number_feasible(k, n);
}

/* The number read, once it ended, within n's bounds. */
static bool number_in_bounds(const lms_jschk *k, const js_node *n)
{
    double v = k->vval / (k->vnf == 0xff ? 1.0 : pow(10.0, k->vnf));
    v = k->vneg ? -v : v;
    return range_meets(n, v, true, v, true, false);
}

/* A byte of the scalar being read. */
static bool scalar_byte(lms_jschk *k, unsigned char c)
{
    if (k->vnode == NONE)
        return true;
    const js_node *n = &nodes_of(k->sc)[k->vnode];
    if (k->vint && (c == '.' || c == 'e' || c == 'E'))
        return false;
    if (k->vkind == K_STR && (n->min_len || n->max_len != UINT32_MAX || n->pattern != NONE) &&
        !string_byte(k, n, c))
        return false;
    if (k->vkind == K_NUM && n->bounds && !number_byte(k, n, c))
        return false;
    if (n->n_enum) {
        k->vcand = enum_narrow(k->sc, k->vcand, &texts_of(k->sc)[n->enums], k->vpos, c);
        if ((uint32_t)k->vcand >= (uint32_t)(k->vcand >> 32))
            return false;
    }
    k->vpos++;
    return true;
}

/* The value in the top container (or the top-level one) is complete. */
static void value_done(lms_jschk *k)
{
    if (k->depth == 0)
        return;
    lms_jsframe *fr = &k->fr[k->depth - 1];
    fr->count++;
    fr->cur = 0xff;
}

/* The scalar being read ends. */
static bool scalar_ends(lms_jschk *k)
{
    if (k->vnode != NONE) {
        const js_node *n = &nodes_of(k->sc)[k->vnode];
        if (k->vkind == K_NUM && n->bounds && !number_in_bounds(k, n))
            return false;
        if (n->n_enum) {
            const js_text *t = &texts_of(k->sc)[n->enums];
            const uint32_t lo = (uint32_t)k->vcand, hi = (uint32_t)(k->vcand >> 32);
            if (lo >= hi || t[lo].len != k->vpos)
                return false;
        }
    }
    k->vnode = NONE;
    value_done(k);
    return true;
}

/* The properties a key may name next: from `next` up to the first
 * required one (optional ones may be skipped, required ones not). */
static uint64_t keys_allowed(const js_node *n, const js_prop *p, int next, int count)
{
    uint64_t m = 0;
    for (int i = next; i < n->n_props; i++) {
        if (count + (n->n_props - i) < n->min_props)
            break; /* skipping to i would leave too few properties for minProperties */
        m |= (uint64_t)1 << i;
        if (p[i].required)
            break;
    }
    return m;
}

static bool required_left(const js_node *n, const js_prop *p, int next)
{
    for (int i = next; i < n->n_props; i++)
        if (p[i].required)
            return true;
    return false;
}

/* Schema checks of the structural byte c (after any scalar it ended). */
static bool structural(lms_jschk *k, unsigned char c, int old_depth, int new_depth,
                       int new_phase)
{
    if (new_depth < old_depth) { /* c closed the top container */
        const lms_jsframe *fr = &k->fr[k->depth - 1];
        if (fr->node != NONE) {
            const js_node *n = &nodes_of(k->sc)[fr->node];
            if (c == '}' && n->map == NONE && required_left(n, props_of(k->sc) + n->props, fr->next))
                return false;
            if (c == '}' && fr->count < n->min_props)
                return false;
            if (c == ']' && fr->count < n->min_items)
                return false;
        }
        k->depth--;
        value_done(k);
        return true;
    }
    if (c == ',' && k->depth > 0) {
        const lms_jsframe *fr = &k->fr[k->depth - 1];
        if (fr->node == NONE)
            return true;
        const js_node *n = &nodes_of(k->sc)[fr->node];
        if (new_phase == LMS_JSON_PH_VALUE) /* in an array */
            return fr->count < n->max_items;
        return fr->count < n->max_props && (n->map != NONE || fr->next < n->n_props);
    }
    return true;
}

/* The top container's node when it is an object of named properties;
 * NULL when its keys are free (no schema, or a map). */
static const js_node *named_object(const lms_jschk *k)
{
    const lms_jsframe *fr = &k->fr[k->depth - 1];
    if (fr->node == NONE)
        return NULL;
    const js_node *n = &nodes_of(k->sc)[fr->node];
    return n->map == NONE ? n : NULL;
}

static bool key_byte(lms_jschk *k, unsigned char c, bool first)
{
    lms_jsframe *fr = &k->fr[k->depth - 1];
    if (first && fr->node != NONE && fr->count >= nodes_of(k->sc)[fr->node].max_props)
        return false; /* maxProperties reached (the first key of an object of at most 0) */
    const js_node *n = named_object(k);
    if (!n)
        return true;
    const js_prop *p = props_of(k->sc) + n->props;
    if (first) { /* the opening quote */
        fr->cand = keys_allowed(n, p, fr->next, fr->count);
        fr->pos = 0;
        return fr->cand != 0;
    }
    fr->cand = narrow(k->sc, fr->cand, NULL, p, n->n_props, fr->pos, c);
    fr->pos++;
    return fr->cand != 0;
}

/* The closing quote of a key: it must be a whole property name. */
static bool key_ends(lms_jschk *k)
{
    lms_jsframe *fr = &k->fr[k->depth - 1];
    const js_node *n = named_object(k);
    if (!n)
        return true;
    const js_prop *p = props_of(k->sc) + n->props;
    for (int i = 0; i < n->n_props; i++)
        if ((fr->cand >> i & 1) && p[i].name.len == fr->pos) {
            fr->cur = (uint8_t)i;
            fr->next = (uint8_t)(i + 1);
            return true;
        }
    return false;
}

static bool step(lms_jschk *k, unsigned char c)
{
    const int op = lms_jsonfsm_phase(&k->f), od = k->f.depth;
    if (!lms_jsonfsm_feed(&k->f, (const char *)&c, 1))
        return false;
    if (!k->sc)
        return true;
    const int np = lms_jsonfsm_phase(&k->f), nd = k->f.depth;
    const bool was_scalar = op == LMS_JSON_PH_STRING || op == LMS_JSON_PH_NUMBER ||
                            op == LMS_JSON_PH_LITERAL;
    const bool is_scalar = np == LMS_JSON_PH_STRING || np == LMS_JSON_PH_NUMBER ||
                           np == LMS_JSON_PH_LITERAL;
    if (op == LMS_JSON_PH_VALUE && nd > od) /* a container opens */
        return value_begins(k, c, true);
    if (op == LMS_JSON_PH_VALUE && is_scalar) /* a scalar begins */
        return value_begins(k, c, false) && scalar_byte(k, c);
    if (was_scalar && is_scalar)
        return scalar_byte(k, c);
    if (was_scalar) { /* it ended: a string or literal with c, a number before c */
        if (op != LMS_JSON_PH_NUMBER && !scalar_byte(k, c))
            return false;
        if (!scalar_ends(k))
            return false;
        return op != LMS_JSON_PH_NUMBER || structural(k, c, od, nd, np);
    }
    if (np == LMS_JSON_PH_KEY)
        return key_byte(k, c, op != LMS_JSON_PH_KEY);
    if (op == LMS_JSON_PH_KEY) /* the closing quote */
        return key_ends(k);
    return structural(k, c, od, nd, np);
}

bool lms_jschk_feed(lms_jschk *k, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!step(k, (unsigned char)p[i]))
            return false;
    /* a pattern looks at a string's new text once per piece (a token's
     * bytes), not per byte: a prefix it refuses cannot be mended by more */
    if (k->vpat_dirty && k->vnode != NONE)
        return pattern_ok(k, &nodes_of(k->sc)[k->vnode], false);
    return true;
}
