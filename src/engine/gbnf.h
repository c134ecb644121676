/*
 * gbnf.h - GBNF grammars (llama.cpp's grammar format, llama-server's
 * "grammar" field): the grammar text compiled into one block of memory,
 * and a checker that accepts, byte by byte, exactly the prefixes of the
 * texts the grammar's root rule produces.
 *
 * The format, as llama.cpp reads it:
 *   name ::= alternatives        a rule; names are letters, digits and '-';
 *                                the output is what `root` produces
 *   a b c                        a sequence; a | b alternatives; ( ... ) a group
 *   "text"                       a literal; [a-z0-9_] and [^...] character
 *                                classes; . any character
 *   x* x+ x? x{m} x{m,} x{m,n}   repetitions
 *   # ...                        a comment, to the end of the line
 * Escapes in literals and classes: \n \r \t \\ \" \[ \] \- \xHH \uHHHH
 * \UHHHHHHHH. A newline ends a rule except inside a group or after '|'.
 * Characters are Unicode code points (the text is UTF-8). Refused at
 * compile time, with the line and column: syntax errors, a rule defined
 * twice, a reference to a rule never defined, no root rule, left recursion
 * (a rule that can reach itself before reading a character), repetition
 * bounds over LMS_GBNF_REP_MAX, and grammars past LMS_GBNF_ELEMS elements.
 *
 * The checker follows every way the text so far can be read (a set of
 * stacks of grammar positions, as llama.cpp's sampler does), at most
 * LMS_GBNF_STACKS of them with LMS_GBNF_POOL positions in all, found with a
 * bounded amount of work per character: a text that would need more is
 * refused (the generation then ends, as on a dead end).
 */
#ifndef LMS_GBNF_H
#define LMS_GBNF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lms_gbnf lms_gbnf;

#define LMS_GBNF_ELEMS 65536 /* elements of a compiled grammar */
#define LMS_GBNF_REP_MAX 1000
#define LMS_GBNF_STACKS 128
#define LMS_GBNF_POOL 2048

/* Compiles grammar text; NULL with a message in err. Free with free(). */
lms_gbnf *lms_gbnf_compile(const char *text, size_t n, char *err, size_t errsz);
/* Bytes of the block: a copy is memcpy(dst, g, lms_gbnf_size(g)). */
size_t lms_gbnf_size(const lms_gbnf *g);

typedef struct lms_gbnf_chk {
    const lms_gbnf *g;
    uint32_t cp;    /* a character whose UTF-8 bytes are not all in: its bits so far */
    uint8_t need;   /* its bytes still to come (0: none pending) */
    uint8_t len;    /* its length in bytes */
    uint16_t n;     /* stacks */
    uint16_t off[LMS_GBNF_STACKS + 1]; /* stack i: pool[off[i] .. off[i + 1]), top last */
    uint32_t pool[LMS_GBNF_POOL];
} lms_gbnf_chk;

/* Starts a checker at the empty text. False when the grammar's start
 * needs more stacks than the checker holds. */
bool lms_gbnf_init(lms_gbnf_chk *c, const lms_gbnf *g);
/* Feeds n bytes. False when they cannot continue a text of the grammar;
 * c is then unchanged. */
bool lms_gbnf_feed(lms_gbnf_chk *c, const char *p, size_t n);
/* Whether the n bytes could be fed (c unchanged either way). */
bool lms_gbnf_allows(const lms_gbnf_chk *c, const char *p, size_t n);
/* The text fed so far is a whole text of the grammar. */
bool lms_gbnf_done(const lms_gbnf_chk *c);
/* The text fed so far is whole and nothing can follow it. */
bool lms_gbnf_closed(const lms_gbnf_chk *c);
/* dst = src (the used part). */
void lms_gbnf_copy(lms_gbnf_chk *dst, const lms_gbnf_chk *src);
/* a and b accept the same continuations (the same state; a cache key). */
bool lms_gbnf_same(const lms_gbnf_chk *a, const lms_gbnf_chk *b);

#endif
