/*
 * chat_template.c: lexer and parser of the Jinja subset used by chat templates, with the
 * environment transformers uses (trim_blocks, lstrip_blocks, no trailing newline), to a
 * syntax tree that chat_template_eval.c renders. Anything else is a clear load-time error.
 */
#include "chat_template.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"
#include "unicode.h"
#include "util.h"

#define HINT "; give a template within tpinfer's Jinja subset with --chat-template FILE"
#define MAX_DEPTH 200

// ----------------------------------------------------------------------------
// lexer

enum tok_type { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct token {
    enum tok_type type;
    char *s; /* owned: text, names, string literals, operators */
    size_t len;
    json_t *num;
    int line;
} token;

typedef struct lexer {
    const char *src;
    size_t n, pos;
    int line;
    token *v;
    size_t nt, cap;
    int depth; /* brackets open in the tag: "}}" closes a dict there, not the tag (as Jinja) */
} lexer;

static tp_status push_tok(lexer *lx, enum tok_type t, const char *s, size_t len)
{
    if (lx->nt == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 64;
        token *v = realloc(lx->v, cap * sizeof *v);
        if (!v) return tp_error(TP_ERR_OOM, "out of memory");
        lx->v = v;
        lx->cap = cap;
    }
    token *k = &lx->v[lx->nt];
    memset(k, 0, sizeof *k);
    k->type = t;
    k->line = lx->line;
    k->s = malloc(len + 1);
    if (!k->s) return tp_error(TP_ERR_OOM, "out of memory");
    if (len) memcpy(k->s, s, len);
    k->s[len] = '\0';
    k->len = len;
    lx->nt++;
    return TP_OK;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The first byte of [a, b) after its leading whitespace (Python's, as Jinja's whitespace control) */
static size_t skip_space(const char *s, size_t a, size_t b)
{
    uint32_t cp;
    int l;
    while (a < b && (l = tp_utf8_next((const uint8_t *)s + a, b - a, &cp)) > 0 && tp_uc_is_py_space(cp)) a += (size_t)l;
    return a;
}

/* The end of [a, b) before its trailing whitespace (none of it a newline where keep_nl) */
static size_t skip_space_back(const char *s, size_t a, size_t b, int keep_nl)
{
    while (b > a) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
        uint32_t cp;
        if (tp_utf8_next((const uint8_t *)s + k, b - k, &cp) <= 0 || !tp_uc_is_py_space(cp) || (keep_nl && cp == '\n')) break;
        b = k;
    }
    return b;
}

static void count_lines(lexer *lx, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) lx->line += lx->src[i] == '\n';
}

/* A Python string literal body with its escapes; s points after the quote. */
static tp_status lex_string(lexer *lx)
{
    char q = lx->src[lx->pos++];
    char *buf = malloc(lx->n - lx->pos + 1);
    if (!buf) return tp_error(TP_ERR_OOM, "out of memory");
    size_t o = 0;
    while (lx->pos < lx->n && lx->src[lx->pos] != q) {
        char c = lx->src[lx->pos++];
        if (c == '\n') lx->line++;
        if (c != '\\' || lx->pos >= lx->n) {
            buf[o++] = c;
            continue;
        }
        char e = lx->src[lx->pos++];
        unsigned v = 0;
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        switch (e) {
        case 'n': buf[o++] = '\n'; break;
        case 't': buf[o++] = '\t'; break;
        case 'r': buf[o++] = '\r'; break;
        case 'a': buf[o++] = '\a'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'v': buf[o++] = '\v'; break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': /* up to three octal digits */
            v = (unsigned)(e - '0');
            for (int i = 0; i < 2 && lx->pos < lx->n && lx->src[lx->pos] >= '0' && lx->src[lx->pos] <= '7'; i++)
                v = v * 8 + (unsigned)(lx->src[lx->pos++] - '0');
            o += (size_t)tp_utf8_put(v, buf + o);
            break;
        case '\\': buf[o++] = '\\'; break;
        case '\'': buf[o++] = '\''; break;
        case '"': buf[o++] = '"'; break;
        case '\n': lx->line++; break;
        default:
            if (!hex) {
                buf[o++] = '\\';
                buf[o++] = e;
                break;
            }
            for (int i = 0; i < hex; i++, lx->pos++) {
                char h = lx->pos < lx->n ? lx->src[lx->pos] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) {
                    free(buf);
                    return tp_error(TP_ERR_FORMAT, "chat template: line %d: bad \\%c escape in a string", lx->line, e);
                }
                v = v * 16 + (unsigned)d;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
                free(buf);
                return tp_error(TP_ERR_FORMAT, "chat template: line %d: escape \\%c%X is not a character", lx->line, e, v);
            }
            o += (size_t)tp_utf8_put(v, buf + o);
        }
    }
    if (lx->pos >= lx->n) {
        free(buf);
        return tp_error(TP_ERR_FORMAT, "chat template: line %d: unterminated string", lx->line);
    }
    lx->pos++;
    tp_status st = push_tok(lx, T_STRING, buf, o);
    free(buf);
    return st;
}

/* Tokens of one {{ }} or {% %} up to its end marker; sets *strip_after for "-}}" / "-%}". */
static tp_status lex_tag(lexer *lx, const char *end, enum tok_type end_type, int *strip_after)
{
    static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">="};
    lx->depth = 0;
    for (;;) {
        while (lx->pos < lx->n && is_ws(lx->src[lx->pos])) lx->line += lx->src[lx->pos++] == '\n';
        if (lx->pos >= lx->n) return tp_error(TP_ERR_FORMAT, "chat template: line %d: unclosed tag", lx->line);
        const char *p = lx->src + lx->pos;
        size_t left = lx->n - lx->pos;
        if (lx->depth <= 0 && left >= 3 && p[0] == '-' && memcmp(p + 1, end, 2) == 0) {
            lx->pos += 3;
            *strip_after = 1;
            return push_tok(lx, end_type, "", 0);
        }
        if (lx->depth <= 0 && left >= 2 && memcmp(p, end, 2) == 0) {
            lx->pos += 2;
            *strip_after = 0;
            return push_tok(lx, end_type, "", 0);
        }
        char c = *p;
        if (c == '\'' || c == '"') {
            TP_CHECK(lex_string(lx));
            continue;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t k = 1;
            while (k < left && ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') || p[k] == '_' ||
                                (p[k] >= '0' && p[k] <= '9')))
                k++;
            lx->pos += k;
            TP_CHECK(push_tok(lx, T_NAME, p, k));
            continue;
        }
        if (c >= '0' && c <= '9') {
            size_t k = 0;
            int real = 0;
            while (k < left && p[k] >= '0' && p[k] <= '9') k++;
            if (k + 1 < left && p[k] == '.' && p[k + 1] >= '0' && p[k + 1] <= '9') {
                real = 1;
                k++;
                while (k < left && p[k] >= '0' && p[k] <= '9') k++;
            }
            if (k + 1 < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1 + (p[k + 1] == '+' || p[k + 1] == '-');
                if (e < left && p[e] >= '0' && p[e] <= '9') {
                    real = 1;
                    k = e;
                    while (k < left && p[k] >= '0' && p[k] <= '9') k++;
                }
            }
            lx->pos += k;
            TP_CHECK(push_tok(lx, real ? T_FLOAT : T_INT, p, k));
            token *t = &lx->v[lx->nt - 1];
            errno = 0;
            const double d = real ? strtod(t->s, NULL) : 0;
            const long long i = real ? 0 : strtoll(t->s, NULL, 10);
            if (real ? !isfinite(d) : errno == ERANGE) /* json_real() takes no inf; ints do not saturate */
                return tp_error(TP_ERR_FORMAT, "chat template: line %d: the number %.40s is out of range", lx->line,
                                t->s);
            t->num = real ? json_real(d) : json_integer(i);
            if (!t->num) return tp_error(TP_ERR_OOM, "chat template: out of memory");
            continue;
        }
        size_t k = 1;
        for (size_t i = 0; i < 6; i++)
            if (left >= 2 && memcmp(p, ops2[i], 2) == 0) k = 2;
        if (k == 1 && !strchr("+-*/%~<>()[]{},.:|=", c))
            return tp_error(TP_ERR_FORMAT, "chat template: line %d: unexpected character '%c' in a tag", lx->line, c);
        lx->pos += k;
        if (k == 1) lx->depth += (c == '(' || c == '[' || c == '{') - (c == ')' || c == ']' || c == '}');
        TP_CHECK(push_tok(lx, T_OP, p, k));
    }
}

static tp_status lex(lexer *lx)
{
    int strip_next = 0, trim_nl = 0;
    size_t n = lx->n;
    /* Jinja drops one trailing newline (keep_trailing_newline=False). */
    if (n > 0 && lx->src[n - 1] == '\n') n -= (n > 1 && lx->src[n - 2] == '\r') ? 2 : 1;
    lx->n = n;
    while (lx->pos < lx->n) {
        size_t start = lx->pos, i = start;
        while (i + 1 < lx->n && !(lx->src[i] == '{' && strchr("{%#", lx->src[i + 1]))) i++;
        if (i + 1 >= lx->n) i = lx->n;
        /* text [start, i) */
        size_t a = start, b = i;
        if (trim_nl && a < b && lx->src[a] == '\n') a++;
        else if (trim_nl && a + 1 < b && lx->src[a] == '\r' && lx->src[a + 1] == '\n') a += 2;
        if (strip_next) a = skip_space(lx->src, a, b);
        char kind = i < lx->n ? lx->src[i + 1] : 0;
        char mod = i + 2 < lx->n ? lx->src[i + 2] : 0;
        if (kind && mod == '-') {
            b = skip_space_back(lx->src, a, b, 0);
        } else if (kind && kind != '{' && mod != '+') {
            /* lstrip_blocks: the whitespace between a line start and a block tag goes */
            size_t k = skip_space_back(lx->src, a, b, 1);
            if (k == 0 || lx->src[k - 1] == '\n') b = k;
        }
        count_lines(lx, start, i);
        if (b > a) TP_CHECK(push_tok(lx, T_TEXT, lx->src + a, b - a));
        if (i >= lx->n) break;
        lx->pos = i + 2 + (mod == '-' || mod == '+');
        strip_next = trim_nl = 0;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t k = lx->pos; k + 1 < lx->n; k++)
                if (lx->src[k] == '#' && lx->src[k + 1] == '}') {
                    e = lx->src + k;
                    break;
                }
            if (!e) return tp_error(TP_ERR_FORMAT, "chat template: line %d: unclosed comment", lx->line);
            size_t epos = (size_t)(e - lx->src);
            count_lines(lx, lx->pos, epos);
            strip_next = epos > lx->pos && lx->src[epos - 1] == '-';
            trim_nl = !strip_next;
            lx->pos = epos + 2;
            continue;
        }
        int strip_after = 0;
        if (kind == '{') {
            TP_CHECK(push_tok(lx, T_VAR_BEGIN, "", 0));
            TP_CHECK(lex_tag(lx, "}}", T_VAR_END, &strip_after));
            strip_next = strip_after;
        } else {
            TP_CHECK(push_tok(lx, T_BLOCK_BEGIN, "", 0));
            TP_CHECK(lex_tag(lx, "%}", T_BLOCK_END, &strip_after));
            strip_next = strip_after;
            trim_nl = !strip_after;
        }
    }
    return push_tok(lx, T_EOF, "", 0);
}

static void lexer_free(lexer *lx)
{
    for (size_t i = 0; i < lx->nt; i++) {
        free(lx->v[i].s);
        json_decref(lx->v[i].num);
    }
    free(lx->v);
}

// ----------------------------------------------------------------------------
// syntax tree

void ct_node_free(ct_node *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->n_kids; i++) ct_node_free(n->kids[i]);
    for (size_t i = 0; i < n->n_names; i++) {
        free(n->names[i]);
        if (n->kw) ct_node_free(n->kw[i]);
    }
    free(n->kids);
    free(n->names);
    free(n->kw);
    free(n->str);
    free(n->attr);
    json_decref(n->lit);
    free(n);
}

static ct_node *node_new(enum ct_kind kind)
{
    ct_node *n = calloc(1, sizeof *n);
    if (n) n->kind = kind;
    return n;
}

static tp_status add_kid(ct_node *n, ct_node *kid)
{
    ct_node **k = realloc(n->kids, (n->n_kids + 1) * sizeof *k);
    if (!k) {
        ct_node_free(kid);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    n->kids = k;
    n->kids[n->n_kids++] = kid;
    return TP_OK;
}

static tp_status add_name(ct_node *n, const char *name, ct_node *kw)
{
    char **nm = realloc(n->names, (n->n_names + 1) * sizeof *nm);
    if (nm) n->names = nm;
    ct_node **k = nm ? realloc(n->kw, (n->n_names + 1) * sizeof *k) : NULL;
    if (k) n->kw = k;
    char *d = strdup(name);
    if (!nm || !k || !d) {
        free(d);
        ct_node_free(kw);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    n->names[n->n_names] = d;
    n->kw[n->n_names++] = kw;
    return TP_OK;
}

// ----------------------------------------------------------------------------
// parser

typedef struct parser {
    token *t;
    size_t i;
    int depth;
    char **macros; /* the names every {% macro %} defines: calls to them are checked at the end */
    size_t n_macros;
    char **calls; /* names called that are no function: each must be a macro's */
    int *call_lines, *call_guarded;
    size_t n_calls;
    int guarded; /* > 0: in conditional code (if, for, macro, x if c else y) */
    char **unknown; /* constructs outside the subset ("filter \"x\""), with their lines */
    int *unknown_lines, *unknown_guarded;
    size_t n_unknown;
} parser;

static tp_status push_str(char ***v, size_t *n, int **lines, const char *s, int line)
{
    char **nv = realloc(*v, (*n + 1) * sizeof *nv);
    if (nv) *v = nv;
    int *nl = nv && lines ? realloc(*lines, (*n + 1) * sizeof *nl) : NULL;
    if (nl) *lines = nl;
    char *d = nv && (!lines || nl) ? strdup(s) : NULL;
    if (!d) return tp_error(TP_ERR_OOM, "out of memory");
    if (lines) (*lines)[*n] = line;
    (*v)[(*n)++] = d;
    return TP_OK;
}

static void parser_free(parser *p)
{
    for (size_t i = 0; i < p->n_macros; i++) free(p->macros[i]);
    for (size_t i = 0; i < p->n_calls; i++) free(p->calls[i]);
    for (size_t i = 0; i < p->n_unknown; i++) free(p->unknown[i]);
    free(p->macros);
    free(p->calls);
    free(p->call_lines);
    free(p->call_guarded);
    free(p->unknown);
    free(p->unknown_lines);
    free(p->unknown_guarded);
}

/* A construct outside the subset: refused at the end if unguarded, else noted */
static tp_status note_unknown(parser *p, const char *what, int line, int guarded);

/* Note name (kind: "filter \"%.40s\"", ...) unless known */
static tp_status check_known(parser *p, int known, const char *kind, const char *name, int line)
{
    if (known) return TP_OK;
    char what[80];
    snprintf(what, sizeof what, kind, name);
    return note_unknown(p, what, line, p->guarded > 0);
}

static tp_status note_unknown(parser *p, const char *what, int line, int guarded)
{
    int *g = realloc(p->unknown_guarded, (p->n_unknown + 1) * sizeof *g);
    if (!g) return tp_error(TP_ERR_OOM, "out of memory");
    p->unknown_guarded = g;
    g[p->n_unknown] = guarded;
    return push_str(&p->unknown, &p->n_unknown, &p->unknown_lines, what, line);
}

static token *cur(parser *p) { return &p->t[p->i]; }
static int is_op(parser *p, const char *op) { return cur(p)->type == T_OP && strcmp(cur(p)->s, op) == 0; }
static int is_name(parser *p, const char *nm) { return cur(p)->type == T_NAME && strcmp(cur(p)->s, nm) == 0; }

static tp_status syntax(parser *p, const char *what)
{
    token *t = cur(p);
    return tp_error(TP_ERR_FORMAT, "chat template: line %d: expected %s, found \"%.40s\"%s", t->line, what,
                    t->type == T_EOF ? "end of template" : t->s, HINT);
}

static tp_status expect_op(parser *p, const char *op)
{
    if (!is_op(p, op)) return syntax(p, op);
    p->i++;
    return TP_OK;
}

static tp_status parse_expr(parser *p, ct_node **out);
static tp_status parse_unary(parser *p, int with_filter, ct_node **out);

static tp_status make_bin(const char *op, ct_node *l, ct_node *r, ct_node **out)
{
    ct_node *n = node_new(CT_BINOP);
    if (!n || !(n->str = strdup(op))) {
        ct_node_free(n);
        ct_node_free(l);
        ct_node_free(r);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    n->kids = malloc(2 * sizeof *n->kids);
    if (!n->kids) {
        ct_node_free(n);
        ct_node_free(l);
        ct_node_free(r);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    n->kids[0] = l;
    n->kids[1] = r;
    n->n_kids = 2;
    *out = n;
    return TP_OK;
}

/* "(" [expr | name=expr] {"," ...} ")" into n's kids (after those it has) and keywords. */
static tp_status parse_args(parser *p, ct_node *n)
{
    TP_CHECK(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (cur(p)->type == T_NAME && p->t[p->i + 1].type == T_OP && strcmp(p->t[p->i + 1].s, "=") == 0) {
            const char *name = cur(p)->s;
            p->i += 2;
            ct_node *v;
            TP_CHECK(parse_expr(p, &v));
            TP_CHECK(add_name(n, name, v));
        } else {
            if (n->n_names) return syntax(p, "a keyword argument (positional after keyword)");
            ct_node *v;
            TP_CHECK(parse_expr(p, &v));
            TP_CHECK(add_kid(n, v));
        }
        if (!is_op(p, ",")) break;
        p->i++;
    }
    return expect_op(p, ")");
}

/* A name that is no function may be a macro's, defined anywhere: checked once all are read */
static tp_status check_call(parser *p, ct_node *callee, int line)
{
    if (callee->kind == CT_NAME && ct_known_function(callee->str)) return TP_OK;
    if (callee->kind == CT_NAME) {
        int *g = realloc(p->call_guarded, (p->n_calls + 1) * sizeof *g);
        if (!g) return tp_error(TP_ERR_OOM, "out of memory");
        p->call_guarded = g;
        g[p->n_calls] = p->guarded > 0;
        return push_str(&p->calls, &p->n_calls, &p->call_lines, callee->str, line);
    }
    if (callee->kind != CT_ATTR)
        return tp_error(TP_ERR_UNSUPPORTED, "chat template: line %d: calling an expression is not supported%s", line,
                        HINT);
    return check_known(p, ct_known_method(callee->str), "method .%.40s()", callee->str, line);
}

/* Refuse the first construct outside the subset that every rendering reaches; the others,
 * in conditional code, as *partial ("filter \"x\" (line 3), method .y() (line 9)") */
static tp_status check_unknowns(parser *p, char **partial)
{
    *partial = NULL;
    for (size_t i = 0; i < p->n_calls; i++) {
        int found = 0;
        for (size_t k = 0; k < p->n_macros && !found; k++) found = !strcmp(p->calls[i], p->macros[k]);
        char what[80];
        snprintf(what, sizeof what, "function %.40s()", p->calls[i]);
        if (!found) TP_CHECK(note_unknown(p, what, p->call_lines[i], p->call_guarded[i]));
    }
    for (size_t i = 0; i < p->n_unknown; i++)
        if (!p->unknown_guarded[i])
            return tp_error(TP_ERR_UNSUPPORTED, "chat template: line %d: %s is not supported%s", p->unknown_lines[i],
                            p->unknown[i], HINT);
    size_t len = 0;
    for (size_t i = 0; i < p->n_unknown; i++) len += strlen(p->unknown[i]) + 32;
    if (!len) return TP_OK;
    char *s = malloc(len);
    if (!s) return tp_error(TP_ERR_OOM, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < p->n_unknown; i++)
        o += (size_t)snprintf(s + o, len - o, "%s%s (line %d)", i ? ", " : "", p->unknown[i], p->unknown_lines[i]);
    *partial = s;
    return TP_OK;
}

static tp_status parse_primary(parser *p, ct_node **out)
{
    token *t = cur(p);
    ct_node *n = NULL;
    if (t->type == T_NAME) {
        static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
        for (int i = 0; i < 6; i++)
            if (strcmp(t->s, lits[i]) == 0) {
                n = node_new(CT_LIT);
                if (n) n->lit = i < 2 ? json_true() : i < 4 ? json_false() : json_null();
            }
        if (!n) {
            n = node_new(CT_NAME);
            if (n && !(n->str = strdup(t->s))) {
                ct_node_free(n);
                n = NULL;
            }
        }
        p->i++;
    } else if (t->type == T_STRING) {
        /* Adjacent literals concatenate, as in Python. */
        size_t total = 0, k = p->i;
        while (p->t[k].type == T_STRING) total += p->t[k++].len;
        char *buf = malloc(total + 1);
        size_t o = 0;
        for (; buf && p->t[p->i].type == T_STRING; p->i++) {
            memcpy(buf + o, p->t[p->i].s, p->t[p->i].len);
            o += p->t[p->i].len;
        }
        n = buf ? node_new(CT_LIT) : NULL;
        if (n) n->lit = json_stringn_nocheck(buf, o);
        free(buf);
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = node_new(CT_LIT);
        if (n) n->lit = json_incref(t->num);
        p->i++;
    } else if (is_op(p, "(")) {
        p->i++;
        TP_CHECK(parse_expr(p, &n));
        if (is_op(p, ",")) {
            /* A tuple: evaluated as a list (enough for str.startswith((a, b))); flag: a tuple,
             * whose items are %'s arguments */
            ct_node *l = node_new(CT_LIST);
            if (l) l->flag = 1;
            tp_status st = l ? add_kid(l, n) : tp_error(TP_ERR_OOM, "out of memory");
            if (!l) ct_node_free(n);
            n = l;
            while (st == TP_OK && is_op(p, ",")) {
                p->i++;
                if (is_op(p, ")")) break;
                ct_node *v;
                st = parse_expr(p, &v);
                if (st == TP_OK) st = add_kid(n, v);
            }
            if (st != TP_OK) {
                ct_node_free(n);
                return st;
            }
        }
        if (!is_op(p, ")")) {
            ct_node_free(n);
            return syntax(p, ")");
        }
        p->i++;
        *out = n;
        return TP_OK;
    } else if (is_op(p, "[") || is_op(p, "{")) {
        int dict = is_op(p, "{");
        const char *close = dict ? "}" : "]";
        p->i++;
        n = node_new(dict ? CT_DICT : CT_LIST);
        if (!n) return tp_error(TP_ERR_OOM, "out of memory");
        tp_status st = TP_OK;
        while (st == TP_OK && !is_op(p, close)) {
            ct_node *v;
            st = parse_expr(p, &v);
            if (st == TP_OK) st = add_kid(n, v);
            if (st == TP_OK && dict) {
                st = expect_op(p, ":");
                if (st == TP_OK) st = parse_expr(p, &v);
                if (st == TP_OK) st = add_kid(n, v);
            }
            if (st != TP_OK || !is_op(p, ",")) break;
            p->i++;
        }
        if (st == TP_OK) st = expect_op(p, close);
        if (st != TP_OK) {
            ct_node_free(n);
            return st;
        }
        *out = n;
        return TP_OK;
    } else {
        return syntax(p, "an expression");
    }
    if (!n || (n->kind == CT_LIT && !n->lit)) {
        ct_node_free(n);
        return tp_error(TP_ERR_OOM, "out of memory");
    }
    *out = n;
    return TP_OK;
}

static tp_status wrap(enum ct_kind kind, ct_node **n)
{
    ct_node *w = node_new(kind);
    if (!w) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st = add_kid(w, *n);
    if (st != TP_OK) {
        *n = NULL;
        free(w);
        return st;
    }
    *n = w;
    return TP_OK;
}

static tp_status parse_postfix(parser *p, ct_node **n)
{
    for (;;) {
        int line = cur(p)->line;
        if (is_op(p, ".")) {
            p->i++;
            if (cur(p)->type != T_NAME && cur(p)->type != T_INT) return syntax(p, "an attribute name");
            if (cur(p)->type == T_INT) {
                ct_node *idx = node_new(CT_LIT);
                if (!idx) return tp_error(TP_ERR_OOM, "out of memory");
                idx->lit = json_incref(cur(p)->num);
                p->i++;
                TP_CHECK(wrap(CT_ITEM, n));
                TP_CHECK(add_kid(*n, idx));
                continue;
            }
            TP_CHECK(wrap(CT_ATTR, n));
            if (!((*n)->str = strdup(cur(p)->s))) return tp_error(TP_ERR_OOM, "out of memory");
            p->i++;
        } else if (is_op(p, "[")) {
            p->i++;
            ct_node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            tp_status st = TP_OK;
            for (;;) {
                if (!is_op(p, ":") && !is_op(p, "]")) st = parse_expr(p, &parts[colons]);
                if (st != TP_OK || !is_op(p, ":") || colons == 2) break;
                colons++;
                p->i++;
            }
            if (st == TP_OK) st = expect_op(p, "]");
            if (st == TP_OK && colons == 0 && !parts[0]) st = syntax(p, "an index");
            if (st == TP_OK) st = wrap(colons ? CT_SLICE : CT_ITEM, n);
            for (int k = 0; k < (colons ? 3 : 1); k++)
                if (st == TP_OK) st = add_kid(*n, parts[k]), parts[k] = NULL;
            for (int k = 0; k < 3; k++) ct_node_free(parts[k]);
            TP_CHECK(st);
        } else if (is_op(p, "(")) {
            TP_CHECK(check_call(p, *n, line));
            TP_CHECK(wrap(CT_CALL, n));
            (*n)->line = line;
            TP_CHECK(parse_args(p, *n));
        } else {
            return TP_OK;
        }
    }
}

static int starts_test_arg(parser *p)
{
    token *t = cur(p);
    if (t->type == T_NAME) {
        static const char *const stop[] = {"else", "or", "and", "if", "in", "is", "not"};
        for (int i = 0; i < 7; i++)
            if (strcmp(t->s, stop[i]) == 0) return 0;
        return 1;
    }
    return t->type == T_STRING || t->type == T_INT || t->type == T_FLOAT || is_op(p, "[") || is_op(p, "{");
}

/* name [(args)] after a "|": *n through that filter */
static tp_status parse_one_filter(parser *p, ct_node **n, int line)
{
    if (cur(p)->type != T_NAME) return syntax(p, "a filter name");
    TP_CHECK(check_known(p, ct_known_filter(cur(p)->s), "filter \"%.40s\"", cur(p)->s, line));
    TP_CHECK(wrap(CT_FILTER, n));
    (*n)->line = line;
    if (!((*n)->str = strdup(cur(p)->s))) return tp_error(TP_ERR_OOM, "out of memory");
    p->i++;
    if (is_op(p, "(")) TP_CHECK(parse_args(p, *n));
    return TP_OK;
}

static tp_status parse_filters(parser *p, ct_node **n)
{
    for (;;) {
        int line = cur(p)->line;
        if (is_op(p, "|")) {
            p->i++;
            TP_CHECK(parse_one_filter(p, n, line));
        } else if (is_name(p, "is")) {
            p->i++;
            int neg = is_name(p, "not");
            if (neg) p->i++;
            if (cur(p)->type != T_NAME) return syntax(p, "a test name");
            TP_CHECK(check_known(p, ct_known_test(cur(p)->s), "test \"is %.40s\"", cur(p)->s, line));
            TP_CHECK(wrap(CT_TEST, n));
            (*n)->line = line;
            (*n)->flag = neg;
            if (!((*n)->str = strdup(cur(p)->s))) return tp_error(TP_ERR_OOM, "out of memory");
            p->i++;
            if (is_op(p, "(")) {
                TP_CHECK(parse_args(p, *n));
            } else if (starts_test_arg(p)) {
                ct_node *arg;
                TP_CHECK(parse_primary(p, &arg));
                TP_CHECK(add_kid(*n, arg));
                TP_CHECK(parse_postfix(p, &(*n)->kids[1]));
            }
        } else if (is_op(p, "(")) {
            TP_CHECK(check_call(p, *n, line));
            TP_CHECK(wrap(CT_CALL, n));
            (*n)->line = line;
            TP_CHECK(parse_args(p, *n));
        } else {
            return TP_OK;
        }
    }
}

static tp_status parse_unary(parser *p, int with_filter, ct_node **out)
{
    *out = NULL;
    if (++p->depth > MAX_DEPTH) return tp_error(TP_ERR_FORMAT, "chat template: expression nested too deeply");
    tp_status st;
    if (is_op(p, "-") || is_op(p, "+")) {
        int neg = is_op(p, "-");
        p->i++;
        st = parse_unary(p, 0, out);
        if (st == TP_OK && neg) st = wrap(CT_NEG, out);
    } else {
        st = parse_primary(p, out);
    }
    if (st == TP_OK) st = parse_postfix(p, out);
    if (st == TP_OK && with_filter) st = parse_filters(p, out);
    p->depth--;
    if (st != TP_OK) {
        ct_node_free(*out);
        *out = NULL;
    }
    return st;
}

/* One binary precedence level: operand (op operand)*. */
typedef tp_status (*level_fn)(parser *, ct_node **);

static tp_status binary_level(parser *p, ct_node **out, level_fn next, const char *const *ops, int by_name)
{
    TP_CHECK(next(p, out));
    for (;;) {
        const char *op = NULL;
        for (size_t i = 0; ops[i] && !op; i++)
            if (by_name ? is_name(p, ops[i]) : is_op(p, ops[i])) op = ops[i];
        if (!op) return TP_OK;
        p->i++;
        ct_node *r;
        tp_status st = next(p, &r);
        if (st == TP_OK) st = make_bin(op, *out, r, out);
        else ct_node_free(*out);
        if (st != TP_OK) {
            *out = NULL;
            return st;
        }
    }
}

static tp_status parse_unary_f(parser *p, ct_node **out) { return parse_unary(p, 1, out); }
static tp_status parse_pow(parser *p, ct_node **out)
{
    static const char *const ops[] = {"**", NULL};
    return binary_level(p, out, parse_unary_f, ops, 0);
}
static tp_status parse_math2(parser *p, ct_node **out)
{
    static const char *const ops[] = {"*", "//", "/", "%", NULL};
    return binary_level(p, out, parse_pow, ops, 0);
}
static tp_status parse_concat(parser *p, ct_node **out)
{
    static const char *const ops[] = {"~", NULL};
    return binary_level(p, out, parse_math2, ops, 0);
}
static tp_status parse_math1(parser *p, ct_node **out)
{
    static const char *const ops[] = {"+", "-", NULL};
    return binary_level(p, out, parse_concat, ops, 0);
}

static tp_status parse_compare(parser *p, ct_node **out)
{
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">", NULL};
    TP_CHECK(parse_math1(p, out));
    int chained = 0;
    for (;;) {
        const char *op = NULL;
        for (size_t i = 0; ops[i] && !op; i++)
            if (is_op(p, ops[i])) op = ops[i];
        if (!op && is_name(p, "in")) op = "in";
        if (!op && is_name(p, "not") && p->t[p->i + 1].type == T_NAME && strcmp(p->t[p->i + 1].s, "in") == 0) {
            op = "not in";
            p->i++;
        }
        if (!op) return TP_OK;
        if (chained++) { /* Jinja: a < b < c is a < b and b < c */
            const int line = p->t[p->i].line;
            ct_node_free(*out);
            *out = NULL;
            return tp_error(TP_ERR_UNSUPPORTED, "chat template: line %d: a chained comparison (... %s ...) is not "
                            "supported (Jinja reads a < b < c as a < b and b < c)%s", line, op, HINT);
        }
        p->i++;
        ct_node *r;
        tp_status st = parse_math1(p, &r);
        if (st == TP_OK) st = make_bin(op, *out, r, out);
        else ct_node_free(*out);
        if (st != TP_OK) {
            *out = NULL;
            return st;
        }
    }
}

static tp_status parse_not(parser *p, ct_node **out)
{
    if (!is_name(p, "not")) return parse_compare(p, out);
    p->i++;
    if (++p->depth > MAX_DEPTH) return tp_error(TP_ERR_FORMAT, "chat template: expression nested too deeply");
    tp_status st = parse_not(p, out);
    p->depth--;
    if (st == TP_OK) st = wrap(CT_NOT, out);
    return st;
}

static tp_status parse_and(parser *p, ct_node **out)
{
    static const char *const ops[] = {"and", NULL};
    return binary_level(p, out, parse_not, ops, 1);
}

static tp_status parse_or(parser *p, ct_node **out)
{
    static const char *const ops[] = {"or", NULL};
    return binary_level(p, out, parse_and, ops, 1);
}

static tp_status parse_expr(parser *p, ct_node **out)
{
    const size_t unknown0 = p->n_unknown, calls0 = p->n_calls;
    TP_CHECK(parse_or(p, out));
    while (is_name(p, "if")) {
        p->i++;
        /* x if c else y: all of it is conditional code, x too (read before the if) */
        for (size_t i = unknown0; i < p->n_unknown; i++) p->unknown_guarded[i] = 1;
        for (size_t i = calls0; i < p->n_calls; i++) p->call_guarded[i] = 1;
        p->guarded++;
        ct_node *n = node_new(CT_COND), *cond = NULL, *other = NULL;
        tp_status st = n ? parse_or(p, &cond) : tp_error(TP_ERR_OOM, "out of memory");
        if (st == TP_OK && is_name(p, "else")) {
            p->i++;
            st = parse_expr(p, &other);
        }
        p->guarded--;
        if (st == TP_OK) st = add_kid(n, cond), cond = NULL;
        if (st == TP_OK) st = add_kid(n, *out), *out = NULL;
        if (st == TP_OK) st = add_kid(n, other), other = NULL;
        ct_node_free(cond);
        ct_node_free(other);
        if (st != TP_OK) {
            ct_node_free(n);
            ct_node_free(*out);
            *out = NULL;
            return st;
        }
        *out = n;
    }
    return TP_OK;
}

// ----------------------------------------------------------------------------
// statements

static tp_status parse_body(parser *p, ct_node **out, const char *const *stops);

static tp_status block_end(parser *p)
{
    if (cur(p)->type != T_BLOCK_END) return syntax(p, "%}");
    p->i++;
    return TP_OK;
}

static tp_status parse_if_guarded(parser *p, ct_node *n);

/* The test and branches of an if are conditional code (jinja2 defers unknown filters there) */
static tp_status parse_if(parser *p, ct_node *n)
{
    p->guarded++;
    tp_status st = parse_if_guarded(p, n);
    p->guarded--;
    return st;
}

static tp_status parse_if_guarded(parser *p, ct_node *n)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    for (;;) {
        ct_node *cond, *body;
        TP_CHECK(parse_expr(p, &cond));
        TP_CHECK(add_kid(n, cond));
        TP_CHECK(block_end(p));
        TP_CHECK(parse_body(p, &body, stops));
        TP_CHECK(add_kid(n, body));
        /* parse_body stopped at "{% elif|else|endif" with the name current. */
        if (is_name(p, "elif")) {
            p->i++;
            continue;
        }
        if (is_name(p, "else")) {
            static const char *const end[] = {"endif", NULL};
            p->i++;
            TP_CHECK(block_end(p));
            TP_CHECK(parse_body(p, &body, end));
            TP_CHECK(add_kid(n, body));
            n->flag = 1;
        }
        if (!is_name(p, "endif")) return syntax(p, "{% endif %}");
        p->i++;
        return block_end(p);
    }
}

static tp_status parse_for(parser *p, ct_node *n)
{
    static const char *const stops[] = {"else", "endfor", NULL};
    do {
        if (cur(p)->type != T_NAME) return syntax(p, "a loop variable");
        TP_CHECK(add_name(n, cur(p)->s, NULL));
        p->i++;
    } while (is_op(p, ",") && (p->i++, 1));
    if (!is_name(p, "in")) return syntax(p, "in");
    p->i++;
    ct_node *iter, *body, *els = NULL, *filter = NULL;
    TP_CHECK(parse_or(p, &iter));
    TP_CHECK(add_kid(n, iter));
    if (is_name(p, "if")) {
        p->i++;
        TP_CHECK(parse_or(p, &filter));
    }
    if (is_name(p, "recursive")) {
        ct_node_free(filter);
        return tp_error(TP_ERR_UNSUPPORTED, "chat template: line %d: recursive loops are not supported%s",
                        cur(p)->line, HINT);
    }
    tp_status st = block_end(p);
    p->guarded++; /* the body runs only for items there are */
    if (st == TP_OK) st = parse_body(p, &body, stops);
    if (st == TP_OK) st = add_kid(n, body);
    if (st == TP_OK && is_name(p, "else")) {
        static const char *const end[] = {"endfor", NULL};
        p->i++;
        st = block_end(p);
        if (st == TP_OK) st = parse_body(p, &els, end);
    }
    p->guarded--;
    if (st == TP_OK) st = add_kid(n, els), els = NULL;
    if (st == TP_OK) st = add_kid(n, filter), filter = NULL;
    ct_node_free(els);
    ct_node_free(filter);
    TP_CHECK(st);
    if (!is_name(p, "endfor")) return syntax(p, "{% endfor %}");
    p->i++;
    return block_end(p);
}

/* [| filters] %}body{% end %} into n's kids[0]: the body's rendering through the filters,
 * for {% set x | f %}...{% endset %} and {% filter f %}...{% endfilter %} */
static tp_status parse_rendered(parser *p, ct_node *n, const char *end_name)
{
    const char *const end[] = {end_name, NULL};
    ct_node *render = node_new(CT_RENDER), *v = render;
    if (!render) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st = TP_OK;
    if (!strcmp(end_name, "endfilter")) st = parse_one_filter(p, &v, cur(p)->line); /* {% filter f %}: no "|" */
    if (st == TP_OK) st = parse_filters(p, &v); /* each wraps v: render stays the innermost node */
    if (st != TP_OK) {
        ct_node_free(v);
        return st;
    }
    TP_CHECK(add_kid(n, v));
    TP_CHECK(block_end(p));
    ct_node *body;
    TP_CHECK(parse_body(p, &body, end));
    TP_CHECK(add_kid(render, body));
    p->i++; /* the end name */
    return block_end(p);
}

static tp_status parse_set(parser *p, ct_node *n)
{
    if (cur(p)->type != T_NAME) return syntax(p, "a variable name");
    if (!(n->str = strdup(cur(p)->s))) return tp_error(TP_ERR_OOM, "out of memory");
    p->i++;
    if (is_op(p, ".")) {
        p->i++;
        if (cur(p)->type != T_NAME) return syntax(p, "an attribute name");
        if (!(n->attr = strdup(cur(p)->s))) return tp_error(TP_ERR_OOM, "out of memory");
        p->i++;
    }
    ct_node *v;
    if (cur(p)->type == T_BLOCK_END || is_op(p, "|")) /* {% set x | f %}...{% endset %} */
        return parse_rendered(p, n, "endset");
    if (!is_op(p, "="))
        return tp_error(TP_ERR_UNSUPPORTED, "chat template: line %d: only {%% set name = expression %%} and "
                        "{%% set name %%}...{%% endset %%} are supported (no tuple assignment)%s",
                        cur(p)->line, HINT);
    p->i++;
    TP_CHECK(parse_expr(p, &v));
    TP_CHECK(add_kid(n, v));
    return block_end(p);
}

/* {% generation %}body{% endgeneration %}: transformers' tag that marks what the assistant
 * said (for its token masks); it renders the body, whose sets stay inside (a call block's) */
static tp_status parse_generation(parser *p, ct_node *n)
{
    static const char *const end[] = {"endgeneration", NULL};
    ct_node *body;
    TP_CHECK(block_end(p));
    TP_CHECK(parse_body(p, &body, end));
    TP_CHECK(add_kid(n, body));
    p->i++; /* endgeneration */
    return block_end(p);
}

/* Whether the tree reads the name (a macro's varargs or kwargs, as Jinja decides) */
static int reads_name(const ct_node *n, const char *name)
{
    if (!n) return 0;
    if (n->kind == CT_NAME && !strcmp(n->str, name)) return 1;
    if (n->kind == CT_MACRO) return 0; /* a macro inside has its own */
    for (size_t i = 0; i < n->n_kids; i++)
        if (reads_name(n->kids[i], name)) return 1;
    for (size_t i = 0; n->kw && i < n->n_names; i++)
        if (reads_name(n->kw[i], name)) return 1;
    return 0;
}

/* {% macro name(a, b=default, ...) %}body{% endmacro %} */
static tp_status parse_macro(parser *p, ct_node *n)
{
    static const char *const end[] = {"endmacro", NULL};
    if (cur(p)->type != T_NAME) return syntax(p, "a macro name");
    if (!(n->str = strdup(cur(p)->s))) return tp_error(TP_ERR_OOM, "out of memory");
    TP_CHECK(push_str(&p->macros, &p->n_macros, NULL, n->str, 0));
    p->i++;
    TP_CHECK(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (cur(p)->type != T_NAME) return syntax(p, "a parameter name");
        const int line = cur(p)->line;
        const char *name = cur(p)->s;
        for (size_t k = 0; k < n->n_names; k++)
            if (!strcmp(n->names[k], name))
                return tp_error(TP_ERR_FORMAT, "chat template: line %d: macro %s has two parameters named %s%s",
                                line, n->str, name, HINT);
        p->i++;
        ct_node *dflt = NULL;
        if (is_op(p, "=")) {
            p->i++;
            TP_CHECK(parse_expr(p, &dflt));
        } else if (n->n_names && n->kw[n->n_names - 1]) {
            return tp_error(TP_ERR_FORMAT, "chat template: line %d: macro %s: parameter %s without a default "
                            "follows one with a default%s", line, n->str, name, HINT);
        }
        TP_CHECK(add_name(n, name, dflt));
        if (!is_op(p, ",")) break;
        p->i++;
    }
    TP_CHECK(expect_op(p, ")"));
    TP_CHECK(block_end(p));
    ct_node *body;
    p->guarded++; /* runs only when called */
    tp_status st = parse_body(p, &body, end);
    p->guarded--;
    TP_CHECK(st);
    TP_CHECK(add_kid(n, body));
    n->flag = (reads_name(body, "varargs") ? MACRO_VARARGS : 0) | (reads_name(body, "kwargs") ? MACRO_KWARGS : 0);
    p->i++; /* endmacro */
    return block_end(p);
}

static tp_status parse_stmt(parser *p, ct_node *body)
{
    token *t = cur(p);
    if (t->type != T_NAME) return syntax(p, "a statement name");
    const char *nm = t->s;
    enum ct_kind kind;
    if (!strcmp(nm, "if")) kind = CT_IF;
    else if (!strcmp(nm, "for")) kind = CT_FOR;
    else if (!strcmp(nm, "set")) kind = CT_SET;
    else if (!strcmp(nm, "break")) kind = CT_BREAK;
    else if (!strcmp(nm, "continue")) kind = CT_CONTINUE;
    else if (!strcmp(nm, "macro")) kind = CT_MACRO;
    else if (!strcmp(nm, "generation")) kind = CT_SCOPE;
    else if (!strcmp(nm, "filter")) kind = CT_OUT;
    else if (!strcmp(nm, "endif") || !strcmp(nm, "endfor") || !strcmp(nm, "elif") || !strcmp(nm, "else") ||
             !strcmp(nm, "endset") || !strcmp(nm, "endmacro") || !strcmp(nm, "endgeneration") ||
             !strcmp(nm, "endfilter"))
        return tp_error(TP_ERR_FORMAT, "chat template: line %d: {%% %s %%} without its opening tag%s", t->line, nm,
                        HINT);
    else
        return tp_error(TP_ERR_UNSUPPORTED, "chat template: line %d: {%% %.40s %%} is not supported by tpinfer's "
                        "template subset (if/elif/else, for, set, macro, filter, generation, break, continue)%s",
                        t->line, nm, HINT);
    p->i++;
    ct_node *n = node_new(kind);
    if (!n) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st = add_kid(body, n);
    if (st != TP_OK) return st;
    if (++p->depth > MAX_DEPTH) return tp_error(TP_ERR_FORMAT, "chat template: blocks nested too deeply");
    if (kind == CT_IF) st = parse_if(p, n);
    else if (kind == CT_FOR) st = parse_for(p, n);
    else if (kind == CT_SET) st = parse_set(p, n);
    else if (kind == CT_MACRO) st = parse_macro(p, n);
    else if (kind == CT_SCOPE) st = parse_generation(p, n);
    else if (kind == CT_OUT) st = parse_rendered(p, n, "endfilter");
    else st = block_end(p);
    p->depth--;
    return st;
}

static tp_status parse_body(parser *p, ct_node **out, const char *const *stops)
{
    ct_node *body = node_new(CT_BLOCK);
    if (!body) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st = TP_OK;
    *out = body;
    for (;;) {
        token *t = cur(p);
        if (t->type == T_EOF) {
            if (stops)
                st = tp_error(TP_ERR_FORMAT, "chat template: a block is not closed (no {%% %s %%})%s",
                              stops[1] ? stops[1 + (stops[2] != NULL)] : stops[0], HINT);
            break;
        }
        if (t->type == T_TEXT) {
            ct_node *n = node_new(CT_TEXT);
            if (!n || !(n->str = malloc(t->len + 1))) {
                free(n);
                st = tp_error(TP_ERR_OOM, "out of memory");
                break;
            }
            memcpy(n->str, t->s, t->len + 1);
            n->len = t->len;
            p->i++;
            if ((st = add_kid(body, n)) != TP_OK) break;
            continue;
        }
        if (t->type == T_VAR_BEGIN) {
            p->i++;
            ct_node *e;
            if ((st = parse_expr(p, &e)) != TP_OK) break;
            if ((st = wrap(CT_OUT, &e)) != TP_OK) break;
            if ((st = add_kid(body, e)) != TP_OK) break;
            if (cur(p)->type != T_VAR_END) {
                st = syntax(p, "}}");
                break;
            }
            p->i++;
            continue;
        }
        if (t->type != T_BLOCK_BEGIN) {
            st = syntax(p, "text or a tag");
            break;
        }
        token *name = &p->t[p->i + 1];
        int stop = 0;
        for (size_t k = 0; stops && stops[k] && name->type == T_NAME; k++) stop |= strcmp(name->s, stops[k]) == 0;
        if (stop) {
            p->i++; /* the caller reads the stop word and what follows */
            break;
        }
        p->i++;
        if ((st = parse_stmt(p, body)) != TP_OK) break;
    }
    if (st != TP_OK) {
        ct_node_free(body);
        *out = NULL;
    }
    return st;
}

// ----------------------------------------------------------------------------
// API

tp_status tp_chat_template_create(const char *source, size_t len, tp_chat_template **out)
{
    *out = NULL;
    if (!tp_utf8_valid(source, len, NULL))
        return tp_error(TP_ERR_FORMAT, "chat template: not valid UTF-8");
    /* Jinja reads every \r\n and lone \r as \n (a template saved on Windows renders alike) */
    char *src = malloc(len + 1);
    if (!src) return tp_error(TP_ERR_OOM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n') i++;
        } else src[n++] = source[i];
    }
    src[n] = '\0';
    lexer lx = {src, n, 0, 1, NULL, 0, 0, 0};
    tp_status st = lex(&lx);
    ct_node *root = NULL;
    char *partial = NULL;
    if (st == TP_OK) {
        parser p = {.t = lx.v};
        st = parse_body(&p, &root, NULL);
        if (st == TP_OK) st = check_unknowns(&p, &partial);
        parser_free(&p);
    }
    lexer_free(&lx);
    free(src);
    tp_chat_template *tpl = st == TP_OK ? calloc(1, sizeof *tpl) : NULL;
    if (st == TP_OK && !tpl) st = tp_error(TP_ERR_OOM, "out of memory");
    if (st != TP_OK) {
        ct_node_free(root);
        free(partial);
        return st;
    }
    tpl->root = root;
    tpl->partial = partial;
    *out = tpl;
    return TP_OK;
}

tp_status tp_chat_template_create_from_file(const char *path, char **source, tp_chat_template **out)
{
    size_t len = 0;
    *out = NULL;
    tp_status st = tp_read_file(path, (size_t)1 << 20, source, &len);
    if (st == TP_OK) st = tp_chat_template_create(*source, len, out);
    if (st == TP_OK) return TP_OK;
    free(*source);
    *source = NULL;
    return tp_error_prefix(st, "--chat-template %s", path);
}

void tp_chat_template_destroy(tp_chat_template *tpl)
{
    if (!tpl) return;
    ct_node_free(tpl->root);
    free(tpl->partial);
    free(tpl);
}

const char *tp_chat_template_partial(const tp_chat_template *tpl) { return tpl ? tpl->partial : NULL; }

tp_status tp_chat_template_render(const tp_chat_template *tpl, json_t *vars, char **out, size_t *len)
{
    return ct_render(tpl->root, vars, out, len);
}

tp_status tp_chat_template_apply(const tp_chat_template *tpl, json_t *messages, json_t *tools,
                                 int add_generation_prompt, const char *bos_token, const char *eos_token, char **out,
                                 size_t *len)
{
    json_t *vars = json_object();
    if (!vars) return tp_error(TP_ERR_OOM, "out of memory");
    json_object_set(vars, "messages", messages);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (bos_token) json_object_set_new(vars, "bos_token", json_string(bos_token));
    if (eos_token) json_object_set_new(vars, "eos_token", json_string(eos_token));
    /* transformers passes these whether the request has them or not */
    json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(vars, "documents", json_null());
    tp_status st = ct_render(tpl->root, vars, out, len);
    json_decref(vars);
    return st;
}
