/*
 * block_alloc.h: the free list of physical KV cache blocks [0, n_blocks) that the
 * scheduler hands to sequences. LIFO and deterministic: a fresh allocator gives
 * 0, 1, 2, ... and a block given back is the next one handed out.
 */
#ifndef TP_BLOCK_ALLOC_H
#define TP_BLOCK_ALLOC_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_block_alloc tp_block_alloc;

tp_status tp_block_alloc_create(int32_t n_blocks, tp_block_alloc **out);
void tp_block_alloc_destroy(tp_block_alloc *a); /* accepts NULL */

/* A free block id, or -1 when none is free. */
int32_t tp_block_alloc_get(tp_block_alloc *a);

/* Give a block back. TP_ERR_INTERNAL for an id out of range or already free. */
tp_status tp_block_alloc_put(tp_block_alloc *a, int32_t block);

int32_t tp_block_alloc_n_free(const tp_block_alloc *a);
int32_t tp_block_alloc_n_blocks(const tp_block_alloc *a);

#ifdef __cplusplus
}
#endif
#endif
