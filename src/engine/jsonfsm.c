/*
 * jsonfsm.c - the JSON-mode checker (jsonfsm.h): a pushdown automaton with
 * the container stack as a bit per level.
 *
 *   VALUE      a value is expected (at depth 0: only '{')
 *   OBJ_FIRST  after '{': a key or '}'
 *   OBJ_KEY    after ',' in an object: a key
 *   COLON      after a key: ':'
 *   ARR_FIRST  after '[': a value or ']'
 *   AFTER      after a value: ',' or the container's closing bracket
 *   STR, ESC, HEX         in a string, after '\', in "\uXXXX"
 *   LIT                   in true / false / null
 *   NUM_*                 in a number: -? (0 | [1-9][0-9]*) (. [0-9]+)?
 *                         ([eE] [+-]? [0-9]+)?
 *   DONE       the top-level object is closed: nothing more
 *
 * A number has no closing byte: in a state where it may end, any other
 * byte ends it and is then read in AFTER.
 */
#include "engine/jsonfsm.h"

enum {
    ST_VALUE,
    ST_OBJ_FIRST,
    ST_OBJ_KEY,
    ST_COLON,
    ST_ARR_FIRST,
    ST_AFTER,
    ST_STR,
    ST_ESC,
    ST_HEX,
    ST_LIT,
    ST_NUM_MINUS, /* after '-' */
    ST_NUM_ZERO,  /* a leading 0 (may end) */
    ST_NUM_INT,   /* integer digits (may end) */
    ST_NUM_DOT,   /* after '.' */
    ST_NUM_FRAC,  /* fraction digits (may end) */
    ST_NUM_E,     /* after 'e' */
    ST_NUM_ESIGN, /* after the exponent's sign */
    ST_NUM_EXP,   /* exponent digits (may end) */
    ST_DONE,
};

static const char *const literals[3] = {"true", "false", "null"};

void lms_jsonfsm_init(lms_jsonfsm *f)
{
    *f = (lms_jsonfsm){.st = ST_VALUE};
}

bool lms_jsonfsm_done(const lms_jsonfsm *f)
{
    return f->st == ST_DONE;
}

bool lms_jsonfsm_same(const lms_jsonfsm *a, const lms_jsonfsm *b)
{
    /* bits above the depth are left from closed containers */
    const uint64_t live = a->depth >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << a->depth) - 1;
    return a->depth == b->depth && ((a->objects ^ b->objects) & live) == 0 && a->st == b->st &&
           a->sub == b->sub && a->lit == b->lit && a->ws == b->ws && a->key == b->key;
}

int lms_jsonfsm_phase(const lms_jsonfsm *f)
{
    switch (f->st) {
    case ST_VALUE: case ST_ARR_FIRST: return LMS_JSON_PH_VALUE;
    case ST_STR: case ST_ESC: case ST_HEX: return f->key ? LMS_JSON_PH_KEY : LMS_JSON_PH_STRING;
    case ST_LIT: return LMS_JSON_PH_LITERAL;
    case ST_DONE: return LMS_JSON_PH_DONE;
    case ST_OBJ_FIRST: case ST_OBJ_KEY: case ST_COLON: case ST_AFTER: return LMS_JSON_PH_STRUCT;
    default: return LMS_JSON_PH_NUMBER;
    }
}

static bool is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A whitespace byte of a run: at most one newline (bit 7 of ws), no
 * carriage return, and LMS_JSON_WS_MAX bytes in all (bits 0-6): enough for
 * pretty-printing, too little for a model to pad its way along. */
static bool ws_byte(lms_jsonfsm *f, unsigned char c)
{
    if (c == '\r' || (c == '\n' && (f->ws & 0x80)))
        return false;
    if (c == '\n')
        f->ws |= 0x80;
    f->ws = (uint8_t)((f->ws & 0x80) | ((f->ws & 0x7f) + 1));
    return (f->ws & 0x7f) <= LMS_JSON_WS_MAX;
}

static bool top_is_object(const lms_jsonfsm *f)
{
    return (f->objects >> (f->depth - 1)) & 1;
}

static bool open_container(lms_jsonfsm *f, bool object)
{
    if (f->depth >= LMS_JSON_DEPTH_MAX)
        return false;
    if (object)
        f->objects |= (uint64_t)1 << f->depth;
    else
        f->objects &= ~((uint64_t)1 << f->depth);
    f->depth++;
    f->st = object ? ST_OBJ_FIRST : ST_ARR_FIRST;
    return true;
}

static void close_container(lms_jsonfsm *f)
{
    f->depth--;
    f->st = f->depth == 0 ? ST_DONE : ST_AFTER;
}

/* The first byte of a value (the state was VALUE or ARR_FIRST). */
static bool value_start(lms_jsonfsm *f, unsigned char c)
{
    if (f->depth == 0)
        return c == '{' && open_container(f, true);
    switch (c) {
    case '{': return open_container(f, true);
    case '[': return open_container(f, false);
    case '"': f->st = ST_STR; f->key = false; return true;
    case '-': f->st = ST_NUM_MINUS; return true;
    case '0': f->st = ST_NUM_ZERO; return true;
    case 't': f->lit = 0; break;
    case 'f': f->lit = 1; break;
    case 'n': f->lit = 2; break;
    default:
        if (c >= '1' && c <= '9') {
            f->st = ST_NUM_INT;
            return true;
        }
        return false;
    }
    f->st = ST_LIT;
    f->sub = 1;
    return true;
}

/* A structural byte after a value. */
static bool after_value(lms_jsonfsm *f, unsigned char c)
{
    if (c == ',') {
        f->st = top_is_object(f) ? ST_OBJ_KEY : ST_VALUE;
        return true;
    }
    if ((c == '}' && top_is_object(f)) || (c == ']' && !top_is_object(f))) {
        close_container(f);
        return true;
    }
    return false;
}

static bool step(lms_jsonfsm *f, unsigned char c)
{
    switch (f->st) {
    case ST_VALUE: case ST_OBJ_FIRST: case ST_OBJ_KEY:
    case ST_COLON: case ST_ARR_FIRST: case ST_AFTER:
        if (is_ws(c)) /* none before the object (as llama.cpp's JSON grammar) */
            return f->depth > 0 && ws_byte(f, c);
        f->ws = 0;
        break;
    default:
        break;
    }
    switch (f->st) {
    case ST_VALUE:
        return value_start(f, c);
    case ST_OBJ_FIRST: /* a key or '}' */
    case ST_OBJ_KEY:
        if (c == '}' && f->st == ST_OBJ_FIRST) {
            close_container(f);
            return true;
        }
        if (c != '"')
            return false;
        f->st = ST_STR;
        f->key = true;
        return true;
    case ST_COLON:
        if (c != ':')
            return false;
        f->st = ST_VALUE;
        return true;
    case ST_ARR_FIRST:
        if (c == ']') {
            close_container(f);
            return true;
        }
        return value_start(f, c);
    case ST_AFTER:
        return after_value(f, c);
    case ST_STR:
        if (c == '"')
            f->st = f->key ? ST_COLON : ST_AFTER;
        else if (c == '\\')
            f->st = ST_ESC;
        else if (c < 0x20)
            return false;
        return true;
    case ST_ESC:
        if (c == 'u') {
            f->st = ST_HEX;
            f->sub = 0;
            return true;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't') {
            f->st = ST_STR;
            return true;
        }
        return false;
    case ST_HEX:
        if (!is_hex(c))
            return false;
        if (++f->sub == 4)
            f->st = ST_STR;
        return true;
    case ST_LIT:
        if (c != (unsigned char)literals[f->lit][f->sub])
            return false;
        if (literals[f->lit][++f->sub] == 0)
            f->st = ST_AFTER;
        return true;
    case ST_NUM_MINUS:
        if (c == '0')
            f->st = ST_NUM_ZERO;
        else if (c >= '1' && c <= '9')
            f->st = ST_NUM_INT;
        else
            return false;
        return true;
    case ST_NUM_ZERO:
    case ST_NUM_INT:
        if (is_digit(c) && f->st == ST_NUM_INT)
            return true;
        if (c == '.') {
            f->st = ST_NUM_DOT;
            return true;
        }
        if (c == 'e' || c == 'E') {
            f->st = ST_NUM_E;
            return true;
        }
        break; /* the number ends */
    case ST_NUM_DOT:
        if (!is_digit(c))
            return false;
        f->st = ST_NUM_FRAC;
        return true;
    case ST_NUM_FRAC:
        if (is_digit(c))
            return true;
        if (c == 'e' || c == 'E') {
            f->st = ST_NUM_E;
            return true;
        }
        break; /* the number ends */
    case ST_NUM_E:
        if (c == '+' || c == '-') {
            f->st = ST_NUM_ESIGN;
            return true;
        }
        /* fall through */
    case ST_NUM_ESIGN:
        if (!is_digit(c))
            return false;
        f->st = ST_NUM_EXP;
        return true;
    case ST_NUM_EXP:
        if (is_digit(c))
            return true;
        break; /* the number ends */
    default: /* ST_DONE */
        return false;
    }
    /* a number ended: the byte is read after it */
    f->st = ST_AFTER;
    return step(f, c);
}

bool lms_jsonfsm_feed(lms_jsonfsm *f, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!step(f, (unsigned char)p[i]))
            return false;
    return true;
}
