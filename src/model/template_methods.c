/*
 * template_methods.c - what templates call: the global functions
 * (namespace, range, dict, raise_exception, strftime_now) and the Python
 * methods of str, dict and list values ("a,b".split(","), d.items(),
 * msg.get("tool_calls"), loop.cycle(...)).
 *
 * String methods follow CPython on UTF-8 text: whitespace is Python's set
 * of Unicode spaces (tpl_cp_is_space), strip(chars) treats chars as a set of code points,
 * split() without a separator splits on runs of whitespace. Case mapping
 * covers all of Unicode through utf8proc (see cp_lower).
 *
 * As in transformers' ImmutableSandboxedEnvironment, methods that mutate
 * a list or dict (append, pop, update, ...) are refused.
 */
#include "model/template_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "base/ckd.h"
#include "base/err.h"

#define TPL_MAX_RANGE 100000 /* jinja2's sandbox limit for range() */

static double ceil_div(double a, double b) { return ceil(a / b); }

/* ---- code points ------------------------------------------------------------- */

/* Case mapping is utf8proc's simple (one code point) mappings, as Python's
 * str methods use for all but a few code points: those that upper-case or
 * title-case to several (k_special below, "ß" -> "SS" / "Ss"), İ which
 * lower-cases to "i" U+0307, and lower()'s final sigma. Python's
 * is-lower / is-upper also count
 * the Other_Lowercase / Other_Uppercase code points (modifier letters,
 * circled letters, Roman numerals), listed here as ranges (Unicode 14). */
typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

static const cp_range k_other_lower[] = {
    {0xAA, 0xAA},       {0xBA, 0xBA},       {0x2B0, 0x2B8},     {0x2C0, 0x2C1},
    {0x2E0, 0x2E4},     {0x345, 0x345},     {0x37A, 0x37A},     {0x1D2C, 0x1D6A},
    {0x1D78, 0x1D78},   {0x1D9B, 0x1DBF},   {0x2071, 0x2071},   {0x207F, 0x207F},
    {0x2090, 0x209C},   {0x2170, 0x217F},   {0x24D0, 0x24E9},   {0x2C7C, 0x2C7D},
    {0xA69C, 0xA69D},   {0xA770, 0xA770},   {0xA7F8, 0xA7F9},   {0xAB5C, 0xAB5F},
    {0x10780, 0x10780}, {0x10783, 0x10785}, {0x10787, 0x107B0}, {0x107B2, 0x107BA},
};

static const cp_range k_other_upper[] = {
    {0x2160, 0x216F},   {0x24B6, 0x24CF},   {0x1F130, 0x1F149},
    {0x1F150, 0x1F169}, {0x1F170, 0x1F189},
};

static bool in_ranges(const cp_range *r, size_t n, uint32_t cp)
{
    for (size_t k = 0; k < n; k++)
        if (cp >= r[k].lo && cp <= r[k].hi)
            return true;
    return false;
}

/* Python's str.upper() / title() of the code points that map to several
 * (SpecialCasing.txt of Unicode 14, as CPython 3.11 has it), UTF-8. */
typedef struct special_case {
    uint32_t cp;
    const char *upper, *title;
} special_case;

static const special_case k_special[] = {
    {0xDF, "\x53\x53", "\x53\x73"},
    {0x149, "\xca\xbc\x4e", "\xca\xbc\x4e"},
    {0x1F0, "\x4a\xcc\x8c", "\x4a\xcc\x8c"},
    {0x390, "\xce\x99\xcc\x88\xcc\x81", "\xce\x99\xcc\x88\xcc\x81"},
    {0x3B0, "\xce\xa5\xcc\x88\xcc\x81", "\xce\xa5\xcc\x88\xcc\x81"},
    {0x587, "\xd4\xb5\xd5\x92", "\xd4\xb5\xd6\x82"},
    {0x1E96, "\x48\xcc\xb1", "\x48\xcc\xb1"},
    {0x1E97, "\x54\xcc\x88", "\x54\xcc\x88"},
    {0x1E98, "\x57\xcc\x8a", "\x57\xcc\x8a"},
    {0x1E99, "\x59\xcc\x8a", "\x59\xcc\x8a"},
    {0x1E9A, "\x41\xca\xbe", "\x41\xca\xbe"},
    {0x1F50, "\xce\xa5\xcc\x93", "\xce\xa5\xcc\x93"},
    {0x1F52, "\xce\xa5\xcc\x93\xcc\x80", "\xce\xa5\xcc\x93\xcc\x80"},
    {0x1F54, "\xce\xa5\xcc\x93\xcc\x81", "\xce\xa5\xcc\x93\xcc\x81"},
    {0x1F56, "\xce\xa5\xcc\x93\xcd\x82", "\xce\xa5\xcc\x93\xcd\x82"},
    {0x1F80, "\xe1\xbc\x88\xce\x99", "\xe1\xbe\x88"},
    {0x1F81, "\xe1\xbc\x89\xce\x99", "\xe1\xbe\x89"},
    {0x1F82, "\xe1\xbc\x8a\xce\x99", "\xe1\xbe\x8a"},
    {0x1F83, "\xe1\xbc\x8b\xce\x99", "\xe1\xbe\x8b"},
    {0x1F84, "\xe1\xbc\x8c\xce\x99", "\xe1\xbe\x8c"},
    {0x1F85, "\xe1\xbc\x8d\xce\x99", "\xe1\xbe\x8d"},
    {0x1F86, "\xe1\xbc\x8e\xce\x99", "\xe1\xbe\x8e"},
    {0x1F87, "\xe1\xbc\x8f\xce\x99", "\xe1\xbe\x8f"},
    {0x1F88, "\xe1\xbc\x88\xce\x99", "\xe1\xbe\x88"},
    {0x1F89, "\xe1\xbc\x89\xce\x99", "\xe1\xbe\x89"},
    {0x1F8A, "\xe1\xbc\x8a\xce\x99", "\xe1\xbe\x8a"},
    {0x1F8B, "\xe1\xbc\x8b\xce\x99", "\xe1\xbe\x8b"},
    {0x1F8C, "\xe1\xbc\x8c\xce\x99", "\xe1\xbe\x8c"},
    {0x1F8D, "\xe1\xbc\x8d\xce\x99", "\xe1\xbe\x8d"},
    {0x1F8E, "\xe1\xbc\x8e\xce\x99", "\xe1\xbe\x8e"},
    {0x1F8F, "\xe1\xbc\x8f\xce\x99", "\xe1\xbe\x8f"},
    {0x1F90, "\xe1\xbc\xa8\xce\x99", "\xe1\xbe\x98"},
    {0x1F91, "\xe1\xbc\xa9\xce\x99", "\xe1\xbe\x99"},
    {0x1F92, "\xe1\xbc\xaa\xce\x99", "\xe1\xbe\x9a"},
    {0x1F93, "\xe1\xbc\xab\xce\x99", "\xe1\xbe\x9b"},
    {0x1F94, "\xe1\xbc\xac\xce\x99", "\xe1\xbe\x9c"},
    {0x1F95, "\xe1\xbc\xad\xce\x99", "\xe1\xbe\x9d"},
    {0x1F96, "\xe1\xbc\xae\xce\x99", "\xe1\xbe\x9e"},
    {0x1F97, "\xe1\xbc\xaf\xce\x99", "\xe1\xbe\x9f"},
    {0x1F98, "\xe1\xbc\xa8\xce\x99", "\xe1\xbe\x98"},
    {0x1F99, "\xe1\xbc\xa9\xce\x99", "\xe1\xbe\x99"},
    {0x1F9A, "\xe1\xbc\xaa\xce\x99", "\xe1\xbe\x9a"},
    {0x1F9B, "\xe1\xbc\xab\xce\x99", "\xe1\xbe\x9b"},
    {0x1F9C, "\xe1\xbc\xac\xce\x99", "\xe1\xbe\x9c"},
    {0x1F9D, "\xe1\xbc\xad\xce\x99", "\xe1\xbe\x9d"},
    {0x1F9E, "\xe1\xbc\xae\xce\x99", "\xe1\xbe\x9e"},
    {0x1F9F, "\xe1\xbc\xaf\xce\x99", "\xe1\xbe\x9f"},
    {0x1FA0, "\xe1\xbd\xa8\xce\x99", "\xe1\xbe\xa8"},
    {0x1FA1, "\xe1\xbd\xa9\xce\x99", "\xe1\xbe\xa9"},
    {0x1FA2, "\xe1\xbd\xaa\xce\x99", "\xe1\xbe\xaa"},
    {0x1FA3, "\xe1\xbd\xab\xce\x99", "\xe1\xbe\xab"},
    {0x1FA4, "\xe1\xbd\xac\xce\x99", "\xe1\xbe\xac"},
    {0x1FA5, "\xe1\xbd\xad\xce\x99", "\xe1\xbe\xad"},
    {0x1FA6, "\xe1\xbd\xae\xce\x99", "\xe1\xbe\xae"},
    {0x1FA7, "\xe1\xbd\xaf\xce\x99", "\xe1\xbe\xaf"},
    {0x1FA8, "\xe1\xbd\xa8\xce\x99", "\xe1\xbe\xa8"},
    {0x1FA9, "\xe1\xbd\xa9\xce\x99", "\xe1\xbe\xa9"},
    {0x1FAA, "\xe1\xbd\xaa\xce\x99", "\xe1\xbe\xaa"},
    {0x1FAB, "\xe1\xbd\xab\xce\x99", "\xe1\xbe\xab"},
    {0x1FAC, "\xe1\xbd\xac\xce\x99", "\xe1\xbe\xac"},
    {0x1FAD, "\xe1\xbd\xad\xce\x99", "\xe1\xbe\xad"},
    {0x1FAE, "\xe1\xbd\xae\xce\x99", "\xe1\xbe\xae"},
    {0x1FAF, "\xe1\xbd\xaf\xce\x99", "\xe1\xbe\xaf"},
    {0x1FB2, "\xe1\xbe\xba\xce\x99", "\xe1\xbe\xba\xcd\x85"},
    {0x1FB3, "\xce\x91\xce\x99", "\xe1\xbe\xbc"},
    {0x1FB4, "\xce\x86\xce\x99", "\xce\x86\xcd\x85"},
    {0x1FB6, "\xce\x91\xcd\x82", "\xce\x91\xcd\x82"},
    {0x1FB7, "\xce\x91\xcd\x82\xce\x99", "\xce\x91\xcd\x82\xcd\x85"},
    {0x1FBC, "\xce\x91\xce\x99", "\xe1\xbe\xbc"},
    {0x1FC2, "\xe1\xbf\x8a\xce\x99", "\xe1\xbf\x8a\xcd\x85"},
    {0x1FC3, "\xce\x97\xce\x99", "\xe1\xbf\x8c"},
    {0x1FC4, "\xce\x89\xce\x99", "\xce\x89\xcd\x85"},
    {0x1FC6, "\xce\x97\xcd\x82", "\xce\x97\xcd\x82"},
    {0x1FC7, "\xce\x97\xcd\x82\xce\x99", "\xce\x97\xcd\x82\xcd\x85"},
    {0x1FCC, "\xce\x97\xce\x99", "\xe1\xbf\x8c"},
    {0x1FD2, "\xce\x99\xcc\x88\xcc\x80", "\xce\x99\xcc\x88\xcc\x80"},
    {0x1FD3, "\xce\x99\xcc\x88\xcc\x81", "\xce\x99\xcc\x88\xcc\x81"},
    {0x1FD6, "\xce\x99\xcd\x82", "\xce\x99\xcd\x82"},
    {0x1FD7, "\xce\x99\xcc\x88\xcd\x82", "\xce\x99\xcc\x88\xcd\x82"},
    {0x1FE2, "\xce\xa5\xcc\x88\xcc\x80", "\xce\xa5\xcc\x88\xcc\x80"},
    {0x1FE3, "\xce\xa5\xcc\x88\xcc\x81", "\xce\xa5\xcc\x88\xcc\x81"},
    {0x1FE4, "\xce\xa1\xcc\x93", "\xce\xa1\xcc\x93"},
    {0x1FE6, "\xce\xa5\xcd\x82", "\xce\xa5\xcd\x82"},
    {0x1FE7, "\xce\xa5\xcc\x88\xcd\x82", "\xce\xa5\xcc\x88\xcd\x82"},
    {0x1FF2, "\xe1\xbf\xba\xce\x99", "\xe1\xbf\xba\xcd\x85"},
    {0x1FF3, "\xce\xa9\xce\x99", "\xe1\xbf\xbc"},
    {0x1FF4, "\xce\x8f\xce\x99", "\xce\x8f\xcd\x85"},
    {0x1FF6, "\xce\xa9\xcd\x82", "\xce\xa9\xcd\x82"},
    {0x1FF7, "\xce\xa9\xcd\x82\xce\x99", "\xce\xa9\xcd\x82\xcd\x85"},
    {0x1FFC, "\xce\xa9\xce\x99", "\xe1\xbf\xbc"},
    {0xFB00, "\x46\x46", "\x46\x66"},
    {0xFB01, "\x46\x49", "\x46\x69"},
    {0xFB02, "\x46\x4c", "\x46\x6c"},
    {0xFB03, "\x46\x46\x49", "\x46\x66\x69"},
    {0xFB04, "\x46\x46\x4c", "\x46\x66\x6c"},
    {0xFB05, "\x53\x54", "\x53\x74"},
    {0xFB06, "\x53\x54", "\x53\x74"},
    {0xFB13, "\xd5\x84\xd5\x86", "\xd5\x84\xd5\xb6"},
    {0xFB14, "\xd5\x84\xd4\xb5", "\xd5\x84\xd5\xa5"},
    {0xFB15, "\xd5\x84\xd4\xbb", "\xd5\x84\xd5\xab"},
    {0xFB16, "\xd5\x8e\xd5\x86", "\xd5\x8e\xd5\xb6"},
    {0xFB17, "\xd5\x84\xd4\xbd", "\xd5\x84\xd5\xad"},
};

static const special_case *find_special(uint32_t cp)
{
    size_t lo = 0, hi = sizeof k_special / sizeof k_special[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (k_special[mid].cp == cp)
            return &k_special[mid];
        if (k_special[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

#define CAPITAL_I_DOT 0x130 /* İ: lower-cases to "i" U+0307 */
#define CAPITAL_SIGMA 0x3A3

static uint32_t cp_lower(uint32_t cp)
{
    return cp > 0x10FFFF ? cp : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

static uint32_t cp_upper(uint32_t cp)
{
    return cp > 0x10FFFF ? cp : (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
}

static uint32_t cp_title(uint32_t cp)
{
    return cp > 0x10FFFF ? cp : (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
}

static utf8proc_category_t cp_category(uint32_t cp)
{
    return cp > 0x10FFFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)cp);
}

/* Python's str.islower / isupper per code point, and "cased" (either, or
 * title case), which title() uses to decide where a word starts. */
static bool cp_is_lower(uint32_t cp)
{
    return cp_category(cp) == UTF8PROC_CATEGORY_LL ||
           in_ranges(k_other_lower, sizeof k_other_lower / sizeof k_other_lower[0], cp);
}

static bool cp_is_upper(uint32_t cp)
{
    return cp_category(cp) == UTF8PROC_CATEGORY_LU ||
           in_ranges(k_other_upper, sizeof k_other_upper / sizeof k_other_upper[0], cp);
}

static bool cp_is_cased(uint32_t cp)
{
    return cp_is_lower(cp) || cp_is_upper(cp) || cp_category(cp) == UTF8PROC_CATEGORY_LT;
}

/* A letter for title()/capitalize(): cased ASCII, or any non-ASCII letter
 * we can map, or other non-ASCII text (treated as letters, uncased). */
static bool cp_is_letter(uint32_t cp)
{
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           (cp >= 0xC0 && cp != 0xD7 && cp != 0xF7 && !tpl_cp_is_space(cp));
}

/* ---- str helpers shared with filters --------------------------------------------- */

int tpl_buf_finish(tpl_ctx *c, const tpl_node *at, tpl_buf *b, int rc, tpl_val *out)
{
    char *o = NULL;
    if (rc == LMS_ERR_LIMIT || rc == LMS_ERR_NOMEM)
        rc =
            tpl_fail(c, at, rc,
                     rc == LMS_ERR_LIMIT ? "string longer than the output limit" : "out of memory");
    if (rc == 0)
        rc = tpl_new_str(c, at, b->n, &o, out);
    if (rc == 0 && b->n)
        memcpy(o, b->p, b->n);
    tpl_buf_free(b);
    return rc;
}

enum { CASE_LOWER, CASE_UPPER, CASE_TITLE }; /* how one code point is mapped */

/* How a code point maps in this mode; prev is the code point before it,
 * first says it is the string's first. */
static int case_how(int mode, uint32_t prev, bool first)
{
    switch (mode) {
    case TPL_CASE_UPPER: return CASE_UPPER;
    case TPL_CASE_LOWER: return CASE_LOWER;
    case TPL_CASE_CAPITALIZE: return first ? CASE_TITLE : CASE_LOWER;
    case TPL_CASE_TITLE: /* Python: a code point after a cased one is lowered */
        return !first && cp_is_cased(prev) ? CASE_LOWER : CASE_TITLE;
    default: /* TPL_CASE_JTITLE: jinja2 upper-cases each word's first character */
        return first || tpl_cp_is_space(prev) || (prev < 0x80 && strchr("-({[<", (int)prev))
                   ? CASE_UPPER
                   : CASE_LOWER;
    }
}

/* Python's Case_Ignorable (marks, format characters, modifiers and the
 * in-word punctuation of Unicode word breaking), which the final-sigma
 * rule looks through. */
static bool cp_is_case_ignorable(uint32_t cp)
{
    static const uint32_t k_mid[] = {'\'',   '.',    ':',    0xB7,   0x387,  0x55F,  0x5F4,
                                     0x2018, 0x2019, 0x2024, 0x2027, 0xFE13, 0xFE52, 0xFE55,
                                     0xFF07, 0xFF0E, 0xFF1A};
    switch (cp_category(cp)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK: return true;
    default: break;
    }
    for (size_t k = 0; k < sizeof k_mid / sizeof k_mid[0]; k++)
        if (cp == k_mid[k])
            return true;
    return false;
}

/* Appends code point cp (k bytes at byte i of s) mapped as `how` says;
 * before is the last code point ahead of it that is not case-ignorable (0
 * if none). An invalid byte is copied. */
static int put_case(tpl_buf *b, tpl_val s, size_t i, size_t k, uint32_t cp, uint32_t before,
                    int how)
{
    char u[4];
    if (k == 1 && cp >= 0x80)
        return tpl_buf_put(b, s.u.s.p + i, 1);
    const special_case *sp = how != CASE_LOWER ? find_special(cp) : NULL;
    if (sp) {
        const char *m = how == CASE_UPPER ? sp->upper : sp->title;
        return tpl_buf_put(b, m, strlen(m));
    }
    if (cp == CAPITAL_I_DOT && how == CASE_LOWER)
        return tpl_buf_put(b, "i\xcc\x87", 3);
    if (cp == CAPITAL_SIGMA && how == CASE_LOWER && cp_is_cased(before)) {
        /* final sigma: after a cased letter and not before one */
        uint32_t next = 0;
        for (size_t j = i + k, kn; j < s.u.s.n; j += kn) {
            next = tpl_utf8_decode(s.u.s.p + j, s.u.s.n - j, &kn);
            if (!cp_is_case_ignorable(next))
                break;
            next = 0;
        }
        if (!cp_is_cased(next))
            return tpl_buf_put(b, u, tpl_utf8_put(u, 0x3C2));
    }
    uint32_t m = how == CASE_UPPER ? cp_upper(cp) : how == CASE_TITLE ? cp_title(cp) : cp_lower(cp);
    return tpl_buf_put(b, u, tpl_utf8_put(u, m));
}

int tpl_str_case(tpl_ctx *c, const tpl_node *at, tpl_val s, int mode, tpl_val *out)
{
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    uint32_t prev = 0, before = 0;
    int how = CASE_LOWER;
    for (size_t i = 0; i < s.u.s.n && rc == 0;) {
        size_t k;
        uint32_t cp = tpl_utf8_decode(s.u.s.p + i, s.u.s.n - i, &k);
        int was = how;
        how = case_how(mode, prev, i == 0);
        /* jinja2's |title lowers each word's rest as a string of its own:
         * nothing comes before it */
        if (mode == TPL_CASE_JTITLE && was == CASE_UPPER)
            before = 0;
        rc = put_case(&b, s, i, k, cp, before, how);
        prev = cp;
        if (!cp_is_case_ignorable(cp))
            before = cp;
        i += k;
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

bool tpl_str_is_case(tpl_val s, bool upper)
{
    /* Python's isupper/islower: no code point of the other case or title
     * case, and at least one of this case */
    bool cased = false;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t k;
        uint32_t cp = tpl_utf8_decode(s.u.s.p + i, s.u.s.n - i, &k);
        if ((upper ? cp_is_lower(cp) : cp_is_upper(cp)) ||
            cp_category(cp) == UTF8PROC_CATEGORY_LT)
            return false;
        cased |= upper ? cp_is_upper(cp) : cp_is_lower(cp);
        i += k;
    }
    return cased;
}

/* Does the code point at p belong to the set `chars` (or whitespace)? */
static bool in_set(tpl_val chars, uint32_t cp)
{
    if (chars.type != TPL_STR)
        return tpl_cp_is_space(cp);
    for (size_t i = 0; i < chars.u.s.n;) {
        size_t k;
        if (tpl_utf8_decode(chars.u.s.p + i, chars.u.s.n - i, &k) == cp)
            return true;
        i += k;
    }
    return false;
}

/* Start of the UTF-8 sequence that ends at p[e-1]. */
static size_t cp_start_before(const char *p, size_t e)
{
    size_t b = e - 1;
    while (b > 0 && ((unsigned char)p[b] & 0xC0) == 0x80 && e - b < 4)
        b--;
    return b;
}

int tpl_str_strip(tpl_ctx *c, const tpl_node *at, tpl_val s, tpl_val chars, int sides, tpl_val *out)
{
    if (chars.type != TPL_STR && chars.type != TPL_NONE && chars.type != TPL_UNDEF)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "strip arg must be None or str");
    const char *p = s.u.s.p;
    size_t b = 0, e = s.u.s.n, k;
    while ((sides & 1) && b < e) {
        uint32_t cp = tpl_utf8_decode(p + b, e - b, &k);
        if (!in_set(chars, cp))
            break;
        b += k;
    }
    while ((sides & 2) && e > b) {
        size_t st = cp_start_before(p, e);
        if (st < b)
            st = b;
        if (!in_set(chars, tpl_utf8_decode(p + st, e - st, &k)))
            break;
        e = st;
    }
    *out = tpl_str(p + b, e - b);
    return 0;
}

int tpl_str_replace(tpl_ctx *c, const tpl_node *at, tpl_val s, tpl_val from, tpl_val to,
                    int64_t count, tpl_val *out)
{
    if (from.type != TPL_STR || to.type != TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "replace() arguments must be str");
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    int rc = 0;
    for (int64_t done = 0; rc == 0 && (count < 0 || done < count); done++) {
        const char *hit;
        if (from.u.s.n == 0) { /* Python puts `to` before every character and at the end */
            rc = tpl_buf_put(&b, to.u.s.p, to.u.s.n);
            if (p >= end)
                break;
            size_t k = tpl_utf8_offset(p, (size_t)(end - p), 1);
            if (rc == 0)
                rc = tpl_buf_put(&b, p, k);
            p += k;
            continue;
        }
        if (!(hit = memmem(p, (size_t)(end - p), from.u.s.p, from.u.s.n)))
            break;
        rc = tpl_buf_put(&b, p, (size_t)(hit - p));
        if (rc == 0)
            rc = tpl_buf_put(&b, to.u.s.p, to.u.s.n);
        p = hit + from.u.s.n;
    }
    if (rc == 0)
        rc = tpl_buf_put(&b, p, (size_t)(end - p));
    return tpl_buf_finish(c, at, &b, rc, out);
}

/* ---- split ----------------------------------------------------------------- */

static int push(tpl_ctx *c, const tpl_node *at, tpl_list *l, tpl_val v)
{
    return tpl_list_push(&c->arena, l, v) < 0 ? tpl_fail_nomem(c, at) : 0;
}

/* Last occurrence of needle in hay, or NULL. */
static const char *find_last(const char *hay, size_t n, const char *needle, size_t k)
{
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (memcmp(hay + i, needle, k) == 0)
            return hay + i;
    return NULL;
}

static void reverse_vals(tpl_list *l)
{
    for (size_t a = 0, z = l->n ? l->n - 1 : 0; a < z; a++, z--) {
        tpl_val t = l->items[a];
        l->items[a] = l->items[z];
        l->items[z] = t;
    }
}

/* split/rsplit with a separator: at most maxsplit cuts (all if < 0). */
static int split_sep(tpl_ctx *c, const tpl_node *at, tpl_list *l, tpl_val s, tpl_val sep,
                     int64_t maxsplit, bool from_right)
{
    const char *p = s.u.s.p;
    size_t b = 0, e = s.u.s.n, k = sep.u.s.n;
    for (int64_t cuts = 0; maxsplit < 0 || cuts < maxsplit; cuts++) {
        const char *hit =
            from_right ? find_last(p + b, e - b, sep.u.s.p, k) : memmem(p + b, e - b, sep.u.s.p, k);
        if (!hit)
            break;
        size_t h = (size_t)(hit - p);
        TPL_TRY(push(c, at, l, from_right ? tpl_str(hit + k, e - h - k) : tpl_str(p + b, h - b)));
        if (from_right)
            e = h;
        else
            b = h + k;
    }
    TPL_TRY(push(c, at, l, tpl_str(p + b, e - b)));
    if (from_right)
        reverse_vals(l);
    return 0;
}

static bool space_at(const char *p, size_t n, size_t i, size_t *len)
{
    return tpl_cp_is_space(tpl_utf8_decode(p + i, n - i, len));
}

static bool space_before(const char *p, size_t e, size_t *len)
{
    size_t b = cp_start_before(p, e);
    *len = e - b;
    return tpl_cp_is_space(tpl_utf8_decode(p + b, e - b, len));
}

/* split()/rsplit() on runs of whitespace: no empty parts; once maxsplit
 * parts are cut, the rest (minus the whitespace that was cut at) is the
 * last part, keeping its whitespace on the far side, as Python does. */
static int split_ws(tpl_ctx *c, const tpl_node *at, tpl_list *l, tpl_val s, int64_t maxsplit,
                    bool from_right)
{
    const char *p = s.u.s.p;
    size_t b = 0, e = s.u.s.n, k;
    for (int64_t parts = 0;; parts++) {
        if (from_right)
            while (e > b && space_before(p, e, &k))
                e -= k;
        else
            while (b < e && space_at(p, e, b, &k))
                b += k;
        if (b >= e)
            break;
        if (maxsplit >= 0 && parts >= maxsplit) {
            TPL_TRY(push(c, at, l, tpl_str(p + b, e - b)));
            break;
        }
        size_t w = from_right ? e : b; /* the word's other end */
        if (from_right)
            while (w > b && !space_before(p, w, &k))
                w -= k;
        else
            while (w < e && !space_at(p, e, w, &k))
                w += k;
        TPL_TRY(push(c, at, l, from_right ? tpl_str(p + w, e - w) : tpl_str(p + b, w - b)));
        if (from_right)
            e = w;
        else
            b = w;
    }
    if (from_right)
        reverse_vals(l);
    return 0;
}

/* Python str.split / str.rsplit (from_right) with maxsplit. */
static int str_split(tpl_ctx *c, const tpl_node *at, tpl_val s, tpl_val sep, int64_t maxsplit,
                     bool from_right, tpl_val *out)
{
    if (sep.type == TPL_STR && sep.u.s.n == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "empty separator");
    tpl_list *l = tpl_list_new(&c->arena, 4);
    if (!l)
        return tpl_fail_nomem(c, at);
    TPL_TRY(sep.type == TPL_STR ? split_sep(c, at, l, s, sep, maxsplit, from_right)
                                : split_ws(c, at, l, s, maxsplit, from_right));
    *out = tpl_list_val(l);
    return 0;
}

static int str_splitlines(tpl_ctx *c, const tpl_node *at, tpl_val s, bool keepends, tpl_val *out)
{
    tpl_list *l = tpl_list_new(&c->arena, 4);
    if (!l)
        return tpl_fail_nomem(c, at);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, b = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n' && p[i] != '\r')
            continue;
        size_t e = i + (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n');
        TPL_TRY(push(c, at, l, tpl_str(p + b, (keepends ? e + 1 : i) - b)));
        i = e;
        b = e + 1;
    }
    if (b < n)
        TPL_TRY(push(c, at, l, tpl_str(p + b, n - b)));
    *out = tpl_list_val(l);
    return 0;
}

/* ---- formatting ----------------------------------------------------------------- */

/* One printf-style conversion spec: "%(name)-08.3f" (Python's str % args). */
typedef struct pct_spec {
    const char *name; /* "(name)" key, or NULL */
    size_t name_n;
    char flags[6];    /* any of "-+ 0#", NUL-terminated */
    int width, prec;  /* -1 = none */
    char conv;
} pct_spec;

/* Text t padded to the spec's width in code points (Python counts
 * characters, not bytes); '-' pads on the right. */
static int put_padded(tpl_buf *b, const pct_spec *sp, const char *t, size_t n)
{
    size_t cps = tpl_utf8_len(t, n);
    size_t pad = sp->width > 0 && (size_t)sp->width > cps ? (size_t)sp->width - cps : 0;
    bool left = strchr(sp->flags, '-') != NULL;
    int rc = 0;
    for (size_t k = 0; k < pad && !left && rc == 0; k++)
        rc = tpl_buf_putc(b, ' ');
    if (rc == 0)
        rc = tpl_buf_put(b, t, n);
    for (size_t k = 0; k < pad && left && rc == 0; k++)
        rc = tpl_buf_putc(b, ' ');
    return rc;
}

/* %s %r %c: text, cut to the precision and padded to the width. */
static int format_text(tpl_ctx *c, const tpl_node *at, tpl_buf *b, const pct_spec *sp, tpl_val v)
{
    tpl_buf t = {.max_bytes = c->lim.max_output_bytes};
    int rc;
    if (sp->conv == 'c') {
        if (v.type == TPL_STR && tpl_utf8_len(v.u.s.p, v.u.s.n) == 1)
            rc = tpl_buf_put(&t, v.u.s.p, v.u.s.n);
        else if (v.type == TPL_INT && v.u.i >= 0 && v.u.i <= 0x10FFFF) {
            char u[4];
            rc = tpl_buf_put(&t, u, tpl_utf8_put(u, (uint32_t)v.u.i));
        } else
            return tpl_fail(c, at, LMS_ERR_FORMAT, "%%c requires an int or a unicode character");
    } else {
        rc = sp->conv == 's' ? tpl_write_str(&t, v) : tpl_write_repr(&t, v);
    }
    size_t n = t.n;
    if (rc == 0 && sp->prec >= 0)
        n = tpl_utf8_offset(t.p ? t.p : "", t.n, (size_t)sp->prec);
    if (rc == 0)
        rc = put_padded(b, sp, t.p ? t.p : "", n);
    tpl_buf_free(&t);
    return rc;
}

/* One %-conversion: s r c, d i u o x X, e E f F g G. Numbers go through
 * C's printf with the same flags, width and precision (Python's rules for
 * these are C's). */
static int format_one(tpl_ctx *c, const tpl_node *at, tpl_buf *b, const pct_spec *sp, tpl_val v)
{
    char conv = sp->conv;
    if (strchr("src", conv))
        return format_text(c, at, b, sp, v);
    bool is_int = strchr("diuoxX", conv) != NULL;
    if (!strchr("diuoxXeEfFgG", conv))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "unsupported format character '%c'", conv);
    if (!tpl_is_number(v))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%%%c format: a real number is required, not %s",
                        conv, tpl_type_name(v));
    if (is_int && conv != 'd' && conv != 'i' && conv != 'u' && v.type == TPL_FLOAT)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%%%c format: an integer is required, not float",
                        conv);
    char f[40];
    int width = sp->width > 512 ? 512 : sp->width, prec = sp->prec > 100 ? 100 : sp->prec;
    int k = snprintf(f, sizeof f, "%%%s", sp->flags);
    if (width >= 0)
        k += snprintf(f + k, sizeof f - (size_t)k, "%d", width);
    if (prec >= 0)
        k += snprintf(f + k, sizeof f - (size_t)k, ".%d", prec);
    int64_t int_val = 0;
    if (is_int) {
        double d = tpl_as_double(v);
        if (v.type == TPL_FLOAT && !(d > -9.2e18 && d < 9.2e18))
            return tpl_fail(c, at, LMS_ERR_RANGE, "%%%c format: number too large", conv);
        int64_t i = v.type == TPL_FLOAT ? (int64_t)d : v.type == TPL_BOOL ? v.u.b : v.u.i;
        int_val = i;
        if (conv == 'o' && strchr(sp->flags, '#')) { /* Python: "0o17", C: "017" */
            char t[40];
            int n = snprintf(t, sizeof t, "%s0o%llo", i < 0 ? "-" : "",
                             (unsigned long long)(i < 0 ? -(uint64_t)i : (uint64_t)i));
            return put_padded(b, sp, t, (size_t)n);
        }
        snprintf(f + k, sizeof f - (size_t)k, "ll%c", conv == 'i' || conv == 'u' ? 'd' : conv);
    } else {
        snprintf(f + k, sizeof f - (size_t)k, "%c", conv);
    }
    /* f is built above from checked flags, numbers and a conversion that
     * matches the argument's type */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    return is_int ? tpl_buf_printf(b, f, (long long)int_val) : tpl_buf_printf(b, f, tpl_as_double(v));
#pragma GCC diagnostic pop
}

/* Reads one spec after the '%' at *pp and moves *pp past it. */
static int parse_pct(tpl_ctx *c, const tpl_node *at, const char **pp, const char *end, pct_spec *sp)
{
    const char *p = *pp;
    *sp = (pct_spec){.width = -1, .prec = -1};
    if (p < end && *p == '(') {
        const char *close = memchr(p, ')', (size_t)(end - p));
        if (!close)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "incomplete format key");
        sp->name = p + 1;
        sp->name_n = (size_t)(close - p - 1);
        p = close + 1;
    }
    size_t nf = 0;
    for (; p < end && strchr("-+ 0#", *p); p++)
        if (!memchr(sp->flags, *p, nf) && nf < sizeof sp->flags - 1)
            sp->flags[nf++] = *p;
    if (p < end && *p == '*')
        return tpl_fail(c, at, LMS_ERR_FORMAT, "'*' in a format spec is not supported");
    for (; p < end && *p >= '0' && *p <= '9'; p++)
        sp->width = (sp->width < 0 ? 0 : sp->width) * 10 + (*p - '0') % 10000000;
    if (p < end && *p == '.') {
        sp->prec = 0;
        for (p++; p < end && *p >= '0' && *p <= '9'; p++)
            sp->prec = (sp->prec * 10 + (*p - '0')) % 10000000;
    }
    while (p < end && (*p == 'l' || *p == 'h' || *p == 'L')) /* ignored, as Python does */
        p++;
    if (p >= end)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "incomplete format");
    sp->conv = *p++;
    *pp = p;
    return 0;
}

/* Python's str % args: args is a tuple (one value per spec), a mapping
 * (for "%(name)s" specs) or a single value. */
int tpl_str_format(tpl_ctx *c, const tpl_node *at, tpl_val fmt, tpl_val args, tpl_val *out)
{
    const tpl_list *tuple = args.type == TPL_LIST && (args.flags & TPL_F_TUPLE) ? args.u.l : NULL;
    /* like CPython: anything subscriptable but a tuple or str may feed %(name)s and
     * is never "not all converted" */
    bool mapping = !tuple && args.type != TPL_STR &&
                   (args.type == TPL_DICT || args.type == TPL_NS || args.type == TPL_LIST);
    size_t next = 0;
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    while (rc == 0 && p < end) {
        const char *pct = memchr(p, '%', (size_t)(end - p));
        rc = tpl_buf_put(&b, p, pct ? (size_t)(pct - p) : (size_t)(end - p));
        if (!pct || rc)
            break;
        p = pct + 1;
        pct_spec sp;
        if ((rc = parse_pct(c, at, &p, end, &sp)) < 0)
            break;
        if (sp.conv == '%' && !sp.name) {
            rc = tpl_buf_putc(&b, '%');
            continue;
        }
        tpl_val v;
        if (sp.name) {
            if (!mapping || args.type == TPL_LIST) {
                rc = tpl_fail(c, at, LMS_ERR_FORMAT, "format requires a mapping");
                break;
            }
            long i = tpl_dict_find_str(args.u.d, sp.name, sp.name_n);
            if (i < 0) {
                rc = tpl_fail(c, at, LMS_ERR_FORMAT, "format key '%.*s' not found",
                              (int)(sp.name_n > 40 ? 40 : sp.name_n), sp.name);
                break;
            }
            v = args.u.d->vals[i];
        } else {
            if ((tuple && next >= tuple->n) || (!tuple && next > 0)) {
                rc = tpl_fail(c, at, LMS_ERR_FORMAT, "not enough arguments for format string");
                break;
            }
            v = tuple ? tuple->items[next] : args;
            next++;
        }
        rc = format_one(c, at, &b, &sp, v);
    }
    if (rc == 0 && !mapping && next < (tuple ? tuple->n : 1))
        rc = tpl_fail(c, at, LMS_ERR_FORMAT, "not all arguments converted during string formatting");
    return tpl_buf_finish(c, at, &b, rc, out);
}

/* str.format with "{}", "{0}", "{name}" fields (no format specs). */
static int str_format_method(tpl_ctx *c, const tpl_node *at, tpl_val fmt, const tpl_args *a,
                             tpl_val *out)
{
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    size_t auto_idx = 0;
    int rc = 0;
    while (rc == 0 && p < end) {
        if ((*p == '{' || *p == '}') && p + 1 < end && p[1] == *p) {
            rc = tpl_buf_putc(&b, *p);
            p += 2;
            continue;
        }
        if (*p != '{') {
            rc = tpl_buf_putc(&b, *p++);
            continue;
        }
        const char *close = memchr(p, '}', (size_t)(end - p));
        if (!close) {
            rc = tpl_fail(c, at, LMS_ERR_FORMAT, "single '{' encountered in format string");
            break;
        }
        const char *f = p + 1;
        size_t fn = (size_t)(close - f);
        tpl_val v = tpl_undef(NULL, 0, TPL_N_TYPES);
        bool found;
        if (fn == 0) {
            found = auto_idx < a->n_pos && (v = a->pos[auto_idx], true);
            auto_idx++;
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t idx = (size_t)strtoul(f, NULL, 10);
            found = idx < a->n_pos && (v = a->pos[idx], true);
        } else {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)fn, f);
            found = tpl_arg(
                &(tpl_args){.kw_names = a->kw_names, .kw_vals = a->kw_vals, .n_kw = a->n_kw}, 0,
                name, &v);
        }
        if (!found || memchr(f, ':', fn) || memchr(f, '!', fn)) {
            rc = tpl_fail(c, at, LMS_ERR_FORMAT, "unsupported or missing format field '{%.*s}'",
                          (int)(fn > 40 ? 40 : fn), f);
            break;
        }
        rc = tpl_write_str(&b, v);
        p = close + 1;
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

/* ---- method table ----------------------------------------------------------------- */

/* arg: the table entry's mode (which case mapping, which sides, ...). */
typedef int (*method_fn)(tpl_ctx *c, const tpl_node *at, tpl_val self, const tpl_args *a, int arg,
                         tpl_val *out);

typedef struct method_def {
    uint8_t type; /* enum tpl_type of self */
    const char *name;
    method_fn fn;       /* NULL: refused by the sandbox (mutates self) */
    const char *params; /* comma-separated names, for argument checks */
    int arg;            /* passed to fn */
} method_def;

static int str_arg(tpl_ctx *c, const tpl_node *at, const tpl_args *a, size_t i, const char *name,
                   tpl_val *v)
{
    if (!tpl_arg(a, i, name, v))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "missing argument '%s'", name);
    if (v->type != TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "argument '%s' must be str, not %s", name,
                        tpl_type_name(*v));
    return 0;
}

static int64_t int_arg(const tpl_args *a, size_t i, const char *name, int64_t def)
{
    tpl_val v;
    if (!tpl_arg(a, i, name, &v) || (v.type != TPL_INT && v.type != TPL_BOOL))
        return def;
    return v.type == TPL_BOOL ? v.u.b : v.u.i;
}

static int m_case(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int mode,
                  tpl_val *out)
{
    return tpl_str_case(c, at, s, mode, out);
}

/* str.expandtabs(tabsize=8): each tab to spaces up to the next multiple of
 * tabsize columns (code points; a line break starts a new line). */
static int m_expandtabs(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int arg,
                        tpl_val *out)
{
    int64_t tab = int_arg(a, 0, "tabsize", 8), col = 0;
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    for (size_t i = 0; i < s.u.s.n && rc == 0;) {
        size_t k = tpl_utf8_offset(s.u.s.p + i, s.u.s.n - i, 1);
        char ch = s.u.s.p[i];
        if (ch == '\t') {
            for (int64_t pad = tab > 0 ? tab - col % tab : 0; pad > 0 && rc == 0; pad--, col++)
                rc = tpl_buf_putc(&b, ' ');
        } else {
            rc = tpl_buf_put(&b, s.u.s.p + i, k);
            col = ch == '\n' || ch == '\r' ? 0 : col + 1;
        }
        i += k;
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

/* str.swapcase: upper case to lower, lower to upper (Python's rules). */
static int m_swapcase(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int arg,
                      tpl_val *out)
{
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    uint32_t before = 0;
    for (size_t i = 0; i < s.u.s.n && rc == 0;) {
        size_t k;
        uint32_t cp = tpl_utf8_decode(s.u.s.p + i, s.u.s.n - i, &k);
        if (cp_is_upper(cp))
            rc = put_case(&b, s, i, k, cp, before, CASE_LOWER);
        else if (cp_is_lower(cp))
            rc = put_case(&b, s, i, k, cp, before, CASE_UPPER);
        else
            rc = tpl_buf_put(&b, s.u.s.p + i, k);
        if (!cp_is_case_ignorable(cp))
            before = cp;
        i += k;
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int m_strip(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int sides,
                   tpl_val *out)
{
    tpl_val chars = tpl_none();
    tpl_arg(a, 0, "chars", &chars);
    return tpl_str_strip(c, at, s, chars, sides, out);
}

static int m_split(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int right,
                   tpl_val *out)
{
    tpl_val sep = tpl_none();
    tpl_arg(a, 0, "sep", &sep);
    if (sep.type != TPL_STR && sep.type != TPL_NONE)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "must be str or None, not %s", tpl_type_name(sep));
    return str_split(c, at, s, sep, int_arg(a, 1, "maxsplit", -1), right, out);
}

static int m_splitlines(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int arg,
                        tpl_val *out)
{
    tpl_val keep = tpl_bool(false);
    tpl_arg(a, 0, "keepends", &keep);
    return str_splitlines(c, at, s, tpl_truthy(keep), out);
}

static int m_replace(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int arg,
                     tpl_val *out)
{
    tpl_val from, to;
    TPL_TRY(str_arg(c, at, a, 0, "old", &from));
    TPL_TRY(str_arg(c, at, a, 1, "new", &to));
    return tpl_str_replace(c, at, s, from, to, int_arg(a, 2, "count", -1), out);
}

/* The part s[start:end] that startswith/find/count/... look at, from their
 * optional start and end arguments (code points, negative from the end,
 * none = open, as Python's slice bounds). *skip: code points cut from the
 * front. False when the window is empty because start passed the end. */
static int str_window(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, size_t first,
                      tpl_val *w, int64_t *skip, bool *past)
{
    int64_t len = (int64_t)tpl_utf8_len(s.u.s.p, s.u.s.n), b[2] = {0, len};
    *past = false;
    for (int k = 0; k < 2; k++) {
        tpl_val v;
        if (!tpl_arg(a, first + (size_t)k, k ? "end" : "start", &v) || v.type == TPL_NONE)
            continue;
        if (v.type != TPL_INT && v.type != TPL_BOOL)
            return tpl_fail(c, at, LMS_ERR_FORMAT,
                            "slice indices must be integers or None or have an __index__ method");
        int64_t i = v.type == TPL_BOOL ? v.u.b : v.u.i;
        if (i < 0)
            i = i + len < 0 ? 0 : i + len;
        *past |= k == 0 && i > len;
        b[k] = i > len ? len : i;
    }
    *past |= b[0] > b[1];
    size_t lo = tpl_utf8_offset(s.u.s.p, s.u.s.n, (size_t)b[0]);
    size_t hi = b[1] > b[0] ? tpl_utf8_offset(s.u.s.p, s.u.s.n, (size_t)b[1]) : lo;
    *w = tpl_str(s.u.s.p + lo, hi - lo);
    *skip = b[0];
    return 0;
}

/* startswith/endswith: the argument may be a str or a tuple/list of str. */
static int m_affix(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int end,
                   tpl_val *out)
{
    tpl_val x;
    int64_t skip;
    bool past;
    TPL_TRY(str_window(c, at, s, a, 1, &s, &skip, &past));
    if (!tpl_arg(a, 0, end ? "suffix" : "prefix", &x))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%s() takes at least 1 argument",
                        end ? "endswith" : "startswith");
    const tpl_val *opts = &x;
    size_t n_opts = 1;
    if (x.type == TPL_LIST) {
        opts = x.u.l->items;
        n_opts = x.u.l->n;
    }
    bool hit = false;
    for (size_t k = 0; k < n_opts && !hit; k++) {
        tpl_val o = opts[k];
        if (o.type != TPL_STR)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "%s arg must be str or a tuple of str, not %s",
                            end ? "endswith" : "startswith", tpl_type_name(o));
        hit = !past && o.u.s.n <= s.u.s.n &&
              memcmp(s.u.s.p + (end ? s.u.s.n - o.u.s.n : 0), o.u.s.p, o.u.s.n) == 0;
    }
    *out = tpl_bool(hit);
    return 0;
}

/* find (mode 0), rfind (1), count (2), index (3), rindex (4) of a
 * substring in s[start:end]; results in code points. */
static int m_search(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int mode,
                    tpl_val *out)
{
    tpl_val sub;
    TPL_TRY(str_arg(c, at, a, 0, "sub", &sub));
    int64_t count = 0, first = -1, last = -1, skip;
    bool past;
    TPL_TRY(str_window(c, at, s, a, 1, &s, &skip, &past));
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    for (const char *q = p; q <= end && !past;) {
        const char *hit = memmem(q, (size_t)(end - q), sub.u.s.p, sub.u.s.n);
        if (!hit)
            break;
        int64_t idx = skip + (int64_t)tpl_utf8_len(p, (size_t)(hit - p));
        if (first < 0)
            first = idx;
        last = idx;
        count++;
        q = hit + (sub.u.s.n ? sub.u.s.n : 1);
        if (mode == 0 && first >= 0)
            break;
    }
    if (mode >= 3 && first < 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "substring not found");
    *out = tpl_int(mode == 0 || mode == 3 ? first : mode == 1 || mode == 4 ? last : count);
    return 0;
}

/* partition / rpartition (right): a 3-tuple (head, sep, tail). */
static int m_partition(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int right,
                       tpl_val *out)
{
    tpl_val sep;
    TPL_TRY(str_arg(c, at, a, 0, "sep", &sep));
    if (sep.u.s.n == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "empty separator");
    const char *hit = right ? find_last(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n)
                            : memmem(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n);
    tpl_val parts[3] = {s, tpl_str("", 0), tpl_str("", 0)};
    if (hit) {
        size_t h = (size_t)(hit - s.u.s.p);
        parts[0] = tpl_str(s.u.s.p, h);
        parts[1] = sep;
        parts[2] = tpl_str(hit + sep.u.s.n, s.u.s.n - h - sep.u.s.n);
    } else if (right) { /* rpartition puts a miss at the end: ('', '', s) */
        parts[0] = parts[2];
        parts[2] = s;
    }
    TPL_TRY(tpl_list_from_vals(c, at, parts, 3, out));
    out->flags = TPL_F_TUPLE;
    return 0;
}

/* removeprefix / removesuffix (end). */
static int m_remove_affix(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int end,
                          tpl_val *out)
{
    tpl_val x;
    TPL_TRY(str_arg(c, at, a, 0, end ? "suffix" : "prefix", &x));
    *out = s;
    if (x.u.s.n <= s.u.s.n &&
        memcmp(s.u.s.p + (end ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n) == 0)
        *out = tpl_str(s.u.s.p + (end ? 0 : x.u.s.n), s.u.s.n - x.u.s.n);
    return 0;
}

/* ljust (mode 0), rjust (1), center (2), zfill (3): s padded to width code
 * points with fillchar (a space; zfill: '0' after any sign). */
static int m_pad(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int mode,
                 tpl_val *out)
{
    tpl_val w, fill = tpl_str(mode == 3 ? "0" : " ", 1);
    if (!tpl_arg(a, 0, "width", &w) || (w.type != TPL_INT && w.type != TPL_BOOL))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%s() wants an integer width",
                        (const char *[]){"ljust", "rjust", "center", "zfill"}[mode]);
    if (mode != 3 && tpl_arg(a, 1, "fillchar", &fill) &&
        (fill.type != TPL_STR || tpl_utf8_len(fill.u.s.p, fill.u.s.n) != 1))
        return tpl_fail(c, at, LMS_ERR_FORMAT,
                        "The fill character must be exactly one character long");
    int64_t width = w.type == TPL_BOOL ? w.u.b : w.u.i;
    int64_t len = (int64_t)tpl_utf8_len(s.u.s.p, s.u.s.n);
    if (width <= len) {
        *out = s;
        return 0;
    }
    if (width > (int64_t)c->lim.max_output_bytes)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "string longer than %zu bytes",
                        c->lim.max_output_bytes);
    int64_t pad = width - len;
    int64_t left = mode == 0 ? 0 : mode == 2 ? pad / 2 + (pad & width & 1) : pad;
    size_t sign = mode == 3 && s.u.s.n && (s.u.s.p[0] == '+' || s.u.s.p[0] == '-');
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = tpl_buf_put(&b, s.u.s.p, sign);
    for (int64_t k = 0; k < left && rc == 0; k++)
        rc = tpl_buf_put(&b, fill.u.s.p, fill.u.s.n);
    if (rc == 0)
        rc = tpl_buf_put(&b, s.u.s.p + sign, s.u.s.n - sign);
    for (int64_t k = left; k < pad && rc == 0; k++)
        rc = tpl_buf_put(&b, fill.u.s.p, fill.u.s.n);
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int m_join(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int arg,
                  tpl_val *out)
{
    tpl_val seq;
    tpl_list *items = NULL;
    if (!tpl_arg(a, 0, "iterable", &seq))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "join() takes exactly one argument");
    TPL_TRY(tpl_iterate(c, at, seq, &items));
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        if (items->items[i].type != TPL_STR) {
            tpl_buf_free(&b);
            return tpl_fail(c, at, LMS_ERR_FORMAT,
                            "sequence item %zu: expected str instance, %s found", i,
                            tpl_type_name(items->items[i]));
        }
        if (i)
            rc = tpl_buf_put(&b, s.u.s.p, s.u.s.n);
        if (rc == 0)
            rc = tpl_buf_put(&b, items->items[i].u.s.p, items->items[i].u.s.n);
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int m_format(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int arg,
                    tpl_val *out)
{
    return str_format_method(c, at, s, a, out);
}

/* isdigit/isalpha/isalnum/isspace, ASCII-based except isspace (non-ASCII
 * code points count as letters for isalpha/isalnum); isupper/islower. */
static int m_is(tpl_ctx *c, const tpl_node *at, tpl_val s, const tpl_args *a, int kind,
                tpl_val *out)
{
    if (kind >= 4) {
        *out = tpl_bool(tpl_str_is_case(s, kind == 4));
        return 0;
    }
    bool ok = s.u.s.n > 0;
    for (size_t i = 0; i < s.u.s.n && ok;) {
        size_t k;
        uint32_t cp = tpl_utf8_decode(s.u.s.p + i, s.u.s.n - i, &k);
        bool digit = cp >= '0' && cp <= '9', alpha = cp_is_letter(cp) && !tpl_cp_is_space(cp);
        switch (kind) {
        case 0: ok = digit; break;
        case 1: ok = alpha; break;
        case 2: ok = alpha || digit; break;
        default: ok = tpl_cp_is_space(cp); break;
        }
        i += k;
    }
    *out = tpl_bool(ok);
    return 0;
}

/* dict.items() / keys() / values() as lists (of tuples for items). */
static int dict_view(tpl_ctx *c, const tpl_node *at, const tpl_dict *d, int which, tpl_val *out)
{
    tpl_list *l = tpl_list_new(&c->arena, d->n);
    if (!l)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0) {
            tpl_val pair[2] = {d->keys[i], d->vals[i]};
            TPL_TRY(tpl_list_from_vals(c, at, pair, 2, &l->items[i]));
            l->items[i].flags = TPL_F_TUPLE;
        } else {
            l->items[i] = which == 1 ? d->keys[i] : d->vals[i];
        }
    }
    l->n = d->n;
    *out = tpl_list_val(l);
    return 0;
}

int tpl_dict_items(tpl_ctx *c, const tpl_node *at, const tpl_dict *d, tpl_val *out)
{
    return dict_view(c, at, d, 0, out);
}

static int m_view(tpl_ctx *c, const tpl_node *at, tpl_val d, const tpl_args *a, int which,
                  tpl_val *out)
{
    return dict_view(c, at, d.u.d, which, out);
}

static int m_get(tpl_ctx *c, const tpl_node *at, tpl_val d, const tpl_args *a, int arg,
                 tpl_val *out)
{
    tpl_val key, def = tpl_none();
    if (!tpl_arg(a, 0, "key", &key))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "get expected at least 1 argument, got 0");
    tpl_arg(a, 1, "default", &def);
    long i = tpl_dict_find(d.u.d, key);
    *out = i >= 0 ? d.u.d->vals[i] : def;
    return 0;
}

/* float.is_integer(): finite and without a fraction. */
static int m_is_integer(tpl_ctx *c, const tpl_node *at, tpl_val v, const tpl_args *a, int arg,
                        tpl_val *out)
{
    *out = tpl_bool(isfinite(v.u.f) && floor(v.u.f) == v.u.f);
    return 0;
}

static int m_copy(tpl_ctx *c, const tpl_node *at, tpl_val v, const tpl_args *a, int arg,
                  tpl_val *out)
{
    if (v.type == TPL_LIST)
        return tpl_list_from_vals(c, at, v.u.l->items, v.u.l->n, out);
    tpl_dict *d = tpl_dict_new(&c->arena, v.u.d->n);
    if (!d)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < v.u.d->n; i++) {
        d->keys[i] = v.u.d->keys[i];
        d->vals[i] = v.u.d->vals[i];
    }
    d->n = v.u.d->n;
    *out = tpl_dict_val(d);
    return 0;
}

static int m_lindex(tpl_ctx *c, const tpl_node *at, tpl_val l, const tpl_args *a, int arg,
                    tpl_val *out)
{
    tpl_val x;
    if (!tpl_arg(a, 0, "value", &x))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "index expected at least 1 argument, got 0");
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (tpl_equal(l.u.l->items[i], x)) {
            *out = tpl_int((int64_t)i);
            return 0;
        }
    }
    return tpl_fail(c, at, LMS_ERR_FORMAT, "value is not in list");
}

static int m_lcount(tpl_ctx *c, const tpl_node *at, tpl_val l, const tpl_args *a, int arg,
                    tpl_val *out)
{
    tpl_val x;
    int64_t n = 0;
    if (!tpl_arg(a, 0, "value", &x))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "count() takes exactly one argument (0 given)");
    for (size_t i = 0; i < l.u.l->n; i++)
        n += tpl_equal(l.u.l->items[i], x);
    *out = tpl_int(n);
    return 0;
}

static int m_cycle(tpl_ctx *c, const tpl_node *at, tpl_val lp, const tpl_args *a, int arg,
                   tpl_val *out)
{
    if (a->n_pos == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "no items for cycling given");
    *out = a->pos[lp.u.loop->index0 % a->n_pos];
    return 0;
}

static int m_changed(tpl_ctx *c, const tpl_node *at, tpl_val lp, const tpl_args *a, int arg,
                     tpl_val *out)
{
    tpl_loop *l = lp.u.loop;
    tpl_val now;
    TPL_TRY(tpl_list_from_vals(c, at, a->pos, a->n_pos, &now));
    bool changed = !l->has_changed || !tpl_equal(l->last_changed, now);
    l->last_changed = now;
    l->has_changed = true;
    *out = tpl_bool(changed);
    return 0;
}

static const method_def k_methods[] = {
    {TPL_STR, "upper", m_case, "", TPL_CASE_UPPER},
    {TPL_STR, "lower", m_case, "", TPL_CASE_LOWER},
    {TPL_STR, "casefold", m_case, "", TPL_CASE_LOWER},
    {TPL_STR, "title", m_case, "", TPL_CASE_TITLE},
    {TPL_STR, "capitalize", m_case, "", TPL_CASE_CAPITALIZE},
    {TPL_STR, "swapcase", m_swapcase, "", 0},
    {TPL_STR, "expandtabs", m_expandtabs, "tabsize", 0},
    {TPL_STR, "strip", m_strip, "chars", 3},
    {TPL_STR, "lstrip", m_strip, "chars", 1},
    {TPL_STR, "rstrip", m_strip, "chars", 2},
    {TPL_STR, "split", m_split, "sep,maxsplit", false},
    {TPL_STR, "rsplit", m_split, "sep,maxsplit", true},
    {TPL_STR, "splitlines", m_splitlines, "keepends", 0},
    {TPL_STR, "replace", m_replace, "old,new,count", 0},
    {TPL_STR, "startswith", m_affix, "prefix,start,end", false},
    {TPL_STR, "endswith", m_affix, "suffix,start,end", true},
    {TPL_STR, "find", m_search, "sub,start,end", 0},
    {TPL_STR, "rfind", m_search, "sub,start,end", 1},
    {TPL_STR, "count", m_search, "sub,start,end", 2},
    {TPL_STR, "index", m_search, "sub,start,end", 3},
    {TPL_STR, "rindex", m_search, "sub,start,end", 4},
    {TPL_STR, "partition", m_partition, "sep", false},
    {TPL_STR, "rpartition", m_partition, "sep", true},
    {TPL_STR, "removeprefix", m_remove_affix, "prefix", false},
    {TPL_STR, "removesuffix", m_remove_affix, "suffix", true},
    {TPL_STR, "ljust", m_pad, "width,fillchar", 0},
    {TPL_STR, "rjust", m_pad, "width,fillchar", 1},
    {TPL_STR, "center", m_pad, "width,fillchar", 2},
    {TPL_STR, "zfill", m_pad, "width", 3},
    {TPL_STR, "isdecimal", m_is, "", 0},
    {TPL_STR, "isnumeric", m_is, "", 0},
    {TPL_STR, "join", m_join, "iterable", 0},
    {TPL_STR, "format", m_format, NULL, 0},
    {TPL_STR, "isdigit", m_is, "", 0},
    {TPL_STR, "isalpha", m_is, "", 1},
    {TPL_STR, "isalnum", m_is, "", 2},
    {TPL_STR, "isspace", m_is, "", 3},
    {TPL_STR, "isupper", m_is, "", 4},
    {TPL_STR, "islower", m_is, "", 5},
    {TPL_DICT, "items", m_view, "", 0},
    {TPL_DICT, "keys", m_view, "", 1},
    {TPL_DICT, "values", m_view, "", 2},
    {TPL_DICT, "get", m_get, "key,default", 0},
    {TPL_DICT, "copy", m_copy, "", 0},
    {TPL_DICT, "pop", NULL, NULL, 0},
    {TPL_DICT, "popitem", NULL, NULL, 0},
    {TPL_DICT, "update", NULL, NULL, 0},
    {TPL_DICT, "clear", NULL, NULL, 0},
    {TPL_DICT, "setdefault", NULL, NULL, 0},
    {TPL_LIST, "index", m_lindex, "value", 0},
    {TPL_LIST, "count", m_lcount, "value", 0},
    {TPL_LIST, "copy", m_copy, "", 0},
    {TPL_LIST, "append", NULL, NULL, 0},
    {TPL_LIST, "extend", NULL, NULL, 0},
    {TPL_LIST, "insert", NULL, NULL, 0},
    {TPL_LIST, "pop", NULL, NULL, 0},
    {TPL_LIST, "remove", NULL, NULL, 0},
    {TPL_LIST, "reverse", NULL, NULL, 0},
    {TPL_LIST, "sort", NULL, NULL, 0},
    {TPL_LIST, "clear", NULL, NULL, 0},
    {TPL_FLOAT, "is_integer", m_is_integer, "", 0},
    {TPL_LOOP, "cycle", m_cycle, NULL, 0},
    {TPL_LOOP, "changed", m_changed, NULL, 0},
};

int tpl_method_find(tpl_ctx *c, const tpl_node *at, tpl_val obj, const char *name, size_t n,
                    tpl_val *out)
{
    for (size_t k = 0; k < sizeof k_methods / sizeof k_methods[0]; k++) {
        const method_def *m = &k_methods[k];
        if (m->type != obj.type || strlen(m->name) != n || memcmp(m->name, name, n) != 0)
            continue;
        if (!m->fn) {
            *out = tpl_undef(m->name, n, obj.type);
            out->flags = TPL_F_UNSAFE;
            return 1;
        }
        tpl_method *bm = tpl_alloc(&c->arena, sizeof *bm);
        if (!bm)
            return tpl_fail_nomem(c, at);
        bm->self = obj;
        bm->name = m->name;
        bm->id = (int)k;
        *out = (tpl_val){.type = TPL_METHOD};
        out->u.meth = bm;
        return 1;
    }
    return 0;
}

int tpl_method_call(tpl_ctx *c, const tpl_node *at, const tpl_method *m, const tpl_args *a,
                    tpl_val *out)
{
    const method_def *def = &k_methods[m->id];
    if (def->params) {
        char what[48];
        snprintf(what, sizeof what, "%s.%s()", tpl_type_name(m->self), def->name);
        TPL_TRY(tpl_args_check(c, at, a, what, def->params));
    }
    return def->fn(c, at, m->self, a, def->arg, out);
}

/* ---- global functions --------------------------------------------------------------- */

static const char *const k_func_names[FN_COUNT] = {
    [FN_NAMESPACE] = "namespace",   [FN_RANGE] = "range",           [FN_DICT] = "dict",
    [FN_RAISE] = "raise_exception", [FN_STRFTIME] = "strftime_now",
};

const char *tpl_func_name(int fn) { return fn >= 0 && fn < FN_COUNT ? k_func_names[fn] : "?"; }

/* namespace(...) and dict(...): dict(mapping?, **kwargs). */
static int fn_mapping(tpl_ctx *c, const tpl_node *at, const tpl_args *a, int type, tpl_val *out)
{
    tpl_dict *d = tpl_dict_new(&c->arena, a->n_kw + 4);
    if (!d)
        return tpl_fail_nomem(c, at);
    if (a->n_pos > 1)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%s expected at most 1 positional argument",
                        type == TPL_NS ? "namespace" : "dict");
    if (a->n_pos == 1) {
        tpl_val src = a->pos[0];
        if (src.type != TPL_DICT && src.type != TPL_NS)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "cannot convert %s to a mapping",
                            tpl_type_name(src));
        for (size_t i = 0; i < src.u.d->n; i++)
            if (tpl_dict_set(&c->arena, d, src.u.d->keys[i], src.u.d->vals[i]) < 0)
                return tpl_fail_nomem(c, at);
    }
    for (size_t k = 0; k < a->n_kw; k++)
        if (tpl_dict_set(&c->arena, d, a->kw_names[k], a->kw_vals[k]) < 0)
            return tpl_fail_nomem(c, at);
    *out = tpl_dict_val(d);
    out->type = (uint8_t)type;
    return 0;
}

static int fn_range(tpl_ctx *c, const tpl_node *at, const tpl_args *a, tpl_val *out)
{
    int64_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "range expected 1 to 3 integer arguments");
    for (size_t k = 0; k < a->n_pos; k++) {
        if (a->pos[k].type != TPL_INT && a->pos[k].type != TPL_BOOL)
            return tpl_fail(c, at, LMS_ERR_FORMAT,
                            "'%s' object cannot be interpreted as an integer",
                            tpl_type_name(a->pos[k]));
        v[a->n_pos == 1 ? 1 : k] = a->pos[k].type == TPL_BOOL ? a->pos[k].u.b : a->pos[k].u.i;
    }
    if (v[2] == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "range() arg 3 must not be zero");
    double count = ceil_div(v[1] - (double)v[0], (double)v[2]);
    if (count > TPL_MAX_RANGE)
        return tpl_fail(c, at, LMS_ERR_LIMIT,
                        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                        TPL_MAX_RANGE);
    size_t n = count > 0 ? (size_t)count : 0;
    tpl_list *l = tpl_list_new(&c->arena, n);
    if (!l)
        return tpl_fail_nomem(c, at);
    for (size_t k = 0; k < n; k++)
        l->items[k] = tpl_int(v[0] + (int64_t)k * v[2]);
    l->n = n;
    *out = tpl_list_val(l);
    return 0;
}

static int fn_raise(tpl_ctx *c, const tpl_node *at, const tpl_args *a, tpl_val *out)
{
    tpl_val msg = a->n_pos ? a->pos[0] : tpl_str("", 0);
    TPL_TRY(tpl_to_str(c, at, msg, &msg));
    c->failed = true;
    return lms_errf(c->err, c->errsz, LMS_ERR_INVAL, "%.*s", (int)msg.u.s.n, msg.u.s.p);
}

static int fn_strftime(tpl_ctx *c, const tpl_node *at, const tpl_args *a, tpl_val *out)
{
    tpl_val fmt;
    if (a->n_pos != 1 || a->pos[0].type != TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "strftime_now() takes one string argument");
    fmt = a->pos[0];
    if (c->vars->now_text) {
        *out = tpl_cstr(c->vars->now_text);
        return 0;
    }
    char f[256], buf[512];
    if (fmt.u.s.n >= sizeof f)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "strftime_now() format longer than %zu bytes",
                        sizeof f - 1);
    memcpy(f, fmt.u.s.p, fmt.u.s.n);
    f[fmt.u.s.n] = 0;
    time_t t = c->vars->now ? (time_t)c->vars->now : time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    /* The format comes from the template; strftime only reads it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = strftime(buf, sizeof buf, f, &tm);
#pragma GCC diagnostic pop
    char *p = NULL;
    TPL_TRY(tpl_new_str(c, at, n, &p, out));
    memcpy(p, buf, n);
    return 0;
}

int tpl_func_call(tpl_ctx *c, const tpl_node *at, int fn, const tpl_args *a, tpl_val *out)
{
    switch (fn) {
    case FN_NAMESPACE: return fn_mapping(c, at, a, TPL_NS, out);
    case FN_DICT: return fn_mapping(c, at, a, TPL_DICT, out);
    case FN_RANGE: return fn_range(c, at, a, out);
    case FN_RAISE: return fn_raise(c, at, a, out);
    case FN_STRFTIME: return fn_strftime(c, at, a, out);
    default: return tpl_fail(c, at, LMS_ERR_FORMAT, "unknown function");
    }
}
