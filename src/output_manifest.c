/*
 * output_manifest.c: OUTPUT.manifest.json's contents (output.c writes it): what identifies a
 * run (tpinfer's version, the model's files and hashes, the input's size and hash, the
 * settings that change the output), and --resume's comparison of an earlier run's with this
 * one's: a difference that would mix results of different runs stops the job unless --force.
 */
#include "output_manifest.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"
#include "util.h"

static int model_file_wanted(const char *name)
{
    static const char *const exact[] = {"config.json",         "tokenizer.json",     "tokenizer_config.json",
                                        "chat_template.jinja", "chat_template.json", "generation_config.json"};
    for (size_t i = 0; i < TP_ARRAY_LEN(exact); i++)
        if (!strcmp(name, exact[i])) return 1;
    size_t n = strlen(name);
    const char *ext = ".safetensors";
    size_t ne = strlen(ext);
    return n > ne && !strcmp(name + n - ne, ext);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static tp_status manifest_model_files(const char *model_dir, json_t *files)
{
    DIR *d = opendir(model_dir);
    if (!d) return tp_error(TP_ERR_IO, "cannot list the model directory %s: %s", model_dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    tp_status st = TP_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!model_file_wanted(de->d_name)) continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nn = realloc(names, ncap * sizeof *nn);
            if (!nn) {
                st = tp_error(TP_ERR_OOM, "out of memory listing %s", model_dir);
                break;
            }
            names = nn;
            cap = ncap;
        }
        if (!(names[n] = strdup(de->d_name))) {
            st = tp_error(TP_ERR_OOM, "out of memory listing %s", model_dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        char *p = tp_path_join(model_dir, names[i]);
        struct stat sb;
        if (!p) st = tp_error(TP_ERR_OOM, "out of memory");
        else if (stat(p, &sb) != 0) st = tp_error(TP_ERR_IO, "cannot stat %s: %s", p, strerror(errno));
        else if (S_ISREG(sb.st_mode))
            json_array_append_new(files, json_pack("{s:s, s:I}", "name", names[i], "size", (json_int_t)sb.st_size));
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

/* tp_hash_file of dir/name as a JSON string, or null when the file is absent. */
static tp_status manifest_hash(const char *dir, const char *name, json_t **out)
{
    *out = NULL;
    char *p = tp_path_join(dir, name);
    if (!p) return tp_error(TP_ERR_OOM, "out of memory");
    struct stat sb;
    tp_status st = TP_OK;
    if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        *out = json_null();
    } else {
        char hex[17];
        st = tp_hash_file(p, hex);
        if (st == TP_OK) *out = json_string(hex);
    }
    free(p);
    return st;
}

tp_status tp_manifest_build(const tp_manifest *m, json_t **out)
{
    *out = NULL;
    json_t *j = json_object();
    json_t *files = json_array();
    if (!j || !files) {
        json_decref(j);
        json_decref(files);
        return tp_error(TP_ERR_OOM, "out of memory building the manifest");
    }
    tp_status st = TP_OK;
    json_object_set_new(j, "tpinfer_version", m->tpinfer_version ? json_string(m->tpinfer_version) : json_null());
    json_object_set_new(j, "model_dir", m->model_dir ? json_string(m->model_dir) : json_null());
    json_t *ch = NULL, *th = NULL;
    if (m->model_dir) {
        st = manifest_model_files(m->model_dir, files);
        if (st == TP_OK) st = manifest_hash(m->model_dir, "config.json", &ch);
        if (st == TP_OK) st = manifest_hash(m->model_dir, "tokenizer.json", &th);
    }
    json_object_set_new(j, "model_files", files);
    json_object_set_new(j, "config_hash", ch ? ch : json_null());
    json_object_set_new(j, "tokenizer_hash", th ? th : json_null());

    json_t *in = json_object();
    json_object_set_new(in, "path", m->input_path ? json_string(m->input_path) : json_null());
    struct stat sb;
    if (st == TP_OK && m->input_path && strcmp(m->input_path, "-") != 0 && stat(m->input_path, &sb) == 0 &&
        S_ISREG(sb.st_mode)) {
        char hex[17];
        st = tp_hash_file(m->input_path, hex);
        json_object_set_new(in, "size", json_integer((json_int_t)sb.st_size));
        json_object_set_new(in, "hash", st == TP_OK ? json_string(hex) : json_null());
    } else {
        /* standard input or a pipe: nothing to identify it by */
        json_object_set_new(in, "size", json_null());
        json_object_set_new(in, "hash", json_null());
    }
    json_object_set_new(j, "input", in);

    json_t *settings = NULL;
    if (st == TP_OK) {
        if (m->settings_json) {
            json_error_t jerr;
            settings = json_loads(m->settings_json, JSON_REJECT_DUPLICATES, &jerr);
            if (!settings || !json_is_object(settings)) {
                json_decref(settings);
                settings = NULL;
                st = tp_error(TP_ERR_INVALID_ARG, "manifest settings are not a JSON object: %s",
                              m->settings_json);
            }
        } else {
            settings = json_object();
        }
    }
    json_object_set_new(j, "settings", settings ? settings : json_object());
    json_object_set_new(j, "status", json_string("running"));
    json_object_set_new(j, "updated_at", json_integer((json_int_t)time(NULL)));
    if (st != TP_OK) {
        json_decref(j);
        return st;
    }
    *out = j;
    return TP_OK;
}

/* A short text form of a JSON value for messages (malloc'ed). */
static char *json_brief(const json_t *v)
{
    if (!v) return strdup("(absent)");
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!s) return strdup("?");
    if (strlen(s) > 160) strcpy(s + 150, "...");
    return s;
}

/* Compare one field; returns 1 when it differs (and handles the report). */
static int field_differs(const char *name, const json_t *old, const json_t *now, int warn_only, int force,
                         const char *manifest_path, tp_status *st)
{
    if (old && now && json_equal((json_t *)old, (json_t *)now)) return 0;
    if (!old && !now) return 0;
    char *a = json_brief(old), *b = json_brief(now);
    if (warn_only) {
        tp_log(TP_LOG_WARN, "resume: %s differs from %s (then %s, now %s); continuing", name, manifest_path,
               a ? a : "?", b ? b : "?");
    } else if (force) {
        tp_log(TP_LOG_WARN, "resume: %s differs from %s (then %s, now %s); continuing because of --force",
               name, manifest_path, a ? a : "?", b ? b : "?");
    } else if (*st == TP_OK) {
        *st = tp_error(TP_ERR_INVALID_ARG,
                       "--resume: %s differs from the earlier run recorded in %s (then %s, now %s); "
                       "resuming would mix results of different runs.%s --force overrides (or --overwrite "
                       "starts over)",
                       name, manifest_path, a ? a : "?", b ? b : "?",
                       !strcmp(name, "settings.chat_max_tokens")
                           ? " The earlier run cut OpenAI chat lines without max_tokens at --max-tokens (default 16): "
                             "give the same --max-tokens to resume it."
                           : "");
    }
    free(a);
    free(b);
    return 1;
}

static json_t *get2(json_t *root, const char *a, const char *b)
{
    json_t *v = json_object_get(root, a);
    return b ? json_object_get(v, b) : v;
}

tp_status tp_manifest_compare(const json_t *old_c, json_t *now, int force, const char *manifest_path)
{
    json_t *old = (json_t *)old_c;
    tp_status st = TP_OK;
    static const struct {
        const char *name, *a, *b;
        int warn_only;
    } fields[] = {
        {"tpinfer_version", "tpinfer_version", NULL, 1},
        {"model_dir", "model_dir", NULL, 1},
        {"model_files", "model_files", NULL, 0},
        {"config_hash", "config_hash", NULL, 0},
        {"tokenizer_hash", "tokenizer_hash", NULL, 0},
        {"input.size", "input", "size", 0},
        {"input.hash", "input", "hash", 0},
        {"input.path", "input", "path", 1},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(fields); i++) {
        field_differs(fields[i].name, get2(old, fields[i].a, fields[i].b), get2(now, fields[i].a, fields[i].b),
                      fields[i].warn_only, force, manifest_path, &st);
        if (st != TP_OK) return st;
    }
    json_t *so = json_object_get(old, "settings"), *sn = json_object_get(now, "settings");
    if (!json_is_object(so) || !json_is_object(sn)) {
        field_differs("settings", so, sn, 0, force, manifest_path, &st);
        return st;
    }
    const char *key;
    json_t *v;
    char name[300];
    json_object_foreach(sn, key, v) {
        snprintf(name, sizeof name, "settings.%s", key);
        field_differs(name, json_object_get(so, key), v, 0, force, manifest_path, &st);
        if (st != TP_OK) return st;
    }
    json_object_foreach(so, key, v) {
        if (json_object_get(sn, key)) continue;
        snprintf(name, sizeof name, "settings.%s", key);
        field_differs(name, v, NULL, 0, force, manifest_path, &st);
        if (st != TP_OK) return st;
    }
    return st;
}
