/*
 * block_alloc.c: a stack of free block ids plus a used flag per block, so a double
 * free or a stray id is caught at once instead of corrupting another sequence's KV.
 */
#include "block_alloc.h"

#include <stdlib.h>

struct tp_block_alloc {
    int32_t n_blocks;
    int32_t n_free;
    int32_t *stack;  /* [n_free] free ids; the top is handed out next */
    uint8_t *used;   /* [n_blocks] */
};

tp_status tp_block_alloc_create(int32_t n_blocks, tp_block_alloc **out)
{
    *out = NULL;
    if (n_blocks < 1)
        return tp_error(TP_ERR_INVALID_ARG, "a KV block pool needs at least 1 block, got %d",
                        (int)n_blocks);
    tp_block_alloc *a = calloc(1, sizeof *a);
    if (!a) return tp_error(TP_ERR_OOM, "out of memory for the KV block allocator");
    a->stack = malloc((size_t)n_blocks * sizeof *a->stack);
    a->used = calloc((size_t)n_blocks, 1);
    if (!a->stack || !a->used) {
        tp_block_alloc_destroy(a);
        return tp_error(TP_ERR_OOM, "out of memory for a free list of %d KV blocks",
                        (int)n_blocks);
    }
    a->n_blocks = n_blocks;
    /* pushed high to low so the first allocations are 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) a->stack[i] = n_blocks - 1 - i;
    a->n_free = n_blocks;
    *out = a;
    return TP_OK;
}

void tp_block_alloc_destroy(tp_block_alloc *a)
{
    if (!a) return;
    free(a->stack);
    free(a->used);
    free(a);
}

int32_t tp_block_alloc_get(tp_block_alloc *a)
{
    if (a->n_free == 0) return -1;
    int32_t b = a->stack[--a->n_free];
    a->used[b] = 1;
    return b;
}

tp_status tp_block_alloc_put(tp_block_alloc *a, int32_t block)
{
    if (block < 0 || block >= a->n_blocks || !a->used[block])
        return tp_error(TP_ERR_INTERNAL, "KV block %d given back but it is %s", (int)block,
                        block < 0 || block >= a->n_blocks ? "out of range" : "not in use");
    a->used[block] = 0;
    a->stack[a->n_free++] = block;
    return TP_OK;
}

int32_t tp_block_alloc_n_free(const tp_block_alloc *a) { return a->n_free; }
int32_t tp_block_alloc_n_blocks(const tp_block_alloc *a) { return a->n_blocks; }
