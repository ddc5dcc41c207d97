/*
 * block_alloc.h: the physical KV cache blocks [0, n_blocks) that the scheduler hands to
 * sequences, and (prefix caching) the blocks whose keys and values are kept after their
 * sequences let them go, so a later sequence with the same prefix reads them instead of
 * computing them again.
 *
 * Without prefix caching: a free list, LIFO and deterministic: a fresh allocator gives
 * 0, 1, 2, ... and a block given back is the next one handed out.
 *
 * With it: a block full of prompt tokens may be registered under (parent, tokens), where
 * parent is the id the registration of the block before it returned (0 for a sequence's
 * first block), and gets an id of its own. Ids are never reused, so (parent, tokens) names
 * one whole prefix: a lookup that finds a block finds the keys and values of exactly that
 * prefix (the tokens are compared, not only hashed). Blocks are reference counted; a
 * registered block nobody holds is "evictable": it still counts as free, and is handed out
 * (and unregistered) only when no never-registered free block is left, least recently let
 * go first. Deterministic too: every rank of a replica makes the same calls.
 */
#ifndef TP_BLOCK_ALLOC_H
#define TP_BLOCK_ALLOC_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_block_alloc tp_block_alloc;

/* block_size > 0 turns prefix caching on (blocks of that many tokens); 0 leaves it off. */
tp_status tp_block_alloc_create(int32_t n_blocks, int32_t block_size, tp_block_alloc **out);
void tp_block_alloc_destroy(tp_block_alloc *a); /* accepts NULL */

/* A free block id (held once), or -1 when none is free. */
int32_t tp_block_alloc_get(tp_block_alloc *a);

/* Let a block go. TP_ERR_INTERNAL for an id out of range or not held. */
tp_status tp_block_alloc_put(tp_block_alloc *a, int32_t block);

/* Free blocks, the evictable ones included. */
int32_t tp_block_alloc_n_free(const tp_block_alloc *a);
int32_t tp_block_alloc_n_blocks(const tp_block_alloc *a);

/* ---- prefix caching (an allocator created with block_size > 0) ---- */

/* The hash of n tokens after the prefix named parent (an id, or another such hash): the
 * table's key, and the scheduler's for blocks in flight and for sizing. */
uint64_t tp_block_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n);

/* The registered block holding tokens[0 .. block_size) after the prefix named parent, and
 * its id in *id; -1 when there is none. Takes no hold: tp_block_alloc_hold does. */
int32_t tp_block_alloc_lookup(const tp_block_alloc *a, uint64_t parent, const int32_t *tokens, uint64_t *id);

/* An evictable block (registered, held by none) becomes the one let go last, evicted after
 * every other; any other block is left as it is. A sequence touches the prefix blocks its
 * sliding window gave back early when it lets go of the rest, so that the prefix's head, which
 * every later hit needs, outlasts its tail. */
void tp_block_alloc_touch(tp_block_alloc *a, int32_t block);

/* Hold a registered block once more (an evictable one stops being evictable). */
void tp_block_alloc_hold(tp_block_alloc *a, int32_t block);

/* Register held block `block`, whose keys and values are now those of tokens[0 ..
 * block_size) after the prefix named parent. Returns the prefix's id: the block's new one,
 * or, where another block already holds that prefix, that block's (this one then stays
 * unregistered and is freed as usual). The block must be held and not registered yet. */
uint64_t tp_block_alloc_register(tp_block_alloc *a, int32_t block, uint64_t parent, const int32_t *tokens);

#ifdef __cplusplus
}
#endif
#endif
