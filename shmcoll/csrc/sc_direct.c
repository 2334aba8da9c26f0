/* Direct schedules: every rank exchanges with every peer in one step.
 *
 * One-shot AllReduce: every rank publishes its vector to every peer and reduces all
 * P vectors itself, in rank order 0..P-1, so every rank computes the same bits.  One
 * synchronisation per chunk instead of the ring's 2(P-1) chained steps: the latency
 * algorithm, for small messages and for ranks that outnumber cores.
 *
 * ReduceScatter: rank r sends block q of its vector to rank q, and reduces block r
 * from all P vectors in rank order.  AllGather: rank r sends its block to every
 * peer.  Two-shot AllReduce is the two, interleaved chunk by chunk: P-1 messages of
 * n/P each way per rank instead of one-shot's n, at the price of a second step.
 *
 * What goes to every peer alike (one-shot's vector, AllGather's block, two-shot's
 * reduced block) is fanned out: written once, read by every peer where it lies
 * (sc_put_all), so a rank writes n instead of n(P-1) bytes for it.
 *
 * Every schedule is chunk-major: for chunk i a rank first sends to every peer, then
 * receives from every peer.  A rank blocked sending to q waits for q to finish an
 * earlier chunk, which only needs chunks sent even earlier, so the waits cannot
 * form a cycle (at most two items per channel are in flight; nslots >= 2). */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

/* Source q of a chunk: our own input, or the slot peer q sent us — to us alone, or
 * (fanned) to every peer at once with sc_put_all. */
static int acquire_source(sc_comm *c, int q, const char *own, int fanned, const void **src)
{
    if (q == c->rank) {
        *src = own;
        return SC_OK;
    }
    return fanned ? sc_recv_acquire_all(c, q, src) : sc_recv_acquire(c, &c->recv[q], src);
}

static void release_source(sc_comm *c, int q, int fanned)
{
    if (q == c->rank)
        return;
    if (fanned)
        sc_recv_release_all(c, q);
    else
        sc_recv_release(&c->recv[q]);
}

/* dst = x_0 (+) x_1 (+) ... (+) x_{P-1} for one chunk, own = our x_rank.  Where
 * x_0 already has the accumulator type it is the first accumulator itself (held
 * until the next step has read it), saving a pass over the chunk: at P = 2 the
 * whole reduction is one pass.  Where x_0 is dst (rank 0 in place) `last` may not
 * write over its accumulator; there dst is merged into in place, as long as
 * nothing is left to finish (same arithmetic, same order: same bits on every rank). */
static int reduce_in_rank_order(sc_comm *c, const sc_kernels *k, const char *own, char *dst,
                                size_t n, int fanned)
{
    int P = c->world, held = 0;
    const void *src, *acc;
    char *bufs[2] = { c->scratch, c->scratch + c->slot_bytes };
    SC_TRY(acquire_source(c, 0, own, fanned, &src));
    int same_type = k->itemsize == k->accsize;
    if (same_type && src == (const void *)dst && !k->finishes) {
        for (int q = 1; q < P; q++) {
            SC_TRY(acquire_source(c, q, own, fanned, &src));
            k->combine(dst, dst, src, n);
            release_source(c, q, fanned);
        }
        return SC_OK;
    }
    if (same_type && src != (const void *)dst) {
        acc = src, held = 1;
    } else {
        k->first(bufs[0], src, n);
        release_source(c, 0, fanned);
        acc = bufs[0];
    }
    for (int q = 1; q < P - 1; q++) {
        SC_TRY(acquire_source(c, q, own, fanned, &src));
        char *next = bufs[q % 2];
        k->mid(next, acc, src, n);
        release_source(c, q, fanned);
        if (held)
            release_source(c, 0, fanned), held = 0;
        acc = next;
    }
    SC_TRY(acquire_source(c, P - 1, own, fanned, &src));
    k->last(dst, acc, src, n, P);
    release_source(c, P - 1, fanned);
    if (held)
        release_source(c, 0, fanned);
    return SC_OK;
}

int sc_direct_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t chunk = c->slot_bytes / k->accsize;
    for (size_t start = 0; start < a->count; start += chunk) {
        size_t n = sc_min(a->count - start, chunk);
        const char *own = (const char *)a->x + start * k->itemsize;
        SC_TRY(sc_put_all(c, own, n * k->itemsize));
        SC_TRY(reduce_in_rank_order(c, k, own, (char *)a->out + start * k->itemsize, n, 1));
    }
    return SC_OK;
}

/* ReduceScatter round i: chunk i of every block.  Block r lands at `mine`. */
static int rs_round(sc_comm *c, const sc_kernels *k, const char *x, char *mine, size_t count,
                    size_t i, size_t chunk)
{
    size_t off, n, isz = k->itemsize, roff, rlen;
    for (int j = 1; j < c->world; j++) {
        int q = (c->rank + j) % c->world;
        if (!sc_chunk_of(count, c->world, q, i, chunk, &off, &n))
            continue;
        SC_TRY(sc_put(c, q, x + off * isz, n * isz));
    }
    if (!sc_chunk_of(count, c->world, c->rank, i, chunk, &off, &n))
        return SC_OK;
    sc_block_range(count, c->world, c->rank, &roff, &rlen);
    return reduce_in_rank_order(c, k, x + off * isz, mine + (off - roff) * isz, n, 0);
}

/* AllGather round i: chunk i of our block (at `mine`) to every peer, theirs into out. */
static int ag_round(sc_comm *c, const char *mine, char *out, size_t count, size_t isz,
                    size_t i, size_t chunk, int stream)
{
    size_t off, n, roff, rlen;
    if (sc_chunk_of(count, c->world, c->rank, i, chunk, &off, &n)) {
        sc_block_range(count, c->world, c->rank, &roff, &rlen);
        const char *src = mine + (off - roff) * isz;
        SC_TRY(sc_put_all(c, src, n * isz));
        if (out + off * isz != src)
            sc_out_copy(out + off * isz, src, n * isz, stream);
    }
    for (int j = 1; j < c->world; j++) {
        int q = (c->rank - j + c->world) % c->world;
        if (!sc_chunk_of(count, c->world, q, i, chunk, &off, &n))
            continue;
        SC_TRY(sc_get_all(c, q, out + off * isz, n * isz, stream));
    }
    return SC_OK;
}

int sc_direct_two_shot(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t chunk = c->slot_bytes / k->accsize, roff, rlen, isz = k->itemsize;
    sc_block_range(a->count, c->world, c->rank, &roff, &rlen);
    char *mine = (char *)a->out + roff * isz;
    int stream = sc_use_stream(c, a->count * isz) && a->out != a->x;
    size_t rounds = sc_div_up(sc_div_up(a->count, (size_t)c->world), chunk);
    for (size_t i = 0; i < rounds; i++) {
        SC_TRY(rs_round(c, k, a->x, mine, a->count, i, chunk));
        SC_TRY(ag_round(c, mine, a->out, a->count, isz, i, chunk, stream));
    }
    return SC_OK;
}

int sc_direct_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t chunk = c->slot_bytes / k->accsize, total = a->count * (size_t)c->world;
    size_t rounds = sc_div_up(a->count, chunk);
    for (size_t i = 0; i < rounds; i++)
        SC_TRY(rs_round(c, k, a->x, a->out, total, i, chunk));
    return SC_OK;
}

int sc_direct_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    size_t total = a->count * (size_t)c->world;
    int stream = sc_use_stream(c, total);
    size_t rounds = sc_div_up(a->count, c->slot_bytes);
    for (size_t i = 0; i < rounds; i++)
        SC_TRY(ag_round(c, a->x, a->out, total, 1, i, c->slot_bytes, stream));
    return SC_OK;
}
