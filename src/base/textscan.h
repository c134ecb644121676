/*
 * textscan.h - small helpers for scanning model output as bytes: JSON's
 * whitespace (space, tab, newline, carriage return) and literal lengths.
 */
#ifndef LMS_TEXTSCAN_H
#define LMS_TEXTSCAN_H

#include <stdbool.h>
#include <stddef.h>

#define LIT_LEN(s) (sizeof(s) - 1)

static inline bool text_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The first i' >= i with s[i'] not whitespace, or n. */
static inline size_t text_skip_space(const char *s, size_t i, size_t n)
{
    while (i < n && text_is_space(s[i]))
        i++;
    return i;
}

#endif
