/*
 * json_prefix.c: a byte-at-a-time JSON recognizer (json_prefix.h). A pushdown automaton: the
 * stack is one bit per open container (object or array), the rest a mode and its part.
 */
#include "json_prefix.h"

#include <string.h>

#include "json_schema.h"

enum mode {
    M_VALUE,          /* a value: the text's start, after ':' or after ',' in an array */
    M_VALUE_OR_CLOSE, /* after '[': a value or ']' */
    M_KEY_OR_CLOSE,   /* after '{': a key or '}' */
    M_KEY,            /* after ',' in an object */
    M_COLON,          /* after a key */
    M_AFTER,          /* after a value in a container: ',' or its closing bracket */
    M_DONE,           /* the text is whole: whitespace only */
    M_STRING,
    M_LITERAL,        /* true, false, null: sub = literal * 8 + bytes matched */
    M_NUMBER,         /* sub: enum number_part */
    M_TEXT,           /* not JSON: UTF-8 text that a regular expression reads (guided_regex) */
};

enum number_part { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS };

/* a string's sub: 0 plain, S_ESCAPE after '\', S_HEX + k after k digits of \u, then
 * S_LOW_SLASH and S_LOW_U: the '\' and 'u' of the low surrogate a high one needs */
enum { S_PLAIN = 0, S_ESCAPE = 1, S_HEX = 2, S_LOW_SLASH = 7, S_LOW_U = 8 };

enum { F_KEY = 1, F_LOW_DUE = 2, F_OBJECT_ONLY = 4, F_NEG = 8, F_FRAC_NZ = 16, F_COMPACT = 32 };

static const char *const literals[] = {"true", "false", "null"};

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ---- under a schema (s->schema): the node each value and container is held to */

static const tp_schema_node *node_of(const tp_json_prefix *s, int32_t n) { return &s->schema->nodes[n]; }

/* the open container's node, under a schema and inside one */
static const tp_schema_node *top_node(const tp_json_prefix *s)
{
    return s->schema && s->depth ? node_of(s, s->frame_node[s->depth - 1]) : NULL;
}

/* an object whose properties are written in order (not a free one, not any value's) */
static int fixed_object(const tp_schema_node *d) { return d && d->kind == TP_SCHEMA_OBJECT && d->count >= 0; }

/* a fixed object's properties that may come next, from position pos: up to and with the
 * first required one (the others may be left out); *last is that index, -1 if none is left */
static int32_t last_candidate(const tp_json_prefix *s, const tp_schema_node *d, int32_t pos)
{
    for (int32_t k = pos; k < d->count; k++)
        if (s->schema->entries[d->first + k].required) return k;
    return d->count - 1;
}

/* whether a required property is left from position pos */
static int required_left(const tp_json_prefix *s, const tp_schema_node *d, int32_t pos)
{
    for (int32_t k = pos; k < d->count; k++)
        if (s->schema->entries[d->first + k].required) return 1;
    return 0;
}

/* the node of a value that starts now */
static int32_t value_node(const tp_json_prefix *s)
{
    const tp_schema_node *p = top_node(s);
    if (!p) return s->schema->root;
    if (fixed_object(p)) return s->schema->entries[p->first + s->frame_pos[s->depth - 1]].node;
    if (p->kind == TP_SCHEMA_ARRAY && s->frame_pos[s->depth - 1] < p->count) /* a tuple's place */
        return s->schema->entries[p->first + s->frame_pos[s->depth - 1]].node;
    if (p->kind == TP_SCHEMA_OBJECT || p->kind == TP_SCHEMA_ARRAY) return p->items;
    return 0; /* inside any value: any value */
}

/* Literal texts e[lo, hi] (an enum's values, an object's keys), the bytes so far the first
 * s->lit_off of e[s->lit]: whether byte c goes on with one of them (s->lit becomes it). */
static int literal_byte(tp_json_prefix *s, const tp_schema_entry *e, int32_t lo, int32_t hi, unsigned char c)
{
    const tp_schema_entry *cur = &e[s->lit];
    for (int32_t j = lo; j <= hi; j++)
        if (e[j].len > s->lit_off && (unsigned char)e[j].text[s->lit_off] == c &&
            memcmp(e[j].text, cur->text, s->lit_off) == 0) {
            s->lit = (uint16_t)j;
            s->lit_off++;
            return 1;
        }
    return 0;
}

static int enum_byte(tp_json_prefix *s, unsigned char c)
{
    const tp_schema_node *d = node_of(s, s->node);
    return literal_byte(s, s->schema->entries + d->first, 0, d->count - 1, c);
}

/* a scalar may end here: not an enum, or the bytes are one of its values */
static int scalar_ok(const tp_json_prefix *s)
{
    if (!s->schema || node_of(s, s->node)->kind != TP_SCHEMA_ENUM) return 1;
    const tp_schema_node *d = node_of(s, s->node);
    const tp_schema_entry *e = s->schema->entries + d->first;
    for (int32_t j = 0; j < d->count; j++)
        if (e[j].len == s->lit_off && memcmp(e[j].text, e[s->lit].text, s->lit_off) == 0) return 1;
    return 0;
}

static int is_enum(const tp_json_prefix *s) { return s->schema && node_of(s, s->node)->kind == TP_SCHEMA_ENUM; }

/* a string value's pattern (its node's), or NULL */
static const tp_regex *pattern_of(const tp_json_prefix *s)
{
    if (!s->schema || (s->flags & F_KEY)) return NULL;
    return node_of(s, s->node)->kind == TP_SCHEMA_STRING ? node_of(s, s->node)->pattern : NULL;
}

/* ---- minLength / maxLength: a string value's characters (code points), counted where each
 * begins (an escape's backslash, a UTF-8 lead byte; a surrogate pair's is one) */

static const tp_schema_node *bounded_string(const tp_json_prefix *s)
{
    if (!s->schema || (s->flags & F_KEY)) return NULL;
    const tp_schema_node *d = node_of(s, s->node);
    return d->kind == TP_SCHEMA_STRING && (d->min_items > 0 || d->max_items >= 0) ? d : NULL;
}

/* one more character, if maxLength allows; without maxLength the count stops at minLength
 * (past it every length is alike: fewer states) */
static int count_char(tp_json_prefix *s, const tp_schema_node *d)
{
    if (d->max_items >= 0 && s->count >= d->max_items) return 0;
    if (d->max_items >= 0 || s->count < d->min_items) s->count++;
    return 1;
}

/* ---- minimum / maximum: a number's integer part, its magnitude m and sign, is kept; a digit
 * may come where some number it begins is within the bounds, and the number may end (or
 * take its '.') where it is */

static const tp_schema_node *bounded_number(const tp_json_prefix *s)
{
    if (!s->schema) return NULL;
    const tp_schema_node *d = node_of(s, s->node);
    return (d->kind == TP_SCHEMA_INTEGER || d->kind == TP_SCHEMA_NUMBER) && (d->has_lo || d->has_hi) ? d : NULL;
}

/* what the integer part's magnitude may be under the sign: at least lo (where lo itself is
 * excluded, with a fraction not 0), at most hi where has_hi; where hi is an included bound
 * itself, with a fraction of 0s only */
typedef struct span {
    int64_t lo, hi;
    int has_hi, lo_excl, hi_whole_only;
} span;

static span span_of(const tp_schema_node *d, int neg)
{
    span p = {0, 0, 0, 0, 0};
    int hi_excl = 0;
    if (!neg) { /* x >= 0 */
        if (d->has_lo && d->lo >= 0) p.lo = d->lo, p.lo_excl = d->lo_excl;
        p.has_hi = d->has_hi, p.hi = d->hi, hi_excl = d->hi_excl;
    } else { /* y = -x >= 0 */
        if (d->has_hi && d->hi <= 0) p.lo = -d->hi, p.lo_excl = d->hi_excl;
        p.has_hi = d->has_lo, p.hi = -d->lo, hi_excl = d->lo_excl;
    }
    if (p.has_hi && hi_excl) p.hi--; /* below hi: a part of hi - 1 with any fraction */
    p.hi_whole_only = p.has_hi && !hi_excl;
    return p;
}

/* whether an integer part beginning m (more digits may follow unless m is 0) can be within */
static int part_feasible(const span *p, uint64_t m)
{
    if (m == 0) return p->lo == 0 && (!p->has_hi || p->hi >= 0);
    if (!p->has_hi) return 1;
    for (int64_t scale = 1; (int64_t)m * scale <= p->hi; scale *= 10)
        if (((int64_t)m + 1) * scale - 1 >= p->lo) return 1;
    return 0;
}

/* digit c of the integer part (the first where s->num is 0 and c's place is the first) */
static int part_digit(tp_json_prefix *s, const tp_schema_node *d, unsigned char c, int first)
{
    const span p = span_of(d, s->flags & F_NEG);
    const uint64_t m = first ? (uint64_t)(c - '0') : s->num * 10 + (uint64_t)(c - '0');
    if (!part_feasible(&p, m)) return 0;
    /* without an upper bound every part past lo behaves alike: kept at lo + 1 */
    s->num = !p.has_hi && m > (uint64_t)p.lo + 1 ? (uint64_t)p.lo + 1 : m;
    return 1;
}

/* the integer part is whole (at its '.' or the number's end): within the bounds */
static int part_whole(const tp_json_prefix *s, const tp_schema_node *d)
{
    const span p = span_of(d, s->flags & F_NEG);
    return (int64_t)s->num >= p.lo && (!p.has_hi || (int64_t)s->num <= p.hi);
}

/* the number may end here */
static int number_within(const tp_json_prefix *s)
{
    const tp_schema_node *d = bounded_number(s);
    if (!d) return 1;
    const span p = span_of(d, s->flags & F_NEG);
    return part_whole(s, d) && !(p.lo_excl && (int64_t)s->num == p.lo && !(s->flags & F_FRAC_NZ));
}

/* a fraction digit: where the part equals an included upper bound only 0 */
static int fraction_digit(tp_json_prefix *s, unsigned char c)
{
    const tp_schema_node *d = bounded_number(s);
    if (!d) return 1;
    const span p = span_of(d, s->flags & F_NEG);
    if (c != '0') {
        if (p.hi_whole_only && (int64_t)s->num == p.hi) return 0;
        s->flags |= F_FRAC_NZ;
    }
    return 1;
}

/* ---- */

static void end_value(tp_json_prefix *s)
{
    s->mode = s->depth ? M_AFTER : M_DONE;
    s->sub = 0;
    s->node = s->lit = s->lit_off = s->count = 0;
    s->num = 0;
    s->cp = 0;
    memset(&s->re, 0, sizeof s->re);
    s->flags &= (uint8_t) ~(F_NEG | F_FRAC_NZ);
    if (s->schema && s->depth) s->frame_pos[s->depth - 1]++;
}

static int open_container(tp_json_prefix *s, int object)
{
    if (s->depth >= (s->schema ? TP_SCHEMA_MAX_DEPTH : TP_JSON_MAX_DEPTH)) return 0;
    if (s->schema) {
        s->frame_node[s->depth] = s->node;
        s->frame_pos[s->depth] = 0;
        s->node = 0;
    }
    if (object) s->objects |= (uint64_t)1 << s->depth;
    else s->objects &= ~((uint64_t)1 << s->depth);
    s->depth++;
    s->mode = object ? M_KEY_OR_CLOSE : M_VALUE_OR_CLOSE;
    return 1;
}

static int top_is_object(const tp_json_prefix *s) { return s->depth && (s->objects >> (s->depth - 1) & 1); }

static int close_container(tp_json_prefix *s, unsigned char c)
{
    if (!s->depth || c != (top_is_object(s) ? '}' : ']')) return 0;
    const tp_schema_node *d = top_node(s);
    const uint16_t done = d ? s->frame_pos[s->depth - 1] : 0;
    if (fixed_object(d) && required_left(s, d, done)) return 0; /* every required property written */
    if (d && d->kind == TP_SCHEMA_ARRAY && done < d->min_items) return 0;
    s->depth--;
    s->objects &= ~((uint64_t)1 << s->depth);
    if (s->schema) s->frame_node[s->depth] = s->frame_pos[s->depth] = 0;
    end_value(s);
    return 1;
}

/* A byte's readings: where a value begins and several of an anyOf's branches may begin with
 * the byte, n of them, and the one this reading takes. */
typedef struct fork {
    int pick, n;
} fork;

/* under a schema: a value may start with c here (its node becomes s->node), or not */
static int schema_start(tp_json_prefix *s, unsigned char c, fork *f)
{
    const tp_schema_node *p = top_node(s);
    if (p && p->kind == TP_SCHEMA_ARRAY && p->max_items >= 0 && s->frame_pos[s->depth - 1] >= p->max_items) return 0;
    int32_t branch[TP_JSON_MAX_PATHS];
    f->n = tp_schema_starts(s->schema, value_node(s), c, branch, TP_JSON_MAX_PATHS);
    if (f->pick >= f->n) return 0;
    const int32_t n = branch[f->pick];
    s->node = (uint16_t)n;
    if (node_of(s, n)->kind == TP_SCHEMA_ENUM) {
        s->lit = 0;
        s->lit_off = 0;
        return enum_byte(s, c);
    }
    return 1;
}

static int start_value(tp_json_prefix *s, unsigned char c, fork *f)
{
    if (s->schema && !schema_start(s, c, f)) return 0;
    if (c == '{') return open_container(s, 1);
    if (s->depth == 0 && (s->flags & F_OBJECT_ONLY)) return 0;
    if (c == '[') return open_container(s, 0);
    s->sub = 0;
    if (c == '"') {
        s->mode = M_STRING;
        s->flags &= (uint8_t)~F_KEY;
        const tp_regex *re = pattern_of(s);
        if (re) s->re = tp_regex_start(re);
        return 1;
    }
    for (int l = 0; l < 3; l++)
        if (c == (unsigned char)literals[l][0]) {
            s->mode = M_LITERAL;
            s->sub = (uint8_t)(l * 8 + 1);
            return 1;
        }
    s->mode = M_NUMBER;
    if (c == '-') s->sub = N_MINUS;
    else if (c == '0') s->sub = N_ZERO;
    else if (c >= '1' && c <= '9') s->sub = N_INT;
    else return 0;
    const tp_schema_node *d = bounded_number(s);
    if (d && c == '-') { /* some number of this sign is within */
        s->flags |= F_NEG;
        const span p = span_of(d, 1);
        for (uint64_t m = 0; m <= 9; m++)
            if (part_feasible(&p, m)) return 1;
        return 0;
    }
    return !d || part_digit(s, d, c, 1);
}

/* A string's byte after a lead byte of UTF-8: the continuation bytes it needs and the range
 * of the first (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static int utf8_lead(tp_json_prefix *s, unsigned char c)
{
    s->utf8_lo = 0x80;
    s->utf8_hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) s->utf8_need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        s->utf8_need = 2;
        if (c == 0xe0) s->utf8_lo = 0xa0;
        if (c == 0xed) s->utf8_hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        s->utf8_need = 3;
        if (c == 0xf0) s->utf8_lo = 0x90;
        if (c == 0xf4) s->utf8_hi = 0x8f;
    } else
        return 0;
    return 1;
}

/* the characters a string value's pattern may still take after the one being read (counted
 * already): what maxLength leaves, so that no text goes where the pattern's match could end
 * only past it */
static int32_t pattern_budget(const tp_json_prefix *s)
{
    const tp_schema_node *d = bounded_string(s);
    return d && d->max_items >= 0 ? (int32_t)(d->max_items - s->count) : TP_REGEX_UNBOUNDED;
}

/* a character of a string value read whole (c: its code point): its pattern may go on */
static int pattern_char(tp_json_prefix *s, uint32_t c)
{
    const tp_regex *re = pattern_of(s);
    s->cp = 0;
    return !re || tp_regex_step(re, &s->re, c, pattern_budget(s));
}

/* the code points a UTF-8 sequence begun may still become: cp's bits so far, utf8_need bytes
 * to come, the next in [utf8_lo, utf8_hi] (which keeps out overlong forms and surrogates) */
static int utf8_may(const tp_regex *re, const tp_json_prefix *s)
{
    const int rest = 6 * (s->utf8_need - 1);
    const uint32_t lo = (s->cp << 6 | (s->utf8_lo & 0x3fu)) << rest;
    const uint32_t hi = (s->cp << 6 | (s->utf8_hi & 0x3fu)) << rest | ((1u << rest) - 1);
    return tp_regex_may_step(re, &s->re, lo, hi, pattern_budget(s));
}

/* a \u escape's digits so far (s->code, 4 - (sub - S_HEX) to come): some character they
 * begin may come (a high surrogate's: the characters of the pairs it begins) */
static int hex_may(const tp_regex *re, const tp_json_prefix *s)
{
    const int rest = 4 * (4 - (s->sub - S_HEX));
    const uint32_t lo = (uint32_t)s->code << rest, hi = lo | ((1u << rest) - 1);
    const int32_t budget = pattern_budget(s);
    if (s->flags & F_LOW_DUE) { /* the low half of a pair: s->cp holds the high */
        const uint32_t base = 0x10000 + ((s->cp - 0xd800) << 10);
        const uint32_t a = lo > 0xdc00 ? lo : 0xdc00, b = hi < 0xdfff ? hi : 0xdfff;
        return a <= b && tp_regex_may_step(re, &s->re, base + (a - 0xdc00), base + (b - 0xdc00), budget);
    }
    /* a character of its own, below the surrogates or above them */
    if (lo <= 0xd7ff && tp_regex_may_step(re, &s->re, lo, hi < 0xd7ff ? hi : 0xd7ff, budget)) return 1;
    if (hi >= 0xe000 && tp_regex_may_step(re, &s->re, lo > 0xe000 ? lo : 0xe000, hi, budget)) return 1;
    const uint32_t a = lo > 0xd800 ? lo : 0xd800, b = hi < 0xdbff ? hi : 0xdbff; /* a pair's high half */
    return a <= b &&
           tp_regex_may_step(re, &s->re, 0x10000 + ((a - 0xd800) << 10), 0x10000 + ((b - 0xd800) << 10) + 0x3ff, budget);
}

static int string_byte(tp_json_prefix *s, unsigned char c)
{
    if ((s->flags & F_KEY) && fixed_object(top_node(s))) { /* a next property's key, byte for byte */
        const tp_schema_node *d = top_node(s);
        const int32_t pos = s->frame_pos[s->depth - 1];
        if (!literal_byte(s, s->schema->entries + d->first, pos, last_candidate(s, d, pos), c)) return 0;
    } else if (is_enum(s) && !enum_byte(s, c))
        return 0;
    const tp_regex *re = pattern_of(s);
    if (s->utf8_need) {
        if (c < s->utf8_lo || c > s->utf8_hi) return 0;
        s->utf8_need--;
        s->utf8_lo = 0x80;
        s->utf8_hi = 0xbf;
        if (!re) return 1;
        s->cp = s->cp << 6 | (c & 0x3f);
        return s->utf8_need ? utf8_may(re, s) : pattern_char(s, s->cp);
    }
    const tp_schema_node *bounded = s->sub == S_PLAIN ? bounded_string(s) : NULL;
    if (bounded && c != '"' && !count_char(s, bounded)) return 0; /* a character begins */
    switch (s->sub) {
    case S_PLAIN:
        if (c == '"') {
            if (bounded && s->count < bounded->min_items) return 0;
            if (re && !tp_regex_accepts(re, &s->re)) return 0;
            if (s->flags & F_KEY) {
                s->flags &= (uint8_t)~F_KEY;
                s->mode = M_COLON;
                s->sub = 0;
                if (fixed_object(top_node(s))) s->frame_pos[s->depth - 1] = s->lit; /* the property it named */
                s->lit = s->lit_off = 0;
            } else {
                if (!scalar_ok(s)) return 0;
                end_value(s);
            }
            return 1;
        }
        if (c == '\\') {
            s->sub = S_ESCAPE;
            return !re || tp_regex_may_step(re, &s->re, 0, 0x10ffff, pattern_budget(s));
        }
        if (c < 0x20) return 0; /* control characters are escaped in JSON */
        if (c < 0x80) return pattern_char(s, c);
        if (!utf8_lead(s, c)) return 0;
        if (!re) return 1;
        s->cp = c & (0x3f >> s->utf8_need); /* the lead byte's bits */
        return utf8_may(re, s);
    case S_ESCAPE: {
        if (c == 'u') {
            s->sub = S_HEX;
            s->code = 0;
            return 1;
        }
        static const char escaped[] = "\"\\/bfnrt", meant[] = "\"\\/\b\f\n\r\t";
        const char *at = c ? strchr(escaped, c) : NULL;
        if (!at) return 0;
        s->sub = S_PLAIN;
        return pattern_char(s, (unsigned char)meant[at - escaped]);
    }
    case S_LOW_SLASH:
        if (c != '\\') return 0;
        s->sub = S_LOW_U;
        return 1;
    case S_LOW_U:
        if (c != 'u') return 0;
        s->sub = S_HEX;
        s->code = 0;
        return 1;
    default: { /* S_HEX + digits read */
        const int v = hex_value(c);
        if (v < 0) return 0;
        s->code = (uint16_t)(s->code * 16 + v);
        if (++s->sub < S_HEX + 4) return !re || hex_may(re, s);
        const int high = s->code >= 0xd800 && s->code <= 0xdbff, low = s->code >= 0xdc00 && s->code <= 0xdfff;
        const uint32_t code = s->code;
        s->code = 0;
        if (s->flags & F_LOW_DUE) { /* the pair's character: the high surrogate was kept in cp */
            if (!low) return 0;
            s->flags &= (uint8_t)~F_LOW_DUE;
            s->sub = S_PLAIN;
            return pattern_char(s, 0x10000 + ((s->cp - 0xd800) << 10) + (code - 0xdc00));
        }
        if (high) {
            s->flags |= F_LOW_DUE;
            s->sub = S_LOW_SLASH;
            if (re) s->cp = code;
            return 1;
        }
        if (low) return 0;
        s->sub = S_PLAIN;
        return pattern_char(s, code);
    }
    }
}

static int number_done(const tp_json_prefix *s)
{
    return s->sub == N_ZERO || s->sub == N_INT || s->sub == N_FRAC || s->sub == N_EXP_DIGITS;
}

static int step(tp_json_prefix *s, unsigned char c, fork *f);

static int number_byte(tp_json_prefix *s, unsigned char c, fork *f)
{
    const int d = is_digit(c);
    const tp_schema_node *bounds = bounded_number(s);
    const int e = (c == 'e' || c == 'E') && !bounds; /* a bounded number is written without one */
    switch (s->sub) {
    case N_MINUS:
        if (!d || (bounds && !part_digit(s, bounds, c, 1))) return 0;
        s->sub = c == '0' ? N_ZERO : N_INT;
        return 1;
    case N_ZERO:
    case N_INT:
        if (d && s->sub == N_INT) return !bounds || part_digit(s, bounds, c, 0);
        if (c == '.') {
            if (bounds && !part_whole(s, bounds)) return 0;
            s->sub = N_DOT;
        } else if (e)
            s->sub = N_EXP;
        else
            break;
        return 1;
    case N_DOT:
        if (!d || !fraction_digit(s, c)) return 0;
        s->sub = N_FRAC;
        return 1;
    case N_FRAC:
        if (d) return fraction_digit(s, c);
        if (!e) break;
        s->sub = N_EXP;
        return 1;
    case N_EXP:
        if (c == '+' || c == '-') s->sub = N_EXP_SIGN;
        else if (d) s->sub = N_EXP_DIGITS;
        else return 0;
        return 1;
    case N_EXP_SIGN:
        if (!d) return 0;
        s->sub = N_EXP_DIGITS;
        return 1;
    case N_EXP_DIGITS:
        if (d) return 1;
        break;
    default:
        return 0;
    }
    /* c does not go on with the number: it ends here, if it may, and c comes after it */
    if (!number_within(s)) return 0;
    end_value(s);
    return step(s, c, f);
}

/* a byte of guided_regex's text: UTF-8, each character read by the root's pattern */
static int text_byte(tp_json_prefix *s, unsigned char c)
{
    const tp_regex *re = node_of(s, s->schema->root)->pattern;
    if (s->utf8_need) {
        if (c < s->utf8_lo || c > s->utf8_hi) return 0;
        s->utf8_need--;
        s->utf8_lo = 0x80;
        s->utf8_hi = 0xbf;
        s->cp = s->cp << 6 | (c & 0x3f);
        if (s->utf8_need) return utf8_may(re, s);
    } else if (c >= 0x80) {
        if (!utf8_lead(s, c)) return 0;
        s->cp = c & (0x3f >> s->utf8_need);
        return utf8_may(re, s);
    } else
        s->cp = c;
    const uint32_t cp = s->cp;
    s->cp = 0;
    return tp_regex_step(re, &s->re, cp, TP_REGEX_UNBOUNDED);
}

static int step(tp_json_prefix *s, unsigned char c, fork *f)
{
    switch (s->mode) {
    case M_TEXT:
        return text_byte(s, c);
    case M_STRING:
        return string_byte(s, c);
    case M_NUMBER:
        if (is_enum(s)) {
            if (enum_byte(s, c)) return number_byte(s, c, f);
            if (strchr("0123456789.eE+-", c) || c == 0) return 0; /* a number no value of the enum is */
            if (!number_done(s) || !scalar_ok(s)) return 0;
            end_value(s);
            return step(s, c, f);
        }
        if (s->schema && node_of(s, s->node)->kind == TP_SCHEMA_INTEGER && (c == '.' || c == 'e' || c == 'E'))
            return 0;
        return number_byte(s, c, f);
    case M_LITERAL: {
        const char *w = literals[s->sub >> 3];
        const int pos = s->sub & 7;
        if (c != (unsigned char)w[pos] || (is_enum(s) && !enum_byte(s, c))) return 0;
        if (w[pos + 1] == 0) {
            if (!scalar_ok(s)) return 0;
            end_value(s);
        } else
            s->sub++;
        return 1;
    }
    default:
        break;
    }
    if (is_space(c)) { /* llama.cpp's json.gbnf: ws ::= | " " | "\n" [ \t]{0,20}; compact: none */
        if (s->flags & F_COMPACT) return 0;
        if (s->space == 0 && (c == ' ' || c == '\n')) s->space = c == ' ' ? 1 : 2;
        else if (s->space >= 2 && s->space < 2 + TP_JSON_MAX_INDENT && (c == ' ' || c == '\t')) s->space++;
        else return 0;
        return 1;
    }
    s->space = 0;
    switch (s->mode) {
    case M_VALUE:
        return start_value(s, c, f);
    case M_VALUE_OR_CLOSE:
        return c == ']' ? close_container(s, c) : start_value(s, c, f);
    case M_KEY_OR_CLOSE:
        if (c == '}') return close_container(s, c);
        /* fall through */
    case M_KEY:
        if (c != '"') return 0;
        if (fixed_object(top_node(s))) { /* a property still to write; its key's quote matched */
            if (s->frame_pos[s->depth - 1] >= top_node(s)->count) return 0;
            s->lit = s->frame_pos[s->depth - 1];
            s->lit_off = 1;
        }
        s->mode = M_STRING;
        s->sub = S_PLAIN;
        s->flags |= F_KEY;
        return 1;
    case M_COLON:
        if (c != ':') return 0;
        s->mode = M_VALUE;
        return 1;
    case M_AFTER:
        if (c == ',') { /* not past the last property, nor past maxItems: no way on from there */
            const tp_schema_node *d = top_node(s);
            if (fixed_object(d) && s->frame_pos[s->depth - 1] >= d->count) return 0;
            if (d && d->kind == TP_SCHEMA_ARRAY && d->max_items >= 0 && s->frame_pos[s->depth - 1] >= d->max_items)
                return 0;
            s->mode = top_is_object(s) ? M_KEY : M_VALUE;
            return 1;
        }
        return close_container(s, c);
    default: /* M_DONE */
        return 0;
    }
}

void tp_json_prefix_init(tp_json_prefix *s, int object_only)
{
    memset(s, 0, sizeof *s);
    s->mode = M_VALUE;
    s->utf8_lo = 0x80;
    s->utf8_hi = 0xbf;
    if (object_only) s->flags = F_OBJECT_ONLY;
}

void tp_json_prefix_compact(tp_json_prefix *s) { s->flags |= F_COMPACT; }

void tp_json_prefix_init_schema(tp_json_prefix *s, const struct tp_schema *schema)
{
    tp_json_prefix_init(s, 0);
    s->schema = schema;
    const tp_schema_node *root = &schema->nodes[schema->root];
    if (root->kind == TP_SCHEMA_TEXT) { /* guided_regex: text, not JSON */
        s->mode = M_TEXT;
        s->re = tp_regex_start(root->pattern);
    }
}

int tp_json_prefix_next(const tp_json_prefix *s, unsigned char c, tp_json_prefix *out, int room)
{
    int k = 0;
    fork f = {0, 1}; /* the first reading finds how many there are */
    for (; f.pick < f.n && k < room; f.pick++) {
        out[k] = *s;
        if (step(&out[k], c, &f)) k++;
    }
    return k;
}

int tp_json_prefix_feed(tp_json_prefix *s, unsigned char c)
{
    tp_json_prefix t;
    if (!tp_json_prefix_next(s, c, &t, 1)) return 0;
    *s = t;
    return 1;
}

size_t tp_json_prefix_feed_n(tp_json_prefix *s, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!tp_json_prefix_feed(s, (unsigned char)bytes[i])) return i;
    return n;
}

int tp_json_prefix_complete(const tp_json_prefix *s)
{
    if (s->mode == M_TEXT) return !s->utf8_need && tp_regex_accepts(node_of(s, s->schema->root)->pattern, &s->re);
    return s->mode == M_DONE ||
           (s->mode == M_NUMBER && s->depth == 0 && number_done(s) && scalar_ok(s) && number_within(s));
}

/* ---- every reading at once */

/* t into the sorted set out[0, *n) unless there already; 0 when there is no room */
static void insert_path(tp_json_prefix *out, int *n, const tp_json_prefix *t)
{
    int lo = 0, hi = *n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2, c = memcmp(&out[mid], t, sizeof *t);
        if (c == 0) return;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    if (*n == TP_JSON_MAX_PATHS) return; /* a reading fewer: what is kept stays valid */
    memmove(&out[lo + 1], &out[lo], (size_t)(*n - lo) * sizeof *out);
    out[lo] = *t;
    (*n)++;
}

int tp_json_paths_next(const tp_json_prefix *in, int n_in, unsigned char c, tp_json_prefix *out)
{
    if (n_in == 1) { /* the usual case: one reading that does not fork */
        out[0] = in[0];
        fork f = {0, 1};
        const int ok = step(&out[0], c, &f);
        if (f.n <= 1) return ok;
    }
    int n = 0;
    for (int i = 0; i < n_in; i++) {
        tp_json_prefix t[TP_JSON_MAX_PATHS];
        const int k = tp_json_prefix_next(&in[i], c, t, TP_JSON_MAX_PATHS);
        for (int j = 0; j < k; j++) insert_path(out, &n, &t[j]);
    }
    return n;
}

void tp_json_paths_init(tp_json_paths *p, const tp_json_prefix *start)
{
    p->n = 1;
    p->path[0] = *start;
}

int tp_json_paths_feed(tp_json_paths *p, unsigned char c)
{
    if (p->n == 1) { /* the usual case: one reading that does not fork */
        tp_json_prefix t = p->path[0];
        fork f = {0, 1};
        const int ok = step(&t, c, &f);
        if (f.n <= 1) {
            if (ok) p->path[0] = t;
            return ok;
        }
    }
    tp_json_prefix next[TP_JSON_MAX_PATHS];
    const int k = tp_json_paths_next(p->path, p->n, c, next);
    if (!k) return 0;
    memcpy(p->path, next, (size_t)k * sizeof *next);
    p->n = k;
    return 1;
}

size_t tp_json_paths_feed_n(tp_json_paths *p, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!tp_json_paths_feed(p, (unsigned char)bytes[i])) return i;
    return n;
}

int tp_json_paths_complete(const tp_json_paths *p)
{
    for (int i = 0; i < p->n; i++)
        if (tp_json_prefix_complete(&p->path[i])) return 1;
    return 0;
}
