/*
 * op_profile.h: TPINFER_PROFILE_OPS=1 wraps the CUDA backend's table with per-operation
 * GPU timing (cuda/op_profile.c).
 */
#ifndef TP_OP_PROFILE_H
#define TP_OP_PROFILE_H

#include "backend.h"

/* When TPINFER_PROFILE_OPS=1: b's operations are timed from now on, and b's destroy prints
 * the table. Otherwise nothing. */
void tp_cuda_op_profile_wrap(tp_backend *b);

#endif
