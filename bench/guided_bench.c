/*
 * guided_bench.c: the host's cost of response_format json_object per decode step. ROWS rows
 * (default 128) each write a JSON record (names, numbers, nested objects and arrays, prose in
 * strings), tokenized by the tokenizer itself; at every step each row asks the guide for its
 * next set (tp_guide_json_ids, as the engine does), so the cost is what a batch of JSON rows
 * adds to a step on the sampler rank. Prints the guide's making, ms per step for all rows,
 * and the walks over the vocabulary (the cache's misses). With --tools N the rows write
 * tool_choice "required"'s list of calls under vLLM's schema for N tools (row r calls tool
 * r mod N), where a text is read by every tool's branch until its name picks one. With
 * --records K each row writes {"records": [K records]} (long outputs: the state each step
 * starts from is the text so far: each row keeps its reading between steps, as the engine
 * does, unless --no-cursors). With --random T each row writes T tokens under the schema
 * {"text": string}, each drawn at random from the set the guide allows (what a random-weight
 * checkpoint writes under bench/gpu_decode.sh's BENCH_REQUEST guided_json: text of any bytes).
 * Usage: guided_bench [--no-cursors] [--rows N] [--tools N] [--records K] [--random T] TOKENIZER_DIR...
 * (default: ../shared/tokenizers/gpt2)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "guided.h"
#include "json_schema.h"
#include "tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Record r: a JSON object as a model asked for one might write it */
static int make_record(int r, char *buf, size_t cap)
{
    static const char *const names[] = {"Ana Lima", "Bob", "Chen Wei", "Dana O'Neil", "Émile Zola", "Farah"};
    static const char *const notes[] = {
        "Prefers email; call after 5pm.", "Renewal due in March, see ticket #4411.",
        "Asked about the \\\"premium\\\" plan twice.", "No notes.", "Moved to Lisbon in 2021 — update the address."};
    return snprintf(buf, cap,
                    "{\n  \"id\": %d,\n  \"name\": \"%s\",\n  \"age\": %d,\n  \"score\": %d.%02d,\n"
                    "  \"active\": %s,\n  \"tags\": [\"t%d\", \"group-%d\"],\n"
                    "  \"address\": {\"city\": \"City %d\", \"zip\": \"%05d\"},\n  \"note\": \"%s\"\n}",
                    1000 + r, names[r % 6], 20 + r % 50, r % 100, (r * 37) % 100, r % 3 ? "true" : "false", r % 7,
                    r % 4, r % 13, (r * 7919) % 100000, notes[r % 5]);
}

/* Row r's list of calls under tool_choice "required" with n tools */
static int make_calls(int r, int n, char *buf, size_t cap)
{
    return snprintf(buf, cap, "[{\"name\": \"lookup_%s_%d\", \"parameters\": {\"city\": \"City %d\", \"days\": %d}}]",
                    r % n % 2 ? "weather" : "time", r % n, r % 13, r % 9);
}

/* vLLM's schema for "required" over n tools named as make_calls names them */
static tp_schema *tools_schema(int n)
{
    json_t *any = json_array();
    for (int k = 0; k < n; k++) {
        char name[64];
        snprintf(name, sizeof name, "lookup_%s_%d", k % 2 ? "weather" : "time", k);
        json_array_append_new(any, json_pack("{s:{s:{s:s, s:[s]}, s:{s:s, s:{s:{s:s}, s:{s:s}}, s:[s]}}, s:[s, s]}",
                                             "properties", "name", "type", "string", "enum", name, "parameters", "type",
                                             "object", "properties", "city", "type", "string", "days", "type",
                                             "integer", "required", "city", "required", "name", "parameters"));
    }
    json_t *doc = json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "array", "minItems", 1, "items", "type", "object", "anyOf",
                            any);
    tp_schema *s = NULL;
    if (tp_schema_compile(doc, &s) != TP_OK) fprintf(stderr, "guided_bench: %s\n", tp_error_message());
    json_decref(doc);
    return s;
}

/* A token the set allows (negated: the ids the set names may not come), drawn with x. */
static int32_t draw_allowed(uint64_t *x, const int32_t *set, int32_t n, int negated, int32_t vocab)
{
    for (;;) {
        *x = *x * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t u = *x >> 33;
        if (!negated) return n > 0 ? set[u % (uint64_t)n] : -1;
        if (n >= vocab) return -1; /* (distinct ids: every one banned) */
        const int32_t t = (int32_t)(u % (uint64_t)vocab);
        int banned = 0;
        for (int32_t i = 0; i < n && !banned; i++) banned = set[i] == t;
        if (!banned) return t;
    }
}

static int bench(const char *dir, int rows, int tools, int records, int use_cursors, int random_len)
{
    tp_tokenizer *tok = NULL;
    if (tp_tokenizer_load(dir, &tok) != TP_OK) {
        fprintf(stderr, "guided_bench: %s: %s\n", dir, tp_error_message());
        return 1;
    }
    const int32_t vocab = (int32_t)tp_tokenizer_vocab_size(tok);
    int32_t eos = tp_tokenizer_eos_id(tok);
    for (int32_t t = 0; eos < 0 && t < vocab; t++)
        if (tp_tokenizer_is_special(tok, t)) eos = t;
    double t0 = now();
    tp_guide *g = NULL;
    if (tp_guide_create(tok, vocab, &eos, eos >= 0, &g) != TP_OK) {
        fprintf(stderr, "guided_bench: %s: %s\n", dir, tp_error_message());
        tp_tokenizer_destroy(tok);
        return 1;
    }
    const double made_ms = 1e3 * (now() - t0);
    tp_ids *ids = calloc((size_t)rows, sizeof *ids);
    size_t longest = 0, total = 0;
    const size_t cap = 1024 * (size_t)records + 16;
    char *buf = malloc(cap);
    tp_schema *schema = tools ? tools_schema(tools) : NULL;
    if (random_len > 0) {
        json_t *doc = json_pack("{s:s, s:{s:{s:s}}, s:[s]}", "type", "object", "properties", "text", "type", "string",
                                "required", "text");
        if (tp_schema_compile(doc, &schema) != TP_OK) fprintf(stderr, "guided_bench: %s\n", tp_error_message());
        json_decref(doc);
    }
    if (!buf || ((tools || random_len > 0) && !schema)) return 1;
    if (random_len > 0) longest = (size_t)random_len; /* the rows written as the steps go */
    for (int r = 0; r < rows && random_len == 0; r++) {
        int n;
        if (tools) {
            n = make_calls(r, tools, buf, cap);
        } else if (records > 1) { /* {"records": [record, record, ...]} */
            n = snprintf(buf, cap, "{\"records\": [");
            for (int k = 0; k < records; k++) {
                n += make_record(r + k, buf + n, cap - (size_t)n);
                n += snprintf(buf + n, cap - (size_t)n, k + 1 < records ? ", " : "]}");
            }
        } else {
            n = make_record(r, buf, cap);
        }
        if (tp_tokenizer_encode(tok, buf, (size_t)n, 0, &ids[r]) != TP_OK) return 1;
        if (ids[r].n > longest) longest = ids[r].n;
        total += ids[r].n;
    }
    /* each row's reading kept between its steps, as the engine keeps it (--no-cursors: read
     * from the start at every step) */
    tp_guide_cursor **cursors = use_cursors ? calloc((size_t)rows, sizeof *cursors) : NULL;
    /* step k: every row still writing asks for the set after its first k tokens */
    int64_t calls = 0, walks = 0, rejected = 0;
    double worst = 0.0;
    t0 = now();
    uint64_t draws = 0x9e3779b97f4a7c15ull;
    for (size_t k = 0; k <= longest; k++) {
        const double s0 = now();
        for (int r = 0; r < rows; r++) {
            if (k > ids[r].n) continue;
            const int32_t *set;
            int32_t n;
            int negated;
            const double c0 = now();
            if (tp_guide_json_ids(g, schema, 0, cursors ? &cursors[r] : NULL, ids[r].v, (int32_t)k, &set, &n,
                                  &negated) != TP_OK)
                return 1;
            walks += now() - c0 > 2e-4; /* a cache hit is microseconds; a walk over the vocabulary, a millisecond */
            calls++;
            if (random_len > 0) { /* the row's next token: any the set allows, or its end */
                const int32_t t = draw_allowed(&draws, set, n, negated, vocab);
                if (t >= 0 && t != eos && ids[r].n < (size_t)random_len && tp_ids_push(&ids[r], t) != TP_OK) return 1;
                continue;
            }
            if (k < ids[r].n) { /* the record's own next token must be in the set */
                int in = negated;
                for (int32_t i = 0; i < n; i++)
                    if (set[i] == ids[r].v[k]) in = !negated;
                rejected += !in;
            }
        }
        const double step = now() - s0;
        if (step > worst) worst = step;
    }
    const double all = now() - t0;
    for (int r = 0; r < rows && random_len > 0; r++) total += ids[r].n; /* what they wrote */
    printf("| %s | %d | %d%s | %.0f | %zu | %.3f | %.2f | %lld / %lld | %lld |\n", dir, (int)vocab, rows,
           tools ? " (calls)" : "", made_ms,
           total / (size_t)rows, 1e3 * all / (double)(longest + 1), 1e3 * worst, (long long)walks,
           (long long)calls, (long long)rejected);
    for (int r = 0; r < rows; r++) {
        tp_ids_free(&ids[r]);
        if (cursors) tp_guide_cursor_free(cursors[r]);
    }
    free(cursors);
    free(ids);
    free(buf);
    tp_guide_destroy(g);
    tp_tokenizer_destroy(tok);
    tp_schema_free(schema);
    return rejected ? 1 : 0;
}

int main(int argc, char **argv)
{
    int rows = 128, tools = 0, records = 1, random_len = 0, rc = 0, first = 1, use_cursors = 1;
    if (argc > 1 && !strcmp(argv[1], "--no-cursors")) use_cursors = 0, first++;
    while (argc > first + 1 && (!strcmp(argv[first], "--rows") || !strcmp(argv[first], "--tools") ||
                                !strcmp(argv[first], "--records") || !strcmp(argv[first], "--random"))) {
        *(!strcmp(argv[first], "--rows")      ? &rows
          : !strcmp(argv[first], "--tools")   ? &tools
          : !strcmp(argv[first], "--records") ? &records
                                              : &random_len) = atoi(argv[first + 1]);
        first += 2;
    }
    if (rows < 1) rows = 1;
    if (records < 1 || records > 1000) records = 1;
    printf("| tokenizer | vocabulary | JSON rows | guide made, ms | tokens a row | ms a step (all rows) | "
           "worst step, ms | walks / sets asked | own tokens refused |\n| --- | ---: | ---: | ---: | ---: | ---: "
           "| ---: | ---: | ---: |\n");
    if (tools < 0) tools = 0;
    if (random_len < 0) random_len = 0;
    if (argc <= first) return bench("../shared/tokenizers/gpt2", rows, tools, records, use_cursors, random_len);
    for (int i = first; i < argc; i++) rc |= bench(argv[i], rows, tools, records, use_cursors, random_len);
    return rc;
}
