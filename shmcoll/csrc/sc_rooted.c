/* Rooted collectives: Broadcast, Reduce, Gather, Scatter, and AllReduce as a Reduce
 * to rank 0 pipelined with a Broadcast from it, over one of three tree shapes.
 *
 * Ranks are renumbered v = rank - root (mod P) and placed on one of three shapes,
 * chosen by the algorithm code:
 *   binomial (tree)   parent of v = v minus its lowest set bit; depth popcount(v),
 *                     at most ceil(log2 P): the O(log P)-latency schedule
 *   chain (ring)      parent of v = v - 1: a pipelined chain, each rank sends n once
 *   star (direct, naive) every v > 0 hangs off the root: one step, root does all work;
 *                     a star Broadcast writes each chunk once for all (fan-out)
 * In every shape the subtree of v is the contiguous range [v, v + size), and the
 * children of v, in merge order, cover it left to right.
 *
 * Data moves in slot-sized chunks and flows one way along tree edges, so the
 * schedules form a DAG and cannot deadlock.  Reductions pass partial results in
 * the accumulator type; a node merges child 0 (+) x, then (+) child 1, child 2...,
 * and the root finishes, so the root alone decides the bits every rank receives. */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

typedef struct tree {
    int world, root, v, size, depth, parent;   /* parent: real rank, -1 at the root */
    int nchildren;
    int child[SC_MAX_WORLD];       /* real ranks, in merge order */
    int child_v[SC_MAX_WORLD];     /* their virtual ranks (subtree start) */
    int child_size[SC_MAX_WORLD];
} tree;

enum shape { BINOMIAL, CHAIN, STAR };

static enum shape shape_of(int algo)
{
    if (algo == SC_ALGO_TREE)
        return BINOMIAL;
    return algo == SC_ALGO_RING ? CHAIN : STAR;
}

static int lowbit(int v) { return v & -v; }

static void add_child(tree *t, int v, int size)
{
    t->child[t->nchildren] = (v + t->root) % t->world;
    t->child_v[t->nchildren] = v;
    t->child_size[t->nchildren] = size;
    t->nchildren++;
}

static void build(tree *t, enum shape s, int world, int rank, int root)
{
    int v = (rank - root + world) % world;
    /* Field by field: a compound literal would zero the child arrays, 12 KiB per call
     * (measured: a two-rank tree Broadcast of 8 B took 1.2x the star's time). */
    t->world = world;
    t->root = root;
    t->v = v;
    t->nchildren = 0;
    int pv = -1;
    if (s == BINOMIAL) {
        t->size = v ? (lowbit(v) < world - v ? lowbit(v) : world - v) : world;
        t->depth = __builtin_popcount((unsigned)v);
        pv = v ? v - lowbit(v) : -1;
        for (int mask = 1; v + mask < world && (v == 0 || mask < lowbit(v)); mask <<= 1) {
            int size = world - (v + mask) < mask ? world - (v + mask) : mask;
            add_child(t, v + mask, size);
        }
    } else if (s == CHAIN) {
        t->size = world - v;
        t->depth = v;
        pv = v - 1;
        if (v + 1 < world)
            add_child(t, v + 1, world - v - 1);
    } else {
        t->size = v ? 1 : world;
        t->depth = v ? 1 : 0;
        pv = v ? 0 : -1;
        for (int u = 1; v == 0 && u < world; u++)
            add_child(t, u, 1);
    }
    t->parent = pv < 0 ? -1 : (pv + root) % world;
}

/* -- Broadcast ------------------------------------------------------------- */

/* Chunk [off, off+bytes) of buf: from the parent (unless root), on to every child. */
static int bcast_chunk(sc_comm *c, const tree *t, char *buf, size_t bytes, int stream)
{
    const void *in = buf;
    sc_endpoint *from = t->parent >= 0 ? &c->recv[t->parent] : NULL;
    if (from)
        SC_TRY(sc_recv_acquire(c, from, &in));
    for (int j = 0; j < t->nchildren; j++)
        SC_TRY(sc_put(c, t->child[j], in, bytes));
    if (from) {
        sc_out_copy(buf, in, bytes, stream);
        sc_recv_release(from);
    }
    return SC_OK;
}

/* The star fans out: the root writes each chunk once (sc_put_all) and every peer
 * copies it from where it lies, so the root moves n bytes, not n(P-1). */
static int star_broadcast(sc_comm *c, const sc_args *a, char *buf, int stream)
{
    for (size_t off = 0; off < a->count; off += c->slot_bytes) {
        size_t bytes = sc_min(a->count - off, c->slot_bytes);
        SC_TRY(c->rank == a->root ? sc_put_all(c, buf + off, bytes)
                                  : sc_get_all(c, a->root, buf + off, bytes, stream));
    }
    return SC_OK;
}

int sc_rooted_broadcast(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    char *buf = (char *)a->x;
    int stream = sc_use_stream(c, a->count);
    if (shape_of(a->algo) == STAR)
        return star_broadcast(c, a, buf, stream);
    tree t;
    build(&t, shape_of(a->algo), c->world, c->rank, a->root);
    for (size_t off = 0; off < a->count; off += c->slot_bytes)
        SC_TRY(bcast_chunk(c, &t, buf + off, sc_min(a->count - off, c->slot_bytes), stream));
    return SC_OK;
}

/* -- Reduce ---------------------------------------------------------------- */

/* Merges child 0 (+) x (+) child 1 (+) ... for one chunk of n elements, and sends
 * the partial to the parent, or (root) writes the finished result to out. */
static int reduce_chunk(sc_comm *c, const tree *t, const sc_kernels *k, const char *x,
                        char *out, size_t n)
{
    sc_endpoint *up = t->parent >= 0 ? &c->send[t->parent] : NULL;
    void *slot = NULL;
    const void *in;
    if (up)
        SC_TRY(sc_send_acquire(c, up, &slot));
    if (t->nchildren == 0) {          /* a leaf: its own x, widened */
        k->first(slot, x, n);
        sc_send_commit(up);
        return SC_OK;
    }
    char *acc = c->scratch;
    for (int j = 0; j < t->nchildren; j++) {
        SC_TRY(sc_recv_acquire(c, &c->recv[t->child[j]], &in));
        int last = j == t->nchildren - 1;
        if (j == 0 && last)
            up ? k->mid(slot, in, x, n) : k->last(out, in, x, n, c->world);
        else if (j == 0)
            k->mid(acc, in, x, n);
        else
            k->combine(last && up ? slot : acc, acc, in, n);
        sc_recv_release(&c->recv[t->child[j]]);
    }
    if (up)
        sc_send_commit(up);
    else if (t->nchildren > 1)
        k->finish(out, acc, n, c->world);
    return SC_OK;
}

int sc_rooted_reduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    tree t;
    build(&t, shape_of(a->algo), c->world, c->rank, a->root);
    size_t chunk = c->slot_bytes / k->accsize, isz = k->itemsize;
    for (size_t start = 0; start < a->count; start += chunk) {
        char *out = a->out ? (char *)a->out + start * isz : NULL;
        SC_TRY(reduce_chunk(c, &t, k, (const char *)a->x + start * isz, out,
                            sc_min(a->count - start, chunk)));
    }
    return SC_OK;
}

/* -- AllReduce = Reduce to rank 0 + Broadcast, pipelined ------------------- */

/* Round i reduces chunk i up the tree, then moves chunk i - depth down it.  The lag
 * of one round per level lets the broadcast of chunk j leave the root while chunk
 * j+1 is still being reduced, without any rank waiting for a whole round trip.
 * Per channel at most two chunks are in flight (nslots >= 2). */
int sc_rooted_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    tree t;
    build(&t, a->algo == SC_ALGO_NAIVE ? STAR : BINOMIAL, c->world, c->rank, 0);
    size_t chunk = c->slot_bytes / k->accsize, isz = k->itemsize;
    size_t rounds = sc_div_up(a->count, chunk);
    int stream = sc_use_stream(c, a->count * isz) && a->out != a->x;
    char *out = a->out;
    for (size_t i = 0; i < rounds + (size_t)t.depth; i++) {
        if (i < rounds)
            SC_TRY(reduce_chunk(c, &t, k, (const char *)a->x + i * chunk * isz,
                                out + i * chunk * isz, sc_min(a->count - i * chunk, chunk)));
        if (i >= (size_t)t.depth) {
            size_t j = i - (size_t)t.depth;
            SC_TRY(bcast_chunk(c, &t, out + j * chunk * isz,
                               sc_min(a->count - j * chunk, chunk) * isz, stream));
        }
    }
    return SC_OK;
}

/* -- Gather and Scatter ---------------------------------------------------- */

/* The stream between v and its parent carries the blocks of v's subtree in
 * virtual-rank order, each block cut into chunks from its own start. */
static size_t chunks_per_block(const sc_comm *c, size_t bytes)
{
    return sc_div_up(bytes, c->slot_bytes);
}

static size_t chunk_len(const sc_comm *c, size_t bytes, size_t i)
{
    return sc_min(bytes - i * c->slot_bytes, c->slot_bytes);
}

/* Relays `blocks` blocks from peer `from` to peer `to` (to < 0: into out, block by
 * block from virtual rank v0). */
static int relay_blocks(sc_comm *c, const tree *t, int from, int to, int v0, int blocks,
                        size_t bytes, char *out, int stream)
{
    size_t per = chunks_per_block(c, bytes);
    for (int b = 0; b < blocks; b++) {
        char *dst = out ? out + (size_t)((v0 + b + t->root) % t->world) * bytes : NULL;
        for (size_t i = 0; i < per; i++) {
            size_t n = chunk_len(c, bytes, i);
            const void *in;
            SC_TRY(sc_recv_acquire(c, &c->recv[from], &in));
            if (to >= 0)
                SC_TRY(sc_put(c, to, in, n));
            if (dst)
                sc_out_copy(dst + i * c->slot_bytes, in, n, stream);
            sc_recv_release(&c->recv[from]);
        }
    }
    return SC_OK;
}

int sc_rooted_gather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    tree t;
    build(&t, shape_of(a->algo), c->world, c->rank, a->root);
    size_t bytes = a->count;
    int root = t.parent < 0;
    int stream = root && sc_use_stream(c, bytes * (size_t)c->world);
    char *out = root ? a->out : NULL;
    if (root) {
        char *own = out + (size_t)c->rank * bytes;
        if (own != a->x)
            sc_out_copy(own, a->x, bytes, stream);
    } else {
        SC_TRY(sc_put_range(c, t.parent, a->x, bytes));
    }
    for (int j = 0; j < t.nchildren; j++)
        SC_TRY(relay_blocks(c, &t, t.child[j], t.parent, t.child_v[j], t.child_size[j], bytes,
                            out, stream));
    return SC_OK;
}

int sc_rooted_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    tree t;
    build(&t, shape_of(a->algo), c->world, c->rank, a->root);
    size_t bytes = a->count;
    if (t.parent < 0) {
        const char *x = a->x;
        for (int j = 0; j < t.nchildren; j++)
            for (int b = 0; b < t.child_size[j]; b++) {
                int q = (t.child_v[j] + b + t.root) % t.world;
                SC_TRY(sc_put_range(c, t.child[j], x + (size_t)q * bytes, bytes));
            }
        const char *own = x + (size_t)c->rank * bytes;
        if (a->out != own)
            memmove(a->out, own, bytes);
        return SC_OK;
    }
    /* Our own block comes first in the stream, then each child's subtree in turn. */
    SC_TRY(sc_get_range(c, t.parent, a->out, bytes, 0));
    for (int j = 0; j < t.nchildren; j++)
        SC_TRY(relay_blocks(c, &t, t.parent, t.child[j], t.child_v[j], t.child_size[j], bytes,
                            NULL, 0));
    return SC_OK;
}
