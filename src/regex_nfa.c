/*
 * regex_nfa.c: a pattern parsed by recursive descent straight into its position automaton
 * (regex_nfa.h). Each character class written is a state; a fragment of the pattern is its
 * first states, its last states and whether it matches the empty text, and joining two
 * adds the moves from one's last states to the other's first (Glushkov). {n,m} parses its
 * atom again for each copy, so each copy has states of its own.
 */
#include "regex_nfa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct range {
    uint32_t lo, hi;
} range;

struct tp_regex {
    int n;                                      /* states: 0 the start, 1.. the classes */
    tp_regex_set follow[TP_REGEX_MAX_STATES];   /* the states that may come after each */
    tp_regex_set accept, live;                  /* where a match ends; whence one can */
    int32_t rest[TP_REGEX_MAX_STATES];          /* the fewest characters after each to an end */
    int32_t first[TP_REGEX_MAX_STATES], count[TP_REGEX_MAX_STATES]; /* a class's ranges */
    uint8_t negate[TP_REGEX_MAX_STATES];
    range *ranges;
    int32_t n_ranges, cap_ranges;
};

typedef struct frag {
    tp_regex_set first, last;
    int nullable;
} frag;

typedef struct parser {
    tp_regex *r;
    const unsigned char *p;
    size_t len, i;
    int anchored_start, anchored_end;
    int depth;   /* groups open (the parse recurses into each) */
    long atoms;  /* atoms parsed so far, each copy of a repeat's again */
} parser;

/* A request's pattern must neither overflow the stack nor hold up the job: groups nested
 * deeper than MAX_GROUP_DEPTH (each level a few frames of the recursive descent) are refused,
 * and so are repeats that parse more than MAX_ATOMS atoms, which only groups matching the
 * empty text can reach within TP_REGEX_MAX_STATES (((){1000}){1000}){1000} took 11 s). */
#define MAX_GROUP_DEPTH 100
#define MAX_ATOMS 100000
#define STR_(x) #x
#define STR(x) STR_(x) /* a bound in its message */

static void set_bit(tp_regex_set *s, int b) { s->w[b / 64] |= (uint64_t)1 << (b % 64); }
static int has_bit(const tp_regex_set *s, int b) { return (int)(s->w[b / 64] >> (b % 64) & 1); }
static void set_or(tp_regex_set *a, const tp_regex_set *b) { a->w[0] |= b->w[0], a->w[1] |= b->w[1]; }
static int set_empty(const tp_regex_set *s) { return !s->w[0] && !s->w[1]; }

static tp_status refuse(const parser *P, const char *what)
{
    /* a long pattern is quoted in part (cut between UTF-8 characters), so the reason shows */
    enum { QUOTED = 120 };
    int n = P->len > QUOTED ? QUOTED : (int)P->len;
    while (n < (int)P->len && n > 0 && (P->p[n] & 0xC0) == 0x80) n--;
    return tp_error(TP_ERR_UNSUPPORTED, "the regular expression \"%.*s%s\": %s (at byte %zu)", n,
                    (const char *)P->p, n < (int)P->len ? "..." : "", what, P->i);
}

static frag empty_frag(void)
{
    frag f;
    memset(&f, 0, sizeof f);
    f.nullable = 1;
    return f;
}

/* every state in from's last may be followed by to's first */
static void link(tp_regex *r, const tp_regex_set *from, const tp_regex_set *to)
{
    for (int s = 0; s < r->n; s++)
        if (has_bit(from, s)) set_or(&r->follow[s], to);
}

static frag cat(tp_regex *r, frag a, frag b)
{
    link(r, &a.last, &b.first);
    frag f = {a.first, b.last, a.nullable && b.nullable};
    if (a.nullable) set_or(&f.first, &b.first);
    if (b.nullable) set_or(&f.last, &a.last);
    return f;
}

static frag alt(frag a, frag b)
{
    set_or(&a.first, &b.first);
    set_or(&a.last, &b.last);
    a.nullable |= b.nullable;
    return a;
}

static frag repeat(tp_regex *r, frag a, int zero_ok) /* a+ (a* where zero_ok) */
{
    link(r, &a.last, &a.first);
    a.nullable |= zero_ok;
    return a;
}

static tp_status add_range(tp_regex *r, uint32_t lo, uint32_t hi)
{
    if (r->n_ranges == r->cap_ranges) {
        r->cap_ranges = 2 * r->cap_ranges + 16;
        range *g = realloc(r->ranges, (size_t)r->cap_ranges * sizeof *g);
        if (!g) return tp_error(TP_ERR_OOM, "out of memory compiling a regular expression");
        r->ranges = g;
    }
    r->ranges[r->n_ranges++] = (range){lo, hi};
    return TP_OK;
}

/* a new state, its class the ranges added from now until the next */
static tp_status new_state(parser *P, int negate, frag *f)
{
    tp_regex *r = P->r;
    if (r->n >= TP_REGEX_MAX_STATES) return refuse(P, "more than 127 characters and classes to follow");
    const int s = r->n++;
    r->first[s] = r->n_ranges;
    r->count[s] = 0;
    r->negate[s] = (uint8_t)negate;
    memset(f, 0, sizeof *f);
    set_bit(&f->first, s);
    set_bit(&f->last, s);
    return TP_OK;
}

static tp_status class_range(parser *P, uint32_t lo, uint32_t hi)
{
    TP_CHECK(add_range(P->r, lo, hi));
    P->r->count[P->r->n - 1]++;
    return TP_OK;
}

/* the code point at P->i (UTF-8), advanced past */
static tp_status code_point(parser *P, uint32_t *c)
{
    const unsigned char b = P->p[P->i];
    int n = b < 0x80 ? 0 : b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : -1;
    if (n < 0 || P->i + (size_t)n >= P->len) return refuse(P, "invalid UTF-8");
    uint32_t v = n ? b & (0x3f >> n) : b;
    for (int k = 1; k <= n; k++) {
        if (P->i + (size_t)k >= P->len || (P->p[P->i + (size_t)k] & 0xc0) != 0x80) return refuse(P, "invalid UTF-8");
        v = v << 6 | (P->p[P->i + (size_t)k] & 0x3f);
    }
    P->i += (size_t)n + 1;
    *c = v;
    return TP_OK;
}

static int hex_digits(parser *P, int n, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < n; k++) {
        if (P->i >= P->len) return 0;
        const unsigned char h = P->p[P->i];
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (uint32_t)d;
        P->i++;
    }
    return 1;
}

enum { ESC_CHAR, ESC_CLASS };

/* after '\\': one character (*c), or a class (*cls: 'd', 'w', 's', or upper case: negated) */
static tp_status escape(parser *P, int *kind, uint32_t *c, char *cls)
{
    if (P->i >= P->len) return refuse(P, "a '\\' at the end");
    const unsigned char e = P->p[P->i++];
    *kind = ESC_CHAR;
    switch (e) {
    case 'd': case 'w': case 's': case 'D': case 'W': case 'S':
        *kind = ESC_CLASS;
        *cls = (char)e;
        return TP_OK;
    case 'n': *c = '\n'; return TP_OK;
    case 't': *c = '\t'; return TP_OK;
    case 'r': *c = '\r'; return TP_OK;
    case 'f': *c = '\f'; return TP_OK;
    case 'v': *c = '\v'; return TP_OK;
    case '0':
        if (P->i < P->len && P->p[P->i] >= '0' && P->p[P->i] <= '9') return refuse(P, "an octal escape");
        *c = 0;
        return TP_OK;
    case 'x':
        if (!hex_digits(P, 2, c)) return refuse(P, "\\x wants two hex digits");
        return TP_OK;
    case 'u':
        if (!hex_digits(P, 4, c)) return refuse(P, "\\u wants four hex digits (\\u{...} is not supported)");
        if (*c >= 0xd800 && *c <= 0xdfff) return refuse(P, "a surrogate \\u escape");
        return TP_OK;
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9'))
            return refuse(P, "this escape (a backreference, \\b, \\p, ...) is not supported");
        P->i--;
        return code_point(P, c); /* an escaped punctuation character, itself */
    }
}

/* the ranges of \d \w \s, or (upper case) of their ASCII complements */
static tp_status class_escape(parser *P, char cls)
{
    static const range digit[] = {{'0', '9'}}, word[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                       space[] = {{'\t', '\r'}, {' ', ' '}};
    const range *g = cls == 'd' || cls == 'D' ? digit : cls == 'w' || cls == 'W' ? word : space;
    const int n = g == digit ? 1 : g == word ? 4 : 2;
    if (cls >= 'a') {
        for (int k = 0; k < n; k++) TP_CHECK(class_range(P, g[k].lo, g[k].hi));
        return TP_OK;
    }
    uint32_t from = 0; /* the complement within ASCII */
    for (int k = 0; k < n; k++) {
        if (g[k].lo > from) TP_CHECK(class_range(P, from, g[k].lo - 1));
        from = g[k].hi + 1;
    }
    return class_range(P, from, 0x7f);
}

/* after '[' */
static tp_status char_class(parser *P, frag *f)
{
    const int negate = P->i < P->len && P->p[P->i] == '^';
    if (negate) P->i++;
    TP_CHECK(new_state(P, negate, f));
    if (P->i < P->len && P->p[P->i] == ']') return refuse(P, "a class that begins with ']' (escape it)");
    for (;;) {
        if (P->i >= P->len) return refuse(P, "a class without its ']'");
        if (P->p[P->i] == ']') {
            P->i++;
            return TP_OK;
        }
        uint32_t lo, hi;
        int kind = ESC_CHAR;
        char cls = 0;
        if (P->p[P->i] == '[') return refuse(P, "a '[' inside a class (escape it)");
        if (P->p[P->i] == '\\') {
            P->i++;
            TP_CHECK(escape(P, &kind, &lo, &cls));
        } else
            TP_CHECK(code_point(P, &lo));
        if (kind == ESC_CLASS) {
            if (cls < 'a') return refuse(P, "\\D, \\W or \\S inside a class");
            TP_CHECK(class_escape(P, cls));
            continue;
        }
        hi = lo;
        if (P->i + 1 < P->len && P->p[P->i] == '-' && P->p[P->i + 1] != ']') {
            P->i++;
            if (P->p[P->i] == '\\') {
                P->i++;
                TP_CHECK(escape(P, &kind, &hi, &cls));
                if (kind == ESC_CLASS) return refuse(P, "a range to a class");
            } else
                TP_CHECK(code_point(P, &hi));
            if (hi < lo) return refuse(P, "a range out of order");
        }
        TP_CHECK(class_range(P, lo, hi));
    }
}

static tp_status parse_alt(parser *P, frag *out);

static tp_status parse_atom(parser *P, frag *f)
{
    if (++P->atoms > MAX_ATOMS) return refuse(P, "repeats that expand to more than " STR(MAX_ATOMS) " atoms");
    const unsigned char b = P->p[P->i];
    if (b == '(') {
        P->i++;
        if (P->i < P->len && P->p[P->i] == '?') {
            if (P->i + 1 < P->len && P->p[P->i + 1] == ':') P->i += 2;
            else return refuse(P, "lookaround, named groups and flags are not supported");
        }
        if (P->depth == MAX_GROUP_DEPTH) return refuse(P, "groups nested more than " STR(MAX_GROUP_DEPTH) " deep");
        P->depth++;
        TP_CHECK(parse_alt(P, f));
        P->depth--;
        if (P->i >= P->len || P->p[P->i] != ')') return refuse(P, "a group without its ')'");
        P->i++;
        return TP_OK;
    }
    if (b == '[') {
        P->i++;
        return char_class(P, f);
    }
    if (b == '.') { /* no line break in either dialect */
        P->i++;
        TP_CHECK(new_state(P, 1, f));
        TP_CHECK(class_range(P, '\n', '\n'));
        TP_CHECK(class_range(P, '\r', '\r'));
        return class_range(P, 0x2028, 0x2029);
    }
    if (b == '^' || b == '$') {
        const int at_start = P->i == 0, at_end = P->i + 1 == P->len;
        if (b == '^' ? !at_start : !at_end) return refuse(P, "^ or $ other than at the pattern's ends");
        P->i++;
        if (b == '^') P->anchored_start = 1;
        else P->anchored_end = 1;
        *f = empty_frag();
        return TP_OK;
    }
    if (b == '*' || b == '+' || b == '?' || b == '{') return refuse(P, "a quantifier with nothing to repeat");
    uint32_t c;
    if (b == '\\') {
        P->i++;
        int kind;
        char cls = 0;
        TP_CHECK(escape(P, &kind, &c, &cls));
        if (kind == ESC_CLASS) {
            TP_CHECK(new_state(P, 0, f));
            return class_escape(P, cls);
        }
    } else
        TP_CHECK(code_point(P, &c));
    TP_CHECK(new_state(P, 0, f));
    return class_range(P, c, c);
}

/* {n}, {n,} or {n,m} after the atom at [start, end): *lo, *hi (-1: no bound) */
static tp_status bounds(parser *P, int *lo, int *hi)
{
    P->i++; /* '{' */
    long v[2] = {-1, -1};
    int k = 0, comma = 0;
    for (; P->i < P->len && P->p[P->i] != '}'; P->i++) {
        const unsigned char c = P->p[P->i];
        if (c == ',' && !comma) comma = 1, k = 1;
        else if (c >= '0' && c <= '9') v[k] = (v[k] < 0 ? 0 : v[k]) * 10 + (c - '0');
        else return refuse(P, "a '{' that is not a quantifier {n}, {n,} or {n,m} (escape it)");
        if (v[k] > 1000) return refuse(P, "a repeat count past 1000");
    }
    if (P->i >= P->len || v[0] < 0) return refuse(P, "a '{' that is not a quantifier {n}, {n,} or {n,m} (escape it)");
    P->i++;
    *lo = (int)v[0];
    *hi = comma ? (int)v[1] : (int)v[0];
    if (*hi >= 0 && *hi < *lo) return refuse(P, "{n,m} with m less than n");
    return TP_OK;
}

static tp_status parse_repeat(parser *P, frag *f)
{
    const size_t start = P->i;
    TP_CHECK(parse_atom(P, f));
    const size_t end = P->i;
    if (P->i >= P->len || !strchr("*+?{", P->p[P->i])) return TP_OK;
    const unsigned char q = P->p[P->i];
    int lo = q == '+', hi = q == '?' ? 1 : -1;
    if (q == '{') TP_CHECK(bounds(P, &lo, &hi));
    else P->i++;
    if (P->i < P->len && P->p[P->i] == '?') P->i++; /* lazy: the same language */
    if (P->i < P->len && strchr("*+?{", P->p[P->i])) return refuse(P, "a quantifier after a quantifier");
    const size_t resume = P->i;
    /* copies: the first is the atom parsed; the others parse it again */
    frag whole = empty_frag(), one = *f;
    const int copies = hi < 0 ? (lo > 0 ? lo : 1) : hi;
    for (int k = 0; k < copies; k++) {
        if (k) {
            P->i = start;
            TP_CHECK(parse_atom(P, &one));
            if (P->i != end) return refuse(P, "a repeated atom read otherwise");
        }
        if (hi < 0 && k == copies - 1) one = repeat(P->r, one, lo == 0); /* the last, as often as wanted */
        else if (k >= lo) one.nullable = 1;                             /* the ones past n, optional */
        whole = cat(P->r, whole, one);
    }
    P->i = resume;
    *f = whole;
    return TP_OK;
}

static tp_status parse_concat(parser *P, frag *f)
{
    *f = empty_frag();
    while (P->i < P->len && P->p[P->i] != '|' && P->p[P->i] != ')') {
        frag g;
        TP_CHECK(parse_repeat(P, &g));
        *f = cat(P->r, *f, g);
    }
    return TP_OK;
}

static tp_status parse_alt(parser *P, frag *out)
{
    TP_CHECK(parse_concat(P, out));
    while (P->i < P->len && P->p[P->i] == '|') {
        P->i++;
        frag g;
        TP_CHECK(parse_concat(P, &g));
        *out = alt(*out, g);
    }
    return TP_OK;
}

/* any code point, as often as wanted (an unanchored end under search) */
static tp_status anything(parser *P, frag *f)
{
    TP_CHECK(new_state(P, 1, f)); /* the complement of nothing */
    *f = repeat(P->r, *f, 1);
    return TP_OK;
}

static int class_meets(const tp_regex *r, int q, uint32_t lo, uint32_t hi);

tp_status tp_regex_compile(const char *pattern, size_t len, int search, tp_regex **out)
{
    *out = NULL;
    tp_regex *r = calloc(1, sizeof *r);
    if (!r) return tp_error(TP_ERR_OOM, "out of memory compiling a regular expression");
    r->n = 1; /* the start */
    parser P = {.r = r, .p = (const unsigned char *)pattern, .len = len};
    frag f;
    tp_status st = parse_alt(&P, &f);
    if (st == TP_OK && P.i < len) st = refuse(&P, "a ')' without its '('");
    if (st == TP_OK && search && !P.anchored_start) {
        frag any;
        if ((st = anything(&P, &any)) == TP_OK) f = cat(r, any, f);
    }
    if (st == TP_OK && search && !P.anchored_end) {
        frag any;
        if ((st = anything(&P, &any)) == TP_OK) f = cat(r, f, any);
    }
    if (st != TP_OK) {
        tp_regex_free(r);
        return st;
    }
    r->follow[0] = f.first;
    r->accept = f.last;
    if (f.nullable) set_bit(&r->accept, 0);
    /* a class that holds no character ([^\x00-\U0010FFFF]) is never entered: neither it nor
     * what comes only through it is live (else the guide would walk into it and stop there,
     * its text unmatched) */
    tp_regex_set can_enter = {{1, 0}};
    for (int s = 1; s < r->n; s++)
        if (class_meets(r, s, 0, 0xD7FF) || class_meets(r, s, 0xE000, 0x10FFFF)) set_bit(&can_enter, s);
    r->live.w[0] = r->accept.w[0] & can_enter.w[0]; /* and every state that reaches it */
    r->live.w[1] = r->accept.w[1] & can_enter.w[1];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = 0; s < r->n; s++)
            if (!has_bit(&r->live, s) && has_bit(&can_enter, s) &&
                ((r->follow[s].w[0] & r->live.w[0]) || (r->follow[s].w[1] & r->live.w[1]))) {
                set_bit(&r->live, s);
                changed = 1;
            }
    }
    /* rest: 0 where a match may end, else one more than the least after the states that may follow */
    for (int s = 0; s < r->n; s++) r->rest[s] = has_bit(&r->live, s) && has_bit(&r->accept, s) ? 0 : INT32_MAX;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = 0; s < r->n; s++)
            for (int t = 1; t < r->n; t++)
                if (has_bit(&r->follow[s], t) && has_bit(&r->live, t) && r->rest[t] < INT32_MAX &&
                    r->rest[t] + 1 < r->rest[s]) {
                    r->rest[s] = r->rest[t] + 1;
                    changed = 1;
                }
    }
    if (!has_bit(&r->live, 0)) {
        tp_regex_free(r);
        return tp_error(TP_ERR_UNSUPPORTED, "the regular expression \"%.*s\" matches no text", (int)len, pattern);
    }
    *out = r;
    return TP_OK;
}

void tp_regex_free(tp_regex *r)
{
    if (!r) return;
    free(r->ranges);
    free(r);
}

tp_regex_set tp_regex_start(const tp_regex *r)
{
    (void)r;
    tp_regex_set s = {{1, 0}};
    return s;
}

static int in_class(const tp_regex *r, int s, uint32_t c)
{
    int in = 0;
    for (int32_t k = 0; k < r->count[s] && !in; k++)
        in = c >= r->ranges[r->first[s] + k].lo && c <= r->ranges[r->first[s] + k].hi;
    return in != r->negate[s];
}

int32_t tp_regex_min_length(const tp_regex *r) { return r->rest[0]; }

int tp_regex_step(const tp_regex *r, tp_regex_set *s, uint32_t c, int32_t budget)
{
    tp_regex_set may = {{0, 0}}, next = {{0, 0}};
    for (int q = 0; q < r->n; q++)
        if (has_bit(s, q)) set_or(&may, &r->follow[q]);
    may.w[0] &= r->live.w[0];
    may.w[1] &= r->live.w[1];
    for (int q = 1; q < r->n; q++)
        if (has_bit(&may, q) && r->rest[q] <= budget && in_class(r, q, c)) set_bit(&next, q);
    if (set_empty(&next)) return 0;
    *s = next;
    return 1;
}

/* whether state q's class holds some code point of [lo, hi] */
static int class_meets(const tp_regex *r, int q, uint32_t lo, uint32_t hi)
{
    const range *g = r->ranges + r->first[q];
    if (!r->negate[q]) {
        for (int32_t k = 0; k < r->count[q]; k++)
            if (g[k].lo <= hi && g[k].hi >= lo) return 1;
        return 0;
    }
    /* negated: some point of [lo, hi] outside every range; the first such is lo or just past a range */
    for (int32_t k = -1; k < r->count[q]; k++) {
        const uint32_t x = k < 0 ? lo : g[k].hi + 1;
        if (x < lo || x > hi || (k >= 0 && g[k].hi == UINT32_MAX)) continue;
        int covered = 0;
        for (int32_t j = 0; j < r->count[q] && !covered; j++) covered = x >= g[j].lo && x <= g[j].hi;
        if (!covered) return 1;
    }
    return 0;
}

int tp_regex_may_step(const tp_regex *r, const tp_regex_set *s, uint32_t lo, uint32_t hi, int32_t budget)
{
    tp_regex_set may = {{0, 0}};
    for (int q = 0; q < r->n; q++)
        if (has_bit(s, q)) set_or(&may, &r->follow[q]);
    for (int q = 1; q < r->n; q++)
        if (has_bit(&may, q) && has_bit(&r->live, q) && r->rest[q] <= budget && class_meets(r, q, lo, hi)) return 1;
    return 0;
}

int tp_regex_accepts(const tp_regex *r, const tp_regex_set *s)
{
    return (s->w[0] & r->accept.w[0]) || (s->w[1] & r->accept.w[1]);
}
