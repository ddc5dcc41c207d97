/*
 * completion.c: per-choice text, stop strings and logprobs, and the output lines.
 */
#include "completion.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// a choice

tp_status tp_choice_init(tp_choice *c, const tp_tokenizer *tok, int skip_special, int want_logprobs,
                         int32_t n_logprobs)
{
    memset(c, 0, sizeof *c);
    c->stop_token = -1;
    c->want_logprobs = want_logprobs;
    c->n_logprobs = n_logprobs;
    return tp_detok_stream_create(tok, skip_special, &c->ds);
}

void tp_choice_free(tp_choice *c)
{
    tp_ids_free(&c->out);
    free(c->text);
    tp_detok_stream_destroy(c->ds);
    free(c->lp);
    free(c->top);
    memset(c, 0, sizeof *c);
}

static tp_status append(tp_choice *c, const char *s, size_t n)
{
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 64;
        while (cap < c->len + n + 1) cap *= 2;
        char *p = realloc(c->text, cap);
        if (!p) return tp_error(TP_ERR_OOM, "out of memory for a completion's text");
        c->text = p;
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = '\0';
    return TP_OK;
}

/* The earliest stop string that ends within the last `fresh` bytes; truncates there. */
static int cut_at_stop(tp_choice *c, size_t fresh, char *const *stop, int32_t n_stop, int include_stop)
{
    size_t best = (size_t)-1, best_len = 0;
    int32_t which = 0;
    for (int32_t i = 0; i < n_stop; i++) {
        size_t k = strlen(stop[i]);
        if (k == 0 || k > c->len) continue;
        size_t from = c->len - fresh + 1 > k ? c->len - fresh + 1 - k : 0;
        for (size_t p = from; p + k <= c->len; p++)
            if (!memcmp(c->text + p, stop[i], k)) {
                if (p < best) {
                    best = p;
                    best_len = k;
                    which = i;
                }
                break;
            }
    }
    if (best == (size_t)-1) return 0;
    c->stop_str = which + 1;
    c->len = best + (include_stop ? best_len : 0);
    c->text[c->len] = '\0';
    return 1;
}

tp_status tp_choice_push(tp_choice *c, int32_t token, int in_text, char *const *stop, int32_t n_stop,
                         int include_stop, int check_stops, int *stopped)
{
    *stopped = 0;
    TP_CHECK(tp_ids_push(&c->out, token));
    if (!in_text) return TP_OK;
    const char *piece;
    size_t n;
    TP_CHECK(tp_detok_stream_push(c->ds, token, &piece, &n));
    if (n) TP_CHECK(append(c, piece, n));
    if (check_stops && n && n_stop) *stopped = cut_at_stop(c, n, stop, n_stop, include_stop);
    return TP_OK;
}

tp_status tp_choice_keep_logprobs(tp_choice *c, const tp_sample_result *r)
{
    if (!c->want_logprobs) return TP_OK;
    size_t i = c->out.n; /* kept before push: index of the new token */
    if (i + 1 > c->lp_cap) {
        size_t cap = c->lp_cap ? 2 * c->lp_cap : 16;
        float *lp = realloc(c->lp, cap * sizeof *lp);
        if (!lp) return tp_error(TP_ERR_OOM, "out of memory for logprobs");
        c->lp = lp;
        if (c->n_logprobs) {
            tp_token_logprob *t = realloc(c->top, cap * (size_t)c->n_logprobs * sizeof *t);
            if (!t) return tp_error(TP_ERR_OOM, "out of memory for logprobs");
            c->top = t;
        }
        c->lp_cap = cap;
    }
    c->lp[i] = r->logprob;
    for (int32_t k = 0; k < c->n_logprobs; k++) {
        tp_token_logprob z = {-1, -INFINITY};
        c->top[i * (size_t)c->n_logprobs + (size_t)k] = k < r->n_top ? r->top[k] : z;
    }
    return TP_OK;
}

tp_status tp_choice_finish(tp_choice *c, tp_finish why, char *const *stop, int32_t n_stop, int include_stop)
{
    c->finish = why;
    const char *piece;
    size_t n;
    TP_CHECK(tp_detok_stream_finish(c->ds, &piece, &n));
    /* what the detokenizer held back (a byte-fallback run) is text unless a stop string cut
     * the text before it; an end token's own bytes are in it only when it was in_text */
    if (n && !c->stop_str) {
        TP_CHECK(append(c, piece, n));
        if (n_stop && cut_at_stop(c, n, stop, n_stop, include_stop)) c->finish = TP_FINISH_STOP;
    }
    return TP_OK;
}

void tp_logprob_of(const float *logits, int32_t vocab, int32_t id, int32_t n_top, float *logprob,
                   int32_t *rank, tp_token_logprob *top)
{
    double mx = -INFINITY;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    *logprob = (float)((double)logits[id] - lse);
    int32_t r = 1;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] > logits[id] || (logits[i] == logits[id] && i < id)) r++;
    *rank = r;
    /* top-N by insertion: N is at most 20 */
    int32_t k = 0;
    for (int32_t i = 0; i < vocab && n_top > 0; i++) {
        if (k == n_top && !(logits[i] > logits[top[k - 1].id])) continue;
        int32_t j = k < n_top ? k++ : k - 1;
        while (j > 0 && logits[top[j - 1].id] < logits[i]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = i;
    }
    for (int32_t j = 0; j < k; j++) top[j].logprob = (float)((double)logits[top[j].id] - lse);
}

// ----------------------------------------------------------------------------
// output lines

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_real(-9999.0); }

static char *piece_of(const tp_tokenizer *tok, int32_t id)
{
    char *s = NULL;
    size_t n = 0;
    if (tp_tokenizer_decode(tok, &id, 1, 0, &s, &n) != TP_OK) {
        tp_error_clear();
        return strdup("");
    }
    return s;
}

static json_t *compact_logprobs(const tp_choice *c, const tp_tokenizer *tok)
{
    json_t *a = json_array();
    for (size_t i = 0; i < c->out.n; i++) {
        json_t *top = json_array();
        for (int32_t k = 0; k < c->n_logprobs; k++) {
            const tp_token_logprob *t = &c->top[i * (size_t)c->n_logprobs + (size_t)k];
            if (t->id < 0) continue;
            json_array_append_new(top, json_pack("{s:i, s:o}", "id", t->id, "logprob", num(t->logprob)));
        }
        json_array_append_new(a, json_pack("{s:i, s:o, s:o}", "id", c->out.v[i], "logprob", num(c->lp[i]),
                                           "top_logprobs", top));
    }
    (void)tok;
    return a;
}

/* Characters (Unicode code points) of UTF-8 text s: text_offset counts them, as Python's len */
static size_t code_points(const char *s)
{
    size_t n = 0;
    for (const unsigned char *q = (const unsigned char *)(s ? s : ""); *q; q++) n += (*q & 0xc0) != 0x80;
    return n;
}

static int echo_skip_special(const tp_completion *c)
{
    const tp_request_params *rp = &c->req->p;
    return rp->has_skip_special_tokens ? rp->skip_special_tokens : 1;
}

/* echo's text_offset: where each token of the prompt and then of choice x starts in the
 * echoed text, in characters, as a detokenizer reading them all in a row writes it */
static void echo_offsets(const tp_completion *c, const tp_tokenizer *tok, const tp_choice *x, json_t *offs)
{
    tp_detok_stream *ds = NULL;
    const int ok = tp_detok_stream_create(tok, echo_skip_special(c), &ds) == TP_OK;
    size_t off = 0;
    for (size_t i = 0; i < (size_t)c->n_prompt + x->out.n; i++) {
        json_array_append_new(offs, json_integer((json_int_t)off));
        const int32_t id = i < (size_t)c->n_prompt ? c->prompt[i] : x->out.v[i - (size_t)c->n_prompt];
        const char *t;
        size_t n;
        if (ok && tp_detok_stream_push(ds, id, &t, &n) == TP_OK)
            for (size_t k = 0; k < n; k++) off += ((unsigned char)t[k] & 0xc0) != 0x80;
    }
    if (!ok) tp_error_clear();
    tp_detok_stream_destroy(ds);
}

/* One token's entries of a completions body's logprobs: its piece, its logprob, and
 * {piece: logprob} of the token itself and then the top N (up to N + 1 entries, as OpenAI
 * and vLLM); lp NULL: the prompt's first token, which has none */
static void completions_entry(const tp_tokenizer *tok, int32_t id, const float *lp, const tp_token_logprob *top,
                              int32_t n_top, json_t *tokens, json_t *lps, json_t *tops)
{
    char *p = piece_of(tok, id);
    json_array_append_new(tokens, json_string(p ? p : ""));
    json_array_append_new(lps, lp ? num(*lp) : json_null());
    json_t *o = lp ? json_object() : json_null();
    if (lp) json_object_set_new(o, p ? p : "", num(*lp));
    free(p);
    for (int32_t k = 0; lp && k < n_top; k++) {
        if (top[k].id < 0) continue;
        char *q = piece_of(tok, top[k].id);
        if (!json_object_get(o, q ? q : "")) json_object_set_new(o, q ? q : "", num(top[k].logprob));
        free(q);
    }
    json_array_append_new(tops, o);
}

/* OpenAI /v1/completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset};
 * with echo the prompt's tokens first (vLLM's echo) */
static json_t *completions_logprobs(const tp_completion *cp, const tp_choice *c, const tp_tokenizer *tok)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    const int echo = cp->req->p.echo;
    if (echo) {
        for (int32_t i = 0; i < cp->n_prompt; i++) {
            const tp_prompt_logprob *e = cp->prompt_lp && i > 0 ? &cp->prompt_lp[i] : NULL;
            completions_entry(tok, cp->prompt[i], e ? &e->logprob : NULL, e ? e->top : NULL, cp->n_prompt_lp_top,
                              tokens, lps, tops);
        }
        echo_offsets(cp, tok, c, offs);
    }
    size_t off = 0;
    for (size_t i = 0; i < c->out.n; i++) {
        if (!echo) {
            char *p = piece_of(tok, c->out.v[i]);
            json_array_append_new(offs, json_integer((json_int_t)off));
            off += code_points(p);
            free(p);
        }
        const tp_token_logprob *top = c->n_logprobs ? &c->top[i * (size_t)c->n_logprobs] : NULL;
        completions_entry(tok, c->out.v[i], &c->lp[i], top, c->n_logprobs, tokens, lps, tops);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *bytes_of(const char *s)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

/* OpenAI chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} */
static json_t *chat_logprobs(const tp_choice *c, const tp_tokenizer *tok)
{
    json_t *content = json_array();
    for (size_t i = 0; i < c->out.n; i++) {
        char *p = piece_of(tok, c->out.v[i]);
        json_t *top = json_array();
        for (int32_t k = 0; k < c->n_logprobs; k++) {
            const tp_token_logprob *t = &c->top[i * (size_t)c->n_logprobs + (size_t)k];
            if (t->id < 0) continue;
            char *q = piece_of(tok, t->id);
            json_array_append_new(top, json_pack("{s:s, s:o, s:o}", "token", q ? q : "", "logprob",
                                                 num(t->logprob), "bytes", bytes_of(q ? q : "")));
            free(q);
        }
        json_array_append_new(content, json_pack("{s:s, s:o, s:o, s:o}", "token", p ? p : "", "logprob",
                                                 num(c->lp[i]), "bytes", bytes_of(p ? p : ""), "top_logprobs", top));
        free(p);
    }
    return json_pack("{s:o}", "content", content);
}

static json_t *prompt_logprobs_json(const tp_completion *c, const tp_tokenizer *tok)
{
    json_t *a = json_array();
    for (int32_t p = 0; p < c->n_prompt; p++) {
        if (p == 0) {
            json_array_append_new(a, json_null());
            continue;
        }
        const tp_prompt_logprob *e = &c->prompt_lp[p];
        json_t *o = json_object();
        char key[16];
        char *s = piece_of(tok, e->id);
        snprintf(key, sizeof key, "%d", e->id);
        json_object_set_new(o, key, json_pack("{s:o, s:i, s:s}", "logprob", num(e->logprob), "rank", e->rank,
                                              "decoded_token", s ? s : ""));
        free(s);
        for (int32_t k = 0; k < c->n_prompt_lp_top; k++) {
            const tp_token_logprob *t = &e->top[k];
            snprintf(key, sizeof key, "%d", t->id);
            if (t->id < 0 || json_object_get(o, key)) continue;
            s = piece_of(tok, t->id);
            json_object_set_new(o, key, json_pack("{s:o, s:i, s:s}", "logprob", num(t->logprob), "rank", k + 1,
                                                  "decoded_token", s ? s : ""));
            free(s);
        }
        json_array_append_new(a, o);
    }
    return a;
}

static const char *reason_name(tp_finish f) { return f == TP_FINISH_STOP ? "stop" : "length"; }

/* vLLM's stop_reason: the stop string or stop_token_ids entry that ended the choice, else
 * null (an end-of-sequence token, or the length) */
static json_t *stop_reason(const tp_completion *c, const tp_choice *x)
{
    if (x->finish != TP_FINISH_STOP) return json_null();
    if (x->stop_str > 0 && x->stop_str <= c->req->p.n_stop) return json_string(c->req->p.stop[x->stop_str - 1]);
    if (x->stop_token >= 0) return json_integer(x->stop_token);
    return json_null();
}

static json_t *token_ids(const tp_choice *c)
{
    json_t *a = json_array();
    for (size_t i = 0; i < c->out.n; i++) json_array_append_new(a, json_integer(c->out.v[i]));
    return a;
}

/* A choice's text as the request's tool-call parser reads it (TP_TOOL_PARSER_NONE: as it is):
 * whether it called tools, the calls, and the content left. */
typedef struct choice_calls {
    tp_tool_calls t;
    int parsed; /* a parser read the text */
    int forced;   /* "tool_choice" named the function: the text is its arguments */
    int required; /* "tool_choice": "required": the text is a list of calls */
    int ok;     /* 0: out of memory */
} choice_calls;

static choice_calls parse_calls(const tp_completion *c, const tp_choice *x)
{
    choice_calls r;
    memset(&r, 0, sizeof r);
    if (c->req->forced_tool) { /* one call, the text its arguments (vLLM's named tool choice) */
        r.parsed = r.forced = r.t.called = 1;
        r.t.v = calloc(1, sizeof *r.t.v);
        if (r.t.v) {
            r.t.n = 1;
            r.t.v[0].name = strdup(c->req->forced_tool);
            r.t.v[0].arguments = malloc(x->len + 1);
            if (r.t.v[0].arguments) {
                if (x->len) memcpy(r.t.v[0].arguments, x->text, x->len);
                r.t.v[0].arguments[x->len] = 0;
            }
        }
        r.ok = r.t.v && r.t.v[0].name && r.t.v[0].arguments;
        return r;
    }
    if (c->req->required_tools) { /* a list of calls (vLLM's "required") */
        r.parsed = r.required = 1;
        r.ok = tp_tool_calls_parse_list(x->text ? x->text : "", x->len, &r.t) == TP_OK;
        if (!r.ok) tp_error_clear();
        return r;
    }
    r.parsed = c->tool_parser != TP_TOOL_PARSER_NONE;
    r.ok = !r.parsed || tp_tool_calls_parse(c->tool_parser, x->text ? x->text : "", x->len, &r.t) == TP_OK;
    if (!r.ok) tp_error_clear(); /* the line's building fails: dump_line says so */
    return r;
}

/* OpenAI's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]; the
 * first only with "parallel_tool_calls": false. NULL: out of memory. */
static json_t *tool_calls_json(const tp_completion *c, int32_t j, const tp_tool_calls *t)
{
    json_t *a = json_array();
    const size_t n = c->req->single_tool_call && t->n > 1 ? 1 : t->n;
    for (size_t k = 0; a && k < n; k++) {
        char id[64];
        tp_tool_call_id(c->tool_parser, c->req->id, j, k, id, sizeof id);
        if (json_array_append_new(a, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                                               "name", t->v[k].name, "arguments", t->v[k].arguments))) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

/* echo: the prompt's text before the completion's, as its tokens decode (special tokens as
 * the request says); NULL where it cannot be decoded (out of memory) */
static json_t *echo_text(const tp_completion *c, const tp_tokenizer *tok, const tp_choice *x)
{
    const int skip = echo_skip_special(c);
    const size_t np = (size_t)c->n_prompt;
    char *prompt = NULL, *both = NULL, *alone = NULL, *s = NULL;
    size_t n_prompt = 0, n_both = 0, n_alone = 0, head = 0; /* head: the completion's bytes replaced */
    int32_t *ids = malloc((np + 1) * sizeof *ids);
    json_t *j = NULL;
    if (!ids || tp_tokenizer_decode(tok, c->prompt, np, skip, &prompt, &n_prompt) != TP_OK) goto out;
    /* the completion's text reads its first token alone, and SentencePiece drops a leading
     * space there; read after the prompt, the space is the text's */
    if (x->len && x->out.n) {
        memcpy(ids, c->prompt, np * sizeof *ids);
        ids[np] = x->out.v[0];
        if (tp_tokenizer_decode(tok, ids, np + 1, skip, &both, &n_both) != TP_OK ||
            tp_tokenizer_decode(tok, &x->out.v[0], 1, skip, &alone, &n_alone) != TP_OK)
            goto out;
        if (n_both >= n_prompt + n_alone && memcmp(both, prompt, n_prompt) == 0 && n_alone <= x->len &&
            memcmp(x->text, alone, n_alone) == 0 && memcmp(both + n_both - n_alone, alone, n_alone) == 0)
            head = n_alone;
        else
            n_both = n_prompt; /* spelt otherwise in context: the completion's text as it is */
    } else
        n_both = n_prompt;
    s = malloc(n_both + x->len - head + 1);
    if (!s) goto out;
    memcpy(s, n_both > n_prompt ? both : prompt, n_both);
    if (x->len > head) memcpy(s + n_both, x->text + head, x->len - head);
    j = json_stringn(s, n_both + x->len - head);
out:
    if (!j) tp_error_clear();
    free(ids);
    free(prompt);
    free(both);
    free(alone);
    free(s);
    return j;
}

/* The choice's text: as generated, or as the parser left it (called: the content before the
 * calls, none as empty_as; else the text, mistral's without its tag) */
static json_t *text_of(const tp_choice *x, const choice_calls *p, json_t *(*empty_as)(void))
{
    if (!p->parsed) return json_stringn(x->text ? x->text : "", x->len);
    if (p->t.called && !p->t.content) return empty_as();
    return json_stringn(p->t.content ? p->t.content : "", p->t.content_len);
}

static json_t *empty_string(void) { return json_string(""); }

/* vLLM's finish reason: "tool_calls" wherever the parser called tools (a named tool
 * choice's call ends as its text did, as OpenAI's and vLLM's; "required"'s list is
 * "tool_calls" where it ended, as vLLM's) */
static const char *finish_of(const tp_choice *x, const choice_calls *p)
{
    if (p->required) return x->finish == TP_FINISH_STOP ? "tool_calls" : reason_name(x->finish);
    return p->t.called && !p->forced ? "tool_calls" : reason_name(x->finish);
}

/* o with its "tool_calls" where the parser called tools; NULL (o released) for memory */
static json_t *with_calls(json_t *o, const tp_completion *c, int32_t j, const choice_calls *p)
{
    if (!o || !p->t.called) return o;
    json_t *a = tool_calls_json(c, j, &p->t);
    if (!a || json_object_set_new(o, "tool_calls", a)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Choice j's fields of a compact line, after key (and its value): text, token_ids,
 * finish_reason, stop_reason, and tool_calls where the parser called tools. NULL: memory. */
static json_t *compact_choice(const tp_completion *c, const tp_tokenizer *tok, int32_t j, json_t *key_value,
                              const char *key)
{
    const tp_choice *x = &c->choices[j];
    choice_calls p = parse_calls(c, x);
    json_t *e = p.ok ? json_pack("{s:o, s:o, s:o, s:s, s:o}", key, key_value, "text",
                                 c->req->p.echo ? echo_text(c, tok, x) : text_of(x, &p, empty_string),
                                 "token_ids", token_ids(x), "finish_reason", finish_of(x, &p), "stop_reason",
                                 stop_reason(c, x))
                     : (json_decref(key_value), NULL);
    e = with_calls(e, c, j, &p);
    tp_tool_calls_free(&p.t);
    return e;
}

static json_t *compact_line(const tp_completion *c, const tp_tokenizer *tok, int64_t completion_tokens)
{
    const tp_choice *ch = &c->choices[0];
    json_t *o = compact_choice(c, tok, 0, json_string(c->req->id), "id");
    if (!o) return NULL;
    if (c->n_choices > 1) { /* n > 1: every choice in "choices" */
        json_t *all = json_array();
        for (int32_t j = 0; j < c->n_choices; j++) {
            const tp_choice *x = &c->choices[j];
            json_t *e = compact_choice(c, tok, j, json_integer(j), "index");
            if (!e) {
                json_decref(all);
                json_decref(o);
                return NULL;
            }
            if (x->want_logprobs) json_object_set_new(e, "logprobs", compact_logprobs(x, tok));
            json_array_append_new(all, e);
        }
        json_object_set_new(o, "choices", all);
    } else if (ch->want_logprobs) {
        json_object_set_new(o, "logprobs", compact_logprobs(ch, tok));
    }
    if (c->prompt_lp) json_object_set_new(o, "prompt_logprobs", prompt_logprobs_json(c, tok));
    json_object_set_new(o, "usage", json_pack("{s:i, s:I, s:{s:i}}", "prompt_tokens", c->n_prompt, "completion_tokens",
                                              (json_int_t)completion_tokens, "prompt_tokens_details",
                                              "cached_tokens", c->n_cached));
    return o;
}

static json_t *openai_body(const tp_completion *c, const tp_tokenizer *tok, int64_t completion_tokens)
{
    int chat = c->req->endpoint == TP_ENDPOINT_CHAT;
    json_t *choices = json_array();
    for (int32_t j = 0; j < c->n_choices; j++) {
        const tp_choice *x = &c->choices[j];
        json_t *e = NULL;
        if (chat) { /* with tool calls: the content before them, or null */
            choice_calls p = parse_calls(c, x);
            json_t *msg = p.ok ? json_pack("{s:s, s:o}", "role", "assistant", "content", text_of(x, &p, json_null))
                               : NULL;
            msg = with_calls(msg, c, j, &p);
            if (msg) e = json_pack("{s:i, s:o, s:s}", "index", j, "message", msg, "finish_reason", finish_of(x, &p));
            tp_tool_calls_free(&p.t);
        } else {
            e = json_pack("{s:i, s:o, s:s}", "index", j, "text",
                          c->req->p.echo ? echo_text(c, tok, x) : json_stringn(x->text ? x->text : "", x->len),
                          "finish_reason", reason_name(x->finish));
        }
        if (!e) {
            json_decref(choices);
            return NULL;
        }
        json_object_set_new(e, "stop_reason", stop_reason(c, x));
        json_object_set_new(e, "logprobs",
                            !x->want_logprobs ? json_null()
                            : chat            ? chat_logprobs(x, tok)
                                              : completions_logprobs(c, x, tok));
        /* vLLM: a completion's prompt logprobs are its choices', a chat's the body's */
        if (c->prompt_lp && !chat) json_object_set_new(e, "prompt_logprobs", prompt_logprobs_json(c, tok));
        json_array_append_new(choices, e);
    }
    char id[48];
    snprintf(id, sizeof id, "%s-%lld", chat ? "chatcmpl" : "cmpl", (long long)c->index);
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:i, s:I, s:I, s:{s:i}}}", "id", id, "object",
                             chat ? "chat.completion" : "text_completion", "created", (json_int_t)c->created,
                             "model", c->model ? c->model : "", "choices", choices, "usage", "prompt_tokens",
                             c->n_prompt, "completion_tokens", (json_int_t)completion_tokens, "total_tokens",
                             (json_int_t)(c->n_prompt + completion_tokens), "prompt_tokens_details", "cached_tokens",
                             c->n_cached);
    if (c->prompt_lp && chat) json_object_set_new(body, "prompt_logprobs", prompt_logprobs_json(c, tok));
    return body;
}

static tp_status dump_line(json_t *o, char **line, size_t *len)
{
    if (!o) return tp_error(TP_ERR_OOM, "out of memory building an output line");
    *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!*line) return tp_error(TP_ERR_OOM, "out of memory building an output line");
    *len = strlen(*line);
    return TP_OK;
}

static json_t *openai_envelope(const tp_request *r, int64_t index, int status, json_t *body)
{
    char id[48], rid[48];
    snprintf(id, sizeof id, "batch_req_%lld", (long long)index);
    snprintf(rid, sizeof rid, "req_%lld", (long long)index);
    return json_pack("{s:s, s:s, s:{s:i, s:s, s:o}, s:n}", "id", id, "custom_id", r->id, "response", "status_code",
                     status, "request_id", rid, "body", body, "error");
}

tp_status tp_completion_format(const tp_completion *c, const tp_tokenizer *tok, char **line, size_t *len)
{
    tp_completion view;
    tp_choice *shown = NULL;
    if (c->req->p.echo_only) { /* the prompt alone: the token drawn (max_tokens 1) is not shown */
        shown = malloc((size_t)(c->n_choices > 0 ? c->n_choices : 1) * sizeof *shown);
        if (!shown) return tp_error(TP_ERR_OOM, "out of memory building an output line");
        for (int32_t j = 0; j < c->n_choices; j++) {
            shown[j] = c->choices[j];
            shown[j].out.n = 0;
            shown[j].len = 0;
            shown[j].finish = TP_FINISH_LENGTH;
            shown[j].stop_str = 0;
            shown[j].stop_token = -1;
        }
        view = *c;
        view.choices = shown;
        c = &view;
    }
    int64_t completion_tokens = 0;
    for (int32_t j = 0; j < c->n_choices; j++) completion_tokens += (int64_t)c->choices[j].out.n;
    json_t *o = c->req->endpoint == TP_ENDPOINT_NONE
                    ? compact_line(c, tok, completion_tokens)
                    : openai_envelope(c->req, c->index, 200, openai_body(c, tok, completion_tokens));
    free(shown);
    return dump_line(o, line, len);
}

tp_status tp_error_line_format(const tp_request *r, int64_t index, const char *code, const char *message,
                               int openai, char **line, size_t *len)
{
    json_t *o;
    if (!openai && r->endpoint == TP_ENDPOINT_NONE)
        o = json_pack("{s:s, s:I, s:s, s:s}", "id", r->id, "line", (json_int_t)r->line, "code", code, "message",
                      message ? message : code);
    else
        o = openai_envelope(r, index, 400,
                            json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", message ? message : code,
                                      "type", "invalid_request_error", "param", "code", code));
    return dump_line(o, line, len);
}
