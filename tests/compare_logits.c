/*
 * compare_logits.c: checks a --dump-logits directory against a Hugging Face reference
 * (reference/logits.safetensors of ../shared/models): prompt ids, prefill logits and
 * greedy-step logits within a bound, greedy ids exactly. Greedy-step logits are compared
 * up to and with the first step whose id differs (after it the contexts differ).
 *   compare_logits --make-input REF OUT.jsonl   write the reference prompts as JSONL
 *   compare_logits REF DUMPDIR [BOUND [MARGIN]] compare (default bound 1e-3)
 *   compare_logits --dump-ref DUMPDIR OUT         a reference made of a --dump-logits
 *                                                 directory (requests p0, p1, ...): another
 *                                                 backend's run as the yardstick
 * With MARGIN (reduced-precision runs), greedy ids must be equal only up to the first step
 * where the reference's top-1 minus top-2 logit is under MARGIN (there the two may rightly
 * part); the logits are held to BOUND either way (inf: only reported; NaN never passes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"
#include "st_write.h"
#include "util.h"

/* A whole tensor as f32 or i32 (n elements); NULL if absent. */
static void *read_all(const tp_st_file *f, const char *name, int64_t *n, int64_t *rows)
{
    const tp_st_tensor *t = tp_st_find(f, name);
    if (!t) return NULL;
    tp_dtype dt = t->dtype == TP_ST_I32 ? TP_DTYPE_I32 : TP_DTYPE_F32;
    *n = tp_st_numel(t);
    *rows = t->rank ? t->shape[0] : 1;
    int64_t cols = *rows ? *n / *rows : 0;
    void *p = malloc((size_t)(*n ? *n : 1) * 4);
    tp_slice s = {0, *rows, 0, cols};
    if (!p || tp_st_read_slice(f, t, s, dt, p) != TP_OK) {
        fprintf(stderr, "reading %s: %s\n", name, tp_error_message());
        exit(2);
    }
    return p;
}

static int make_input(const char *ref, const char *out)
{
    tp_st_file f = {0};
    if (tp_st_open(ref, &f) != TP_OK) {
        fprintf(stderr, "%s\n", tp_error_message());
        return 2;
    }
    FILE *o = fopen(out, "w");
    if (!o) return 2;
    for (int k = 0;; k++) {
        char name[64];
        int64_t n, rows, gn = 0, grows;
        snprintf(name, sizeof name, "input_ids_%d", k);
        int32_t *ids = read_all(&f, name, &n, &rows);
        if (!ids) break;
        snprintf(name, sizeof name, "greedy_%d", k);
        int32_t *g = read_all(&f, name, &gn, &grows);
        fprintf(o, "{\"id\": \"p%d\", \"max_tokens\": %lld, \"ignore_eos\": true, \"prompt_token_ids\": [", k,
                (long long)(gn ? gn : 1));
        for (int64_t i = 0; i < n; i++) fprintf(o, "%s%d", i ? ", " : "", ids[i]);
        fprintf(o, "]}\n");
        free(ids);
        free(g);
    }
    fclose(o);
    tp_st_free(&f);
    return 0;
}

/* The dumps DIR/p0.safetensors, p1, ... (until one is absent) as one reference file:
 * input_ids_k, logits_k (the prompt's), greedy_k and greedy_logits_k of each. A dump that is
 * there but does not read is an error, not the end of the list. */
static int dump_ref(const char *dir, const char *out)
{
    enum { PER = 4 };
    static const char *const src[PER] = {"prompt_ids", "prompt_logits", "output_ids", "logits"};
    static const char *const dst[PER] = {"input_ids_%d", "logits_%d", "greedy_%d", "greedy_logits_%d"};
    tp_st_out_tensor *t = NULL; /* names and data malloc'd, one of each a tensor */
    int n = 0, k, rc = 0;
    for (k = 0; rc == 0; k++) {
        char file[32];
        snprintf(file, sizeof file, "p%d.safetensors", k);
        char *path = tp_path_join(dir, file);
        if (!path || access(path, F_OK) != 0) {
            free(path);
            break;
        }
        tp_st_file d = {0};
        if (tp_st_open(path, &d) != TP_OK) {
            fprintf(stderr, "%s\n", tp_error_message());
            free(path);
            rc = 2;
            break;
        }
        free(path);
        tp_st_out_tensor *nt = realloc(t, (size_t)(n + PER) * sizeof *t);
        if (nt) t = nt;
        for (int j = 0; j < PER && rc == 0 && nt; j++, n++) {
            const tp_st_tensor *x = tp_st_find(&d, src[j]);
            int64_t numel, rows;
            if (!x || x->rank > 4) {
                fprintf(stderr, "%s/%s: %s %s\n", dir, file, x ? "more than 4 dimensions in" : "no", src[j]);
                rc = 2;
                break;
            }
            char *name = malloc(32);
            if (!name) {
                fprintf(stderr, "out of memory\n");
                rc = 2;
                break;
            }
            snprintf(name, 32, dst[j], k);
            t[n] = (tp_st_out_tensor){name, x->dtype == TP_ST_I32 ? "I32" : "F32", x->rank, {0},
                                      read_all(&d, src[j], &numel, &rows), 0};
            t[n].bytes = (size_t)numel * 4;
            for (int a = 0; a < x->rank; a++) t[n].shape[a] = x->shape[a];
        }
        if (!nt) {
            fprintf(stderr, "out of memory\n");
            rc = 2;
        }
        tp_st_free(&d);
    }
    if (rc == 0 && k == 0) {
        fprintf(stderr, "%s: no p0.safetensors\n", dir);
        rc = 2;
    }
    if (rc == 0 && tp_st_write(out, t, n, NULL, 0) != TP_OK) {
        fprintf(stderr, "%s\n", tp_error_message());
        rc = 2;
    }
    for (int i = 0; i < n; i++) free((void *)t[i].name), free((void *)t[i].data);
    free(t);
    return rc;
}

static double max_abs_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return d; /* NaN: a failure against any bound */
        if (d > m) m = d;
    }
    return m;
}

/* The first greedy step whose reference margin (top-1 minus top-2 logit) is under m. */
static int64_t first_close_step(const float *logits, int64_t steps, int64_t vocab, double m)
{
    for (int64_t s = 0; s < steps; s++) {
        const float *row = logits + s * vocab;
        float a = -INFINITY, b = -INFINITY;
        for (int64_t i = 0; i < vocab; i++) {
            if (row[i] > a) {
                b = a;
                a = row[i];
            } else if (row[i] > b) {
                b = row[i];
            }
        }
        if ((double)a - (double)b < m) return s;
    }
    return steps;
}

static int compare(const char *ref, const char *dir, double bound, double margin)
{
    tp_st_file r = {0};
    if (tp_st_open(ref, &r) != TP_OK) {
        fprintf(stderr, "%s\n", tp_error_message());
        return 2;
    }
    int failures = 0, k;
    for (k = 0;; k++) {
        char name[64], file[64];
        int64_t n = 0, rows = 0, dn = 0, drows = 0; /* read_all leaves them where a tensor is absent */
        snprintf(name, sizeof name, "input_ids_%d", k);
        int32_t *ids = read_all(&r, name, &n, &rows);
        if (!ids) break;
        snprintf(file, sizeof file, "p%d.safetensors", k);
        char *path = tp_path_join(dir, file);
        tp_st_file d = {0};
        if (tp_st_open(path, &d) != TP_OK) {
            fprintf(stderr, "prompt %d: %s\n", k, tp_error_message());
            tp_error_clear();
            return 1;
        }
        int32_t *dids = read_all(&d, "prompt_ids", &dn, &drows);
        int ok = dids && dn == n && !memcmp(ids, dids, (size_t)n * 4);
        if (!ok) printf("prompt %d: prompt ids differ\n", k);
        int64_t ln = 0, lrows = 0, dln = 0, dlrows = 0;
        snprintf(name, sizeof name, "logits_%d", k);
        float *lg = read_all(&r, name, &ln, &lrows);
        float *dlg = read_all(&d, "prompt_logits", &dln, &dlrows);
        double pre = dlg && dln == ln ? max_abs_diff(lg, dlg, ln) : INFINITY;
        double step = 0;
        int64_t same = 0, gn = 0, grows, steps = 0;
        snprintf(name, sizeof name, "greedy_%d", k);
        int32_t *g = read_all(&r, name, &gn, &grows);
        int64_t need = gn; /* greedy ids that must match */
        if (g) {
            int64_t on = 0, orows = 0, sn = 0, srows = 0, dsn = 0, dsrows = 0;
            int32_t *out = read_all(&d, "output_ids", &on, &orows);
            while (same < gn && same < on && out[same] == g[same]) same++;
            snprintf(name, sizeof name, "greedy_logits_%d", k);
            float *sl = read_all(&r, name, &sn, &srows);
            float *dsl = read_all(&d, "logits", &dsn, &dsrows);
            /* the steps up to the first id that differs (its logits still had the reference's
             * context; after it, both choose from different ones) */
            steps = srows && same < srows ? same + 1 : srows;
            step = dsl && dsn == sn ? max_abs_diff(sl, dsl, srows ? steps * (sn / srows) : sn) : INFINITY;
            if (margin > 0 && srows > 0) need = first_close_step(sl, srows, sn / srows, margin);
            if (on != gn) same = -1;
            free(out);
            free(sl);
            free(dsl);
        }
        int logits_ok = pre < bound && step < bound;
        int pass = ok && logits_ok && (!g || same >= need);
        printf("prompt %d: %lld tokens, prefill max|d| %.3g, greedy steps max|d| %.3g (%lld steps of the same context),"
               " greedy ids %lld/%lld equal (%lld needed): %s\n",
               k, (long long)n, pre, step, (long long)steps, (long long)same, (long long)gn, (long long)need,
               pass ? "ok" : "FAIL");
        failures += !pass;
        free(ids);
        free(dids);
        free(lg);
        free(dlg);
        free(g);
        free(path);
        tp_st_free(&d);
    }
    tp_st_free(&r);
    if (k == 0) {
        printf("no prompts in %s\n", ref);
        return 1;
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--make-input")) return make_input(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "--dump-ref")) return dump_ref(argv[2], argv[3]);
    if (argc >= 3 && argc <= 5)
        return compare(argv[1], argv[2], argc >= 4 ? atof(argv[3]) : 1e-3, argc == 5 ? atof(argv[4]) : 0);
    fprintf(stderr, "usage: compare_logits --make-input REF OUT.jsonl | --dump-ref DUMPDIR OUT |"
                    " compare_logits REF DUMPDIR [BOUND [MARGIN]]\n");
    return 2;
}
