/*
 * check_grid.c: the dp x pp x tp layout: every rank gets distinct coordinates, TP groups
 * are consecutive ranks, and bad world sizes give a message that suggests a fix.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"

START_TEST(layout_is_a_bijection)
{
    for (int tp = 1; tp <= 8; tp++)
        for (int pp = 1; pp <= 4; pp++)
            for (int dp = 1; dp <= 3; dp++) {
                int world = tp * pp * dp;
                char *seen = calloc((size_t)world, 1);
                for (int r = 0; r < world; r++) {
                    tp_grid g;
                    ck_assert_int_eq(tp_grid_layout(world, r, tp, pp, &g), TP_OK);
                    ck_assert_int_eq(g.dp, dp);
                    ck_assert(g.tp_rank < tp && g.pp_rank < pp && g.dp_rank < dp);
                    ck_assert_int_eq(tp_grid_rank_of(&g, g.dp_rank, g.pp_rank, g.tp_rank), r);
                    /* TP groups are consecutive ranks */
                    ck_assert_int_eq(r / tp, g.dp_rank * pp + g.pp_rank);
                    int cell = (g.dp_rank * pp + g.pp_rank) * tp + g.tp_rank;
                    ck_assert(!seen[cell]);
                    seen[cell] = 1;
                }
                free(seen);
            }
}
END_TEST

START_TEST(bad_worlds)
{
    tp_grid g;
    tp_error_clear();
    ck_assert_int_eq(tp_grid_layout(3, 0, 2, 1, &g), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "multiple of 2"));
    tp_error_clear();
    ck_assert_int_eq(tp_grid_layout(2, 0, 2, 2, &g), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "needs 4 ranks but 2 were started"));
    tp_error_clear();
    ck_assert_int_eq(tp_grid_layout(6, 0, 2, 2, &g), TP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(tp_error_message(), "-np 4"));
    tp_error_clear();
    ck_assert_int_eq(tp_grid_layout(4, 0, 0, 1, &g), TP_ERR_INVALID_ARG);
    tp_error_clear();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grid");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, layout_is_a_bijection);
    tcase_add_test(tc, bad_worlds);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
