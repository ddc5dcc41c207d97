/*
 * check_weights.c: model directories of anchors/reliability.md §3.2 "I" built in mkdtemp
 * directories (escaping shard names, symlinks, missing shards, index/shard disagreement,
 * bad JSON, precedence), then the shared sharded bf16 model against its f32 original.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"
#include "st_builder.h"
#include "status.h"
#include "weights.h"

#define INDEX "model.safetensors.index.json"

static float tensor_value(const char *name, int i) { return (float)name[0] + 0.5f * (float)i; }

/* Write a shard of F32 [2] tensors: spec is "t1,t2". */
static void write_shard(const char *dir, const char *file, const char *spec)
{
    char *copy = strdup(spec), *save = NULL;
    stb_tensor t[16];
    float vals[16][2];
    size_t n = 0;
    for (char *name = strtok_r(copy, ",", &save); name && n < 16;
         name = strtok_r(NULL, ",", &save)) {
        vals[n][0] = tensor_value(name, 0);
        vals[n][1] = tensor_value(name, 1);
        t[n] = (stb_tensor){name, "F32", 1, {2}, vals[n], sizeof vals[n]};
        n++;
    }
    size_t len;
    unsigned char *img = stb_build(t, n, "{\"format\":\"pt\"}", 0, &len);
    ck_assert_int_eq(stb_write(dir, file, img, len), 0);
    free(img);
    free(copy);
}

/* "s1.safetensors=a,b;s2.safetensors=c" */
static void write_shards(const char *dir, const char *spec)
{
    char *copy = strdup(spec), *save = NULL;
    for (char *s = strtok_r(copy, ";", &save); s; s = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(s, '=');
        ck_assert_ptr_nonnull(eq);
        *eq = '\0';
        write_shard(dir, s, eq + 1);
    }
    free(copy);
}

/* The index text is written with ' for " so the table stays readable. */
static void write_index(const char *dir, const char *text)
{
    char *json = strdup(text);
    for (char *p = json; *p; p++)
        if (*p == '\'') *p = '"';
    ck_assert_int_eq(stb_write_text(dir, INDEX, json), 0);
    free(json);
}

/* ---- setups for the cases a table row cannot say -------------------------------- */

static char *outside_dir(const char *dir) { return stb_strdupf("%s-outside", dir); }

static void setup_symlink_out(const char *dir)
{
    char *out = outside_dir(dir);
    ck_assert_int_eq(mkdir(out, 0755), 0);
    write_shard(out, "x.safetensors", "a");
    char *target = stb_strdupf("%s/x.safetensors", out);
    char *link = stb_strdupf("%s/evil.safetensors", dir);
    ck_assert_int_eq(symlink(target, link), 0);
    free(target);
    free(link);
    free(out);
}

static void setup_symlink_in(const char *dir)
{
    char *link = stb_strdupf("%s/link.safetensors", dir);
    ck_assert_int_eq(symlink("s1.safetensors", link), 0);
    free(link);
}

static void setup_subdir(const char *dir)
{
    char *sub = stb_strdupf("%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    write_shard(sub, "x.safetensors", "a");
    free(sub);
}

static void setup_dir_shard(const char *dir)
{
    char *d = stb_strdupf("%s/d.safetensors", dir);
    ck_assert_int_eq(mkdir(d, 0755), 0);
    free(d);
}

static void setup_fifo_shard(const char *dir)
{
    char *p = stb_strdupf("%s/f.safetensors", dir);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    free(p);
}

static void setup_garbage_shard(const char *dir)
{
    ck_assert_int_eq(stb_write_text(dir, "g.safetensors", "not a safetensors file"), 0);
}

static void setup_single(const char *dir) { write_shard(dir, "model.safetensors", "single"); }

/* ---- the table -------------------------------------------------------------------- */

typedef struct dir_case {
    const char *name;
    const char *shards;          /* write_shards() spec, or NULL */
    const char *index;           /* index text with ' for ", or NULL for no index */
    void (*setup)(const char *dir);
    tp_status st;
    const char *msg;             /* error substring; for TP_OK, a warning substring or NULL */
    size_t n_shards, n_refs;     /* for TP_OK */
} dir_case;

#define AB "s1.safetensors=a,b;s2.safetensors=c"
#define MAP_AB "'a':'s1.safetensors','b':'s1.safetensors','c':'s2.safetensors'"
#define BAD(n, map, m) {n, AB, "{'weight_map':{" map "}}", NULL, TP_ERR_FORMAT, m, 0, 0}

static const dir_case dir_cases[] = {
    {"valid index", AB, "{'metadata':{'total_size':24},'weight_map':{" MAP_AB "}}", NULL, TP_OK,
     NULL, 2, 3},
    {"valid, no metadata", AB, "{'weight_map':{" MAP_AB "}}", NULL, TP_OK, NULL, 2, 3},
    {"single file", "model.safetensors=x,y", NULL, NULL, TP_OK, NULL, 1, 2},
    {"symlink inside the directory", AB,
     "{'weight_map':{'a':'link.safetensors','b':'link.safetensors'}}", setup_symlink_in, TP_OK,
     NULL, 1, 2},
    /* I1 */
    BAD("I1 ../x", "'a':'../s1.safetensors'", "maps to shard \"../s1.safetensors\", which is "
        "not a bare file name"),
    BAD("I1 ../../etc/passwd", "'a':'../../etc/passwd'", "not a bare file name"),
    BAD("I1 /etc/shadow", "'a':'/etc/shadow'", "\"/etc/shadow\", which is not a bare file name"),
    {"I1 sub/x.safetensors", AB, "{'weight_map':{'a':'sub/x.safetensors'}}", setup_subdir,
     TP_ERR_FORMAT, "not a bare file name", 0, 0},
    BAD("I1 .", "'a':'.'", "not a bare file name"),
    BAD("I1 ..", "'a':'..'", "not a bare file name"),
    BAD("I1 empty name", "'a':''", "not a bare file name"),
    BAD("I1 NUL in name", "'a':'s1.safetensors\\u0000x'", "invalid JSON"),
    {"I1 symlink to outside", NULL, "{'weight_map':{'a':'evil.safetensors'}}", setup_symlink_out,
     TP_ERR_FORMAT, "shard \"evil.safetensors\" resolves to", 0, 0},
    /* I2-I4 */
    {"I2 missing shard", AB, "{'weight_map':{" MAP_AB ",'d':'s3.safetensors'}}", NULL, TP_ERR_IO,
     "shard \"s3.safetensors\" cannot be opened: No such file or directory", 0, 0},
    BAD("I3 tensor only in a shard", "'a':'s1.safetensors','c':'s2.safetensors'",
        "tensor \"b\" is in shard s1.safetensors but not in " INDEX),
    BAD("I3 tensor only in the index", MAP_AB ",'zz':'s2.safetensors'",
        "puts tensor \"zz\" in s2.safetensors, but that shard has no such tensor"),
    BAD("I3 tensor in the wrong shard", "'a':'s2.safetensors','b':'s1.safetensors',"
        "'c':'s2.safetensors'", "puts tensor \"a\" in s2.safetensors, but it is in s1.safetensors"),
    {"I4 tensor in two shards", "s1.safetensors=a,b;s2.safetensors=b,c",
     "{'weight_map':{" MAP_AB "}}", NULL, TP_ERR_FORMAT,
     "tensor \"b\" is in two shards, s1.safetensors and s2.safetensors", 0, 0},
    /* I5: warnings only */
    {"I5 total_size 0", AB, "{'metadata':{'total_size':0},'weight_map':{" MAP_AB "}}", NULL,
     TP_OK, "total_size is not 24", 2, 3},
    {"I5 total_size wrong", AB, "{'metadata':{'total_size':4943257600},'weight_map':{" MAP_AB
     "}}", NULL, TP_OK, "total_size is not 24", 2, 3},
    {"I5 total_size a string", AB, "{'metadata':{'total_size':'24'},'weight_map':{" MAP_AB "}}",
     NULL, TP_OK, "total_size is not 24", 2, 3},
    /* I6 */
    {"I6 weight_map an array", AB, "{'weight_map':['s1.safetensors']}", NULL, TP_ERR_FORMAT,
     "\"weight_map\" is missing or not an object", 0, 0},
    {"I6 weight_map a string", AB, "{'weight_map':'s1.safetensors'}", NULL, TP_ERR_FORMAT,
     "\"weight_map\" is missing or not an object", 0, 0},
    {"I6 no weight_map", AB, "{'metadata':{}}", NULL, TP_ERR_FORMAT,
     "\"weight_map\" is missing", 0, 0},
    {"index is an array", AB, "[{'weight_map':{" MAP_AB "}}]", NULL, TP_ERR_FORMAT,
     "\"weight_map\" is missing", 0, 0},
    BAD("I6 number value", MAP_AB ",'d':1", "weight_map value of \"d\" is not a string"),
    BAD("I6 null value", "'a':null", "weight_map value of \"a\" is not a string"),
    BAD("I6 object value", "'a':{'file':'s1.safetensors'}", "value of \"a\" is not a string"),
    {"metadata not an object", AB, "{'metadata':[],'weight_map':{" MAP_AB "}}", NULL,
     TP_ERR_FORMAT, "\"metadata\" is not an object", 0, 0},
    /* I7: the index wins, with a warning */
    {"I7 both files", AB, "{'weight_map':{" MAP_AB "}}", setup_single, TP_OK,
     "has both model.safetensors and " INDEX "; using the index", 2, 3},
    /* I8, I9 */
    {"I8 empty weight_map", AB, "{'weight_map':{}}", NULL, TP_ERR_FORMAT,
     "\"weight_map\" is empty", 0, 0},
    {"I9 invalid JSON", AB, "{'weight_map':{" MAP_AB "}", NULL, TP_ERR_FORMAT,
     INDEX ": invalid JSON", 0, 0},
    {"I9 empty file", AB, "", NULL, TP_ERR_FORMAT, "invalid JSON", 0, 0},
    BAD("I9 duplicate tensor", MAP_AB ",'a':'s1.safetensors'", "duplicate object key"),
    {"I9 duplicate weight_map", AB, "{'weight_map':{" MAP_AB "},'weight_map':{" MAP_AB "}}", NULL,
     TP_ERR_FORMAT, "duplicate object key", 0, 0},
    /* the shards themselves */
    {"shard not safetensors", NULL, "{'weight_map':{'a':'g.safetensors'}}", setup_garbage_shard,
     TP_ERR_FORMAT, "/g.safetensors: header length", 0, 0},
    {"shard is a directory", NULL, "{'weight_map':{'a':'d.safetensors'}}", setup_dir_shard,
     TP_ERR_IO, "/d.safetensors: not a regular file", 0, 0},
    {"shard is a FIFO (refused, not waited on)", NULL, "{'weight_map':{'a':'f.safetensors'}}", setup_fifo_shard,
     TP_ERR_IO, "/f.safetensors: not a regular file", 0, 0},
    {"no weights at all", "other.safetensors=a", NULL, NULL, TP_ERR_IO,
     "no weights: neither model.safetensors nor " INDEX " exists", 0, 0},
};

/* Run fn with stderr sent to a temp file; returns what it wrote (malloc'ed). */
static char *capture_stderr(tp_status (*fn)(const char *, tp_weights *), const char *dir,
                            tp_weights *w, tp_status *st)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    *st = fn(dir, w);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t n = lseek(fileno(tmp), 0, SEEK_END); /* written through fd 2, not the FILE */
    char *text = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    if (n > 0 && pread(fileno(tmp), text, (size_t)n, 0) != n) text[0] = '\0';
    fclose(tmp);
    return text;
}

static void check_ok(const dir_case *c, const tp_weights *w, const char *dir)
{
    ck_assert_uint_eq(w->n_shards, c->n_shards);
    ck_assert_uint_eq(w->n_refs, c->n_refs);
    ck_assert_int_eq(w->from_index, c->index != NULL);
    ck_assert_int_eq(w->multimodal, 0);
    for (size_t i = 0; i < w->n_refs; i++) {
        const char *name = w->refs[i].tensor->name;
        ck_assert_ptr_eq(w->refs[i].name, name); /* found by the stored name */
        ck_assert_int_eq(w->refs[i].other_part, 0);
        ck_assert_ptr_eq(tp_weights_find(w, name), &w->refs[i]);
        if (i) ck_assert_int_lt(strcmp(w->refs[i - 1].tensor->name, name), 0);
        float v[2];
        ck_assert_int_eq(tp_weights_read_slice(w, name, (tp_slice){0, 2, 0, 1}, TP_DTYPE_F32, v),
                         TP_OK);
        ck_assert_float_eq(v[0], tensor_value(name, 0));
        ck_assert_float_eq(v[1], tensor_value(name, 1));
    }
    ck_assert_ptr_null(tp_weights_find(w, "single")); /* I7: model.safetensors unused */
    float v[2];
    tp_error_clear();
    ck_assert_int_eq(tp_weights_read_slice(w, "nope", (tp_slice){0, 1, 0, 1}, TP_DTYPE_F32, v),
                     TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "no tensor \"nope\""));
    ck_assert_ptr_nonnull(strstr(tp_error_message(), dir));
}

START_TEST(test_dir_case)
{
    const dir_case *c = &dir_cases[_i];
    char *dir = stb_tmpdir();
    ck_assert_ptr_nonnull(dir);
    if (c->shards) write_shards(dir, c->shards);
    if (c->index) write_index(dir, c->index);
    if (c->setup) c->setup(dir);
    tp_weights w;
    tp_status st;
    tp_error_clear();
    char *err = capture_stderr(tp_weights_open, dir, &w, &st);
    const char *m = tp_error_message();
    ck_assert_msg(st == c->st, "%s: status %s, want %s (%s)", c->name, tp_status_str(st),
                  tp_status_str(c->st), m);
    if (st == TP_OK) {
        if (c->msg) ck_assert_msg(strstr(err, c->msg), "%s: no warning \"%s\" in: %s", c->name,
                                  c->msg, err);
        else ck_assert_msg(!*err, "%s: unexpected output: %s", c->name, err);
        check_ok(c, &w, dir);
        tp_weights_free(&w);
    } else {
        ck_assert_msg(strstr(m, dir), "%s: message does not name %s: %s", c->name, dir, m);
        ck_assert_msg(strstr(m, c->msg), "%s: message lacks \"%s\": %s", c->name, c->msg, m);
        ck_assert_ptr_null(w.shards); /* freed on failure */
    }
    free(err);
    char *out = outside_dir(dir);
    stb_rmtree(out);
    free(out);
    stb_rmtree(dir);
    free(dir);
}
END_TEST

/* Open dir's weights, expecting st (and, for an error, msg in its message). */
static void open_expect(const char *dir, tp_weights *w, tp_status st, const char *msg)
{
    tp_error_clear();
    tp_status got = tp_weights_open(dir, w);
    ck_assert_msg(got == st, "status %s, want %s (%s)", tp_status_str(got), tp_status_str(st), tp_error_message());
    if (msg) ck_assert_msg(strstr(tp_error_message(), msg), "message lacks \"%s\": %s", msg, tp_error_message());
}

/* A multimodal checkpoint's text model (Gemma3ForConditionalGeneration's) is found under the
 * text-only names, in the Hub's layout (language_model.model.X, language_model.lm_head) and in
 * transformers >= 4.52's (model.language_model.X); the vision tower's and projector's tensors
 * are another part's; a checkpoint holding the text model in both layouts is refused. */
START_TEST(test_multimodal_names)
{
    static const struct {
        const char *stored, *found; /* found NULL: another part's, found by its stored name */
    } hub[] = {{"language_model.model.embed_tokens.weight", "model.embed_tokens.weight"},
               {"language_model.model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"},
               {"language_model.lm_head.weight", "lm_head.weight"},
               {"vision_tower.vision_model.post_layernorm.weight", NULL},
               {"multi_modal_projector.mm_input_projection_weight", NULL}},
      newer[] = {{"model.language_model.norm.weight", "model.norm.weight"},
                 {"lm_head.weight", "lm_head.weight"},
                 {"model.vision_tower.vision_model.post_layernorm.weight", NULL}};
    char *dir = stb_tmpdir();
    write_shards(dir, "s1.safetensors=language_model.model.embed_tokens.weight,"
                      "language_model.model.layers.0.mlp.down_proj.weight,vision_tower.vision_model.post_layernorm.weight;"
                      "s2.safetensors=multi_modal_projector.mm_input_projection_weight,language_model.lm_head.weight");
    write_index(dir, "{'weight_map':{'language_model.model.embed_tokens.weight':'s1.safetensors',"
                     "'language_model.model.layers.0.mlp.down_proj.weight':'s1.safetensors',"
                     "'vision_tower.vision_model.post_layernorm.weight':'s1.safetensors',"
                     "'multi_modal_projector.mm_input_projection_weight':'s2.safetensors',"
                     "'language_model.lm_head.weight':'s2.safetensors'}}");
    char *single = stb_tmpdir();
    write_shard(single, "model.safetensors",
                "model.language_model.norm.weight,lm_head.weight,model.vision_tower.vision_model.post_layernorm.weight");
    for (int layout = 0; layout < 2; layout++) {
        tp_weights w;
        open_expect(layout ? single : dir, &w, TP_OK, NULL);
        ck_assert_int_eq(w.multimodal, 1);
        const size_t n = layout ? sizeof newer / sizeof newer[0] : sizeof hub / sizeof hub[0];
        ck_assert_uint_eq(w.n_refs, n);
        for (size_t i = 1; i < w.n_refs; i++) ck_assert_int_lt(strcmp(w.refs[i - 1].name, w.refs[i].name), 0);
        for (size_t i = 0; i < n; i++) {
            const char *stored = layout ? newer[i].stored : hub[i].stored, *found = layout ? newer[i].found : hub[i].found;
            const tp_weight_ref *r = tp_weights_find(&w, found ? found : stored);
            ck_assert_msg(r && !strcmp(r->tensor->name, stored), "%s is not found as %s", stored, found ? found : stored);
            ck_assert_int_eq(r->other_part, found == NULL);
            if (found && strcmp(found, stored)) ck_assert_ptr_null(tp_weights_find(&w, stored));
            float v[2];
            ck_assert_int_eq(tp_weights_read_slice(&w, found ? found : stored, (tp_slice){0, 2, 0, 1}, TP_DTYPE_F32, v),
                             TP_OK);
            ck_assert_float_eq(v[1], tensor_value(stored, 1));
        }
        /* a text tensor missing is named as found, with where such names are stored */
        tp_error_clear();
        ck_assert_int_eq(tp_weights_check(&w, "model.layers.1.mlp.up_proj.weight", 2, 1, NULL), TP_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(tp_error_message(), "has no tensor \"model.layers.1.mlp.up_proj.weight\" (its "
                                     "text model's: language_model.model. or model.language_model. in place of model.)"));
        tp_weights_free(&w);
    }
    stb_rmtree(dir);
    stb_rmtree(single);
    ck_assert_int_eq(mkdir(single, 0700), 0);
    write_shard(single, "model.safetensors", "language_model.model.norm.weight,model.language_model.norm.weight");
    tp_weights w;
    open_expect(single, &w, TP_ERR_FORMAT, "tensors \"language_model.model.norm.weight\" (model.safetensors) and "
                "\"model.language_model.norm.weight\" (model.safetensors) are both the text model's model.norm.weight");
    stb_rmtree(single);
    free(dir);
    free(single);
}
END_TEST

/* A snapshot of the Hugging Face hub's cache as huggingface_hub lays it out: the files of
 * models--o--m/snapshots/rev are relative links to ../../blobs/HASH. Its shards load; a link
 * elsewhere in the repository (not blobs/) is still refused, saying what to do. */
START_TEST(test_hub_cache_snapshot)
{
    char *root = stb_tmpdir();
    char *repo = stb_strdupf("%s/models--o--m", root), *blobs = stb_strdupf("%s/blobs", repo),
         *snaps = stb_strdupf("%s/snapshots", repo), *snap = stb_strdupf("%s/rev", snaps),
         *other = stb_strdupf("%s/refs", repo);
    ck_assert_int_eq(mkdir(repo, 0755), 0);
    ck_assert_int_eq(mkdir(blobs, 0755), 0);
    ck_assert_int_eq(mkdir(snaps, 0755), 0);
    ck_assert_int_eq(mkdir(snap, 0755), 0);
    ck_assert_int_eq(mkdir(other, 0755), 0);
    write_shards(blobs, "h1=a,b;h2=c");
    write_index(blobs, "{'weight_map':{" MAP_AB "}}");
    write_shard(other, "h3", "a");
    const char *links[][2] = {{"s1.safetensors", "../../blobs/h1"}, {"s2.safetensors", "../../blobs/h2"},
                              {INDEX, "../../blobs/" INDEX}, {"s3.safetensors", "../../refs/h3"}};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        char *link = stb_strdupf("%s/%s", snap, links[i][0]);
        ck_assert_int_eq(symlink(links[i][1], link), 0);
        free(link);
    }
    tp_weights w;
    tp_error_clear();
    ck_assert_msg(tp_weights_open(snap, &w) == TP_OK, "%s", tp_error_message());
    ck_assert_uint_eq(w.n_shards, 2);
    tp_weights_free(&w);
    /* the index now maps a to the link into refs/ */
    char *index = stb_strdupf("%s/" INDEX, blobs);
    ck_assert_int_eq(unlink(index), 0);
    write_index(blobs, "{'weight_map':{'a':'s3.safetensors'}}");
    tp_error_clear();
    ck_assert_int_eq(tp_weights_open(snap, &w), TP_ERR_FORMAT);
    const char *m = tp_error_message();
    ck_assert_msg(strstr(m, "shard \"s3.safetensors\" resolves to") && strstr(m, "repository's blobs/") &&
                  strstr(m, "copy the files into the directory"), "%s", m);
    free(index);
    stb_rmtree(root);
    free(root);
    free(repo);
    free(blobs);
    free(snaps);
    free(snap);
    free(other);
}
END_TEST

/* tp_weights_parse_index: deduplicated shard names in first-seen order. */
START_TEST(test_parse_index)
{
    char *dir = stb_tmpdir();
    write_shards(dir, "b.safetensors=x;a.safetensors=y");
    static const char text[] = "{\"weight_map\":{\"t1\":\"b.safetensors\",\"t2\":\"a.safetensors\","
                               "\"t3\":\"b.safetensors\",\"t4\":\"a.safetensors\"}}";
    char **names = NULL;
    size_t n = 0;
    ck_assert_int_eq(tp_weights_parse_index(text, sizeof text - 1, dir, &names, &n), TP_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(names[0], "b.safetensors");
    ck_assert_str_eq(names[1], "a.safetensors");
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    static const char bad[] = "{\"weight_map\":{\"t1\":\"b.safetensors\",\"t2\":\"../a\"}}";
    tp_error_clear();
    ck_assert_int_eq(tp_weights_parse_index(bad, sizeof bad - 1, dir, &names, &n), TP_ERR_FORMAT);
    ck_assert_ptr_null(names);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "\"../a\""));
    stb_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_missing_dir)
{
    tp_weights w;
    tp_error_clear();
    ck_assert_int_eq(tp_weights_open("/nonexistent/tpinfer-model", &w), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "/nonexistent/tpinfer-model"));
    tp_weights zero = {0};
    tp_weights_free(&zero);
    ck_assert_ptr_null(tp_weights_find(&zero, "x"));
}
END_TEST

/* ---- the shared sharded model ------------------------------------------------------ */

static const char *shared_dir(void)
{
    const char *s = getenv("TPINFER_SHARED");
    return s && *s ? s : "../shared";
}

static float *read_all(const tp_weights *w, const tp_weight_ref *r, tp_dtype dt, int64_t *n)
{
    const tp_st_tensor *t = r->tensor;
    int64_t rows = t->rank ? t->shape[0] : 1;
    *n = tp_st_numel(t);
    float *buf = malloc((size_t)*n * sizeof(float) + 1);
    tp_status st = tp_weights_read_slice(w, t->name, (tp_slice){0, rows, 0, rows ? *n / rows : 0},
                                         dt, buf);
    ck_assert_msg(st == TP_OK, "%s", tp_error_message());
    return buf;
}

START_TEST(test_shared_sharded)
{
    char *bf = stb_strdupf("%s/models/stories260K-hf-bf16-sharded", shared_dir());
    char *f32 = stb_strdupf("%s/models/stories260K-hf", shared_dir());
    struct stat sb;
    if (stat(bf, &sb) != 0 || stat(f32, &sb) != 0) {
        printf("skipping the shared models: %s or %s not found (set TPINFER_SHARED)\n", bf, f32);
        free(bf);
        free(f32);
        return;
    }
    tp_weights wb, wf;
    ck_assert_msg(tp_weights_open(bf, &wb) == TP_OK, "%s", tp_error_message());
    ck_assert_msg(tp_weights_open(f32, &wf) == TP_OK, "%s", tp_error_message());
    ck_assert_int_eq(wb.from_index, 1);
    ck_assert_uint_eq(wb.n_shards, 2);
    ck_assert_int_eq(wf.from_index, 0);
    ck_assert_uint_eq(wb.n_refs, wf.n_refs);
    size_t checked = 0;
    for (size_t i = 0; i < wf.n_refs; i++) {
        const tp_st_tensor *tf = wf.refs[i].tensor;
        const tp_weight_ref *rb = tp_weights_find(&wb, tf->name);
        ck_assert_msg(rb != NULL, "%s missing from the sharded model", tf->name);
        ck_assert_int_eq(rb->tensor->dtype, TP_ST_BF16);
        ck_assert_int_eq(rb->tensor->rank, tf->rank);
        for (int d = 0; d < tf->rank; d++) ck_assert_int_eq(rb->tensor->shape[d], tf->shape[d]);
        int64_t n, nb;
        float *ref = read_all(&wf, &wf.refs[i], TP_DTYPE_F32, &n);
        float *got = read_all(&wb, rb, TP_DTYPE_F32, &nb);
        uint16_t *raw = (uint16_t *)read_all(&wb, rb, TP_DTYPE_BF16, &nb);
        /* The bf16 copy is exactly the round-to-nearest-even of the f32 original. */
        for (int64_t k = 0; k < n; k++) {
            if (raw[k] != tp_f32_to_bf16(ref[k]) || got[k] != tp_bf16_to_f32(raw[k]))
                ck_abort_msg("%s[%lld]: bf16 %04x, f32 %a rounds to %04x", tf->name,
                             (long long)k, raw[k], (double)ref[k], tp_f32_to_bf16(ref[k]));
        }
        checked += (size_t)n;
        free(ref);
        free(got);
        free(raw);
    }
    printf("stories260K: %zu tensors, %zu values equal to bf16(f32)\n", wf.n_refs, checked);
    tp_weights_free(&wb);
    tp_weights_free(&wf);
    free(bf);
    free(f32);
}
END_TEST

static Suite *weights_suite(void)
{
    Suite *s = suite_create("weights");
    TCase *tc = tcase_create("index");
    tcase_add_loop_test(tc, test_dir_case, 0, (int)(sizeof dir_cases / sizeof dir_cases[0]));
    tcase_add_test(tc, test_parse_index);
    tcase_add_test(tc, test_hub_cache_snapshot);
    tcase_add_test(tc, test_multimodal_names);
    tcase_add_test(tc, test_missing_dir);
    suite_add_tcase(s, tc);
    tc = tcase_create("shared");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_shared_sharded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(weights_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failures = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failures ? 1 : 0;
}
