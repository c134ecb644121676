/*
 * template_impl.h - internals of the chat-template engine (a Jinja2 subset).
 *
 * Pipeline, one file per stage (internal prefix tpl_):
 *
 *   source --template_lex.c--> tokens --template_parse.c--> AST (tpl_node)
 *   AST + variables --template_eval.c--> text
 *
 *   template_value.c    arena, values (tpl_val), lists, dicts, str()/repr(),
 *                       equality and ordering, tojson, UTF-8 and code points
 *   template_filters.c  the |filters and `is` tests
 *   template_methods.c  Python methods of str/dict/list, case mapping,
 *                       global functions (namespace, range, strftime_now, ...)
 *   template_builtin.c  templates shipped with lmserv (chatml, llama3, ...)
 *   template.c          the public API of template.h, JSON -> values
 *
 * The reference is jinja2 3.1 as Hugging Face transformers configures it
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
 * json.dumps-based tojson). Where Python semantics show through (str methods,
 * truthiness, repr, integer division) we copy Python.
 *
 * Memory: a parsed template owns one arena (AST, literals). A render owns
 * another arena for every value it creates; nothing is freed before the
 * render ends, so values can share and alias freely (lists and dicts are
 * reference objects, as in Python). The arena has a byte cap, which is how
 * the memory limit of a render is enforced.
 */
#ifndef LMS_TEMPLATE_IMPL_H
#define LMS_TEMPLATE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/template.h"

/* Returns from the calling function when x (an int status) is an error. */
#define TPL_TRY(x)                                                                                 \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_ < 0)                                                                               \
            return rc_;                                                                            \
    } while (0)

/* ---- arena ---------------------------------------------------------------- */

typedef struct tpl_chunk tpl_chunk;

typedef struct tpl_arena {
    tpl_chunk *head;
    size_t used_bytes; /* sum of chunk sizes */
    size_t cap_bytes;  /* allocation fails past this (0 = no cap) */
    bool hit_cap;      /* an allocation failed because of cap_bytes */
} tpl_arena;

void tpl_arena_init(tpl_arena *a, size_t cap_bytes);
void tpl_arena_deinit(tpl_arena *a);
/* Zeroed, max-aligned memory; NULL when out of memory or over the cap. */
void *tpl_alloc(tpl_arena *a, size_t n);
/* Copy of n bytes plus a NUL terminator; NULL on failure. */
char *tpl_strdup(tpl_arena *a, const char *p, size_t n);

/* ---- growable byte buffer (malloc-backed, capped) -------------------------- */

typedef struct tpl_buf {
    char *p;
    size_t n, cap;
    size_t max_bytes; /* appends fail beyond this */
} tpl_buf;

/* 0 ok, LMS_ERR_NOMEM, or LMS_ERR_LIMIT past max_bytes. */
int tpl_buf_put(tpl_buf *b, const char *p, size_t n);
int tpl_buf_putc(tpl_buf *b, char c);
int tpl_buf_printf(tpl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tpl_buf_free(tpl_buf *b);

/* ---- values ---------------------------------------------------------------- */

enum tpl_type {
    TPL_UNDEF, /* jinja2 Undefined: prints "", falsy, iterates empty */
    TPL_NONE,
    TPL_BOOL,
    TPL_INT,
    TPL_FLOAT,
    TPL_STR,  /* UTF-8 bytes, immutable */
    TPL_LIST, /* also tuples (flag TPL_F_TUPLE, only changes repr) */
    TPL_DICT, /* insertion ordered */
    TPL_NS,   /* namespace(): a dict whose entries are attributes */
    TPL_MACRO,
    TPL_FUNC,   /* a global function (namespace, range, ...) */
    TPL_METHOD, /* a bound method: "abc".upper, d.items, loop.cycle */
    TPL_LOOP,   /* the `loop` variable of a for loop */
    TPL_N_TYPES
};

#define TPL_F_TUPLE 1 /* list shown as (a, b) */
#define TPL_F_UNSAFE                                                                               \
    2                   /* undefined standing for a method the sandbox forbids                     \
                         * (list.append, dict.pop, ...): using it raises */
#define TPL_F_ELEMENT 4 /* undefined from a missing list index (name: the index) */
#define TPL_F_GEN                                                                                  \
    8 /* list standing for the generator that select/reject/map return: always                 \
       * true, no len(), no index, not JSON, and iterating uses it up */
#define TPL_F_SAFE                                                                                 \
    16 /* str marked safe (markupsafe.Markup, from |safe or |escape): `+` with a                \
        * plain str HTML-escapes the plain one and stays safe */
#define TPL_F_GROUP 32 /* (grouper, list) tuple from |groupby: has those two attributes */

typedef struct tpl_list tpl_list;
typedef struct tpl_dict tpl_dict;
typedef struct tpl_macro tpl_macro;
typedef struct tpl_method tpl_method;
typedef struct tpl_loop tpl_loop;

typedef struct tpl_val {
    uint8_t type;  /* enum tpl_type */
    uint8_t flags; /* TPL_F_* */
    uint8_t owner; /* TPL_UNDEF only: type of the object that lacked the
                    * attribute, or TPL_N_TYPES for an unknown name */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* STR: text; UNDEF: the missing name (may be NULL) */
            size_t n;
        } s;
        tpl_list *l;
        tpl_dict *d; /* DICT and NS */
        tpl_macro *m;
        int fn; /* FUNC: enum tpl_func */
        tpl_method *meth;
        tpl_loop *loop;
    } u;
} tpl_val;

struct tpl_list {
    tpl_val *items;
    size_t n, cap;
    size_t taken; /* TPL_F_GEN only: items already yielded */
};

struct tpl_dict {
    tpl_val *keys; /* any hashable value; in practice strings */
    tpl_val *vals;
    size_t n, cap;
};

struct tpl_method {
    tpl_val self;
    const char *name; /* static string from the method table */
    int id;           /* index in that table */
};

/* Constructors for scalar values. */
tpl_val tpl_undef(const char *name, size_t n, int owner);
tpl_val tpl_none(void);
tpl_val tpl_bool(bool b);
tpl_val tpl_int(int64_t i);
tpl_val tpl_float(double f);
tpl_val tpl_str(const char *p, size_t n); /* borrows p: must outlive the render */
tpl_val tpl_cstr(const char *p);          /* same, for static C strings */

tpl_list *tpl_list_new(tpl_arena *a, size_t cap);
int tpl_list_push(tpl_arena *a, tpl_list *l, tpl_val v);
tpl_dict *tpl_dict_new(tpl_arena *a, size_t cap);
/* Index of key or -1. */
long tpl_dict_find(const tpl_dict *d, tpl_val key);
long tpl_dict_find_str(const tpl_dict *d, const char *p, size_t n);
/* Inserts or replaces (keeps the original position, as Python does). */
int tpl_dict_set(tpl_arena *a, tpl_dict *d, tpl_val key, tpl_val v);
/* Adds a key known to be absent (no search: for JSON objects, whose keys
 * are unique, so that converting a large one stays linear). */
int tpl_dict_append(tpl_arena *a, tpl_dict *d, tpl_val key, tpl_val v);
tpl_val tpl_list_val(tpl_list *l);
tpl_val tpl_dict_val(tpl_dict *d);

bool tpl_truthy(tpl_val v);
bool tpl_is_number(tpl_val v); /* int, float or bool (Python's bool is an int) */
double tpl_as_double(tpl_val v);
/* Python ==, deep for lists and dicts. */
bool tpl_equal(tpl_val a, tpl_val b);
/* Python <: sets *lt; returns false when the types do not order. */
bool tpl_less(tpl_val a, tpl_val b, bool *lt);
const char *tpl_type_name(tpl_val v); /* Python's name: "str", "dict", ... */

/* str(v) appended to b (undefined prints nothing); repr(v) likewise. */
int tpl_write_str(tpl_buf *b, tpl_val v);
int tpl_write_repr(tpl_buf *b, tpl_val v);
/* Python json.dumps(v, ensure_ascii=False, indent, separators, sort_keys).
 * indent < 0 means None. On an unserialisable value returns LMS_ERR_FORMAT
 * and writes its type name to *bad. */
typedef struct tpl_json_opts {
    int indent;           /* spaces, or -1 for a single line */
    const char *indent_str; /* with indent >= 0: this text per level instead of spaces */
    const char *item_sep; /* NULL = "," with indent, ", " without */
    const char *key_sep;  /* NULL = ": " */
    bool sort_keys;
    bool ensure_ascii; /* escape non-ASCII as \uXXXX */
} tpl_json_opts;
int tpl_write_json(tpl_buf *b, tpl_val v, const tpl_json_opts *o, int depth, const char **bad);
/* Python float repr: shortest text that reads back to the same double. */
int tpl_write_float(tpl_buf *b, double f);

/* Number of code points of a UTF-8 string / byte offset of code point i
 * (clamped to n). */
size_t tpl_utf8_len(const char *p, size_t n);
size_t tpl_utf8_offset(const char *p, size_t n, size_t i);
/* The code point at p (n > 0 bytes) and its length; an invalid byte
 * decodes as itself with length 1. */
uint32_t tpl_utf8_decode(const char *p, size_t n, size_t *len);
/* Writes cp as UTF-8 (1-4 bytes; surrogates become U+FFFD); returns the length. */
size_t tpl_utf8_put(char *o, uint32_t cp);
/* Python's str.isspace() for one code point. */
bool tpl_cp_is_space(uint32_t cp);
/* Python's str.isprintable() for one code point (approximate outside the
 * ranges templates meet: controls, spaces, format characters). */
bool tpl_cp_is_printable(uint32_t cp);
/* A character of Python's regex \w (letters, digits, underscore). */
bool tpl_cp_is_word(uint32_t cp);

/* ---- AST ------------------------------------------------------------------ */

/*
 * One node type for statements and expressions. Field use per kind
 * (name is n->name, value is n->value):
 *
 *   kind         name        value       a          b          c        kids
 *   -----------  ----------  ----------  ---------  ---------  -------  ------------------
 *   N_BLOCK                                                             statements
 *   N_TEXT                   STR text
 *   N_OUTPUT                             expr
 *   N_IF                                 cond       then       else*
 *   N_FOR                                iterable   body       else*    [0] if-filter*,
 *                                                                       [1..] targets
 *                                                                       (op 1: recursive)
 *   N_SET                                expr       target
 *   N_SETBLOCK                           target     body       filters
 *   N_MACRO      macro                              body                N_PARAM...  (op: TPL_MACRO_*)
 *   N_PARAM      parameter               default*
 *   N_FILTERBLK                          filters    body
 *   N_WITH                                          body                N_SET...
 *   N_CALLBLOCK                          N_CALL     N_MACRO "caller" (params, body)
 *   N_BREAK, N_CONTINUE
 *   N_CONST                  the value
 *   N_NAME       variable
 *   N_ATTR       attribute               object
 *   N_ITEM                               object     key
 *   N_SLICE                              object     start*     stop*    [0] step*
 *   N_CALL                               callee                         args
 *   N_KWARG      keyword                 value
 *   N_FILTER     filter      INT id      input                          args
 *   N_TEST       test        INT id      input                          args   (op 1: is not)
 *   N_UNARY                              operand                                (op: NEG, POS)
 *   N_BINARY                             left       right               (op: ADD ... CONCAT)
 *   N_COMPARE                            first                          N_CMPOP (op, a: rhs)
 *   N_AND, N_OR                          left       right
 *   N_NOT                                operand
 *   N_COND                               then       cond       else*
 *   N_LIST, N_TUPLE                                                     items
 *   N_DICT                                                              key, value, ...
 *   N_HOLE       the text a set block or {% filter %} block captured (input of its filters)
 *
 *   * may be NULL. A target is N_NAME, N_ATTR (ns.attr) or N_TUPLE of N_NAME.
 *   Filter and test ids are -1 when the name is unknown (an error if reached).
 */
enum tpl_node_kind {
    N_BLOCK,
    N_TEXT,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_PARAM,
    N_FILTERBLK,
    N_WITH,
    N_CALLBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_CONST,
    N_NAME,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_KWARG,
    N_FILTER,
    N_TEST,
    N_UNARY,
    N_BINARY,
    N_COMPARE,
    N_CMPOP,
    N_AND,
    N_OR,
    N_NOT,
    N_COND,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_HOLE
};

/* Operators (op field of N_UNARY, N_BINARY, N_CMPOP). */
enum tpl_op {
    OP_NONE,
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_NEG,
    OP_POS
};

typedef struct tpl_node tpl_node;
struct tpl_node {
    uint8_t kind; /* enum tpl_node_kind */
    uint8_t op;   /* enum tpl_op, or a flag (see table) */
    int line, col;
    const char *name; /* NUL-terminated, in the template arena */
    size_t name_n;
    tpl_val value;
    tpl_node *a, *b, *c;
    tpl_node **kids;
    size_t n_kids;
};

/* A parsed template (the opaque lms_template of template.h). */
struct lms_template {
    tpl_arena arena; /* nodes, names and literals */
    tpl_node *root;  /* N_BLOCK */
};

/* ---- lexer ---------------------------------------------------------------- */

enum tpl_tok_kind {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP
};

typedef struct tpl_token {
    uint8_t kind; /* enum tpl_tok_kind */
    int line, col;
    const char *p; /* DATA: text; NAME/OP: spelling; STRING: decoded value */
    size_t n;
    int64_t i; /* INT */
    double f;  /* FLOAT */
} tpl_token;

typedef struct tpl_tokens {
    tpl_token *v;
    size_t n, cap;
} tpl_tokens;

/* Tokenises a template (whitespace control applied to DATA tokens). Tokens
 * and decoded strings live in arena a. */
int tpl_lex(tpl_arena *a, const char *src, size_t n, tpl_tokens *out, char *err, size_t errsz);

/* Builds the AST from tokens (into t->arena). */
int tpl_parse(lms_template *t, const tpl_tokens *toks, char *err, size_t errsz);

/* ---- evaluation ----------------------------------------------------------- */

typedef struct tpl_scope tpl_scope;
struct tpl_scope {
    tpl_scope *parent;
    tpl_dict vars; /* name -> value */
};

/* What a macro body refers to, so that calls may pass more (jinja2 decides
 * the same way): extra positional arguments become `varargs`, unknown
 * keywords `kwargs`, and a `caller` keyword is accepted. */
#define TPL_MACRO_VARARGS 1
#define TPL_MACRO_KWARGS  2
#define TPL_MACRO_CALLER  4 /* takes `caller` ({% call %} passes it) */

struct tpl_macro {
    const tpl_node *def; /* N_MACRO */
    tpl_scope *closure;  /* where it was defined */
};

struct tpl_loop {
    tpl_list *items; /* what is iterated (after the loop's if-filter) */
    size_t index0;
    int depth;
    const tpl_node *recursive; /* the N_FOR of a `recursive` loop: loop(seq) reruns it */
    tpl_scope *outer;          /* the scope that loop started in */
    tpl_val last_changed; /* for loop.changed() */
    bool has_changed;
};

/* Render state. Error strings are written once (the first error wins). */
typedef struct tpl_ctx {
    tpl_arena arena;  /* every value made during the render */
    tpl_buf *out;     /* where text goes now (macros capture into their own) */
    tpl_scope *scope; /* innermost scope */
    const lms_template_vars *vars;
    lms_template_limits lim;
    int64_t n_iters;     /* loop iterations so far */
    int64_t n_steps;     /* node evaluations, for the clock check */
    int64_t deadline_ms; /* monotonic, 0 = none */
    int depth;           /* macro call depth */
    int nest;            /* eval/exec recursion depth (stack guard) */
    tpl_val hole;        /* input of the filters of a set/filter block */
    bool failed;         /* an error message is in err: keep it */
    char *err;
    size_t errsz;
} tpl_ctx;

/* Reports an error at node n (line:col prefix) and returns code. */
int tpl_fail(tpl_ctx *c, const tpl_node *n, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reports an out-of-memory or limit error from a failed allocation. */
int tpl_fail_nomem(tpl_ctx *c, const tpl_node *n);
/* Renders root with the given variables into c->out. */
int tpl_render(tpl_ctx *c, const tpl_node *root);
/* Calls any callable value (macro, function, method). */
int tpl_call_value(tpl_ctx *c, const tpl_node *at, tpl_val fn, const tpl_val *args, size_t n_args,
                   const tpl_val *kw_names, const tpl_val *kw_vals, size_t n_kw, tpl_val *out);
/* x.name following jinja2: attribute first, then item (dicts: keys). */
int tpl_getattr(tpl_ctx *c, const tpl_node *at, tpl_val obj, const char *name, size_t n,
                tpl_val *out);
/* x[key] following jinja2: item first, then attribute; misses are undefined. */
int tpl_getitem(tpl_ctx *c, const tpl_node *at, tpl_val obj, tpl_val key, tpl_val *out);
/* The items of an iterable (list, dict keys, string characters, undefined
 * gives none). Fails on other types. */
int tpl_iterate(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_list **out);
/* str(v) as a string value in the render arena. */
int tpl_to_str(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_val *out);
/* Raises jinja2's UndefinedError for v. */
int tpl_fail_undefined(tpl_ctx *c, const tpl_node *at, tpl_val v);
/* Counts an operation against the time budget; fails past the deadline. */
int tpl_tick(tpl_ctx *c, const tpl_node *at);
/* New string value of n bytes (uninitialised contents, NUL-terminated). */
int tpl_new_str(tpl_ctx *c, const tpl_node *at, size_t n, char **p, tpl_val *out);
/* A new list value holding a copy of v[0..n). */
int tpl_list_from_vals(tpl_ctx *c, const tpl_node *at, const tpl_val *v, size_t n, tpl_val *out);

/* Arguments of a built-in call, bound Python-style by position or keyword. */
typedef struct tpl_args {
    const tpl_val *pos;
    size_t n_pos;
    const tpl_val *kw_names;
    const tpl_val *kw_vals;
    size_t n_kw;
} tpl_args;

/* Fetches argument `name` (position i); false when absent. */
bool tpl_arg(const tpl_args *a, size_t i, const char *name, tpl_val *out);
/* Fails unless the arguments fit `params`, comma-separated parameter names
 * ("d,attribute"): at most that many positional, keywords among them. */
int tpl_args_check(tpl_ctx *c, const tpl_node *at, const tpl_args *a, const char *what,
                   const char *params);

/* Filters and tests (template_filters.c). Lookup returns -1 when unknown. */
int tpl_filter_find(const char *name);
int tpl_filter_apply(tpl_ctx *c, const tpl_node *at, int id, tpl_val in, const tpl_args *a,
                     tpl_val *out);
int tpl_test_find(const char *name);
int tpl_test_apply(tpl_ctx *c, const tpl_node *at, int id, tpl_val in, const tpl_args *a,
                   bool *out);

/* Global functions and methods (template_methods.c). */
enum tpl_func { FN_NAMESPACE, FN_RANGE, FN_DICT, FN_RAISE, FN_STRFTIME, FN_COUNT };
const char *tpl_func_name(int fn);
int tpl_func_call(tpl_ctx *c, const tpl_node *at, int fn, const tpl_args *a, tpl_val *out);
/* The method `name` of obj: 1 and *out set (a bound method, or an unsafe
 * undefined for mutating methods), 0 when obj has no such method, < 0 on
 * error. */
int tpl_method_find(tpl_ctx *c, const tpl_node *at, tpl_val obj, const char *name, size_t n,
                    tpl_val *out);
int tpl_method_call(tpl_ctx *c, const tpl_node *at, const tpl_method *m, const tpl_args *a,
                    tpl_val *out);

/* Python str methods shared by filters and methods (template_methods.c). */
int tpl_str_strip(tpl_ctx *c, const tpl_node *at, tpl_val s, tpl_val chars, int sides,
                  tpl_val *out); /* sides: 1 left, 2 right, 3 both */
int tpl_str_replace(tpl_ctx *c, const tpl_node *at, tpl_val s, tpl_val from, tpl_val to,
                    int64_t count, tpl_val *out);
/* str.upper/lower/title/capitalize, and jinja2's |title filter (words
 * start only after whitespace or one of "-({[<"). */
enum { TPL_CASE_UPPER, TPL_CASE_LOWER, TPL_CASE_TITLE, TPL_CASE_CAPITALIZE, TPL_CASE_JTITLE };
int tpl_str_case(tpl_ctx *c, const tpl_node *at, tpl_val s, int mode, tpl_val *out);
/* Python's str.isupper() (upper) or str.islower() on the string s. */
bool tpl_str_is_case(tpl_val s, bool upper);
/* Python's "fmt % args" (args: a tuple, or one value). */
int tpl_str_format(tpl_ctx *c, const tpl_node *at, tpl_val fmt, tpl_val args, tpl_val *out);
/* dict.items(): a list of (key, value) tuples. */
int tpl_dict_items(tpl_ctx *c, const tpl_node *at, const tpl_dict *d, tpl_val *out);
/* Turns a buffer into a string value and frees it; rc is the status of
 * the writes into b (mapped to an error message when < 0). */
/* markupsafe.escape(v): str(v) with &<>"' as entities, marked safe; a safe
 * string comes back as it is. */
int tpl_escape_html(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_val *out);
int tpl_buf_finish(tpl_ctx *c, const tpl_node *at, tpl_buf *b, int rc, tpl_val *out);

#endif
