/* Single-copy schedules: peers' buffers are read or written where they lie, so
 * nothing is staged through channel slots and the bytes cross between cores once.
 * Two ways to reach a peer's buffer:
 *
 *   symmetric   x (and out) in a symmetric allocation (Communicator.empty): rank q's
 *               array lives at the same offset of slice q of one shared segment that
 *               every rank maps, so a peer's array is a pointer away;
 *   cma         any array: each rank publishes the addresses of its x and out in its
 *               call record and peers read them with cross-memory attach (sc_cma.c;
 *               a reduction reads chunk by chunk into a staging buffer).
 *
 * A copy may be made by either end: the reader pulls the bytes, or their owner
 * pushes them into the reader's buffer.  Where one end would sit idle, both work:
 * Broadcast's root pushes the head of every receiver's copy while each receiver
 * pulls the rest, so two cores copy at once (P=2, 4 MiB: half the time of one core
 * pulling it all).  With cma, what a rank contributes is pushed by it: its x into
 * the others' out in AllGather and Gather (whose root no longer copies every row
 * alone), its reduced block into the others' out in two-shot AllReduce.  Those bytes
 * are in the owner's cache: two ranks writing 256 KiB-1 MiB each had just written
 * into each other took 0.44-0.64x the time of reading them (and the same time where
 * the bytes were unchanged since the last read).
 *
 * Two synchronisations frame every schedule:
 *   arrive    every peer's call is checked (sc_call_check): a peer publishes its call
 *             after it wrote its x, so the acquire of its call makes x visible (and
 *             tells where its buffers lie), and ranks that disagree stop before a
 *             byte is read;
 *   all_done  a barrier on the ranks' barrier counters after the last read of, or
 *             write into, a peer's buffer: no rank returns (and may write its x
 *             again, or read its out) while a peer still reads the one or writes
 *             the other.  Where only the root's buffers are reached by all
 *             (Broadcast, Gather, Reduce over symmetric arrays) the peers wait for
 *             the root alone, or not at all (root_done).
 * Over symmetric x two-shot AllReduce adds one between its halves (every block
 * reduced before any is pulled); with cma, whose ranks push their blocks, none is
 * needed.  Every reduction combines the P sources in rank order, so every rank
 * computes the same bits. */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

/* Where every rank's copy of one buffer (x, or out) lies, as this rank reaches it. */
typedef struct sources {
    const char *own;        /* this rank's */
    const char *base;       /* symmetric: rank q's at base + q * stride */
    size_t stride;
    int where;              /* cma (base NULL): the call record's address of it */
} sources;

static sources of_x(const sc_comm *c, const sc_args *a)
{
    (void)c;
    return (sources){ a->x, a->sym_x, a->sym_x_stride, SC_WHERE_X };
}

static sources of_out(const sc_comm *c, const sc_args *a)
{
    (void)c;
    return (sources){ a->out, a->sym_out, a->sym_out_stride, SC_WHERE_OUT };
}

static uint64_t remote(const sc_comm *c, const sources *s, int q)
{
    return c->peer_where[2 * (size_t)q + (size_t)s->where];
}

/* Bytes [at, at + bytes) of rank q's buffer, readable here: in place, or read into
 * `stage` (NULL, with *st set, when the read failed). */
static const char *fetch(sc_comm *c, const sources *s, int q, size_t at, size_t bytes,
                         char *stage, int *st)
{
    if (q == c->rank)
        return s->own + at;
    if (s->base)
        return s->base + (size_t)q * s->stride + at;
    *st = sc_cma_read(c, q, remote(c, s, q) + at, stage, bytes);
    return *st == SC_OK ? stage : NULL;
}

/* dst = bytes [at, at + bytes) of rank q's buffer. */
static int copy_from(sc_comm *c, const sources *s, int q, size_t at, char *dst, size_t bytes,
                     int stream)
{
    if (q != c->rank && !s->base)
        return sc_cma_read(c, q, remote(c, s, q) + at, dst, bytes);
    const char *src = q == c->rank ? s->own + at : s->base + (size_t)q * s->stride + at;
    if (dst != src)         /* (in place: this rank's own row is there already) */
        sc_out_copy(dst, src, bytes, stream);
    return SC_OK;
}

/* Bytes [at, at + bytes) of rank q's buffer = src. */
static int copy_to(sc_comm *c, const sources *s, int q, size_t at, const char *src, size_t bytes,
                   int stream)
{
    if (q != c->rank && !s->base)
        return sc_cma_write(c, q, remote(c, s, q) + at, src, bytes);
    char *dst = (char *)(q == c->rank ? s->own : s->base + (size_t)q * s->stride) + at;
    if (dst != src)
        sc_out_copy(dst, src, bytes, stream);
    return SC_OK;
}

/* Of a copy of `bytes` to each of P-1 receivers, the head the sender pushes (the
 * receiver pulls the rest): 1/P of it, so that sender and receivers copy as much,
 * in whole pages (a page copied from both ends is pinned twice, and its lines move
 * between the cores); none where 1/P is under a page. */
static size_t pushed_head(size_t bytes, int world)
{
    return (bytes / (size_t)world) & ~(size_t)(SC_PAGE - 1);
}

/* Every peer's call checked: its buffers are ready and it agrees with ours. */
static int arrive(sc_comm *c)
{
    return sc_call_check_all(c);
}

/* This rank is past its reads of and writes into its peers' buffers: it counts the
 * next barrier.  Returns the count the others wait for. */
static uint64_t count_done(sc_comm *c)
{
    sc_stream_fence();      /* streaming stores are visible before the counter says so */
    uint64_t n = ++c->barrier_seq;
    sc_signal(&c->ranks[c->rank].barrier, n);
    return n;
}

static int wait_done(sc_comm *c, int peer, uint64_t n)
{
    return sc_wait_ge(c, &c->ranks[peer].barrier, n, peer,
                      "waiting for the symmetric-buffer reads of", NULL);
}

/* Every peer has counted barrier n. */
static int peers_done(sc_comm *c, uint64_t n)
{
    for (int i = 1; i < c->world; i++)
        SC_TRY(wait_done(c, (c->rank + i) % c->world, n));
    return SC_OK;
}

/* Every rank is past its reads of and writes into the others' buffers. */
static int all_done(sc_comm *c)
{
    return peers_done(c, count_done(c));
}

/* all_done for a rooted schedule, where only the root's buffers are reached by every
 * peer: the root waits until every peer is past its reads of or writes into them, and
 * a peer waits for the root only where the root reaches the peer's buffers too
 * (`root_reaches`).  The peers do not wait for each other, and where the root reaches
 * none of theirs (cma Gather: each pushes its own row) they return at once.  Every
 * rank still counts the barrier, so the counters stay level for the next one. */
static int root_done(sc_comm *c, int root, int root_reaches)
{
    uint64_t n = count_done(c);
    if (c->rank != root)
        return root_reaches ? wait_done(c, root, n) : SC_OK;
    return peers_done(c, n);
}

/* dst[0, n) = src_0 (+) ... (+) src_{P-1} over items [off, off + n) of every rank's
 * buffer, in rank order, chunk by chunk so the partial (and a staged peer chunk)
 * stays in cache.  `alias`: dst is one of the sources, so only the last step may
 * write it. */
static int reduce_sources(sc_comm *c, const sc_kernels *k, const sources *s, size_t off,
                          size_t n, char *dst, int alias)
{
    int P = c->world, st = SC_OK;
    size_t isz = k->itemsize, chunk = c->slot_bytes / k->accsize;
    char *stage[2] = { c->stage, c->stage ? c->stage + c->slot_bytes : NULL };
    /* Items that are their own accumulator combine straight into dst. */
    int direct = !alias && k->accsize == isz && !k->finishes;
    for (size_t start = 0; start < n; start += chunk) {
        size_t m = sc_min(n - start, chunk), at = (off + start) * isz, len = m * isz;
        char *d = dst + start * isz;
        const char *a = fetch(c, s, 0, at, len, stage[0], &st), *b;
        if (!a)
            return st;
        if (direct) {
            if (!(b = fetch(c, s, 1, at, len, stage[1], &st)))
                return st;
            k->combine(d, a, b, m);
            for (int q = 2; q < P; q++) {
                if (!(b = fetch(c, s, q, at, len, stage[1], &st)))
                    return st;
                k->combine(d, d, b, m);
            }
            continue;
        }
        char *acc = c->scratch, *next = c->scratch + c->slot_bytes;
        k->first(acc, a, m);
        for (int q = 1; q < P - 1; q++) {
            if (!(b = fetch(c, s, q, at, len, stage[1], &st)))
                return st;
            k->mid(next, acc, b, m);
            char *t = acc;
            acc = next, next = t;
        }
        if (!(b = fetch(c, s, P - 1, at, len, stage[1], &st)))
            return st;
        k->last(d, acc, b, m, P);
    }
    return SC_OK;
}

/* One-shot: every rank reduces all P buffers itself.  Peers read x while this rank
 * writes out, so in place (cma; symmetric is never offered one-shot in place) the
 * result is made aside and copied into x once every peer has read it. */
int sc_single_copy_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    sources x = of_x(c, a);
    size_t bytes = a->count * k->itemsize;
    char *dst = a->out;
    if (a->out == a->x && bytes && !(dst = sc_wide(c, bytes)))
        return SC_ENOMEM;
    SC_TRY(arrive(c));
    SC_TRY(reduce_sources(c, k, &x, 0, a->count, dst, 0));
    SC_TRY(all_done(c));
    if (dst != a->out)
        memcpy(a->out, dst, bytes);
    return SC_OK;
}

/* Items [off, off + n) reduced over every x a slot's worth at a time, each chunk
 * written into rank `to`'s out (every peer's where `to` < 0) while it is still in
 * this rank's cache.  A chunk is made in place in this rank's own out (`own_out`),
 * or where own_out is NULL in a private buffer. */
static int reduce_and_push(sc_comm *c, const sc_kernels *k, const sources *x,
                           const sources *out, char *own_out, size_t off, size_t n,
                           int in_place, int to)
{
    size_t isz = k->itemsize, chunk = c->slot_bytes / k->accsize;
    char *made = own_out || !n ? NULL : sc_wide(c, sc_min(n, chunk) * isz);
    if (!own_out && n && !made)
        return SC_ENOMEM;
    for (size_t start = 0; start < n; start += chunk) {
        size_t m = sc_min(n - start, chunk), at = (off + start) * isz;
        char *dst = own_out ? own_out + at : made;
        SC_TRY(reduce_sources(c, k, x, off + start, m, dst, in_place));
        for (int i = 1; i < c->world; i++) {
            int q = (c->rank + i) % c->world;
            if (to < 0 || q == to)
                SC_TRY(copy_to(c, out, q, at, dst, m * isz, 0));
        }
    }
    return SC_OK;
}

/* Two-shot: rank r reduces block r of every x into block r of its out, and every out
 * gets every block.  Over symmetric x every rank pulls each block from the rank that
 * reduced it, after a middle barrier (every block reduced before any is copied).  With
 * cma rank r pushes its block into the others' out chunk by chunk as it reduces it,
 * while the chunk is in its cache, and no middle barrier is needed: block r of every
 * rank's x and out is reached by rank r alone — in place (out is x) too, where rank r
 * reads block r of x_q before it writes it. */
int sc_single_copy_two_shot(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    sources x = of_x(c, a), out = of_out(c, a);
    size_t isz = k->itemsize, off, len;
    int in_place = a->out == a->x;
    SC_TRY(arrive(c));
    sc_block_range(a->count, c->world, c->rank, &off, &len);
    if (!x.base) {
        SC_TRY(reduce_and_push(c, k, &x, &out, (char *)a->out, off, len, in_place, -1));
        return all_done(c);
    }
    SC_TRY(reduce_sources(c, k, &x, off, len, (char *)a->out + off * isz, in_place));
    SC_TRY(all_done(c));
    int stream = sc_use_stream(c, a->count * isz) && !in_place;
    for (int i = 1; i < c->world; i++) {
        int q = (c->rank + i) % c->world;
        sc_block_range(a->count, c->world, q, &off, &len);
        SC_TRY(copy_from(c, &out, q, off * isz, (char *)a->out + off * isz, len * isz, stream));
    }
    return all_done(c);
}

/* Rank r reduces block r of every x (in place when out is block r of its own x: no
 * peer reads that block). */
int sc_single_copy_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    sources x = of_x(c, a);
    size_t isz = k->itemsize, block = a->count * isz;
    const char *mine = (const char *)a->x + (size_t)c->rank * block;
    SC_TRY(arrive(c));
    SC_TRY(reduce_sources(c, k, &x, (size_t)c->rank * a->count, a->count, a->out,
                          (const char *)a->out == mine));
    return all_done(c);
}

/* Every rank copies every x into its out (count: bytes of one x): with cma each
 * pushes its own x into every peer's out, else each pulls every peer's x. */
int sc_single_copy_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    sources x = of_x(c, a), out = of_out(c, a);
    int stream = sc_use_stream(c, a->count * (size_t)c->world), push = !x.base;
    size_t row = (size_t)c->rank * a->count;
    SC_TRY(arrive(c));
    for (int i = 0; i < c->world; i++) {
        int q = (c->rank + i) % c->world;
        if (push)
            SC_TRY(copy_to(c, &out, q, row, a->x, a->count, stream));
        else
            SC_TRY(copy_from(c, &x, q, 0, (char *)a->out + (size_t)q * a->count, a->count,
                             stream));
    }
    return all_done(c);
}

/* Every rank copies the root's x into its own: the root pushes the head of every
 * receiver's copy (pushed_head) while the receivers pull the rest. */
int sc_single_copy_broadcast(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    sources x = of_x(c, a);
    size_t head = pushed_head(a->count, c->world);
    int stream = sc_use_stream(c, a->count);
    SC_TRY(arrive(c));
    for (int i = 1; i < c->world && c->rank == a->root && head; i++)
        SC_TRY(copy_to(c, &x, (c->rank + i) % c->world, 0, a->x, head, stream));
    if (c->rank != a->root)
        SC_TRY(copy_from(c, &x, a->root, head, (char *)a->x + head, a->count - head, stream));
    return root_done(c, a->root, head != 0);
}

/* The root's out = every x reduced.  With symmetric x the root reduces it all.  With
 * cma every rank reduces block r (its pieces read from every x) and writes it into
 * the root's out, so the ranks share the work the root did alone (in place, block r
 * of the root's x is read and then written by rank r only). */
int sc_single_copy_reduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    sources x = of_x(c, a), out = of_out(c, a);
    SC_TRY(arrive(c));
    if (x.base) {
        if (c->rank == a->root)
            SC_TRY(reduce_sources(c, k, &x, 0, a->count, a->out, a->out == a->x));
        return root_done(c, a->root, 1);
    }
    size_t off, len, isz = k->itemsize;
    sc_block_range(a->count, c->world, c->rank, &off, &len);
    if (c->rank == a->root)
        SC_TRY(reduce_sources(c, k, &x, off, len, (char *)a->out + off * isz,
                              a->out == a->x));
    else
        SC_TRY(reduce_and_push(c, k, &x, &out, NULL, off, len, 0, a->root));
    return all_done(c);
}

/* The root's out gets every x as its rows (count: bytes of one x): with cma every
 * rank pushes its own, else the root pulls them all. */
int sc_single_copy_gather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    sources x = of_x(c, a), out = of_out(c, a);
    int stream = sc_use_stream(c, a->count * (size_t)c->world);
    SC_TRY(arrive(c));
    if (!x.base)
        SC_TRY(copy_to(c, &out, a->root, (size_t)c->rank * a->count, a->x, a->count, stream));
    else if (c->rank == a->root)
        for (int q = 0; q < c->world; q++)
            SC_TRY(copy_from(c, &x, q, 0, (char *)a->out + (size_t)q * a->count, a->count,
                             stream));
    return root_done(c, a->root, x.base != NULL);
}
