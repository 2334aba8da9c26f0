/* Single-copy schedules over symmetric buffers.
 *
 * A symmetric buffer is one allocation made by every rank together (Communicator.
 * empty): rank q's array lives at the same offset of slice q of one shared segment
 * that every rank maps.  When x is such an array, nothing is staged through channel
 * slots: each rank reads its peers' arrays where they lie, so the copy into the
 * channel disappears and the bytes cross between cores once.
 *
 * Two synchronisations frame every schedule:
 *   arrive    every peer's call is checked (sc_call_check): a peer publishes its call
 *             after it wrote its x, so the acquire of its call makes x visible, and
 *             ranks that disagree stop before a byte is read;
 *   all_done  a barrier on the ranks' barrier counters after the last read of a
 *             peer's buffer: no rank returns (and may write its x again) while a peer
 *             still reads it.
 * Two-shot AllReduce adds one between its halves (every block reduced before any is
 * copied).  Every reduction combines the P sources in rank order, so every rank
 * computes the same bits. */
#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

static const char *source(const char *base, size_t stride, int q) { return base + (size_t)q * stride; }

/* Every peer's call checked: its buffers are ready and it agrees with ours. */
static int arrive(sc_comm *c)
{
    for (int i = 1; i < c->world; i++) {
        int peer = (c->rank + i) % c->world;
        SC_TRY(sc_call_check(c, peer));
        c->recv[peer].checked = c->call_seq;
    }
    return SC_OK;
}

/* Every rank is past its reads of the others' buffers. */
static int all_done(sc_comm *c)
{
    sc_stream_fence();      /* streaming stores are visible before the counter says so */
    uint64_t n = ++c->barrier_seq;
    sc_signal(&c->ranks[c->rank].barrier, n);
    for (int i = 1; i < c->world; i++) {
        int peer = (c->rank + i) % c->world;
        SC_TRY(sc_wait_ge(c, &c->ranks[peer].barrier, n, peer,
                          "waiting for the symmetric-buffer reads of", NULL));
    }
    return SC_OK;
}

/* dst[0, n) = src_0 (+) ... (+) src_{P-1}, src_q = base + q * stride + off items, in
 * rank order, chunk by chunk so the partial stays in cache.  `alias`: dst is one of
 * the sources, so only the last step may write it. */
static void reduce_sources(sc_comm *c, const sc_kernels *k, const char *base, size_t stride,
                           size_t off, size_t n, char *dst, int alias)
{
    int P = c->world;
    size_t isz = k->itemsize, chunk = c->slot_bytes / k->accsize;
    /* Items that are their own accumulator combine straight into dst. */
    int direct = !alias && k->accsize == isz && !k->finishes;
    for (size_t start = 0; start < n; start += chunk) {
        size_t m = sc_min(n - start, chunk), at = (off + start) * isz;
        char *d = dst + start * isz;
        if (direct) {
            k->combine(d, source(base, stride, 0) + at, source(base, stride, 1) + at, m);
            for (int q = 2; q < P; q++)
                k->combine(d, d, source(base, stride, q) + at, m);
            continue;
        }
        char *acc = c->scratch, *next = c->scratch + c->slot_bytes;
        k->first(acc, source(base, stride, 0) + at, m);
        for (int q = 1; q < P - 1; q++) {
            k->mid(next, acc, source(base, stride, q) + at, m);
            char *t = acc;
            acc = next, next = t;
        }
        k->last(d, acc, source(base, stride, P - 1) + at, m, P);
    }
}

/* One-shot: every rank reduces all P arrays itself (out must not be x). */
int sc_symmetric_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    SC_TRY(arrive(c));
    reduce_sources(c, k, a->sym_x, a->sym_x_stride, 0, a->count, a->out, 0);
    return all_done(c);
}

/* Two-shot: rank r reduces block r of every x into block r of its (symmetric) out,
 * then copies every other block from the rank that reduced it.  In place (out is x)
 * too: block r of x_q is read only by rank r, before anyone writes it. */
int sc_symmetric_two_shot(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t isz = k->itemsize, off, len;
    int in_place = a->out == a->x;
    SC_TRY(arrive(c));
    sc_block_range(a->count, c->world, c->rank, &off, &len);
    reduce_sources(c, k, a->sym_x, a->sym_x_stride, off, len, (char *)a->out + off * isz,
                   in_place);
    SC_TRY(all_done(c));
    int stream = sc_use_stream(c, a->count * isz) && !in_place;
    for (int i = 1; i < c->world; i++) {
        int q = (c->rank + i) % c->world;
        sc_block_range(a->count, c->world, q, &off, &len);
        sc_out_copy((char *)a->out + off * isz, source(a->sym_out, a->sym_out_stride, q) + off * isz,
                    len * isz, stream);
    }
    return all_done(c);
}

/* Rank r reduces block r of every x (in place when out is block r of its own x: no
 * peer reads that block). */
int sc_symmetric_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t isz = k->itemsize, block = a->count * isz;
    const char *mine = (const char *)a->x + (size_t)c->rank * block;
    SC_TRY(arrive(c));
    reduce_sources(c, k, a->sym_x, a->sym_x_stride, (size_t)c->rank * a->count, a->count,
                   a->out, (const char *)a->out == mine);
    return all_done(c);
}

/* Every rank copies every x into its out (count: bytes of one x). */
int sc_symmetric_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    int stream = sc_use_stream(c, a->count * (size_t)c->world);
    SC_TRY(arrive(c));
    for (int i = 0; i < c->world; i++) {
        int q = (c->rank + i) % c->world;
        char *dst = (char *)a->out + (size_t)q * a->count;
        const char *src = source(a->sym_x, a->sym_x_stride, q);
        if (dst != src)
            sc_out_copy(dst, src, a->count, stream);
    }
    return all_done(c);
}

/* Every rank copies the root's x into its own. */
int sc_symmetric_broadcast(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(arrive(c));
    if (c->rank != a->root)
        sc_out_copy((void *)a->x, source(a->sym_x, a->sym_x_stride, a->root), a->count,
                    sc_use_stream(c, a->count));
    return all_done(c);
}

/* The root reduces every x into its out; the others only wait for it. */
int sc_symmetric_reduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    SC_TRY(arrive(c));
    if (c->rank == a->root)
        reduce_sources(c, k, a->sym_x, a->sym_x_stride, 0, a->count, a->out, a->out == a->x);
    return all_done(c);
}

/* The root copies every x into its out (count: bytes of one x). */
int sc_symmetric_gather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(arrive(c));
    if (c->rank == a->root) {
        int stream = sc_use_stream(c, a->count * (size_t)c->world);
        for (int q = 0; q < c->world; q++) {
            char *dst = (char *)a->out + (size_t)q * a->count;
            const char *src = source(a->sym_x, a->sym_x_stride, q);
            if (dst != src)         /* (in place: the root's own row is there already) */
                sc_out_copy(dst, src, a->count, stream);
        }
    }
    return all_done(c);
}
