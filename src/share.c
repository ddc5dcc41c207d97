/*
 * share.c: the input split over the grid (share.h). Both exchanges travel as int32 words;
 * a request's id or ids are written as their length, then their bytes, padded to a word.
 */
#include "share.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The words of the exchanges, written at buf[*n] (NULL buf: only counted). */
static void put_i32(int32_t *buf, size_t *n, int32_t v)
{
    if (buf) buf[*n] = v;
    ++*n;
}

static void put_i64(int32_t *buf, size_t *n, int64_t v)
{
    put_i32(buf, n, (int32_t)(uint32_t)((uint64_t)v & 0xffffffffu));
    put_i32(buf, n, (int32_t)(uint32_t)((uint64_t)v >> 32));
}

static int64_t get_i64(const int32_t *w) { return (int64_t)((uint64_t)(uint32_t)w[0] | (uint64_t)(uint32_t)w[1] << 32); }

/* len bytes of s, padded to a word (their length goes before them, as the caller says). */
static void put_bytes(int32_t *buf, size_t *n, const void *s, size_t len)
{
    if (buf && len) memcpy(buf + *n, s, len);
    *n += TP_CEIL_DIV(len, 4);
}

/* The len bytes at w[*i] as a C string (malloc'd; NULL: no memory), *i past their words. */
static char *take_string(const int32_t *w, size_t *i, size_t len)
{
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, w + *i, len);
        s[len] = '\0';
    }
    *i += TP_CEIL_DIV(len, 4);
    return s;
}

/* tp_share_gather_ids: each replica's first rank sends rank 0 its share's ids (no rank
 * parses the whole input); rank 0 checks them for duplicates and merges the fields that no
 * replica reads. Words: any_endpoint | any_chat_room << 1, unknown_lines (2), n_unknown,
 * unknown_more, the unknown fields (ID_FIELD_WORDS each), the count, then per request its
 * line (2), stand-in flag, id length and id. */
enum { ID_FIELD_WORDS = (sizeof(((tp_unknown_field *)0)->name) + 3) / 4 + 4 };

static size_t pack_ids(const tp_request_list *l, int32_t *buf)
{
    size_t n = 0;
    put_i32(buf, &n, (l->any_endpoint ? 1 : 0) | (l->any_chat_room ? 2 : 0));
    put_i64(buf, &n, l->unknown_lines);
    put_i32(buf, &n, l->n_unknown);
    put_i32(buf, &n, l->unknown_more);
    for (int i = 0; i < l->n_unknown; i++) {
        const tp_unknown_field *u = &l->unknown[i];
        put_bytes(buf, &n, u->name, sizeof u->name);
        put_i64(buf, &n, u->lines);
        put_i64(buf, &n, u->first_line);
    }
    put_i32(buf, &n, (int32_t)l->n);
    for (size_t k = 0; k < l->n; k++) {
        const tp_request *r = &l->v[k];
        const size_t len = strlen(r->id);
        put_i64(buf, &n, r->line);
        put_i32(buf, &n, r->standin);
        put_i32(buf, &n, (int32_t)len);
        put_bytes(buf, &n, r->id, len);
    }
    return n;
}

static void merge_unknown(tp_request_list *l, const tp_unknown_field *u)
{
    for (int i = 0; i < l->n_unknown; i++)
        if (!strcmp(l->unknown[i].name, u->name)) {
            l->unknown[i].lines += u->lines;
            if (u->first_line < l->unknown[i].first_line) l->unknown[i].first_line = u->first_line;
            return;
        }
    if (l->n_unknown == TP_UNKNOWN_FIELDS_KEPT) l->unknown_more = 1;
    else l->unknown[l->n_unknown++] = *u;
}

/* Replica q's words into rank 0's table: its k-th request is the input's q + k * dp. */
static tp_status unpack_ids(tp_request_list *l, int q, int dp, const int32_t *w, size_t n)
{
    size_t i = 5;
    if (n < 5) return tp_error(TP_ERR_INTERNAL, "replica %d sent %zu words of ids", q, n);
    l->any_endpoint |= w[0] & 1;
    l->any_chat_room |= (w[0] >> 1) & 1;
    l->unknown_lines += get_i64(w + 1);
    l->unknown_more |= w[4];
    for (int f = 0; f < w[3]; f++, i += ID_FIELD_WORDS) {
        tp_unknown_field u;
        memcpy(u.name, w + i, sizeof u.name);
        u.name[sizeof u.name - 1] = '\0';
        u.lines = get_i64(w + i + ID_FIELD_WORDS - 4);
        u.first_line = get_i64(w + i + ID_FIELD_WORDS - 2);
        merge_unknown(l, &u);
    }
    const size_t count = (size_t)w[i++];
    tp_status st = TP_OK;
    for (size_t k = 0; k < count && st == TP_OK && i + 4 <= n; k++) {
        const int64_t line = get_i64(w + i);
        const int standin = w[i + 2];
        const size_t len = (size_t)w[i + 3];
        i += 4;
        char *id = take_string(w, &i, len);
        st = id ? tp_requests_put_id(l, (size_t)q + k * (size_t)dp, id, line, standin) : tp_error(TP_ERR_OOM, "out of memory");
        free(id);
    }
    if (st == TP_OK && i != n) return tp_error(TP_ERR_INTERNAL, "replica %d's ids: %zu words read of %zu", q, i, n);
    return st;
}

static int by_first_line(const void *a, const void *b)
{
    const tp_unknown_field *x = a, *y = b;
    return (x->first_line > y->first_line) - (x->first_line < y->first_line);
}

enum { ID_CHUNK = 1 << 16 }; /* words a message: rank 0 can drain what it has no room for */

tp_status tp_share_gather_ids(tp_request_list *l, tp_comm *c, const char *what)
{
    if (c->rank != 0) {
        const size_t n = pack_ids(l, NULL);
        int32_t *buf = n <= INT32_MAX ? malloc((n ? n : 1) * sizeof *buf) : NULL;
        int32_t size = buf ? (int32_t)n : -1; /* -1: rank 0 is told this one failed, and still hears the others */
        if (buf) pack_ids(l, buf);
        tp_status st = tp_comm_send(c, &size, 1, TP_DTYPE_I32, 0, NULL);
        for (size_t at = 0; st == TP_OK && buf && at < n; at += ID_CHUNK)
            st = tp_comm_send(c, buf + at, n - at < ID_CHUNK ? n - at : ID_CHUNK, TP_DTYPE_I32, 0, NULL);
        free(buf);
        return st != TP_OK ? st : size < 0 ? tp_error(TP_ERR_OOM, "out of memory sending %zu words of ids", n) : TP_OK;
    }
    static int32_t drain[ID_CHUNK];
    tp_status st = TP_OK;
    for (size_t k = 0; k < l->n && st == TP_OK; k++) {
        const tp_request *r = &l->v[k];
        st = tp_requests_put_id(l, (size_t)r->pos, r->id, r->line, r->standin);
    }
    for (int q = 1; q < c->size; q++) { /* every sender is heard, whatever failed */
        int32_t size = 0;
        TP_CHECK(tp_comm_recv(c, &size, 1, TP_DTYPE_I32, q, NULL));
        if (size < 0) {
            if (st == TP_OK) st = tp_error(TP_ERR_OOM, "replica %d could not send rank 0 its ids (out of memory)", q);
            continue;
        }
        int32_t *buf = st == TP_OK ? malloc((size ? (size_t)size : 1) * sizeof *buf) : NULL;
        if (!buf && st == TP_OK) st = tp_error(TP_ERR_OOM, "out of memory for replica %d's ids", q);
        for (size_t at = 0; at < (size_t)size; at += ID_CHUNK) /* into drain where there is no room */
            TP_CHECK(tp_comm_recv(c, buf ? buf + at : drain, (size_t)size - at < ID_CHUNK ? (size_t)size - at : ID_CHUNK,
                                  TP_DTYPE_I32, q, NULL));
        if (buf) st = unpack_ids(l, q, c->size, buf, (size_t)size);
        free(buf);
    }
    /* the fields in the order of the file, as one rank reading it all would list them */
    qsort(l->unknown, (size_t)l->n_unknown, sizeof *l->unknown, by_first_line);
    return st == TP_OK ? tp_requests_check_ids(l, what) : st;
}

/* The ids (or the errors) this rank encoded among the replica's requests [b0, b1), as
 * int32 words: k - b0, then n and n ids, or -1 - bytes and the message; NULL buf: counts. */
static size_t pack_encoded(const tp_request_list *l, const tp_comm *c, size_t b0, size_t b1, int32_t *buf)
{
    size_t n = 0;
    for (size_t k = b0; k < b1; k++) {
        const tp_request *in = &l->v[k];
        if (!tp_share_encodes(c, k) || !in->encoded) continue; /* given ids, done earlier, bad settings */
        put_i32(buf, &n, (int32_t)(k - b0));
        if (in->error_code) {
            const size_t len = strlen(in->error_message);
            put_i32(buf, &n, -1 - (int32_t)len);
            put_bytes(buf, &n, in->error_message, len);
        } else {
            put_i32(buf, &n, in->n_prompt_ids);
            put_bytes(buf, &n, in->prompt_ids, (size_t)in->n_prompt_ids * 4);
        }
    }
    return n;
}

static tp_status unpack_encoded(tp_request_list *l, size_t b0, const int32_t *buf, size_t n)
{
    for (size_t i = 0; i < n;) {
        tp_request *in = &l->v[b0 + (size_t)buf[i]];
        const int32_t m = buf[i + 1];
        i += 2;
        in->encoded = 1;
        if (m < 0) {
            in->error_code = "invalid_request";
            in->error_message = take_string(buf, &i, (size_t)(-1 - (int64_t)m));
            if (!in->error_message) return tp_error(TP_ERR_OOM, "out of memory");
        } else {
            in->prompt_ids = malloc(m ? (size_t)m * 4 : 4);
            if (!in->prompt_ids) return tp_error(TP_ERR_OOM, "out of memory");
            if (m) memcpy(in->prompt_ids, buf + i, (size_t)m * 4);
            in->n_prompt_ids = m;
            i += (size_t)m;
        }
    }
    return TP_OK;
}

/* tp_share_exchange: every rank of the replica learns what the others encoded in [b0, b1),
 * and whether any was stopped by a signal (*stop) or has failed (*failed, from *mine):
 * then all leave prepare_all together. A rank that fails to take the others' ids fails in *mine, which the
 * next exchange tells. An error returned (the communicator, or no memory for the exchange
 * once the others are in it) leaves peers in a collective: the job must be aborted. */
tp_status tp_share_exchange(tp_request_list *l, tp_comm *c, int32_t *heads, size_t b0, size_t b1, int stop_here,
                            tp_status *mine, int *stop, int *failed)
{
    const size_t words = *mine == TP_OK ? pack_encoded(l, c, b0, b1, NULL) : 0;
    if (words > INT32_MAX)
        *mine = tp_error(TP_ERR_INVALID_ARG, "the token ids of %zu prompts exceed 8 GB", b1 - b0);
    int32_t head[3] = {*mine == TP_OK ? (int32_t)words : 0, stop_here != 0, *mine != TP_OK};
    TP_CHECK(tp_comm_all_gather(c, head, heads, 3, TP_DTYPE_I32, NULL));
    size_t most = 0;
    *stop = *failed = 0;
    for (int q = 0; q < c->size; q++) {
        most = (size_t)heads[3 * q] > most ? (size_t)heads[3 * q] : most;
        *stop |= heads[3 * q + 1];
        *failed |= heads[3 * q + 2];
    }
    if (*stop || *failed || most == 0) return TP_OK;
    int32_t *own = calloc(most, sizeof *own), *all = malloc(most * (size_t)c->size * sizeof *all);
    tp_status st = own && all ? TP_OK : tp_error(TP_ERR_OOM, "out of memory for %zu prompt ids", most * (size_t)c->size);
    if (st == TP_OK) pack_encoded(l, c, b0, b1, own);
    if (st == TP_OK) st = tp_comm_all_gather(c, own, all, most, TP_DTYPE_I32, NULL);
    for (int q = 0; st == TP_OK && *mine == TP_OK && q < c->size; q++)
        if (q != c->rank) *mine = unpack_encoded(l, b0, all + (size_t)q * most, (size_t)heads[3 * q]);
    free(own);
    free(all);
    return st;
}

int tp_share_encodes(const tp_comm *replica, size_t k)
{
    return (int)(k % (size_t)replica->size) == replica->rank;
}
