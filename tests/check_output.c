/*
 * check_output.c: the crash-safe output (whole lines, ordered mode, errors file, refusals,
 * manifest, resume and torn-line repair, disk-full), tp_hash_file, and progress: the
 * status file, percentiles and the progress line. Every test works in its own mkdtemp
 * directory.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "output.h"
#include "status.h"
#include "util.h"

static char tmpdir[256];
static char modeldir[512];

#define P(buf, name) snprintf((buf), sizeof(buf), "%s/%s", tmpdir, (name))

static void put_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    if (len) ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static void put_str(const char *path, const char *s) { put_file(path, s, strlen(s)); }

static char *slurp(const char *path, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    ck_assert_msg(tp_read_file(path, (size_t)1 << 30, &buf, &n) == TP_OK, "cannot read %s: %s", path,
                  tp_error_message());
    if (len) *len = n;
    return buf;
}

static long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static json_t *load_json(const char *path)
{
    char *text = slurp(path, NULL);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    ck_assert_msg(j != NULL, "%s is not JSON: %s", path, err.text);
    free(text);
    return j;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/check_output.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    P(modeldir, "model");
    ck_assert_int_eq(mkdir(modeldir, 0755), 0);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/config.json", modeldir);
    put_str(p, "{\"hidden_size\": 64}\n");
    snprintf(p, sizeof p, "%s/tokenizer.json", modeldir);
    put_str(p, "{\"model\": {}}\n");
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", modeldir);
    put_str(p, "0123456789");
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", modeldir);
    put_str(p, "01234");
    snprintf(p, sizeof p, "%s/chat_template.jinja", modeldir); /* renders the prompts: part of it */
    put_str(p, "{{ x }}");
    snprintf(p, sizeof p, "%s/notes.txt", modeldir);
    put_str(p, "not part of the model");
    tp_error_clear();
}

static void teardown(void)
{
    if (tmpdir[0]) {
        chmod(tmpdir, 0700);
        nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

static const char *SETTINGS = "{\"temperature\": 0.0, \"max_tokens\": 16}";

static tp_manifest manifest_for(const char *input, const char *settings)
{
    tp_manifest m = {"0.1.0", modeldir, input, settings ? settings : SETTINGS};
    return m;
}

static tp_output_config cfg_for(const char *out)
{
    tp_output_config c = {out, NULL, 0, 0, 0, 0, 2.0};
    return c;
}

static void make_input(char *buf, size_t size, const char *content)
{
    snprintf(buf, size, "%s/in.jsonl", tmpdir);
    put_str(buf, content);
}

static void write_str(tp_output *o, int64_t index, const char *line, int is_error)
{
    tp_status st = tp_output_write(o, index, line, strlen(line), is_error);
    ck_assert_msg(st == TP_OK, "write failed: %s", tp_error_message());
}

/* ---------------------------------------------------------------------------
 * Hash */

START_TEST(hash_file_fnv1a)
{
    char p[PATH_MAX], hex[17];
    P(p, "h");
    put_str(p, "");
    ck_assert_int_eq(tp_hash_file(p, hex), TP_OK);
    ck_assert_str_eq(hex, "cbf29ce484222325");
    put_str(p, "a");
    ck_assert_int_eq(tp_hash_file(p, hex), TP_OK);
    ck_assert_str_eq(hex, "af63dc4c8601ec8c");
    put_str(p, "foobar");
    ck_assert_int_eq(tp_hash_file(p, hex), TP_OK);
    ck_assert_str_eq(hex, "85944171f73967e8");

    /* more than one 1 MiB chunk */
    size_t n = 3u * 1024 * 1024 + 17;
    unsigned char *big = malloc(n);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        big[i] = (unsigned char)(i * 131 + (i >> 11));
        h ^= big[i];
        h *= 0x100000001b3ULL;
    }
    put_file(p, (const char *)big, n);
    free(big);
    char want[17];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)h);
    ck_assert_int_eq(tp_hash_file(p, hex), TP_OK);
    ck_assert_str_eq(hex, want);

    P(p, "missing");
    ck_assert_int_eq(tp_hash_file(p, hex), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "missing"));
}
END_TEST

/* ---------------------------------------------------------------------------
 * Writing */

START_TEST(writes_whole_lines)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    enum { N = 200 };
    size_t cap = 120000;
    char *line = malloc(cap);
    for (int i = 0; i < N; i++) {
        size_t pad = (size_t)(i * 517) % 100000;
        int k = snprintf(line, cap, "{\"id\":\"r%d\",\"text\":\"", i);
        memset(line + k, 'a' + i % 26, pad);
        memcpy(line + k + pad, "\"}", 3);
        ck_assert_int_eq(tp_output_write(o, i, line, strlen(line), 0), TP_OK);
    }
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    size_t len;
    char *text = slurp(out, &len);
    ck_assert_int_eq(count_lines(text), N);
    ck_assert(len > 0 && text[len - 1] == '\n');
    char *s = text;
    for (int i = 0; i < N; i++) {
        char *nl = strchr(s, '\n');
        ck_assert_ptr_nonnull(nl);
        json_error_t err;
        json_t *j = json_loadb(s, (size_t)(nl - s), 0, &err);
        ck_assert_msg(j != NULL, "line %d is not JSON", i);
        char id[32];
        snprintf(id, sizeof id, "r%d", i);
        ck_assert_str_eq(json_string_value(json_object_get(j, "id")), id);
        ck_assert_uint_eq(strlen(json_string_value(json_object_get(j, "text"))), (size_t)(i * 517) % 100000);
        json_decref(j);
        s = nl + 1;
    }
    free(text);
    free(line);
}
END_TEST

static const int64_t ARRIVAL[] = {3, 1, 0, 2, 6, 5, 4};

static void write_arrivals(tp_output *o)
{
    char line[64];
    for (size_t i = 0; i < sizeof ARRIVAL / sizeof ARRIVAL[0]; i++) {
        snprintf(line, sizeof line, "{\"id\":\"r%lld\"}", (long long)ARRIVAL[i]);
        write_str(o, ARRIVAL[i], line, 0);
    }
}

START_TEST(ordered_holds_early_lines)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.ordered = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 3, "{\"id\":\"r3\"}", 0);
    write_str(o, 1, "{\"id\":\"r1\"}", 0);
    ck_assert_int_eq(file_size(out), 0); /* both wait for index 0 */
    write_str(o, 0, "{\"id\":\"r0\"}", 0);
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r0\"}\n{\"id\":\"r1\"}\n");
    free(t);
    write_str(o, 2, "{\"id\":\"r2\"}", 0);
    write_str(o, 6, "{\"id\":\"r6\"}", 0);
    write_str(o, 5, "{\"id\":\"r5\"}", 0);
    t = slurp(out, NULL);
    ck_assert_int_eq(count_lines(t), 4);
    free(t);
    write_str(o, 4, "{\"id\":\"r4\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r0\"}\n{\"id\":\"r1\"}\n{\"id\":\"r2\"}\n{\"id\":\"r3\"}\n"
                        "{\"id\":\"r4\"}\n{\"id\":\"r5\"}\n{\"id\":\"r6\"}\n");
    free(t);
}
END_TEST

START_TEST(ordered_many_shuffled)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.ordered = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    enum { N = 3000 };
    int64_t *perm = malloc(N * sizeof *perm);
    for (int i = 0; i < N; i++) perm[i] = i;
    srand(7);
    for (int i = N - 1; i > 0; i--) {
        int j = rand() % (i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    char line[64];
    for (int i = 0; i < N; i++) {
        snprintf(line, sizeof line, "{\"id\":\"r%lld\"}", (long long)perm[i]);
        write_str(o, perm[i], line, 0);
    }
    free(perm);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    char *t = slurp(out, NULL), *s = t;
    for (int i = 0; i < N; i++) {
        snprintf(line, sizeof line, "{\"id\":\"r%d\"}\n", i);
        ck_assert_int_eq(strncmp(s, line, strlen(line)), 0);
        s += strlen(line);
    }
    ck_assert_int_eq(*s, '\0');
    free(t);
}
END_TEST

START_TEST(unordered_writes_at_once)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 3, "{\"id\":\"r3\"}", 0);
    ck_assert_int_eq(file_size(out), 12); /* no waiting */
    write_arrivals(o);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r3\"}\n{\"id\":\"r3\"}\n{\"id\":\"r1\"}\n{\"id\":\"r0\"}\n{\"id\":\"r2\"}\n"
                        "{\"id\":\"r6\"}\n{\"id\":\"r5\"}\n{\"id\":\"r4\"}\n");
    free(t);
}
END_TEST

START_TEST(errors_file_split)
{
    char out[PATH_MAX], err[PATH_MAX];
    P(out, "out.jsonl");
    P(err, "errors.jsonl");
    tp_output_config c = cfg_for(out);
    c.errors_path = err;
    c.ordered = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 2, "{\"id\":\"r2\"}", 0);
    write_str(o, 1, "{\"id\":\"r1\",\"error\":{\"code\":\"x\"}}", 1);
    ck_assert_int_eq(file_size(err), 0); /* an error record is ordered too */
    write_str(o, 0, "{\"id\":\"r0\"}", 0);
    write_str(o, 3, "{\"id\":\"r3\",\"error\":{\"code\":\"y\"}}", 1);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r0\"}\n{\"id\":\"r2\"}\n");
    free(t);
    t = slurp(err, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r1\",\"error\":{\"code\":\"x\"}}\n{\"id\":\"r3\",\"error\":{\"code\":\"y\"}}\n");
    free(t);

    /* without an errors file, error records go inline */
    c.errors_path = NULL;
    c.ordered = 0;
    c.overwrite = 1;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 0, "{\"id\":\"a\"}", 0);
    write_str(o, 1, "{\"id\":\"b\",\"error\":{}}", 1);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"a\"}\n{\"id\":\"b\",\"error\":{}}\n");
    free(t);
}
END_TEST

START_TEST(bad_write_arguments)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.ordered = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    ck_assert_int_eq(tp_output_write(o, 0, "{\"a\":1}\n{}", 10, 0), TP_ERR_INTERNAL);
    ck_assert_int_eq(tp_output_write(o, 0, "", 0, 0), TP_ERR_INTERNAL);
    write_str(o, 0, "{}", 0);
    tp_error_clear();
    ck_assert_int_eq(tp_output_write(o, 0, "{}", 2, 0), TP_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "twice"));
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    ck_assert_int_eq(tp_output_close(NULL, 1), TP_OK);
}
END_TEST

START_TEST(ordered_close_with_held_lines)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.ordered = 1;
    tp_output *o;
    /* interrupted: held lines are dropped so the file stays an in-order prefix */
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 0, "{\"id\":\"r0\"}", 0);
    write_str(o, 2, "{\"id\":\"r2\"}", 0);
    write_str(o, 3, "{\"id\":\"r3\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r0\"}\n");
    free(t);
    /* "complete" with a gap is a bug upstream: the results are kept, the status says so */
    c.overwrite = 1;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 3, "{\"id\":\"r3\"}", 0);
    write_str(o, 2, "{\"id\":\"r2\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "never came"));
    t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"r2\"}\n{\"id\":\"r3\"}\n");
    free(t);
}
END_TEST

START_TEST(stdout_output)
{
    char cap[PATH_MAX];
    P(cap, "stdout.txt");
    fflush(stdout);
    int saved = dup(1);
    int fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 1);
    close(fd);
    tp_output_config c = cfg_for(NULL);
    c.sync_seconds = 0;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 0, "{\"id\":\"x\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    dup2(saved, 1);
    close(saved);
    char *t = slurp(cap, NULL);
    ck_assert_str_eq(t, "{\"id\":\"x\"}\n");
    free(t);
    c.resume = 1;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "--resume"));
}
END_TEST

/* ---------------------------------------------------------------------------
 * Refusals */

START_TEST(refuse_existing_output)
{
    char out[PATH_MAX], err[PATH_MAX];
    P(out, "out.jsonl");
    P(err, "errors.jsonl");
    put_str(out, "{\"id\":\"old\"}\n");
    tp_output_config c = cfg_for(out);
    tp_output *o = (tp_output *)1;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_INVALID_ARG);
    ck_assert_ptr_null(o);
    char want[PATH_MAX + 100];
    snprintf(want, sizeof want, "%s exists; give --resume to continue it or --overwrite to replace it", out);
    ck_assert_str_eq(tp_error_message(), want);
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"old\"}\n"); /* untouched */
    free(t);

    /* an empty file is no result: fine */
    put_str(out, "");
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);

    /* the errors file is guarded the same way */
    tp_error_clear();
    put_str(err, "{\"id\":\"e\"}\n");
    c.errors_path = err;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), err));

    /* --overwrite replaces both */
    put_str(out, "{\"id\":\"old\"}\n");
    c.overwrite = 1;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    write_str(o, 0, "{\"id\":\"new\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    t = slurp(out, NULL);
    ck_assert_str_eq(t, "{\"id\":\"new\"}\n");
    free(t);
    ck_assert_int_eq(file_size(err), 0);

    /* the output and the errors file must differ */
    tp_error_clear();
    c.errors_path = out;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_INVALID_ARG);
    char alias[PATH_MAX];
    snprintf(alias, sizeof alias, "%s/./out.jsonl", tmpdir);
    c.errors_path = alias;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_INVALID_ARG);

    /* a directory is not an output */
    tp_error_clear();
    c = cfg_for(tmpdir);
    c.overwrite = 1;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "directory"));
}
END_TEST

START_TEST(refuse_output_is_input)
{
    char in[PATH_MAX], sym[PATH_MAX], hard[PATH_MAX], alias[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\",\"prompt\":\"hi\"}\n");
    tp_manifest m = manifest_for(in, NULL);
    tp_output *o;
    const char *paths[4];
    P(sym, "link.jsonl");
    ck_assert_int_eq(symlink(in, sym), 0);
    P(hard, "hard.jsonl");
    ck_assert_int_eq(link(in, hard), 0);
    snprintf(alias, sizeof alias, "%s/model/../in.jsonl", tmpdir);
    paths[0] = in;
    paths[1] = sym;
    paths[2] = hard;
    paths[3] = alias;
    for (int i = 0; i < 4; i++) {
        /* even with --overwrite and --resume */
        for (int mode = 0; mode < 2; mode++) {
            tp_error_clear();
            tp_output_config c = cfg_for(paths[i]);
            c.overwrite = mode == 0;
            c.resume = mode == 1;
            ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_ERR_INVALID_ARG);
            ck_assert_msg(strstr(tp_error_message(), paths[i]) && strstr(tp_error_message(), in),
                          "message names both files: %s", tp_error_message());
        }
    }
    /* the errors file too */
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.errors_path = hard;
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_ERR_INVALID_ARG);
    char *t = slurp(in, NULL);
    ck_assert_str_eq(t, "{\"id\":\"a\",\"prompt\":\"hi\"}\n");
    free(t);
}
END_TEST

START_TEST(refuse_missing_directory)
{
    char out[PATH_MAX];
    P(out, "nope/out.jsonl");
    tp_output_config c = cfg_for(out);
    c.resume = 1; /* a missing directory is an error even with --resume */
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "nope"));
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "does not exist"));
}
END_TEST

START_TEST(refuse_unwritable_directory)
{
    char ro[PATH_MAX], out[PATH_MAX];
    P(ro, "ro");
    ck_assert_int_eq(mkdir(ro, 0555), 0);
    ck_assert_int_eq(chmod(tmpdir, 0755), 0);
    P(out, "ro/out.jsonl");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* root can write anywhere: be nobody for this check */
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(77);
        tp_output_config c = cfg_for(out);
        tp_output *o;
        tp_status st = tp_output_open(&c, NULL, &o);
        if (st != TP_ERR_IO) _exit(1);
        if (!strstr(tp_error_message(), "not writable") || !strstr(tp_error_message(), ro)) _exit(2);
        if (access(out, F_OK) == 0) _exit(3);
        _exit(0);
    }
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert(WIFEXITED(ws));
    if (WEXITSTATUS(ws) == 77) return; /* cannot drop privileges here */
    ck_assert_int_eq(WEXITSTATUS(ws), 0);
}
END_TEST

START_TEST(refuse_second_writer)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.resume = 1;
    tp_output *a, *b;
    ck_assert_int_eq(tp_output_open(&c, NULL, &a), TP_OK);
    write_str(a, 0, "{\"id\":\"r0\"}", 0);
    ck_assert_int_eq(tp_output_open(&c, NULL, &b), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "another tpinfer"));
    ck_assert_int_eq(tp_output_close(a, 0), TP_OK);
    ck_assert_int_eq(tp_output_open(&c, NULL, &b), TP_OK);
    ck_assert(tp_output_is_done(b, "r0"));
    ck_assert_int_eq(tp_output_close(b, 1), TP_OK);
}
END_TEST

/* ---------------------------------------------------------------------------
 * Manifest */

static int dir_has_temp_files(const char *dir)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q '\\.tmp'", dir);
    return system(cmd) == 0;
}

START_TEST(manifest_fields)
{
    char in[PATH_MAX], out[PATH_MAX], man[PATH_MAX], p[PATH_MAX], hex[17];
    make_input(in, sizeof in, "{\"id\":\"a\",\"prompt\":\"hi\"}\n{\"id\":\"b\",\"prompt\":\"yo\"}\n");
    P(out, "out.jsonl");
    P(man, "out.jsonl.manifest.json");
    tp_manifest m = manifest_for(in, NULL);
    tp_output_config c = cfg_for(out);
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_OK);
    ck_assert(!dir_has_temp_files(tmpdir));
    json_t *j = load_json(man);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "running");
    ck_assert_str_eq(json_string_value(json_object_get(j, "tpinfer_version")), "0.1.0");
    ck_assert_str_eq(json_string_value(json_object_get(j, "model_dir")), modeldir);
    json_t *files = json_object_get(j, "model_files");
    ck_assert_uint_eq(json_array_size(files), 5);
    const char *names[] = {"chat_template.jinja", "config.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "tokenizer.json"};
    const long long sizes[] = {7, 20, 5, 10, 14};
    for (size_t i = 0; i < 5; i++) {
        json_t *f = json_array_get(files, i);
        ck_assert_str_eq(json_string_value(json_object_get(f, "name")), names[i]);
        ck_assert_int_eq(json_integer_value(json_object_get(f, "size")), sizes[i]);
    }
    snprintf(p, sizeof p, "%s/config.json", modeldir);
    ck_assert_int_eq(tp_hash_file(p, hex), TP_OK);
    ck_assert_str_eq(json_string_value(json_object_get(j, "config_hash")), hex);
    snprintf(p, sizeof p, "%s/tokenizer.json", modeldir);
    ck_assert_int_eq(tp_hash_file(p, hex), TP_OK);
    ck_assert_str_eq(json_string_value(json_object_get(j, "tokenizer_hash")), hex);
    json_t *input = json_object_get(j, "input");
    ck_assert_str_eq(json_string_value(json_object_get(input, "path")), in);
    ck_assert_int_eq(json_integer_value(json_object_get(input, "size")), file_size(in));
    ck_assert_int_eq(tp_hash_file(in, hex), TP_OK);
    ck_assert_str_eq(json_string_value(json_object_get(input, "hash")), hex);
    json_t *want = json_loads(SETTINGS, 0, NULL);
    ck_assert(json_equal(json_object_get(j, "settings"), want));
    json_decref(want);
    ck_assert(json_is_integer(json_object_get(j, "updated_at")));
    ck_assert_int_ge(json_integer_value(json_object_get(j, "updated_at")), 1700000000);
    json_decref(j);

    write_str(o, 0, "{\"id\":\"a\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    j = load_json(man);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "completed");
    json_decref(j);
    ck_assert(!dir_has_temp_files(tmpdir));

    /* an interrupted run says so */
    c.resume = 1;
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_OK);
    j = load_json(man);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "running");
    json_decref(j);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    j = load_json(man);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "interrupted");
    json_decref(j);

    /* settings must be a JSON object */
    tp_error_clear();
    tp_manifest bad = manifest_for(in, "[1,2]");
    c.resume = 0;
    c.overwrite = 1;
    ck_assert_int_eq(tp_output_open(&c, &bad, &o), TP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(atomic_replace_helper)
{
    char p[PATH_MAX];
    P(p, "f.json");
    ck_assert_int_eq(tp_write_file_atomic(p, "{\"a\":1}\n", 8, 1), TP_OK);
    ck_assert_int_eq(tp_write_file_atomic(p, "{\"a\":2}\n", 8, 0), TP_OK);
    char *t = slurp(p, NULL);
    ck_assert_str_eq(t, "{\"a\":2}\n");
    free(t);
    ck_assert(!dir_has_temp_files(tmpdir));
    P(p, "nope/f.json");
    ck_assert_int_eq(tp_write_file_atomic(p, "x", 1, 1), TP_ERR_IO);
}
END_TEST

/* --status-file through a symbolic link (dangling too), a FIFO (as /dev/null: not a regular
 * file), /dev/stdout into a log file, or a directory: the link stays a link with its target
 * replaced, the FIFO stays a FIFO and gets the text (no reader: a clear error, no hang), the
 * log keeps its lines with the text appended, a directory is an error; no temp files. */
START_TEST(atomic_replace_special_paths)
{
    char target[PATH_MAX], link[PATH_MAX], fifo[PATH_MAX], dir[PATH_MAX];
    P(target, "target.json");
    P(link, "link.json");
    put_str(target, "old\n");
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_int_eq(tp_write_file_atomic(link, "new\n", 4, 1), TP_OK);
    struct stat sb;
    ck_assert_int_eq(lstat(link, &sb), 0);
    ck_assert_msg(S_ISLNK(sb.st_mode), "the symbolic link was replaced by a file");
    char *t = slurp(target, NULL);
    ck_assert_str_eq(t, "new\n");
    free(t);

    P(fifo, "status.fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(tp_write_file_atomic(fifo, "x\n", 2, 1), TP_ERR_IO); /* no reader */
    ck_assert_msg(strstr(tp_error_message(), fifo) != NULL, "%s", tp_error_message());
    tp_error_clear();
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
    ck_assert_int_ge(rfd, 0);
    ck_assert_int_eq(tp_write_file_atomic(fifo, "{\"a\":3}\n", 8, 1), TP_OK);
    char buf[16] = {0};
    ck_assert_int_eq(read(rfd, buf, sizeof buf - 1), 8);
    ck_assert_str_eq(buf, "{\"a\":3}\n");
    close(rfd);
    ck_assert_int_eq(stat(fifo, &sb), 0);
    ck_assert_msg(S_ISFIFO(sb.st_mode), "the FIFO was replaced by a file");

    /* a dangling relative link: its target is made, the link stays */
    char dangling[PATH_MAX], made[PATH_MAX];
    P(dangling, "dangling.json");
    P(made, "made.json");
    ck_assert_int_eq(symlink("made.json", dangling), 0);
    ck_assert_int_eq(tp_write_file_atomic(dangling, "m\n", 2, 1), TP_OK);
    ck_assert_int_eq(lstat(dangling, &sb), 0);
    ck_assert_msg(S_ISLNK(sb.st_mode), "the dangling link was replaced by a file");
    t = slurp(made, NULL);
    ck_assert_str_eq(t, "m\n");
    free(t);

    /* /dev/stdout into a log file (as under Slurm): appended to, never renamed over */
    char log[PATH_MAX];
    P(log, "job.log");
    fflush(stdout);
    const int saved = dup(1), lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert(saved >= 0 && lfd >= 0);
    ck_assert_int_eq(dup2(lfd, 1), 1);
    ck_assert_int_eq(write(1, "line A\n", 7), 7);
    const tp_status through_stdout = tp_write_file_atomic("/dev/stdout", "{}\n", 3, 1);
    ck_assert_int_eq(write(1, "line B\n", 7), 7);
    dup2(saved, 1);
    close(saved);
    struct stat before, after;
    ck_assert_int_eq(fstat(lfd, &before), 0);
    close(lfd);
    ck_assert_int_eq(through_stdout, TP_OK);
    ck_assert_int_eq(stat(log, &after), 0);
    ck_assert_msg(before.st_ino == after.st_ino, "the log was replaced by the status file");
    t = slurp(log, NULL);
    ck_assert_str_eq(t, "line A\n{}\nline B\n");
    free(t);

    P(dir, "a-directory");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(tp_write_file_atomic(dir, "x", 1, 1), TP_ERR_IO);
    ck_assert_msg(strstr(tp_error_message(), "directory") != NULL, "%s", tp_error_message());
    ck_assert(!dir_has_temp_files(tmpdir));
}
END_TEST

/* ---------------------------------------------------------------------------
 * Resume */

static tp_output *resume_open(const char *out, const tp_manifest *m, tp_status want)
{
    tp_output_config c = cfg_for(out);
    c.resume = 1;
    tp_output *o = NULL;
    tp_status st = tp_output_open(&c, m, &o);
    ck_assert_msg(st == want, "open: %d, wanted %d: %s", st, want, tp_error_message());
    return o;
}

START_TEST(resume_torn_last_line)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    const char *good = "{\"id\":\"r0\"}\n{\"id\":\"r1\",\"text\":\"x\"}\n{\"id\":\"r2\"}\n";
    char buf[256];
    snprintf(buf, sizeof buf, "%s{\"id\":\"r3\",\"te", good);
    put_str(out, buf);
    tp_output *o = resume_open(out, NULL, TP_OK);
    ck_assert_int_eq(file_size(out), (long long)strlen(good));
    ck_assert_int_eq(tp_output_done_count(o), 3);
    ck_assert(tp_output_is_done(o, "r0") && tp_output_is_done(o, "r1") && tp_output_is_done(o, "r2"));
    ck_assert(!tp_output_is_done(o, "r3"));
    write_str(o, 0, "{\"id\":\"r3\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    char *t = slurp(out, NULL);
    snprintf(buf, sizeof buf, "%s{\"id\":\"r3\"}\n", good);
    ck_assert_str_eq(t, buf);
    free(t);

    /* a complete object without its newline is still a torn write */
    put_str(out, "{\"id\":\"r0\"}\n{\"id\":\"r1\"}");
    o = resume_open(out, NULL, TP_OK);
    ck_assert_int_eq(file_size(out), 12);
    ck_assert_int_eq(tp_output_done_count(o), 1);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);

    /* a torn line longer than the 1 MiB read chunk */
    size_t n = 3u << 20;
    char *big = malloc(n + 32);
    strcpy(big, "{\"id\":\"r0\"}\n{\"id\":\"r1\",\"t\":\"");
    size_t k = strlen(big);
    memset(big + k, 'z', n - k);
    put_file(out, big, n);
    free(big);
    o = resume_open(out, NULL, TP_OK);
    ck_assert_int_eq(file_size(out), 12);
    ck_assert_int_eq(tp_output_done_count(o), 1);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
}
END_TEST

START_TEST(resume_invalid_last_line)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    const char *good = "{\"id\":\"r0\"}\n{\"id\":\"r1\"}\n";
    const char *tails[] = {"{not json}\n", "[1,2]\n", "{\"id\":\"r2\"\n", "\"r2\"\n"};
    char buf[256];
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        snprintf(buf, sizeof buf, "%s%s", good, tails[i]);
        put_str(out, buf);
        tp_output *o = resume_open(out, NULL, TP_OK);
        ck_assert_int_eq(file_size(out), (long long)strlen(good));
        ck_assert_int_eq(tp_output_done_count(o), 2);
        ck_assert(!tp_output_is_done(o, "r2"));
        ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    }
    /* a tail of zero bytes (data blocks lost in a power cut), spanning "lines" */
    char z[64];
    size_t gl = strlen(good);
    memcpy(z, good, gl);
    memset(z + gl, 0, 10);
    z[gl + 4] = '\n';
    put_file(out, z, gl + 10);
    tp_output *o = resume_open(out, NULL, TP_OK);
    ck_assert_int_eq(file_size(out), (long long)gl);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
}
END_TEST

START_TEST(resume_refuses_bad_middle_line)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    const char *text = "{\"id\":\"r0\"}\n{garbage\n{\"id\":\"r2\"}\n";
    put_str(out, text);
    resume_open(out, NULL, TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "line 2"));
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, text); /* nothing cut */
    free(t);
}
END_TEST

START_TEST(resume_refuses_foreign_file)
{
    /* --resume --force (or no manifest) against a file that is not a JSONL output at all:
     * repairing its "torn tail" would delete it */
    char out[PATH_MAX];
    P(out, "README");
    const char *text = "# Notes\nnot json at all\n";
    put_str(out, text);
    tp_output_config c = cfg_for(out);
    c.resume = 1;
    c.force = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "does not look like a tpinfer output"));
    char *t = slurp(out, NULL);
    ck_assert_str_eq(t, text);
    free(t);
    /* but a first line torn by a crash (no newline yet) is repaired */
    put_str(out, "{\"id\":\"r0\",\"te");
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    ck_assert_int_eq(file_size(out), 0);
    ck_assert_int_eq(tp_output_done_count(o), 0);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
}
END_TEST

START_TEST(resume_collects_ids)
{
    char out[PATH_MAX], err[PATH_MAX];
    P(out, "out.jsonl");
    P(err, "errors.jsonl");
    /* OpenAI lines: custom_id wins over the per-line id */
    put_str(out,
            "{\"id\":\"batch_req_1\",\"custom_id\":\"request-1\",\"response\":{\"status_code\":200},\"error\":null}\n"
            "{\"id\":\"c1\",\"text\":\"compact\"}\n"
            "{\"id\":\"nul\",\"text\":\"a generated \\u0000 is valid JSON\"}\n"
            "{\"id\":\"e1\",\"line\":9,\"code\":\"invalid_request\",\"message\":\"m\"}\n"
            "{\"id\":\"e1\",\"line\":9,\"code\":\"invalid_request\",\"message\":\"counted once\"}\n"
            "\n"
            "{\"id\":42,\"text\":\"a numeric id\"}\n"
            "{\"text\":\"no id\"}\n"
            "{\"id\":\"c1\",\"text\":\"a duplicate\"}\n");
    put_str(err, "{\"id\":\"batch_req_2\",\"custom_id\":\"request-2\",\"response\":null,\"error\":{\"code\":\"x\"}}\n");
    tp_output_config c = cfg_for(out);
    c.errors_path = err;
    c.resume = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    ck_assert(tp_output_is_done(o, "request-1"));
    ck_assert(tp_output_is_done(o, "request-2"));
    ck_assert(tp_output_is_done(o, "c1"));
    ck_assert(tp_output_is_done(o, "42"));
    ck_assert(tp_output_is_done(o, "nul")); /* a NUL in the text: the line is whole */
    ck_assert(!tp_output_is_done(o, "batch_req_1"));
    ck_assert(!tp_output_is_done(o, "request-3"));
    ck_assert(!tp_output_is_done(o, ""));
    ck_assert(!tp_output_is_done(o, NULL));
    ck_assert_int_eq(tp_output_done_count(o), 6);
    /* error records: the compact line's code and OpenAI's error (not "error": null) */
    ck_assert_int_eq(tp_output_done_errors(o), 2);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    ck_assert_int_eq(tp_output_is_done(NULL, "x"), 0);
    ck_assert_int_eq(tp_output_done_count(NULL), 0);

    /* many ids, each twice: a set */
    enum { N = 20000 };
    FILE *f = fopen(out, "w");
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < N; i++) fprintf(f, "{\"custom_id\":\"req-%d\",\"x\":%d}\n", i, rep);
    fclose(f);
    put_str(err, "");
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    ck_assert_int_eq(tp_output_done_count(o), N);
    char id[32];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "req-%d", i);
        ck_assert(tp_output_is_done(o, id));
        snprintf(id, sizeof id, "req-%d", N + i);
        ck_assert(!tp_output_is_done(o, id));
    }
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
}
END_TEST

START_TEST(resume_finished_job)
{
    char in[PATH_MAX], out[PATH_MAX], man[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n");
    P(out, "out.jsonl");
    P(man, "out.jsonl.manifest.json");
    tp_manifest m = manifest_for(in, NULL);
    tp_output *o = resume_open(out, &m, TP_OK); /* --resume on a first run = fresh */
    write_str(o, 0, "{\"id\":\"a\"}", 0);
    write_str(o, 1, "{\"id\":\"b\"}", 0);
    write_str(o, 2, "{\"id\":\"c\"}", 1);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    char *before = slurp(out, NULL);

    o = resume_open(out, &m, TP_OK);
    ck_assert_int_eq(tp_output_done_count(o), 3);
    ck_assert(tp_output_is_done(o, "a") && tp_output_is_done(o, "b") && tp_output_is_done(o, "c"));
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK); /* nothing to do */
    char *after = slurp(out, NULL);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
    json_t *j = load_json(man);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "completed");
    json_decref(j);
}
END_TEST

START_TEST(resume_refuses_changed_input)
{
    char in[PATH_MAX], out[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    P(out, "out.jsonl");
    tp_manifest m = manifest_for(in, NULL);
    tp_output_config c = cfg_for(out);
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_OK);
    write_str(o, 0, "{\"id\":\"a\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    char *before = slurp(out, NULL);

    /* a line added: the size differs */
    put_str(in, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n");
    tp_error_clear();
    resume_open(out, &m, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "input.size"));
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "--force"));

    /* the same size, other bytes: the hash differs */
    put_str(in, "{\"id\":\"x\"}\n{\"id\":\"y\"}\n");
    tp_error_clear();
    resume_open(out, &m, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "input.hash"));
    char *after = slurp(out, NULL);
    ck_assert_str_eq(before, after);
    free(after);

    /* --force: warn and continue */
    c.resume = 1;
    c.force = 1;
    tp_error_clear();
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_OK);
    ck_assert(tp_output_is_done(o, "a"));
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    after = slurp(out, NULL);
    ck_assert_str_eq(before, after);
    free(after);
    free(before);

    /* and the manifest now records the new input: a plain resume is accepted */
    o = resume_open(out, &m, TP_OK);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
}
END_TEST

START_TEST(resume_refuses_changed_settings_or_model)
{
    char in[PATH_MAX], out[PATH_MAX], p[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\"}\n");
    P(out, "out.jsonl");
    tp_manifest m = manifest_for(in, NULL);
    tp_output_config c = cfg_for(out);
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_OK);
    write_str(o, 0, "{\"id\":\"a\"}", 0);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);

    tp_manifest m2 = manifest_for(in, "{\"temperature\": 0.7, \"max_tokens\": 16}");
    resume_open(out, &m2, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "settings.temperature"));

    tp_error_clear();
    tp_manifest m3 = manifest_for(in, "{\"temperature\": 0.0, \"max_tokens\": 16, \"seed\": 5}");
    resume_open(out, &m3, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "settings.seed"));

    tp_error_clear();
    tp_manifest m4 = manifest_for(in, "{\"temperature\": 0.0}");
    resume_open(out, &m4, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "settings.max_tokens"));

    /* a different tpinfer version is allowed (a warning) */
    tp_manifest m5 = m;
    m5.tpinfer_version = "0.2.0";
    o = resume_open(out, &m5, TP_OK);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);

    /* a changed weight file (its size) or config (its hash) */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", modeldir);
    put_str(p, "01234567890");
    tp_error_clear();
    resume_open(out, &m, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "model_files"));
    put_str(p, "0123456789");
    snprintf(p, sizeof p, "%s/config.json", modeldir);
    put_str(p, "{\"hidden_size\": 65}\n");
    tp_error_clear();
    resume_open(out, &m, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "config_hash"));

    /* a manifest that is not a JSON object (cut short, overwritten): refused, unless --force,
     * which goes on (the output's lines are kept) */
    char man[PATH_MAX];
    P(man, "out.jsonl.manifest.json");
    put_str(man, "{\"tpinfer_version\": \"0.1");
    tp_error_clear();
    resume_open(out, &m, TP_ERR_FORMAT);
    ck_assert_msg(strstr(tp_error_message(), "is not a valid manifest; --force overrides"), "%s", tp_error_message());
    tp_output_config cf = cfg_for(out);
    cf.resume = 1;
    cf.force = 1;
    tp_error_clear();
    ck_assert_msg(tp_output_open(&cf, &m, &o) == TP_OK, "%s", tp_error_message());
    ck_assert_int_eq(tp_output_done_count(o), 1);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
}
END_TEST

START_TEST(resume_without_prior_output_is_fresh)
{
    char in[PATH_MAX], out[PATH_MAX], man[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\"}\n");
    P(out, "out.jsonl");
    P(man, "out.jsonl.manifest.json");
    tp_manifest m = manifest_for(in, NULL);
    tp_output *o = resume_open(out, &m, TP_OK);
    ck_assert_int_eq(tp_output_done_count(o), 0);
    ck_assert_int_eq(file_size(out), 0);
    ck_assert_int_ge(file_size(man), 10);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);

    /* an empty output and a manifest of some other run: still a fresh start */
    tp_manifest other = manifest_for(in, "{\"temperature\": 1.5}");
    o = resume_open(out, &other, TP_OK);
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
    json_t *j = load_json(man);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "settings"), "max_tokens")), 0);
    ck_assert(json_real_value(json_object_get(json_object_get(j, "settings"), "temperature")) == 1.5);
    json_decref(j);
}
END_TEST

START_TEST(resume_needs_manifest)
{
    char in[PATH_MAX], out[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\"}\n");
    P(out, "out.jsonl");
    put_str(out, "{\"id\":\"a\"}\n");
    tp_manifest m = manifest_for(in, NULL);
    resume_open(out, &m, TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "manifest"));
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "--force"));
    tp_output_config c = cfg_for(out);
    c.resume = 1;
    c.force = 1;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, &m, &o), TP_OK);
    ck_assert(tp_output_is_done(o, "a"));
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
}
END_TEST

/* ---------------------------------------------------------------------------
 * Disk full, sync */

START_TEST(disk_full_is_a_clear_error)
{
    if (access("/dev/full", W_OK) != 0) return;
    char in[PATH_MAX];
    make_input(in, sizeof in, "{\"id\":\"a\"}\n");
    tp_manifest m = manifest_for(in, NULL);
    for (int with_manifest = 0; with_manifest < 2; with_manifest++) {
        tp_error_clear();
        tp_output_config c = cfg_for("/dev/full");
        c.overwrite = 1;
        c.sync_seconds = 0;
        tp_output *o;
        ck_assert_int_eq(tp_output_open(&c, with_manifest ? &m : NULL, &o), TP_OK);
        ck_assert_int_eq(tp_output_write(o, 0, "{\"id\":\"a\"}", 10, 0), TP_ERR_IO);
        ck_assert_ptr_nonnull(strstr(tp_error_message(), "/dev/full"));
        ck_assert_ptr_nonnull(strstr(tp_error_message(), "disk full?"));
        ck_assert_int_eq(tp_output_write(o, 1, "{\"id\":\"b\"}", 10, 0), TP_ERR_IO); /* sticky */
        ck_assert_int_eq(tp_output_maybe_sync(o), TP_ERR_IO);
        ck_assert_int_eq(tp_output_close(o, 1), TP_ERR_IO);
    }
    ck_assert_int_eq(access("/dev/full.manifest.json", F_OK), -1);
}
END_TEST

START_TEST(partial_write_is_rolled_back)
{
    /* RLIMIT_FSIZE makes write(2) stop short at the limit, then fail with EFBIG. It is set
     * in a child: check's own result file must not hit the limit. */
    char out[PATH_MAX];
    P(out, "out.jsonl");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1000, 1000};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
        tp_output_config c = cfg_for(out);
        tp_output *o;
        if (tp_output_open(&c, NULL, &o) != TP_OK) _exit(11);
        char line[300];
        memset(line, 'x', sizeof line);
        memcpy(line, "{\"id\":\"", 7);
        memcpy(line + 8, "\",\"t\":\"", 7);
        memcpy(line + 297, "\"}", 2);
        for (int i = 0; i < 3; i++) {
            line[7] = (char)('0' + i);
            if (tp_output_write(o, i, line, 299, 0) != TP_OK) _exit(12);
        }
        if (file_size(out) != 900) _exit(13);
        line[7] = '3';
        if (tp_output_write(o, 3, line, 299, 0) != TP_ERR_IO) _exit(14);
        if (!strstr(tp_error_message(), "ulimit")) _exit(15);
        if (!strstr(tp_error_message(), "partial line was removed")) _exit(16);
        if (file_size(out) != 900) _exit(17); /* whole lines only */
        if (tp_output_close(o, 1) != TP_ERR_IO) _exit(18);
        _exit(0);
    }
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert(WIFEXITED(ws));
    ck_assert_int_eq(WEXITSTATUS(ws), 0);
    ck_assert_int_eq(file_size(out), 900);
    tp_output *o = resume_open(out, NULL, TP_OK);
    ck_assert_int_eq(tp_output_done_count(o), 3);
    ck_assert(tp_output_is_done(o, "2") && !tp_output_is_done(o, "3"));
    ck_assert_int_eq(tp_output_close(o, 0), TP_OK);
}
END_TEST

/* output.c's fdatasync calls land here (this program's definition comes before libc's): a
 * test can hold them, as a busy file system does, or fail them, as a dying disk does. */
static atomic_int sync_held, sync_entered, sync_fails;

int fdatasync(int fd)
{
    atomic_fetch_add(&sync_entered, 1);
    while (atomic_load(&sync_held)) nanosleep(&(struct timespec){0, 1000000}, NULL);
    if (atomic_load(&sync_fails)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fdatasync, fd);
}

/* A timed fdatasync that does not return holds up no write: the syncer thread waits in it
 * (were the writer's own thread to sync, the loop below would never end and check's
 * timeout fails the test). Released, every line is in the file. */
START_TEST(slow_sync_does_not_hold_writes)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    tp_output_config c = cfg_for(out);
    c.sync_seconds = 0.01;
    tp_output *o;
    ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
    atomic_store(&sync_held, 1);
    write_str(o, 0, "{\"id\":\"x\"}", 0);
    while (atomic_load(&sync_entered) == 0) nanosleep(&(struct timespec){0, 1000000}, NULL);
    for (int i = 1; i < 200; i++) {
        write_str(o, i, "{\"id\":\"x\"}", 0);
        ck_assert_int_eq(tp_output_maybe_sync(o), TP_OK);
    }
    ck_assert_int_eq(atomic_load(&sync_entered), 1); /* the writes did not sync */
    atomic_store(&sync_held, 0);
    ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
    ck_assert_int_ge(atomic_load(&sync_entered), 2); /* close syncs what came after */
    ck_assert_int_eq(file_size(out), 200 * 11);
}
END_TEST

/* The syncer's failed fdatasync reaches the writer: the next maybe_sync, write and close
 * fail, naming the file; with sync_seconds 0 the write that was not synced fails at once. */
START_TEST(failed_sync_is_sticky)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    atomic_store(&sync_fails, 1);
    for (int every_line = 0; every_line < 2; every_line++) {
        tp_error_clear();
        tp_output_config c = cfg_for(out);
        c.overwrite = 1;
        c.sync_seconds = every_line ? 0 : 0.01;
        tp_output *o;
        ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
        tp_status st = tp_output_write(o, 0, "{\"id\":\"a\"}", 10, 0);
        if (every_line) {
            ck_assert_int_eq(st, TP_ERR_IO);
        } else {
            ck_assert_int_eq(st, TP_OK);
            for (int i = 0; i < 5000 && st == TP_OK; i++) {
                nanosleep(&(struct timespec){0, 1000000}, NULL);
                st = tp_output_maybe_sync(o);
            }
            ck_assert_int_eq(st, TP_ERR_IO);
        }
        ck_assert_ptr_nonnull(strstr(tp_error_message(), "fdatasync of"));
        ck_assert_ptr_nonnull(strstr(tp_error_message(), out));
        ck_assert_int_eq(tp_output_write(o, 1, "{\"id\":\"b\"}", 10, 0), TP_ERR_IO);
        ck_assert_int_eq(tp_output_maybe_sync(o), TP_ERR_IO);
        ck_assert_int_eq(tp_output_close(o, 1), TP_ERR_IO);
    }
    atomic_store(&sync_fails, 0);
}
END_TEST

START_TEST(sync_cadence)
{
    char out[PATH_MAX];
    P(out, "out.jsonl");
    double cadences[] = {0.0, 2.0, 1e9, -1.0, NAN};
    for (size_t k = 0; k < sizeof cadences / sizeof cadences[0]; k++) {
        tp_output_config c = cfg_for(out);
        c.overwrite = 1;
        c.sync_seconds = cadences[k]; /* 0: fdatasync after every line; < 0 or NaN: the default 2 s */
        tp_output *o;
        ck_assert_int_eq(tp_output_open(&c, NULL, &o), TP_OK);
        for (int i = 0; i < 50; i++) {
            write_str(o, i, "{\"id\":\"x\"}", 0);
            ck_assert_int_eq(tp_output_maybe_sync(o), TP_OK);
        }
        ck_assert_int_eq(tp_output_close(o, 1), TP_OK);
        ck_assert_int_eq(file_size(out), 50 * 11);
    }
    ck_assert_int_eq(tp_output_maybe_sync(NULL), TP_OK);
}
END_TEST

/* ---------------------------------------------------------------------------
 * Progress */

START_TEST(percentiles_nearest_rank)
{
    double a[10];
    for (int i = 0; i < 10; i++) a[i] = i + 1;
    ck_assert(tp_percentile(a, 10, 50) == 5);
    ck_assert(tp_percentile(a, 10, 90) == 9);
    ck_assert(tp_percentile(a, 10, 99) == 10);
    ck_assert(tp_percentile(a, 10, 100) == 10);
    ck_assert(tp_percentile(a, 10, 0) == 1);
    ck_assert(tp_percentile(a, 10, 10) == 1);
    ck_assert(tp_percentile(a, 10, 11) == 2);
    double b[100];
    for (int i = 0; i < 100; i++) b[i] = (i + 1) * 0.5;
    ck_assert(tp_percentile(b, 100, 50) == 25);
    ck_assert(tp_percentile(b, 100, 90) == 45);
    ck_assert(tp_percentile(b, 100, 99) == 49.5);
    double one = 3.25;
    ck_assert(tp_percentile(&one, 1, 50) == 3.25 && tp_percentile(&one, 1, 99) == 3.25);
    ck_assert(isnan(tp_percentile(a, 0, 50)));
    double c3[3] = {1, 2, 3};
    ck_assert(tp_percentile(c3, 3, 50) == 2); /* ceil(1.5) = 2 */
    ck_assert(tp_percentile(c3, 3, 99) == 3);
}
END_TEST

static int status_ok(const char *path, const char *want_status)
{
    char *text = NULL;
    size_t len = 0;
    if (tp_read_file(path, 1 << 20, &text, &len) != TP_OK) return 0;
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    free(text);
    int ok = json_is_object(j) && !strcmp(json_string_value(json_object_get(j, "object")), "batch") &&
             (!want_status || !strcmp(json_string_value(json_object_get(j, "status")), want_status));
    json_decref(j);
    return ok;
}

START_TEST(status_file_content)
{
    char sp[PATH_MAX];
    P(sp, "status.json");
    tp_progress *p;
    ck_assert_int_eq(tp_progress_create(10, sp, 0, 3600, &p), TP_OK);
    json_t *j = load_json(sp);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "batch");
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "in_progress");
    json_t *rc = json_object_get(j, "request_counts");
    ck_assert_int_eq(json_integer_value(json_object_get(rc, "total")), 10);
    ck_assert_int_eq(json_integer_value(json_object_get(rc, "completed")), 0);
    ck_assert(json_is_integer(json_object_get(j, "created_at")));
    ck_assert(json_is_integer(json_object_get(j, "in_progress_at")));
    ck_assert(json_is_null(json_object_get(j, "completed_at")));
    ck_assert(json_is_null(json_object_get(j, "cancelled_at")));
    ck_assert(json_is_null(json_object_get(j, "eta_seconds")));
    json_decref(j);

    tp_progress_request_done(p, 0, 100, 20, 0.05, 0.01);
    tp_progress_request_done(p, 0, 50, 30, 0.07, 0.02);
    tp_progress_request_done(p, 1, 7, 0, NAN, NAN);
    ck_assert_int_eq(tp_progress_update(p, 0), TP_OK); /* interval not reached: no rewrite */
    j = load_json(sp);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "request_counts"), "completed")), 0);
    json_decref(j);
    ck_assert_int_eq(tp_progress_update(p, 1), TP_OK);
    j = load_json(sp);
    rc = json_object_get(j, "request_counts");
    ck_assert_int_eq(json_integer_value(json_object_get(rc, "total")), 10);
    ck_assert_int_eq(json_integer_value(json_object_get(rc, "completed")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(rc, "failed")), 1);
    json_t *u = json_object_get(j, "usage");
    ck_assert_int_eq(json_integer_value(json_object_get(u, "input_tokens")), 157);
    ck_assert_int_eq(json_integer_value(json_object_get(u, "output_tokens")), 50);
    ck_assert_int_eq(json_integer_value(json_object_get(u, "total_tokens")), 207);
    ck_assert(json_is_integer(json_object_get(j, "eta_seconds")));
    json_t *tput = json_object_get(j, "throughput");
    ck_assert(json_is_number(json_object_get(tput, "input_tokens_per_s")));
    ck_assert(json_is_number(json_object_get(tput, "output_tokens_per_s")));
    json_decref(j);

    fflush(stderr);
    ck_assert_int_eq(tp_progress_finish(p, TP_PROGRESS_COMPLETED), TP_OK);
    j = load_json(sp);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "completed");
    ck_assert(json_is_integer(json_object_get(j, "completed_at")));
    ck_assert(json_is_null(json_object_get(j, "cancelled_at")));
    json_decref(j);
    ck_assert(!dir_has_temp_files(tmpdir));
    tp_progress_destroy(p);

    ck_assert_int_eq(tp_progress_create(5, sp, 0, 3600, &p), TP_OK);
    ck_assert_int_eq(tp_progress_finish(p, TP_PROGRESS_CANCELLED), TP_OK);
    j = load_json(sp);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "cancelled");
    ck_assert(json_is_integer(json_object_get(j, "cancelled_at")));
    ck_assert(json_is_null(json_object_get(j, "completed_at")));
    json_decref(j);
    tp_progress_destroy(p);

    ck_assert_int_eq(tp_progress_create(5, sp, 0, 3600, &p), TP_OK);
    ck_assert_int_eq(tp_progress_finish(p, TP_PROGRESS_FAILED), TP_OK);
    ck_assert(status_ok(sp, "failed"));
    tp_progress_destroy(p);

    /* no status file; a bad status directory */
    ck_assert_int_eq(tp_progress_create(5, NULL, 0, 1, &p), TP_OK);
    ck_assert_int_eq(tp_progress_finish(p, 0), TP_OK);
    tp_progress_destroy(p);
    tp_progress_destroy(NULL);
    P(sp, "nope/status.json");
    ck_assert_int_eq(tp_progress_create(5, sp, 0, 1, &p), TP_ERR_IO);
    ck_assert_int_eq(tp_progress_create(-1, NULL, 0, 1, &p), TP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(status_file_always_whole)
{
    char sp[PATH_MAX], stop[PATH_MAX];
    P(sp, "status.json");
    P(stop, "stop");
    tp_progress *p;
    ck_assert_int_eq(tp_progress_create(100000, sp, 0, 0, &p), TP_OK);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* a monitor: every read must be whole JSON */
        long reads = 0;
        while (access(stop, F_OK) != 0) {
            if (!status_ok(sp, NULL)) _exit(1);
            reads++;
        }
        _exit(reads > 0 ? 0 : 2);
    }
    int saved = dup(2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2); /* the progress lines */
    close(devnull);
    tp_status st = TP_OK;
    for (int i = 0; i < 3000 && st == TP_OK; i++) {
        tp_progress_request_done(p, i % 7 == 0, 1000 + i, 10 * i, 0.01, 0.001);
        st = tp_progress_update(p, 1);
    }
    dup2(saved, 2);
    close(saved);
    put_str(stop, "");
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_int_eq(st, TP_OK);
    ck_assert(WIFEXITED(ws));
    ck_assert_int_eq(WEXITSTATUS(ws), 0);
    tp_progress_destroy(p);
}
END_TEST

static int saved_stderr = -1;
static char capture_path[PATH_MAX];

static void capture_begin(void)
{
    P(capture_path, "stderr.txt");
    fflush(stderr);
    saved_stderr = dup(2);
    int fd = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    return slurp(capture_path, NULL);
}

static int matches(const char *re, const char *s)
{
    regex_t r;
    ck_assert_int_eq(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0);
    int ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

/* A status file that stops taking writes after the run started (a FIFO whose reader went
 * away; a disk that filled): one warning, the updates go on returning TP_OK. */
START_TEST(status_update_failure_warns_once)
{
    char sp[PATH_MAX];
    P(sp, "status.fifo");
    ck_assert_int_eq(mkfifo(sp, 0600), 0);
    int rfd = open(sp, O_RDONLY | O_NONBLOCK);
    ck_assert_int_ge(rfd, 0);
    tp_progress *p;
    ck_assert_int_eq(tp_progress_create(10, sp, 0, 0, &p), TP_OK); /* the first write: a reader */
    close(rfd);
    capture_begin();
    tp_progress_request_done(p, 0, 10, 5, 0.01, 0.001);
    const tp_status a = tp_progress_update(p, 1), b = tp_progress_update(p, 1);
    char *err = capture_end();
    ck_assert_int_eq(a, TP_OK);
    ck_assert_int_eq(b, TP_OK);
    ck_assert_msg(matches("warning: the status file is not being updated: cannot open .*status.fifo.*; the run goes on", err),
                  "%s", err);
    ck_assert_msg(strstr(strstr(err, "not being updated") + 1, "not being updated") == NULL, "warned twice: %s", err);
    ck_assert_str_eq(tp_error_message(), "");
    free(err);
    tp_progress_destroy(p);
}
END_TEST

START_TEST(progress_line_format)
{
    tp_progress *p;
    char line[512];
    ck_assert_int_eq(tp_progress_create(10, NULL, 0, 3600, &p), TP_OK);
    tp_progress_format(p, line, sizeof line);
    ck_assert_msg(matches("^progress: 0/10 done \\(0 failed\\), 0 in tok/s, 0 out tok/s, ETA --:--:--$", line),
                  "%s", line);
    tp_progress_request_done(p, 0, 100, 20, 0.05, 0.01);
    tp_progress_request_done(p, 0, 50, 30, 0.07, 0.02);
    tp_progress_request_done(p, 1, 7, 0, NAN, NAN);
    tp_progress_format(p, line, sizeof line);
    ck_assert_msg(matches("^progress: 3/10 done \\(1 failed\\), [0-9]+ in tok/s, [0-9]+ out tok/s, "
                          "ETA [0-9]{2,}:[0-5][0-9]:[0-5][0-9]$",
                          line),
                  "%s", line);

    capture_begin();
    ck_assert_int_eq(tp_progress_update(p, 1), TP_OK);
    ck_assert_int_eq(tp_progress_update(p, 0), TP_OK); /* within the interval: silent */
    char *err = capture_end();
    ck_assert_msg(matches("^tpinfer\\[[^]]*\\]: info: progress: 3/10 done \\(1 failed\\), [0-9]+ in tok/s, "
                          "[0-9]+ out tok/s, ETA [0-9:]+\n$",
                          err),
                  "%s", err);
    free(err);

    for (int i = 0; i < 7; i++) tp_progress_request_done(p, 0, 1, 2, 0.01 * (i + 1), 0.001);
    tp_progress_format(p, line, sizeof line);
    ck_assert_msg(matches("^progress: 10/10 done \\(1 failed\\), .* ETA 00:00:00$", line), "%s", line);
    tp_progress_destroy(p);
}
END_TEST

START_TEST(progress_bar_and_summary)
{
    tp_progress *p;
    ck_assert_int_eq(tp_progress_create(10, NULL, 1, 0, &p), TP_OK);
    capture_begin();
    for (int i = 0; i < 10; i++) {
        tp_progress_request_done(p, 0, 10, 5, 0.01 * (i + 1), 0.001 * (10 - i));
        ck_assert_int_eq(tp_progress_update(p, 0), TP_OK);
    }
    char *err = capture_end();
    ck_assert_ptr_nonnull(strchr(err, '\r'));
    ck_assert_ptr_null(strchr(err, '\n')); /* redrawn in place */
    ck_assert_ptr_nonnull(strstr(err, "10/10 (0 failed)"));
    ck_assert_ptr_nonnull(strstr(err, "[##############################] 100%"));
    free(err);
    capture_begin();
    ck_assert_int_eq(tp_progress_finish(p, 0), TP_OK);
    ck_assert_int_eq(tp_progress_finish(p, 0), TP_OK); /* once */
    err = capture_end();
    ck_assert_int_eq(err[0], '\r');
    ck_assert_msg(strstr(err, "summary (completed): 10 requests: 10 completed, 0 failed; wall time 00:00:00") != NULL,
                  "%s", err);
    ck_assert_msg(strstr(err, "summary: tokens: 100 prompt, 50 completion;") != NULL, "%s", err);
    /* nearest rank over 10, 20, ..., 100 ms and 1, 2, ..., 10 ms */
    ck_assert_msg(strstr(err, "time to first token 50.00/90.00/100.00 ms (10 requests), "
                              "inter-token latency 5.00/9.00/10.00 ms (10 requests)") != NULL,
                  "%s", err);
    ck_assert_int_eq(count_lines(err), 4);
    free(err);
    tp_progress_destroy(p);

    /* no samples: n/a; interrupted: what is left */
    ck_assert_int_eq(tp_progress_create(4, NULL, 0, 0, &p), TP_OK);
    tp_progress_request_done(p, 1, 3, 0, 0, 0);
    capture_begin();
    ck_assert_int_eq(tp_progress_finish(p, TP_PROGRESS_CANCELLED), TP_OK);
    err = capture_end();
    ck_assert_msg(strstr(err, "summary (cancelled): 4 requests: 0 completed, 1 failed, 3 not done") != NULL, "%s",
                  err);
    ck_assert_msg(strstr(err, "time to first token n/a (0 requests)") != NULL, "%s", err);
    free(err);
    tp_progress_destroy(p);
}
END_TEST

static Suite *output_suite(void)
{
    Suite *s = suite_create("output");
    TCase *t = tcase_create("output");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 60);
    tcase_add_test(t, hash_file_fnv1a);
    tcase_add_test(t, writes_whole_lines);
    tcase_add_test(t, ordered_holds_early_lines);
    tcase_add_test(t, ordered_many_shuffled);
    tcase_add_test(t, unordered_writes_at_once);
    tcase_add_test(t, errors_file_split);
    tcase_add_test(t, bad_write_arguments);
    tcase_add_test(t, ordered_close_with_held_lines);
    tcase_add_test(t, stdout_output);
    tcase_add_test(t, refuse_existing_output);
    tcase_add_test(t, refuse_output_is_input);
    tcase_add_test(t, refuse_missing_directory);
    tcase_add_test(t, refuse_unwritable_directory);
    tcase_add_test(t, refuse_second_writer);
    tcase_add_test(t, manifest_fields);
    tcase_add_test(t, atomic_replace_helper);
    tcase_add_test(t, atomic_replace_special_paths);
    tcase_add_test(t, resume_torn_last_line);
    tcase_add_test(t, resume_invalid_last_line);
    tcase_add_test(t, resume_refuses_bad_middle_line);
    tcase_add_test(t, resume_refuses_foreign_file);
    tcase_add_test(t, resume_collects_ids);
    tcase_add_test(t, resume_finished_job);
    tcase_add_test(t, resume_refuses_changed_input);
    tcase_add_test(t, resume_refuses_changed_settings_or_model);
    tcase_add_test(t, resume_without_prior_output_is_fresh);
    tcase_add_test(t, resume_needs_manifest);
    tcase_add_test(t, disk_full_is_a_clear_error);
    tcase_add_test(t, partial_write_is_rolled_back);
    tcase_add_test(t, sync_cadence);
    tcase_add_test(t, slow_sync_does_not_hold_writes);
    tcase_add_test(t, failed_sync_is_sticky);
    suite_add_tcase(s, t);

    TCase *pr = tcase_create("progress");
    tcase_add_checked_fixture(pr, setup, teardown);
    tcase_set_timeout(pr, 60);
    tcase_add_test(pr, percentiles_nearest_rank);
    tcase_add_test(pr, status_file_content);
    tcase_add_test(pr, status_file_always_whole);
    tcase_add_test(pr, status_update_failure_warns_once);
    tcase_add_test(pr, progress_line_format);
    tcase_add_test(pr, progress_bar_and_summary);
    suite_add_tcase(s, pr);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(output_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
