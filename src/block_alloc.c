/*
 * block_alloc.c: a stack of never-registered free block ids, a hold count per block (so a
 * double free or a stray id is caught at once instead of corrupting another sequence's
 * KV), and for prefix caching the registered blocks: a chained hash table over (parent,
 * tokens) and a least-recently-let-go list of the evictable ones.
 */
#include "block_alloc.h"

#include <stdlib.h>
#include <string.h>

struct tp_block_alloc {
    int32_t n_blocks;
    int32_t n_stack;
    int32_t *stack;  /* [n_stack] free never-registered ids; the top is handed out next */
    uint32_t *holds; /* [n_blocks] */

    /* prefix caching (block_size > 0) */
    int32_t block_size;
    uint64_t next_id;
    uint64_t *id, *parent, *hash; /* [n_blocks]; id 0: not registered */
    int32_t *tokens;              /* [n_blocks * block_size] a registered block's tokens */
    int32_t *bucket, *chain;      /* heads [n_buckets], next in chain [n_blocks]; -1 ends */
    uint32_t bucket_mask;
    int32_t *lru_prev, *lru_next; /* evictable blocks, oldest first */
    int32_t lru_head, lru_tail, n_lru;
};

static uint64_t mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64 finalizer */
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t tp_block_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n)
{
    uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
    for (int32_t i = 0; i < n; i++) h = mix(h ^ (uint32_t)tokens[i]) + (uint64_t)i;
    return h;
}

tp_status tp_block_alloc_create(int32_t n_blocks, int32_t block_size, tp_block_alloc **out)
{
    *out = NULL;
    if (n_blocks < 1)
        return tp_error(TP_ERR_INVALID_ARG, "a KV block pool needs at least 1 block, got %d", (int)n_blocks);
    if (block_size < 0)
        return tp_error(TP_ERR_INVALID_ARG, "a KV block of %d tokens", (int)block_size);
    tp_block_alloc *a = calloc(1, sizeof *a);
    if (!a) return tp_error(TP_ERR_OOM, "out of memory for the KV block allocator");
    const size_t n = (size_t)n_blocks;
    a->stack = malloc(n * sizeof *a->stack);
    a->holds = calloc(n, sizeof *a->holds);
    int ok = a->stack && a->holds;
    if (ok && block_size > 0) {
        uint32_t nb = 1;
        while (nb < (uint32_t)n_blocks && nb < (1u << 30)) nb *= 2;
        a->block_size = block_size;
        a->bucket_mask = nb - 1;
        a->id = calloc(n, sizeof *a->id);
        a->parent = calloc(n, sizeof *a->parent);
        a->hash = calloc(n, sizeof *a->hash);
        a->tokens = malloc(n * (size_t)block_size * sizeof *a->tokens);
        a->bucket = malloc((size_t)nb * sizeof *a->bucket);
        a->chain = malloc(n * sizeof *a->chain);
        a->lru_prev = malloc(n * sizeof *a->lru_prev);
        a->lru_next = malloc(n * sizeof *a->lru_next);
        ok = a->id && a->parent && a->hash && a->tokens && a->bucket && a->chain && a->lru_prev && a->lru_next;
        if (ok) memset(a->bucket, 0xff, (size_t)nb * sizeof *a->bucket); /* all -1 */
        a->lru_head = a->lru_tail = -1;
    }
    if (!ok) {
        tp_block_alloc_destroy(a);
        return tp_error(TP_ERR_OOM, "out of memory for the books of %d KV blocks", (int)n_blocks);
    }
    a->n_blocks = n_blocks;
    /* pushed high to low so the first allocations are 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) a->stack[i] = n_blocks - 1 - i;
    a->n_stack = n_blocks;
    *out = a;
    return TP_OK;
}

void tp_block_alloc_destroy(tp_block_alloc *a)
{
    if (!a) return;
    free(a->stack);
    free(a->holds);
    free(a->id);
    free(a->parent);
    free(a->hash);
    free(a->tokens);
    free(a->bucket);
    free(a->chain);
    free(a->lru_prev);
    free(a->lru_next);
    free(a);
}

static void lru_remove(tp_block_alloc *a, int32_t b)
{
    int32_t p = a->lru_prev[b], n = a->lru_next[b];
    if (p >= 0) a->lru_next[p] = n;
    else a->lru_head = n;
    if (n >= 0) a->lru_prev[n] = p;
    else a->lru_tail = p;
    a->n_lru--;
}

static void lru_push_back(tp_block_alloc *a, int32_t b)
{
    a->lru_prev[b] = a->lru_tail;
    a->lru_next[b] = -1;
    if (a->lru_tail >= 0) a->lru_next[a->lru_tail] = b;
    else a->lru_head = b;
    a->lru_tail = b;
    a->n_lru++;
}

static void unregister(tp_block_alloc *a, int32_t b)
{
    int32_t *link = &a->bucket[a->hash[b] & a->bucket_mask];
    while (*link != b) link = &a->chain[*link];
    *link = a->chain[b];
    a->id[b] = 0;
}

int32_t tp_block_alloc_get(tp_block_alloc *a)
{
    int32_t b;
    if (a->n_stack > 0) {
        b = a->stack[--a->n_stack];
    } else if (a->n_lru > 0) { /* the registered block let go longest ago */
        b = a->lru_head;
        lru_remove(a, b);
        unregister(a, b);
    } else {
        return -1;
    }
    a->holds[b] = 1;
    return b;
}

tp_status tp_block_alloc_put(tp_block_alloc *a, int32_t block)
{
    if (block < 0 || block >= a->n_blocks || !a->holds[block])
        return tp_error(TP_ERR_INTERNAL, "KV block %d given back but it is %s", (int)block,
                        block < 0 || block >= a->n_blocks ? "out of range" : "not in use");
    if (--a->holds[block]) return TP_OK;
    if (a->id && a->id[block]) lru_push_back(a, block);
    else a->stack[a->n_stack++] = block;
    return TP_OK;
}

int32_t tp_block_alloc_n_free(const tp_block_alloc *a) { return a->n_stack + a->n_lru; }
int32_t tp_block_alloc_n_blocks(const tp_block_alloc *a) { return a->n_blocks; }

static int32_t find(const tp_block_alloc *a, uint64_t h, uint64_t parent, const int32_t *tokens)
{
    for (int32_t b = a->bucket[h & a->bucket_mask]; b >= 0; b = a->chain[b])
        if (a->hash[b] == h && a->parent[b] == parent &&
            !memcmp(a->tokens + (size_t)b * (size_t)a->block_size, tokens, (size_t)a->block_size * sizeof *tokens))
            return b;
    return -1;
}

int32_t tp_block_alloc_lookup(const tp_block_alloc *a, uint64_t parent, const int32_t *tokens, uint64_t *id)
{
    if (!a->id) return -1;
    int32_t b = find(a, tp_block_prefix_hash(parent, tokens, a->block_size), parent, tokens);
    if (b >= 0 && id) *id = a->id[b];
    return b;
}

void tp_block_alloc_touch(tp_block_alloc *a, int32_t block)
{
    if (!a->id || block < 0 || block >= a->n_blocks || !a->id[block] || a->holds[block]) return;
    lru_remove(a, block);
    lru_push_back(a, block);
}

void tp_block_alloc_hold(tp_block_alloc *a, int32_t block)
{
    if (!a->holds[block]) lru_remove(a, block);
    a->holds[block]++;
}

uint64_t tp_block_alloc_register(tp_block_alloc *a, int32_t block, uint64_t parent, const int32_t *tokens)
{
    const uint64_t h = tp_block_prefix_hash(parent, tokens, a->block_size);
    const int32_t other = find(a, h, parent, tokens);
    if (other >= 0) return a->id[other];
    a->id[block] = ++a->next_id;
    a->parent[block] = parent;
    a->hash[block] = h;
    memcpy(a->tokens + (size_t)block * (size_t)a->block_size, tokens, (size_t)a->block_size * sizeof *tokens);
    int32_t *head = &a->bucket[h & a->bucket_mask];
    a->chain[block] = *head;
    *head = block;
    return a->id[block];
}
