/* Ring ReduceScatter, ring AllGather, and ring AllReduce = the two (Patarasuk & Yuan).
 *
 * The vector is cut into `world` blocks; block b is reduced by rank b.  Each block
 * is streamed in chunks of one channel slot, and the schedule is chunk-major: for
 * chunk i every step of the ring runs before chunk i+1 starts, so each channel
 * carries items in exactly the order its consumer asks for them, and a message of
 * any size flows through nslots x slot_bytes of shared memory per channel.
 *
 * ReduceScatter, rank r, chunk i (P-1 steps, sc_recv_reduce_send in the middle):
 *   send   acc = x[r-1]                                  -> r+1
 *   step=1..P-2: acc = recv (+) x[r-step-1], send        -> r+1
 *   recv   dst[r] = recv (+) x[r]        (forwarded to r+1 when AllGather follows)
 * AllGather, rank r, chunk i (P-1 steps):
 *   send own block (unless the ReduceScatter already forwarded it)
 *   step=0..P-2: out[r-step-1] = recv, forward it unless step = P-2
 * Per rank and per round sends minus receives never exceed one, so with nslots >= 2
 * the channels can never all be full at once: the pipeline cannot deadlock.
 * In place (out == x) is safe: within a round every x chunk is read before the
 * AllGather writes the same chunk of out. */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

typedef struct ring_plan {
    const char *x;            /* ReduceScatter input, or AllGather's own block */
    char *out;                /* AllGather output: all blocks */
    char *final;              /* where ReduceScatter leaves this rank's block */
    size_t count;             /* elements over all blocks */
    size_t chunk;             /* elements per chunk */
    size_t itemsize;
    const sc_kernels *k;
    int stream;               /* write the output with streaming stores */
} ring_plan;

/* Chunk i of block b, as an element range; false when the block has no chunk i. */
static inline int chunk_of(const sc_comm *c, const ring_plan *p, int b, size_t i, size_t *off,
                           size_t *n)
{
    return sc_chunk_of(p->count, c->world, b, i, p->chunk, off, n);
}

static int rs_round(sc_comm *c, const ring_plan *p, size_t i, int forward)
{
    int r = c->rank, P = c->world, next = sc_wrap(r + 1, P), prev = sc_wrap(r - 1, P);
    sc_endpoint *to = &c->send[next], *from = &c->recv[prev];
    size_t off, n, isz = p->itemsize;
    void *out_slot;
    const void *in_slot;

    if (chunk_of(c, p, prev, i, &off, &n)) {
        SC_TRY(sc_send_acquire(c, to, &out_slot));
        p->k->first(out_slot, p->x + off * isz, n);
        sc_send_commit(to);
    }
    for (int step = 1; step <= P - 2; step++)
        if (chunk_of(c, p, sc_wrap(r - step - 1, P), i, &off, &n))
            SC_TRY(sc_recv_reduce_send(c, prev, next, p->k, p->x + off * isz, n));
    if (!chunk_of(c, p, r, i, &off, &n))
        return SC_OK;
    size_t boff, blen;
    sc_block_range(p->count, P, r, &boff, &blen);
    char *dst = p->final + (off - boff) * isz;
    SC_TRY(sc_recv_acquire(c, from, &in_slot));
    if (forward) {
        /* Reduce into the outgoing slot (in cache), then copy it to the output. */
        SC_TRY(sc_send_acquire(c, to, &out_slot));
        p->k->last(out_slot, in_slot, p->x + off * isz, n, P);
        sc_recv_release(from);
        sc_out_copy(dst, out_slot, n * isz, p->stream);
        sc_send_commit(to);
        return SC_OK;
    }
    p->k->last(dst, in_slot, p->x + off * isz, n, P);
    sc_recv_release(from);
    return SC_OK;
}

static int ag_round(sc_comm *c, const ring_plan *p, size_t i, int own_sent)
{
    int r = c->rank, P = c->world;
    sc_endpoint *to = &c->send[sc_wrap(r + 1, P)], *from = &c->recv[sc_wrap(r - 1, P)];
    size_t off, n, isz = p->itemsize;
    void *out_slot;
    const void *in_slot;

    if (!own_sent && chunk_of(c, p, r, i, &off, &n)) {
        SC_TRY(sc_send_acquire(c, to, &out_slot));
        size_t boff, blen;
        sc_block_range(p->count, P, r, &boff, &blen);
        const char *src = p->x + (off - boff) * isz;
        memcpy(out_slot, src, n * isz);
        if (p->out + off * isz != src)
            sc_out_copy(p->out + off * isz, src, n * isz, p->stream);
        sc_send_commit(to);
    }
    for (int step = 0; step <= P - 2; step++) {
        if (!chunk_of(c, p, sc_wrap(r - step - 1, P), i, &off, &n))
            continue;
        SC_TRY(sc_recv_acquire(c, from, &in_slot));
        sc_out_copy(p->out + off * isz, in_slot, n * isz, p->stream);
        if (step < P - 2) {
            SC_TRY(sc_send_acquire(c, to, &out_slot));
            memcpy(out_slot, in_slot, n * isz);
            sc_send_commit(to);
        }
        sc_recv_release(from);
    }
    return SC_OK;
}

static size_t rounds(const sc_comm *c, const ring_plan *p)
{
    return sc_div_up(sc_div_up(p->count, (size_t)c->world), p->chunk);
}

static size_t chunk_elems(const sc_comm *c, size_t accsize)
{
    return c->slot_bytes / accsize;
}

int sc_ring_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t roff, rlen, count = a->count;
    sc_block_range(count, c->world, c->rank, &roff, &rlen);
    ring_plan p = { a->x, a->out, (char *)a->out + roff * k->itemsize, count,
                    chunk_elems(c, k->accsize), k->itemsize, k,
                    sc_use_stream(c, count * k->itemsize) && a->out != a->x };
    /* AllGather's own block is the reduced block, already in out. */
    ring_plan ag = p;
    ag.x = p.final;
    for (size_t i = 0, n = rounds(c, &p); i < n; i++) {
        SC_TRY(rs_round(c, &p, i, 1));
        SC_TRY(ag_round(c, &ag, i, 1));
    }
    return SC_OK;
}

int sc_ring_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    ring_plan p = { a->x, NULL, a->out, a->count * (size_t)c->world,
                    chunk_elems(c, k->accsize), k->itemsize, k, 0 };
    for (size_t i = 0, n = rounds(c, &p); i < n; i++)
        SC_TRY(rs_round(c, &p, i, 0));
    return SC_OK;
}

int sc_ring_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    /* Bytes as uint8: equal blocks of count bytes, chunked by whole slots. */
    size_t total = a->count * (size_t)c->world;
    ring_plan p = { a->x, a->out, NULL, total, chunk_elems(c, 1), 1, NULL,
                    sc_use_stream(c, total) };
    for (size_t i = 0, n = rounds(c, &p); i < n; i++)
        SC_TRY(ag_round(c, &p, i, 0));
    return SC_OK;
}
