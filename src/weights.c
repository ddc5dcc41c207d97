/*
 * weights.c: open a model directory's safetensors files. A sharded index's weight_map is
 * attacker-controlled (transformers#47176), so every shard name must be a bare file name
 * whose realpath stays inside the directory (or, in a snapshot of the Hugging Face hub's
 * cache, its repository's blobs/, where huggingface_hub's links go), and the index and the
 * shards' headers must agree tensor by tensor (anchors/reliability.md §1.7).
 */
#include "weights.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "log.h"
#include "util.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_INDEX_BYTES (64u << 20)

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

static int file_exists(const char *dir, const char *name)
{
    char *p = tp_path_join(dir, name);
    struct stat sb;
    int ok = p && stat(p, &sb) == 0;
    free(p);
    return ok;
}

/* ---- the index ------------------------------------------------------------------- */

static tp_status check_bare_name(const char *dir, const char *tensor, json_t *v)
{
    if (!json_is_string(v))
        return tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": weight_map value of \"%.200s\" is "
                        "not a string", dir, tensor);
    const char *s = json_string_value(v);
    if (!*s || !strcmp(s, ".") || !strcmp(s, "..") || strchr(s, '/') ||
        strlen(s) != json_string_length(v))
        return tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": tensor \"%.200s\" maps to shard "
                        "\"%.200s\", which is not a bare file name in the model directory",
                        dir, tensor, s);
    return TP_OK;
}

/* Where a shard may resolve besides the directory: a snapshot of the Hugging Face hub's
 * cache (.../models--ORG--NAME/snapshots/REV) holds links to ../../blobs/HASH, as
 * huggingface_hub lays it out, so there that repository's blobs/ too. NULL otherwise. */
static char *hub_blobs_dir(const char *real_dir)
{
    const char *rev = strrchr(real_dir, '/');
    if (!rev || rev == real_dir) return NULL;
    const size_t parent_len = (size_t)(rev - real_dir);
    static const char snapshots[] = "/snapshots";
    const size_t k = sizeof snapshots - 1;
    if (parent_len <= k || memcmp(real_dir + parent_len - k, snapshots, k)) return NULL;
    char *blobs = malloc(parent_len - k + sizeof "/blobs");
    if (!blobs) return NULL;
    memcpy(blobs, real_dir, parent_len - k);
    strcpy(blobs + parent_len - k, "/blobs");
    return blobs;
}

static int is_under(const char *real, const char *root)
{
    const size_t n = strlen(root);
    return strncmp(real, root, n) == 0 && (real[n] == '/' || !strcmp(root, "/"));
}

/* The shard must exist and, symlinks resolved, still lie inside the directory (or its hub
 * repository's blobs/). */
static tp_status check_inside(const char *dir, const char *real_dir, const char *name)
{
    char *path = tp_path_join(dir, name);
    if (!path) return tp_error(TP_ERR_OOM, "out of memory");
    char *real = realpath(path, NULL);
    int err = errno;
    free(path);
    if (!real)
        return tp_error(TP_ERR_IO, "%s/" INDEX_NAME ": shard \"%s\" cannot be opened: %s", dir,
                        name, strerror(err));
    char *blobs = hub_blobs_dir(real_dir);
    const int inside = is_under(real, real_dir) || (blobs && is_under(real, blobs));
    tp_status st = inside ? TP_OK
                          : tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": shard \"%s\" resolves "
                                     "to %s, outside the model directory%s; a shard may be a link only "
                                     "within it (or, in a Hugging Face hub cache snapshot, into the "
                                     "repository's blobs/): copy the files into the directory",
                                     dir, name, real, blobs ? " and its repository's blobs/" : "");
    free(blobs);
    free(real);
    return st;
}

static tp_status add_name(char ***names, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*names)[i], name)) return TP_OK;
    char **grown = realloc(*names, (*n + 1) * sizeof *grown);
    if (!grown) return tp_error(TP_ERR_OOM, "out of memory");
    *names = grown;
    if (!(grown[*n] = strdup(name))) return tp_error(TP_ERR_OOM, "out of memory");
    (*n)++;
    return TP_OK;
}

static tp_status collect_shards(json_t *map, const char *dir, char ***names, size_t *n)
{
    char *real_dir = realpath(dir, NULL);
    if (!real_dir)
        return tp_error(TP_ERR_IO, "cannot resolve model directory %s: %s", dir, strerror(errno));
    tp_status st = TP_OK;
    const char *tensor;
    json_t *v;
    json_object_foreach(map, tensor, v) {
        st = check_bare_name(dir, tensor, v);
        if (st == TP_OK) st = add_name(names, n, json_string_value(v));
        if (st != TP_OK) break;
    }
    for (size_t i = 0; st == TP_OK && i < *n; i++) st = check_inside(dir, real_dir, (*names)[i]);
    free(real_dir);
    return st;
}

/* Parse and check the index; on success *root holds it (the caller decrefs). */
static tp_status load_index(const char *text, size_t len, const char *dir, json_t **root,
                            char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    json_error_t err;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!*root)
        return tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": invalid JSON: %s (line %d, column %d)",
                        dir, err.text, err.line, err.column);
    json_t *map = json_object_get(*root, "weight_map"), *meta = json_object_get(*root, "metadata");
    tp_status st = TP_OK;
    if (!json_is_object(*root) || !json_is_object(map))
        st = tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": \"weight_map\" is missing or not an "
                      "object", dir);
    else if (json_object_size(map) == 0)
        st = tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": \"weight_map\" is empty", dir);
    else if (meta && !json_is_object(meta))
        st = tp_error(TP_ERR_FORMAT, "%s/" INDEX_NAME ": \"metadata\" is not an object", dir);
    if (st == TP_OK) st = collect_shards(map, dir, names, n);
    if (st != TP_OK) {
        free_names(*names, *n);
        *names = NULL;
        *n = 0;
        json_decref(*root);
        *root = NULL;
    }
    return st;
}

tp_status tp_weights_parse_index(const char *json_text, size_t len, const char *dir,
                                 char ***shard_names, size_t *n_shards)
{
    json_t *root;
    TP_CHECK(load_index(json_text, len, dir, &root, shard_names, n_shards));
    json_decref(root);
    return TP_OK;
}

/* ---- refs --------------------------------------------------------------------------- */

static const char *shard_name(const tp_st_file *f)
{
    const char *slash = strrchr(f->path, '/');
    return slash ? slash + 1 : f->path;
}

static int ref_cmp(const void *a, const void *b)
{
    return strcmp(((const tp_weight_ref *)a)->name, ((const tp_weight_ref *)b)->name);
}

/* Every tensor of every shard, sorted; a name in two shards is an error. */
static tp_status build_refs(tp_weights *w)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n_shards; i++) n += w->shards[i].n_tensors;
    w->refs = calloc(n ? n : 1, sizeof *w->refs);
    if (!w->refs) return tp_error(TP_ERR_OOM, "out of memory");
    for (size_t i = 0; i < w->n_shards; i++)
        for (size_t j = 0; j < w->shards[i].n_tensors; j++)
            w->refs[w->n_refs++] = (tp_weight_ref){&w->shards[i], &w->shards[i].tensors[j],
                                                   w->shards[i].tensors[j].name, 0};
    qsort(w->refs, w->n_refs, sizeof *w->refs, ref_cmp);
    for (size_t i = 1; i < w->n_refs; i++) {
        if (!strcmp(w->refs[i].tensor->name, w->refs[i - 1].tensor->name))
            return tp_error(TP_ERR_FORMAT, "%s: tensor \"%.200s\" is in two shards, %s and %s",
                            w->dir, w->refs[i].tensor->name, shard_name(w->refs[i - 1].file),
                            shard_name(w->refs[i].file));
    }
    return TP_OK;
}

/* The index's tensor set must equal the shards' (tensor -> the right shard). */
static tp_status match_index(const tp_weights *w, json_t *map)
{
    for (size_t i = 0; i < w->n_refs; i++) {
        const tp_weight_ref *r = &w->refs[i];
        json_t *v = json_object_get(map, r->tensor->name);
        if (!v)
            return tp_error(TP_ERR_FORMAT, "%s: tensor \"%.200s\" is in shard %s but not in "
                            INDEX_NAME, w->dir, r->tensor->name, shard_name(r->file));
        if (strcmp(json_string_value(v), shard_name(r->file)))
            return tp_error(TP_ERR_FORMAT, "%s: " INDEX_NAME " puts tensor \"%.200s\" in %s, "
                            "but it is in %s", w->dir, r->tensor->name, json_string_value(v),
                            shard_name(r->file));
    }
    const char *tensor;
    json_t *v;
    json_object_foreach(map, tensor, v) {
        if (!tp_weights_find(w, tensor))
            return tp_error(TP_ERR_FORMAT, "%s: " INDEX_NAME " puts tensor \"%.200s\" in %s, "
                            "but that shard has no such tensor", w->dir, tensor,
                            json_string_value(v));
    }
    return TP_OK;
}

/* Where a multimodal checkpoint keeps its text model: transformers before 4.52 saved
 * Gemma3ForConditionalGeneration's as "language_model.model.X" and "language_model.lm_head.weight"
 * (the Hub's files), later ones as "model.language_model.X" (its conversion mapping). */
static const struct {
    const char *from, *to;
} text_prefixes[] = {
    {"language_model.model.", "model."},
    {"model.language_model.", "model."},
    {"language_model.lm_head.", "lm_head."},
};

/* The text model's tensors renamed to the text-only names and sorted again; where any was, the
 * tensors left (the vision tower's, the projector's) are another part's. Two tensors of one name
 * then (a checkpoint holding both layouts) are an error naming both. */
static tp_status map_text_model(tp_weights *w)
{
    for (size_t i = 0; i < w->n_refs; i++)
        for (size_t k = 0; k < TP_ARRAY_LEN(text_prefixes); k++) {
            const char *name = w->refs[i].tensor->name, *from = text_prefixes[k].from;
            if (strncmp(name, from, strlen(from)) != 0) continue;
            char *to = malloc(strlen(text_prefixes[k].to) + strlen(name + strlen(from)) + 1);
            if (!to) return tp_error(TP_ERR_OOM, "out of memory");
            strcpy(to, text_prefixes[k].to);
            strcat(to, name + strlen(from));
            w->refs[i].name = to;
            w->multimodal = 1;
            break;
        }
    if (!w->multimodal) return TP_OK;
    for (size_t i = 0; i < w->n_refs; i++)
        w->refs[i].other_part = w->refs[i].name == w->refs[i].tensor->name && strcmp(w->refs[i].name, "lm_head.weight");
    qsort(w->refs, w->n_refs, sizeof *w->refs, ref_cmp);
    for (size_t i = 1; i < w->n_refs; i++)
        if (!strcmp(w->refs[i].name, w->refs[i - 1].name))
            return tp_error(TP_ERR_FORMAT, "%s: tensors \"%.200s\" (%s) and \"%.200s\" (%s) are both the text "
                            "model's %s: the checkpoint holds two layouts of it", w->dir, w->refs[i - 1].tensor->name,
                            shard_name(w->refs[i - 1].file), w->refs[i].tensor->name, shard_name(w->refs[i].file),
                            w->refs[i].name);
    return TP_OK;
}

/* total_size is informational; scripts write 0 or file sizes, so a mismatch only warns. */
static void check_total_size(const tp_weights *w, json_t *root)
{
    json_t *total = json_object_get(json_object_get(root, "metadata"), "total_size");
    if (!total) return;
    uint64_t sum = 0;
    for (size_t i = 0; i < w->n_refs; i++) sum += w->refs[i].tensor->end - w->refs[i].tensor->begin;
    if (!json_is_integer(total) || (uint64_t)json_integer_value(total) != sum)
        tp_log(TP_LOG_WARN, "%s/" INDEX_NAME ": metadata.total_size is not %" PRIu64 ", the "
               "sum of the tensors' bytes; ignoring it", w->dir, sum);
}

/* ---- opening ------------------------------------------------------------------------ */

static tp_status open_shards(tp_weights *w, char **names, size_t n)
{
    w->shards = calloc(n ? n : 1, sizeof *w->shards);
    if (!w->shards) return tp_error(TP_ERR_OOM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char *path = tp_path_join(w->dir, names[i]);
        if (!path) return tp_error(TP_ERR_OOM, "out of memory");
        tp_status st = tp_st_open(path, &w->shards[i]);
        free(path);
        TP_CHECK(st);
        w->n_shards++;
    }
    return TP_OK;
}

static tp_status open_index(tp_weights *w)
{
    char *path = tp_path_join(w->dir, INDEX_NAME), *text = NULL, **names = NULL;
    if (!path) return tp_error(TP_ERR_OOM, "out of memory");
    size_t len, n = 0;
    json_t *root = NULL;
    tp_status st = tp_read_file(path, MAX_INDEX_BYTES, &text, &len);
    free(path);
    if (st == TP_OK) st = load_index(text, len, w->dir, &root, &names, &n);
    free(text);
    if (st == TP_OK) st = open_shards(w, names, n);
    if (st == TP_OK) st = build_refs(w);
    if (st == TP_OK) st = match_index(w, json_object_get(root, "weight_map"));
    if (st == TP_OK) check_total_size(w, root);
    if (st == TP_OK) st = map_text_model(w);
    free_names(names, n);
    json_decref(root);
    return st;
}

tp_status tp_weights_open(const char *model_dir, tp_weights *w)
{
    memset(w, 0, sizeof *w);
    if (!(w->dir = strdup(model_dir))) return tp_error(TP_ERR_OOM, "out of memory");
    tp_status st;
    if (file_exists(model_dir, INDEX_NAME)) {
        if (file_exists(model_dir, SINGLE_NAME))
            tp_log(TP_LOG_WARN, "%s has both " SINGLE_NAME " and " INDEX_NAME "; using the index",
                   model_dir);
        w->from_index = 1;
        st = open_index(w);
    } else if (file_exists(model_dir, SINGLE_NAME)) {
        char *names[] = {SINGLE_NAME};
        st = open_shards(w, names, 1);
        if (st == TP_OK) st = build_refs(w);
        if (st == TP_OK) st = map_text_model(w);
    } else {
        st = tp_error(TP_ERR_IO, "%s: no weights: neither " SINGLE_NAME " nor " INDEX_NAME
                      " exists there", model_dir);
    }
    if (st != TP_OK) tp_weights_free(w);
    return st;
}

void tp_weights_free(tp_weights *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_refs; i++)
        if (w->refs[i].name != w->refs[i].tensor->name) free((char *)w->refs[i].name);
    for (size_t i = 0; i < w->n_shards; i++) tp_st_free(&w->shards[i]);
    free(w->shards);
    free(w->refs);
    free(w->dir);
    memset(w, 0, sizeof *w);
}

tp_status tp_weights_fingerprint(const tp_weights *w, uint64_t *fingerprint)
{
    enum { SAMPLES = 16, SAMPLE_BYTES = 4096 };
    unsigned char block[SAMPLE_BYTES];
    uint64_t h = TP_FNV_OFFSET;
    for (size_t i = 0; i < w->n_shards; i++) {
        const tp_st_file *f = &w->shards[i];
        h = tp_fnv1a(h, &f->file_size, sizeof f->file_size);
        h = tp_fnv1a(h, &f->data_offset, sizeof f->data_offset);
        for (size_t k = 0; k < f->n_tensors; k++) {
            const tp_st_tensor *t = &f->tensors[k];
            h = tp_fnv1a(h, t->name, strlen(t->name) + 1);
            h = tp_fnv1a(h, &t->dtype, sizeof t->dtype);
            h = tp_fnv1a(h, t->shape, (size_t)t->rank * sizeof *t->shape);
            h = tp_fnv1a(h, &t->begin, sizeof t->begin);
            h = tp_fnv1a(h, &t->end, sizeof t->end);
        }
        const uint64_t data = f->file_size - f->data_offset;
        for (int s = 0; s < SAMPLES && data > 0; s++) {
            const uint64_t at = f->data_offset + (data > SAMPLE_BYTES ? (data - SAMPLE_BYTES) / (SAMPLES - 1) * (uint64_t)s : 0);
            const size_t n = data < SAMPLE_BYTES ? (size_t)data : SAMPLE_BYTES;
            ssize_t got;
            do got = pread(f->fd, block, n, (off_t)at);
            while (got < 0 && errno == EINTR);
            if (got != (ssize_t)n)
                return tp_error(TP_ERR_IO, "%s: cannot read %zu bytes at %" PRIu64 ": %s", f->path, n, at,
                                got < 0 ? strerror(errno) : "the file is shorter than its header says");
            h = tp_fnv1a(h, block, n);
        }
    }
    *fingerprint = h;
    return TP_OK;
}

const tp_weight_ref *tp_weights_find(const tp_weights *w, const char *name)
{
    if (!w->n_refs) return NULL;
    tp_weight_ref key_ref = {.name = name};
    return bsearch(&key_ref, w->refs, w->n_refs, sizeof *w->refs, ref_cmp);
}

/* The [rows, cols] view of a stored tensor, as safetensors.h defines it. */
static void view_2d(const tp_st_tensor *t, int64_t *rows, int64_t *cols)
{
    *rows = t->rank ? t->shape[0] : 1;
    *cols = 1;
    for (int i = 1; i < t->rank; i++) *cols *= t->shape[i];
}

tp_status tp_weights_check(const tp_weights *w, const char *name, int64_t full_rows, int64_t full_cols,
                           tp_dtype *dtype)
{
    const tp_weight_ref *ref = tp_weights_find(w, name);
    if (!ref)
        return tp_error(TP_ERR_FORMAT,
                        "%s: the model has no tensor \"%.200s\"%s, which config.json's architecture needs: a shard "
                        "missing or cut short in the download (model.safetensors.index.json lists them), or "
                        "weights of another model",
                        w->dir, name, w->multimodal ? " (its text model's: language_model.model. or "
                                                      "model.language_model. in place of model.)" : "");
    tp_dtype dt;
    if (!tp_st_dtype_to_dtype(ref->tensor->dtype, &dt) || dt == TP_DTYPE_I32)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s; tpinfer loads F32, F16 and BF16 weights",
                        ref->file->path, ref->tensor->name, tp_st_dtype_name(ref->tensor->dtype));
    int64_t rows, cols;
    view_2d(ref->tensor, &rows, &cols);
    const int want_rank = full_cols == 1 ? 1 : 2;
    if (rows != full_rows || cols != full_cols || ref->tensor->rank != want_rank)
        return tp_error(TP_ERR_FORMAT,
                        "%s: tensor %s has %d-D shape %" PRId64 " x %" PRId64 " but config.json implies %d-D %" PRId64
                        " x %" PRId64 " (does config.json belong to these weights?)",
                        ref->file->path, ref->tensor->name, ref->tensor->rank, rows, cols, want_rank, full_rows,
                        full_cols);
    if (dtype) *dtype = dt;
    return TP_OK;
}

tp_status tp_weights_read_slice(const tp_weights *w, const char *name, tp_slice s,
                                tp_dtype dst_dt, void *dst)
{
    const tp_weight_ref *r = tp_weights_find(w, name);
    if (!r) return tp_error(TP_ERR_FORMAT, "%s: the model has no tensor \"%.200s\"", w->dir, name);
    return tp_st_read_slice(r->file, r->tensor, s, dst_dt, dst);
}
