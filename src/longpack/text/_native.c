/* longpack.text._native: a strict scanner for pre-tokenized JSON Lines rows, compiled ahead of time.
 *
 * scan_pretokenized(data, vocab_size, tokens, mask, lengths, lines)
 *     -> (rows, tokens_written, newlines, rows_with_mask, declined, extra_keys)
 *
 * Reads every line of `data` (split at '\n', as the per-row path splits a chunk) and takes a line only if
 * json.loads reads it to an object whose "input_ids" (a list of integers in [0, vocab_size), at least 2)
 * and optional "loss_mask" (a list of 0/1 integers of the same length) the per-row path would take as is:
 *
 *     line   := ws* '{' ws* member (ws* ',' ws* member)* ws* '}' ws*        (ws: space, tab, CR)
 *     member := "input_ids" ':' ints | "loss_mask" ':' ints | KEY ':' VALUE  (each key once)
 *     ints   := '[' ws* (INT (ws* ',' ws* INT)*)? ws* ']'     INT: -?(0|[1-9][0-9]{0,17})
 *
 * KEY is a string without escapes, VALUE any JSON value json.loads reads (strings with valid escapes and
 * valid UTF-8 without encoded surrogates, numbers, true/false/null, NaN/Infinity/-Infinity, arrays and
 * objects nested at most 32 deep). Anything else on a line (another number syntax, a bool mask, a value out
 * of range, a duplicate key, an escaped key, other bytes) makes the scanner *decline* the line: it is left
 * for the per-row json.loads path, which reads it (or reports it with file:line) exactly as before. So an
 * accepted line is always one json.loads accepts, with the same tokens and mask; the tests check both ways.
 *
 * Blank lines (only bytes.strip() whitespace) are skipped, as the per-row path skips them.
 * Outputs: accepted rows' tokens and 0/1 mask appended to `tokens` (int32 or int64) and `mask` (uint8);
 * per row its token count (`lengths`, int64) and line index within `data` (`lines`, int64, 0-based);
 * `declined`: [(start, end, line index)] byte ranges of declined lines; `extra_keys`: [(row, start, end)]
 * byte ranges of the other keys of accepted rows (counted as columns by the caller).
 * Capacity: `tokens` and `mask` need (len(data) + 1) // 2 items, `lengths` and `lines` len(data) // 19 + 2.
 * The scan runs without the GIL.
 */
#include "../_native_common.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_DEPTH 32
#define MAX_EXTRA 64

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

static inline void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

/* Parse a JSON integer token (json.loads: -?(0|[1-9]\d*)), at most 18 digits; the next byte must not
 * continue a number ('.', 'e', 'E', a digit). Returns 1 and the value, or 0 (decline). */
static inline int parse_int(cursor *c, int64_t *out) {
    const uint8_t *p = c->p, *end = c->end;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return 0;
    int64_t v = 0;
    if (*p == '0') {
        p++;
    } else {
        const uint8_t *start = p;
        while (p < end && *p >= '0' && *p <= '9') {
            v = v * 10 + (*p - '0');
            p++;
            if (p - start > 18) return 0;
        }
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9'))) return 0;
    c->p = p;
    *out = neg ? -v : v;
    return 1;
}

/* Up to 8 leading digits of the 8 bytes at p (a SWAR step: one load, a few multiplies): the count of
 * digits before the first other byte (8 = all digits), and their value. The bytes after the line's end
 * may be read (the caller keeps 8 bytes of the buffer ahead), never used. */
static inline int swar_digits(const uint8_t *p, uint64_t *value) {
    uint64_t x;
    memcpy(&x, p, 8);
    /* a byte is a digit iff its high nibble is 3 and adding 6 keeps it 3 (a carry out of a non-digit
     * byte only reaches later bytes, after the first non-digit, which are never used) */
    uint64_t hi = x & 0xF0F0F0F0F0F0F0F0ULL;
    uint64_t hi6 = (x + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL;
    uint64_t other = (hi ^ 0x3030303030303030ULL) | (hi6 ^ 0x3030303030303030ULL);
    int k = other ? __builtin_ctzll(other) >> 3 : 8;
    if (k == 0) return 0;
    uint64_t v = (x & 0x0F0F0F0F0F0F0F0FULL) << (8 * (8 - k));
    v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFULL;
    v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFULL;
    v = (v * 10000 + (v >> 32)) & 0x00000000FFFFFFFFULL;
    *value = v;
    return k;
}

/* One integer of a list: the SWAR path while 8 bytes of the buffer are left ahead, else parse_int. */
static inline int next_int(cursor *c, const uint8_t *buf_end, int64_t *out) {
    const uint8_t *q = c->p;
    if (buf_end - q >= 24) {
        int neg = *q == '-';
        q += neg;
        uint64_t v;
        int k = swar_digits(q, &v);
        if (k == 0 || (k > 1 && *q == '0')) return 0;
        if (k == 8) return parse_int(c, out); /* a long number: the digit loop (checks 18 digits) */
        q += k;
        if (*q == '.' || *q == 'e' || *q == 'E') return 0;
        c->p = q;
        *out = neg ? -(int64_t)v : (int64_t)v;
        return 1;
    }
    return parse_int(c, out);
}

/* Bit i set where p[i] is ',' or ']', for the 64 bytes at p (the caller keeps 64 bytes of the buffer
 * ahead). SSE2 (every x86-64) compares 16 bytes at a time; elsewhere a byte loop. */
static inline uint64_t separators64(const uint8_t *p) {
#if defined(__SSE2__)
    const __m128i comma = _mm_set1_epi8(','), close = _mm_set1_epi8(']');
    uint64_t bits = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * i));
        __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(v, comma), _mm_cmpeq_epi8(v, close));
        bits |= (uint64_t)(uint32_t)_mm_movemask_epi8(hit) << (16 * i);
    }
    return bits;
#else
    uint64_t bits = 0;
    for (int i = 0; i < 64; i++) bits |= (uint64_t)(p[i] == ',' || p[i] == ']') << i;
    return bits;
#endif
}

/* The integer of one list item [s, e): ws* INT ws* exactly (INT as in parse_int). 1 and the value, else 0.
 * Uses the SWAR step, so 8 bytes past s must be readable. */
static inline int item_int(const uint8_t *s, const uint8_t *e, int64_t *out) {
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
    int neg = s < e && *s == '-';
    s += neg;
    uint64_t v;
    int k = swar_digits(s, &v);
    if (k == 0 || k == 8 || (k > 1 && *s == '0')) return 0; /* k == 8: a long number, the slow loop */
    s += k;
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
    if (s != e) return 0;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* A list of integers in [lo, hi]; values written to out (width 4 or 8, or 1 for the mask), at most cap.
 * Returns the count, or -1 (decline). While 88 bytes of the buffer are left ahead, the separators of 64
 * bytes are found at once and the items between them parsed independently of each other (no chain of
 * "where does the next number start" through every digit); near the buffer's end, number by number. */
#define PARSE_INTS(NAME, T)                                                                          \
    static Py_ssize_t NAME(cursor *c, const uint8_t *buf_end, int64_t lo, int64_t hi, T *out,         \
                           Py_ssize_t cap) {                                                         \
        if (c->p >= c->end || *c->p != '[') return -1;                                               \
        c->p++;                                                                                      \
        skip_ws(c);                                                                                  \
        Py_ssize_t n = 0;                                                                            \
        if (c->p < c->end && *c->p == ']') {                                                         \
            c->p++;                                                                                  \
            return 0;                                                                                \
        }                                                                                            \
        const uint8_t *start = c->p; /* the current item's first byte */                            \
        while (buf_end - start >= 88) {                                                              \
            uint64_t bits = separators64(start);                                                     \
            if (bits == 0) break; /* an item longer than 64 bytes: the slow loop */                  \
            const uint8_t *base = start;                                                             \
            do {                                                                                     \
                const uint8_t *e = base + __builtin_ctzll(bits);                                     \
                int64_t v;                                                                           \
                const uint8_t *d = start + (*start == ' ');                                          \
                if (e - d == 1 && (uint8_t)(*d - '0') < 10 && e < c->end) {                          \
                    v = *d - '0'; /* one digit (every mask value): no SWAR step */                   \
                    if (v < lo || v > hi || n >= cap) {                                              \
                        c->p = start;                                                                \
                        goto slow;                                                                   \
                    }                                                                                \
                } else if (e >= c->end || !item_int(start, e, &v) || v < lo || v > hi || n >= cap) { \
                    c->p = start; /* let the slow loop decide (it declines what is not valid) */     \
                    goto slow;                                                                       \
                }                                                                                    \
                out[n++] = (T)v;                                                                     \
                if (*e == ']') {                                                                     \
                    c->p = e + 1;                                                                    \
                    return n;                                                                        \
                }                                                                                    \
                start = e + 1;                                                                       \
                bits &= bits - 1;                                                                    \
            } while (bits);                                                                          \
        }                                                                                            \
        c->p = start;                                                                                \
    slow:                                                                                            \
        skip_ws(c);                                                                                  \
        for (;;) {                                                                                   \
            int64_t v;                                                                               \
            if (!next_int(c, buf_end, &v) || c->p > c->end || v < lo || v > hi || n >= cap)          \
                return -1;                                                                           \
            out[n++] = (T)v;                                                                         \
            skip_ws(c);                                                                              \
            if (c->p >= c->end) return -1;                                                           \
            if (*c->p == ',') {                                                                      \
                c->p++;                                                                              \
                skip_ws(c);                                                                          \
                continue;                                                                            \
            }                                                                                        \
            if (*c->p == ']') {                                                                      \
                c->p++;                                                                              \
                return n;                                                                            \
            }                                                                                        \
            return -1;                                                                               \
        }                                                                                            \
    }

PARSE_INTS(parse_ints32, int32_t)
PARSE_INTS(parse_ints64, int64_t)
PARSE_INTS(parse_ints8, uint8_t)

/* One UTF-8 sequence starting at a byte >= 0x80: valid, shortest form, not a surrogate, <= U+10FFFF. */
static inline int utf8_char(cursor *c) {
    const uint8_t *p = c->p, *end = c->end;
    uint8_t b0 = p[0];
    int len;
    uint32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
        cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        cp = b0 & 0x0F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        cp = b0 & 0x07;
    } else {
        return 0;
    }
    if (end - p < len) return 0;
    for (int i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0; /* json.loads decodes these (surrogatepass): decline */
    c->p = p + len;
    return 1;
}

static inline int is_hex(uint8_t ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* A JSON string (cursor at the opening quote). allow_escapes=0 declines any backslash (keys). */
static int parse_string(cursor *c, int allow_escapes) {
    if (c->p >= c->end || *c->p != '"') return 0;
    c->p++;
    while (c->p < c->end) {
        uint8_t ch = *c->p;
        if (ch == '"') {
            c->p++;
            return 1;
        }
        if (ch < 0x20) return 0; /* json.loads (strict) refuses control characters in strings */
        if (ch == '\\') {
            if (!allow_escapes || c->end - c->p < 2) return 0;
            uint8_t e = c->p[1];
            if (e == 'u') {
                if (c->end - c->p < 6 || !is_hex(c->p[2]) || !is_hex(c->p[3]) || !is_hex(c->p[4]) ||
                    !is_hex(c->p[5]))
                    return 0;
                c->p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                       e == 't') {
                c->p += 2;
            } else {
                return 0;
            }
        } else if (ch >= 0x80) {
            if (!utf8_char(c)) return 0;
        } else {
            c->p++;
        }
    }
    return 0;
}

static inline int literal(cursor *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* A JSON number as json.loads reads it: -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)? (or -Infinity). */
static int parse_number(cursor *c) {
    if (c->p < c->end && *c->p == '-') {
        c->p++;
        if (c->p < c->end && *c->p == 'I') return literal(c, "Infinity");
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
    if (*c->p == '0')
        c->p++;
    else
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    }
    /* Like json.loads, a digit or '.' right after is not part of this number: the container then
     * finds no ',' or closing bracket there and declines. */
    return 1;
}

static int parse_value(cursor *c, int depth);

static int parse_array(cursor *c, int depth) {
    c->p++; /* '[' */
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 1;
    }
    for (;;) {
        if (!parse_value(c, depth + 1)) return 0;
        skip_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == ',') {
            c->p++;
            skip_ws(c);
            continue;
        }
        if (*c->p == ']') {
            c->p++;
            return 1;
        }
        return 0;
    }
}

static int parse_object(cursor *c, int depth) {
    c->p++; /* '{' */
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        if (!parse_string(c, 1)) return 0;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') return 0;
        c->p++;
        skip_ws(c);
        if (!parse_value(c, depth + 1)) return 0;
        skip_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == ',') {
            c->p++;
            skip_ws(c);
            continue;
        }
        if (*c->p == '}') {
            c->p++;
            return 1;
        }
        return 0;
    }
}

static int parse_value(cursor *c, int depth) {
    if (depth > MAX_DEPTH || c->p >= c->end) return 0;
    switch (*c->p) {
    case '"': return parse_string(c, 1);
    case '[': return parse_array(c, depth);
    case '{': return parse_object(c, depth);
    case 't': return literal(c, "true");
    case 'f': return literal(c, "false");
    case 'n': return literal(c, "null");
    case 'N': return literal(c, "NaN");
    case 'I': return literal(c, "Infinity");
    default: return parse_number(c);
    }
}

typedef struct {
    /* outputs (capacities checked on write) */
    void *tokens;
    int tok_width;
    uint8_t *mask;
    Py_ssize_t tok_cap;
    int64_t *lengths;
    int64_t *lines;
    Py_ssize_t row_cap;
    const uint8_t *buf_end; /* end of the scanned data (8-byte loads stay before it) */
    /* results */
    Py_ssize_t rows, ntok, with_mask;
    int64_t newlines;
    /* declined lines: start, end, line */
    int64_t *declined;
    Py_ssize_t n_declined, cap_declined;
    /* extra keys of accepted rows: row, start, end */
    int64_t *keys;
    Py_ssize_t n_keys, cap_keys;
    int oom;
} scan_state;

static int push3(int64_t **arr, Py_ssize_t *n, Py_ssize_t *cap, int64_t a, int64_t b, int64_t c) {
    if (*n >= *cap) {
        Py_ssize_t grown = *cap ? *cap * 2 : 64;
        int64_t *p = (int64_t *)realloc(*arr, sizeof(int64_t) * 3 * (size_t)grown);
        if (p == NULL) return -1;
        *arr = p;
        *cap = grown;
    }
    (*arr)[3 * *n] = a;
    (*arr)[3 * *n + 1] = b;
    (*arr)[3 * *n + 2] = c;
    (*n)++;
    return 0;
}

static inline int is_blank(const uint8_t *p, const uint8_t *end) {
    for (; p < end; p++)
        if (!(*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == 0x0b || *p == 0x0c)) return 0;
    return 1;
}

/* One line [line, end): 1 accepted (outputs advanced), 0 declined (outputs untouched). */
static int scan_line(scan_state *st, const uint8_t *base, const uint8_t *line, const uint8_t *end,
                     int64_t vocab) {
    cursor c = {line, end};
    Py_ssize_t tok0 = st->ntok;
    Py_ssize_t room = st->tok_cap - tok0;
    void *tok_out = (uint8_t *)st->tokens + (size_t)tok0 * (size_t)st->tok_width;
    uint8_t *mask_out = st->mask + tok0;
    Py_ssize_t n_ids = -1, n_mask = -1;
    int64_t extra[MAX_EXTRA][2];
    int n_extra = 0;
    if (st->rows >= st->row_cap) return 0;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') return 0;
    c.p++;
    skip_ws(&c);
    for (;;) {
        const uint8_t *key = c.p;
        if (!parse_string(&c, 0)) return 0;
        const uint8_t *key_end = c.p; /* past the closing quote */
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':') return 0;
        c.p++;
        skip_ws(&c);
        Py_ssize_t klen = key_end - key;
        if (klen == 11 && memcmp(key, "\"input_ids\"", 11) == 0) {
            if (n_ids >= 0) return 0;
            if (st->tok_width == 4)
                n_ids = parse_ints32(&c, st->buf_end, 0, vocab - 1, (int32_t *)tok_out, room);
            else
                n_ids = parse_ints64(&c, st->buf_end, 0, vocab - 1, (int64_t *)tok_out, room);
            if (n_ids < 0) return 0;
        } else if (klen == 11 && memcmp(key, "\"loss_mask\"", 11) == 0) {
            if (n_mask >= 0) return 0;
            n_mask = parse_ints8(&c, st->buf_end, 0, 1, mask_out, room);
            if (n_mask < 0) return 0;
        } else {
            if (n_extra >= MAX_EXTRA) return 0;
            for (int i = 0; i < n_extra; i++)
                if (extra[i][1] - extra[i][0] == klen - 2 && memcmp(base + extra[i][0], key + 1, (size_t)(klen - 2)) == 0)
                    return 0; /* a duplicate key: json.loads keeps the last; leave it to it */
            extra[n_extra][0] = key + 1 - base;
            extra[n_extra][1] = key_end - 1 - base;
            n_extra++;
            if (!parse_value(&c, 1)) return 0;
        }
        skip_ws(&c);
        if (c.p >= c.end) return 0;
        if (*c.p == ',') {
            c.p++;
            skip_ws(&c);
            continue;
        }
        if (*c.p == '}') {
            c.p++;
            break;
        }
        return 0;
    }
    skip_ws(&c);
    if (c.p != c.end) return 0;
    if (n_ids < 2) return 0;
    if (n_mask >= 0 && n_mask != n_ids) return 0;
    if (n_mask < 0)
        memset(mask_out, 1, (size_t)n_ids);
    else
        st->with_mask++;
    for (int i = 0; i < n_extra; i++) {
        if (push3(&st->keys, &st->n_keys, &st->cap_keys, st->rows, extra[i][0], extra[i][1]) < 0) {
            st->oom = 1;
            return 0;
        }
    }
    st->lengths[st->rows] = n_ids;
    st->lines[st->rows] = st->newlines;
    st->rows++;
    st->ntok += n_ids;
    return 1;
}

static void scan_all(scan_state *st, const uint8_t *data, Py_ssize_t n, int64_t vocab) {
    const uint8_t *p = data, *end = data + n;
    st->buf_end = end;
    while (p < end) {
        const uint8_t *nl = (const uint8_t *)memchr(p, '\n', (size_t)(end - p));
        const uint8_t *line_end = nl ? nl : end;
        if (!is_blank(p, line_end)) {
            if (!scan_line(st, data, p, line_end, vocab)) {
                if (st->oom) return;
                if (push3(&st->declined, &st->n_declined, &st->cap_declined, p - data, line_end - data,
                          st->newlines) < 0) {
                    st->oom = 1;
                    return;
                }
            }
        }
        if (nl == NULL) break;
        st->newlines++;
        p = nl + 1;
    }
}

static PyObject *triples(const int64_t *a, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("LLL", (long long)a[3 * i], (long long)a[3 * i + 1], (long long)a[3 * i + 2]);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

static PyObject *scan_pretokenized(PyObject *self, PyObject *args) {
    PyObject *od, *ot, *om, *ol, *oln;
    long long vocab;
    if (!PyArg_ParseTuple(args, "OLOOOO", &od, &vocab, &ot, &om, &ol, &oln)) return NULL;
    lp_array data, tok, mask, lens, lines;
    int got = 0;
    PyObject *result = NULL;
    scan_state st;
    memset(&st, 0, sizeof(st));
    if (lp_get(od, &data, 0, "data") < 0) goto done;
    got = 1;
    if (lp_get_int(ot, &tok, 1, "tokens") < 0) goto done;
    got = 2;
    if (lp_get(om, &mask, 1, "mask") < 0) goto done;
    got = 3;
    if (lp_get_i64(ol, &lens, 1, "lengths") < 0) goto done;
    got = 4;
    if (lp_get_i64(oln, &lines, 1, "lines") < 0) goto done;
    got = 5;
    Py_ssize_t n = data.n * data.itemsize;
    if (mask.itemsize != 1 || tok.n < (n + 1) / 2 || mask.n < (n + 1) / 2 || lens.n < n / 19 + 2 ||
        lines.n < n / 19 + 2 || vocab < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "scan_pretokenized: tokens/mask need (len(data) + 1) // 2 items, lengths/lines "
                        "len(data) // 19 + 2, vocab_size >= 1");
        goto done;
    }
    st.tokens = tok.data;
    st.tok_width = (int)tok.itemsize;
    st.mask = (uint8_t *)mask.data;
    st.tok_cap = tok.n < mask.n ? tok.n : mask.n;
    st.lengths = (int64_t *)lens.data;
    st.lines = (int64_t *)lines.data;
    st.row_cap = lens.n < lines.n ? lens.n : lines.n;
    if (tok.itemsize == 4 && vocab > 2147483647LL) {
        PyErr_SetString(PyExc_ValueError, "scan_pretokenized: int32 tokens cannot hold this vocabulary");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    scan_all(&st, (const uint8_t *)data.data, n, vocab);
    Py_END_ALLOW_THREADS
    if (st.oom) {
        PyErr_NoMemory();
        goto done;
    }
    {
        PyObject *declined = triples(st.declined, st.n_declined);
        PyObject *keys = declined ? triples(st.keys, st.n_keys) : NULL;
        if (keys != NULL)
            result = Py_BuildValue("nnLnNN", st.rows, st.ntok, (long long)st.newlines, st.with_mask, declined,
                                   keys);
        else
            Py_XDECREF(declined);
    }
done:
    free(st.declined);
    free(st.keys);
    if (got >= 1) lp_release(&data);
    if (got >= 2) lp_release(&tok);
    if (got >= 3) lp_release(&mask);
    if (got >= 4) lp_release(&lens);
    if (got >= 5) lp_release(&lines);
    return result;
}

/* count_newlines(data) -> number of b"\n" (memchr; no GIL). */
static PyObject *count_newlines(PyObject *self, PyObject *args) {
    PyObject *od;
    if (!PyArg_ParseTuple(args, "O", &od)) return NULL;
    lp_array data;
    if (lp_get(od, &data, 0, "data") < 0) return NULL;
    Py_ssize_t count = 0;
    const uint8_t *p = (const uint8_t *)data.data, *end = p + data.n * data.itemsize;
    Py_BEGIN_ALLOW_THREADS
    while (p < end) {
        const uint8_t *nl = (const uint8_t *)memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) break;
        count++;
        p = nl + 1;
    }
    Py_END_ALLOW_THREADS
    lp_release(&data);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"scan_pretokenized", scan_pretokenized, METH_VARARGS,
     "scan_pretokenized(data, vocab_size, tokens, mask, lengths, lines) -> (rows, tokens, newlines, "
     "rows_with_mask, declined, extra_keys): strict pre-tokenized JSON Lines rows straight into buffers"},
    {"count_newlines", count_newlines, METH_VARARGS, "count_newlines(data) -> number of newline bytes"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native",
                                       "longpack's pre-tokenized JSON Lines scanner, compiled ahead of time.",
                                       -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (lp_init_numpy() < 0) return NULL;
    return PyModule_Create(&moduledef);
}
