/*
 * main.c: tpinfer's entry point. Parses the command line on every rank (so every rank
 * reaches the same verdict without talking), builds the rank grid, and is the only
 * place that ends the job: a clean exit when all ranks agree, MPI_Abort otherwise.
 */
#include "config.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "check_mode.h"
#include "comm_mpi.h"
#include "device.h"
#include "dry_run.h"
#include "engine.h"
#include "log.h"
#include "options.h"
#include "status.h"
#include "tokenize_mode.h"

/* 4: the run finished, but some requests got error records (scripts tell it from 1, a fatal failure) */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_INTERRUPTED = 3, EXIT_REQUEST_ERRORS = 4 };

static int exit_code(tp_status st)
{
    return st == TP_OK ? EXIT_OK : st == TP_ERR_INVALID_ARG ? EXIT_USAGE : EXIT_FAIL;
}

/* What to do about a failure of this kind, after its message ("" where the message says it). */
static const char *advice(tp_status st)
{
    return st == TP_ERR_NUMERIC ? " (the model computed NaN or Inf: its weights may hold such values (check the "
                                  "checkpoint), or its activations passed float16's range (--dtype bfloat16 or float32))"
                                : "";
}

/* Print this rank's failure: every failing rank speaks, except that when all ranks
 * failed (the usual case: same files, same flags) only rank 0 does. */
static void report(tp_status st, int rank, int n_failed, int world)
{
    if (st == TP_OK || !*tp_error_message()) return;
    if (n_failed == world && rank != 0) return;
    if (world > 1)
        tp_log(TP_LOG_ERROR, "%s%s", tp_error_message(), advice(st));
    else
        fprintf(stderr, "tpinfer: %s%s\n", tp_error_message(), advice(st));
    tp_log(TP_LOG_DEBUG, "(recorded at %s: %s)", tp_error_where(), tp_status_str(st));
}

static void abort_job(tp_status st, int rank)
{
    tp_log(TP_LOG_ERROR, "%s%s; ending all ranks", *tp_error_message() ? tp_error_message() : tp_status_str(st),
           advice(st));
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, exit_code(st));
}

static int run(const tp_options *o, int rank, int world_size)
{
    tp_grid layout;
    tp_status st = tp_grid_layout(world_size, rank, o->tp, o->pp, &layout);
    if (st != TP_OK) { /* every rank computes the same verdict */
        report(st, rank, world_size, world_size);
        return exit_code(st);
    }
    tp_mpi_world world;
    st = tp_mpi_world_create(o->tp, o->pp, &world);
    if (st != TP_OK) abort_job(st, rank);

    tp_device_info dev;
    tp_status mine = tp_device_query(world.grid.local_rank, &dev);
    int n_failed = 0, n_usage = 0;
    if (tp_mpi_agree(world.world, mine, &n_failed, &n_usage) != TP_OK) abort_job(TP_ERR_MPI, rank);
    if (n_failed) {
        report(mine, rank, n_failed, world_size);
        tp_mpi_world_free(&world);
        return EXIT_FAIL;
    }

    int64_t request_errors = 0;
    int interrupted = 0;
    if (o->mode == TP_MODE_DRY_RUN) {
        st = tp_dry_run(o, &world, &dev, stdout, &n_failed);
    } else if (o->mode == TP_MODE_CHECK) {
        int must_abort = 0;
        int64_t wrong = 0;
        st = tp_check(o, &world, &dev, stdout, &n_failed, &must_abort, &wrong);
        if (st != TP_OK && must_abort) abort_job(st, rank);
        if (st == TP_OK && wrong > 0) {
            if (rank == 0)
                tp_log(TP_LOG_ERROR, "--check: %lld wrong element(s) in the all-reduce results",
                       (long long)wrong);
            tp_mpi_world_free(&world);
            return EXIT_FAIL;
        }
    } else {
        int must_abort = 0;
        st = tp_generate(o, &world, &dev, &n_failed, &must_abort, &request_errors, &interrupted);
        if (st != TP_OK && must_abort) abort_job(st, rank);
    }
    report(st, rank, n_failed, world_size);
    tp_mpi_world_free(&world);
    if (st == TP_OK && interrupted) {
        if (rank == 0)
            tp_log(TP_LOG_WARN, "interrupted: the finished requests are in the output; run again with --resume");
        return EXIT_INTERRUPTED;
    }
    if (st == TP_OK && request_errors > 0) {
        if (rank == 0)
            tp_log(TP_LOG_WARN, "%lld request(s) failed; their lines in %s say why", (long long)request_errors,
                   o->errors ? o->errors : o->output ? o->output : "the output");
        return EXIT_REQUEST_ERRORS;
    }
    return exit_code(st);
}

int main(int argc, char **argv)
{
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "tpinfer: MPI_Init failed; is this an MPI launch (mpirun/srun)?\n");
        return EXIT_FAIL;
    }
    /* A closed pipe on --output - is an error to report, not a silent death. */
    signal(SIGPIPE, SIG_IGN);
    /* Errors come back as codes, so one rank's failure can be agreed on or aborted. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    tp_log_init(rank, size);

    tp_options o;
    int code;
    tp_status st = tp_options_parse(argc, argv, &o);
    if (st != TP_OK) {
        if (rank == 0) fprintf(stderr, "tpinfer: %s\n", tp_error_message());
        code = EXIT_USAGE;
    } else if (o.mode == TP_MODE_HELP) {
        if (rank == 0) tp_options_print_help(stdout);
        code = EXIT_OK;
    } else if (o.mode == TP_MODE_VERSION) {
        if (rank == 0) printf("tpinfer %s\n", PACKAGE_VERSION);
        code = EXIT_OK;
    } else if (o.mode == TP_MODE_TOKENIZE || o.mode == TP_MODE_DETOKENIZE) {
        /* no weights, no grid: rank 0 does it all */
        code = EXIT_OK;
        if (rank == 0) {
            st = tp_tokenize_run(o.model, o.input, o.output, o.mode == TP_MODE_DETOKENIZE, o.chat_template);
            if (st != TP_OK) fprintf(stderr, "tpinfer: %s\n", tp_error_message());
            code = exit_code(st);
        }
    } else {
        code = run(&o, rank, size);
    }
    fflush(NULL);
    MPI_Finalize();
    return code;
}
