/*
 * check_status.c: the first-failure message rule, status names, and util's strict
 * number parsing and file reads.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status.h"
#include "util.h"

START_TEST(first_error_wins)
{
    tp_error_clear();
    ck_assert_int_eq(tp_error(TP_ERR_FORMAT, "root cause %d", 1), TP_ERR_FORMAT);
    ck_assert_int_eq(tp_error(TP_ERR_IO, "consequence"), TP_ERR_IO);
    ck_assert_str_eq(tp_error_message(), "root cause 1");
    ck_assert_ptr_nonnull(strstr(tp_error_where(), "check_status.c:"));
    tp_error_clear();
    ck_assert_str_eq(tp_error_message(), "");
}
END_TEST

/* a prefix names what the user gave (an option and its file) before the root cause, whose
 * file:line stays; with nothing recorded it is the message; OK passes through untouched */
START_TEST(error_prefix)
{
    tp_error_clear();
    tp_error(TP_ERR_IO, "cannot open %s", "x.jinja");
    char where[256];
    snprintf(where, sizeof where, "%s", tp_error_where());
    ck_assert_int_eq(tp_error_prefix(TP_ERR_IO, "--chat-template %s", "x.jinja"), TP_ERR_IO);
    ck_assert_str_eq(tp_error_message(), "--chat-template x.jinja: cannot open x.jinja");
    ck_assert_str_eq(tp_error_where(), where);
    ck_assert_int_eq(tp_error_prefix(TP_OK, "never"), TP_OK);
    ck_assert_str_eq(tp_error_message(), "--chat-template x.jinja: cannot open x.jinja");
    tp_error_clear();
    ck_assert_int_eq(tp_error_prefix(TP_ERR_INTERNAL, "row %d", 3), TP_ERR_INTERNAL);
    ck_assert_str_eq(tp_error_message(), "row 3");
    /* a long cause is cut at its end, the prefix kept */
    char longer[3000];
    memset(longer, 'a', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    tp_error_clear();
    tp_error(TP_ERR_FORMAT, "%s", longer);
    tp_error_prefix(TP_ERR_FORMAT, "--opt f");
    ck_assert(!strncmp(tp_error_message(), "--opt f: aaa", 12));
    ck_assert_uint_eq(strlen(tp_error_message()), 2047);
    tp_error_clear();
}
END_TEST

START_TEST(status_names)
{
    for (int s = 0; s < TP_STATUS_COUNT; s++) ck_assert_str_ne(tp_status_str((tp_status)s), "unknown status");
    ck_assert_str_eq(tp_status_str(TP_STATUS_COUNT), "unknown status");
    ck_assert_str_eq(tp_status_str((tp_status)-1), "unknown status");
}
END_TEST

START_TEST(parse_numbers)
{
    int64_t v;
    double d;
    ck_assert(tp_parse_i64("42", &v) && v == 42);
    ck_assert(tp_parse_i64("-7", &v) && v == -7);
    ck_assert(!tp_parse_i64("2x", &v));
    ck_assert(!tp_parse_i64("", &v));
    ck_assert(!tp_parse_i64("1e3", &v));
    ck_assert(!tp_parse_i64("99999999999999999999", &v));
    ck_assert(tp_parse_i64(" 3", &v) && v == 3); /* strtoll skips leading space: accepted */
    ck_assert(!tp_parse_i64("3 ", &v));          /* but nothing may follow the number */
    ck_assert(tp_parse_double("0.5", &d) && d == 0.5);
    ck_assert(!tp_parse_double("nan", &d));
    ck_assert(!tp_parse_double("inf", &d));
    ck_assert(!tp_parse_double("0.5.1", &d));
    ck_assert(!tp_parse_double("1e999", &d));
}
END_TEST

START_TEST(read_file_errors)
{
    char *buf;
    size_t len;
    tp_error_clear();
    ck_assert_int_eq(tp_read_file("/nonexistent/x", 100, &buf, &len), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "/nonexistent/x"));
    tp_error_clear();
    ck_assert_int_eq(tp_read_file("/", 100, &buf, &len), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "not a regular file"));
    /* a FIFO with no writer: refused at once, not waited on */
    char fifo[] = "/tmp/tp_status_fifo_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(fifo));
    char *named = malloc(sizeof fifo + 8);
    ck_assert_ptr_nonnull(named);
    strcpy(named, fifo);
    strcat(named, "/fifo");
    ck_assert_int_eq(mkfifo(named, 0600), 0);
    tp_error_clear();
    ck_assert_int_eq(tp_read_file(named, 100, &buf, &len), TP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "not a regular file"));
    unlink(named);
    rmdir(fifo);
    free(named);
    char path[] = "/tmp/tp_status_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "hello", 5), 5);
    close(fd);
    tp_error_clear();
    ck_assert_int_eq(tp_read_file(path, 4, &buf, &len), TP_ERR_FORMAT);
    tp_error_clear();
    ck_assert_int_eq(tp_read_file(path, 5, &buf, &len), TP_OK);
    ck_assert_uint_eq(len, 5);
    ck_assert_str_eq(buf, "hello");
    free(buf);
    unlink(path);
}
END_TEST

START_TEST(path_join)
{
    char *p = tp_path_join("a/b", "c.json");
    ck_assert_str_eq(p, "a/b/c.json");
    free(p);
    p = tp_path_join("a/b/", "c.json");
    ck_assert_str_eq(p, "a/b/c.json");
    free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("status");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, first_error_wins);
    tcase_add_test(tc, error_prefix);
    tcase_add_test(tc, status_names);
    tcase_add_test(tc, parse_numbers);
    tcase_add_test(tc, read_file_errors);
    tcase_add_test(tc, path_join);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
