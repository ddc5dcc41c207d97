#!/bin/sh
# The MPI collectives of tp_comm on 4 ranks (a 2 x 2 grid).
. "$top_srcdir/tests/lib.sh"
CK_FORK=no mpi 4 "$top_builddir/tests/check_comm"
