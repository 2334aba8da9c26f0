/* Ring ReduceScatter, ring AllGather, and ring AllReduce = the two (Patarasuk & Yuan).
 *
 * The vector is cut into `world` blocks; block b is reduced by rank b.  Each block
 * is streamed in chunks of one channel slot, and the schedule is chunk-major: for
 * chunk c every step of the ring runs before chunk c+1 starts, so each channel
 * carries items in exactly the order its consumer asks for them, and a message of
 * any size flows through nslots x slot_bytes of shared memory per channel.
 *
 * ReduceScatter, rank r, chunk c (P-1 steps, "recv-reduce-send" fused):
 *   send   acc = x[r-1]                                  -> r+1
 *   k=1..P-2: acc = recv (+) x[r-k-1], send              -> r+1
 *   recv   dst[r] = recv (+) x[r]        (forwarded to r+1 when AllGather follows)
 * AllGather, rank r, chunk c (P-1 steps):
 *   send own block (unless the ReduceScatter already forwarded it)
 *   j=0..P-2: out[r-j-1] = recv, forward it unless j = P-2
 * Per rank and per round sends minus receives never exceed one, so with nslots >= 2
 * the channels can never all be full at once: the pipeline cannot deadlock.
 * In place (out == x) is safe: within a round every x chunk is read before the
 * AllGather writes the same chunk of out. */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

typedef struct ring_plan {
    sc_comm *c;
    const char *x;            /* ReduceScatter input, or AllGather's own block */
    char *out;                /* AllGather output: all blocks */
    char *final;              /* where ReduceScatter leaves this rank's block */
    size_t count;             /* elements over all blocks */
    size_t chunk;             /* elements per chunk */
    size_t itemsize;
    const sc_kernels *k;
    int op;
    int stream;               /* write the output with streaming stores */
} ring_plan;

/* Chunk c of block b, as an element range; false when the block has no chunk c. */
static inline int chunk_of(const ring_plan *p, int b, size_t c, size_t *off, size_t *n)
{
    return sc_chunk_of(p->count, p->c->world, b, c, p->chunk, off, n);
}

static int rs_round(const ring_plan *p, size_t c, int forward)
{
    sc_comm *cm = p->c;
    int r = cm->rank, P = cm->world;
    sc_endpoint *to = &cm->send[sc_wrap(r + 1, P)], *from = &cm->recv[sc_wrap(r - 1, P)];
    size_t off, n, isz = p->itemsize;
    void *out_slot;
    const void *in_slot;
    int st;

    if (chunk_of(p, sc_wrap(r - 1, P), c, &off, &n)) {
        if ((st = sc_send_acquire(cm, to, &out_slot)))
            return st;
        p->k->first(out_slot, p->x + off * isz, n);
        sc_send_commit(to);
    }
    for (int k = 1; k <= P - 2; k++) {
        if (!chunk_of(p, sc_wrap(r - k - 1, P), c, &off, &n))
            continue;
        if ((st = sc_recv_acquire(cm, from, &in_slot)) || (st = sc_send_acquire(cm, to, &out_slot)))
            return st;
        p->k->mid(out_slot, in_slot, p->x + off * isz, n);
        sc_recv_release(from);
        sc_send_commit(to);
    }
    if (!chunk_of(p, r, c, &off, &n))
        return SC_OK;
    size_t boff, blen;
    sc_block_range(p->count, P, r, &boff, &blen);
    char *dst = p->final + (off - boff) * isz;
    if ((st = sc_recv_acquire(cm, from, &in_slot)))
        return st;
    if (forward) {
        /* Reduce into the outgoing slot (in cache), then copy it to the output. */
        if ((st = sc_send_acquire(cm, to, &out_slot)))
            return st;
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

static int ag_round(const ring_plan *p, size_t c, int own_sent)
{
    sc_comm *cm = p->c;
    int r = cm->rank, P = cm->world;
    sc_endpoint *to = &cm->send[sc_wrap(r + 1, P)], *from = &cm->recv[sc_wrap(r - 1, P)];
    size_t off, n, isz = p->itemsize;
    void *out_slot;
    const void *in_slot;
    int st;

    if (!own_sent && chunk_of(p, r, c, &off, &n)) {
        if ((st = sc_send_acquire(cm, to, &out_slot)))
            return st;
        size_t boff, blen;
        sc_block_range(p->count, P, r, &boff, &blen);
        const char *src = p->x + (off - boff) * isz;
        memcpy(out_slot, src, n * isz);
        if (p->out + off * isz != src)
            sc_out_copy(p->out + off * isz, src, n * isz, p->stream);
        sc_send_commit(to);
    }
    for (int j = 0; j <= P - 2; j++) {
        if (!chunk_of(p, sc_wrap(r - j - 1, P), c, &off, &n))
            continue;
        if ((st = sc_recv_acquire(cm, from, &in_slot)))
            return st;
        sc_out_copy(p->out + off * isz, in_slot, n * isz, p->stream);
        if (j < P - 2) {
            if ((st = sc_send_acquire(cm, to, &out_slot)))
                return st;
            memcpy(out_slot, in_slot, n * isz);
            sc_send_commit(to);
        }
        sc_recv_release(from);
    }
    return SC_OK;
}

static size_t rounds(const ring_plan *p)
{
    size_t biggest = (p->count + (size_t)p->c->world - 1) / (size_t)p->c->world;
    return (biggest + p->chunk - 1) / p->chunk;
}

static size_t chunk_elems(const sc_comm *c, size_t accsize)
{
    return c->slot_bytes / accsize;
}

int sc_ring_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    size_t roff, rlen, count = a->count;
    sc_block_range(count, c->world, c->rank, &roff, &rlen);
    ring_plan p = { c, a->x, a->out, (char *)a->out + roff * k->itemsize, count,
                    chunk_elems(c, k->accsize), k->itemsize, k, a->op,
                    sc_use_stream(c, count * k->itemsize) && a->out != a->x };
    /* AllGather's own block is the reduced block, already in out. */
    ring_plan ag = p;
    ag.x = p.final;
    size_t n = rounds(&p);
    int st = SC_OK;
    for (size_t i = 0; i < n && st == SC_OK; i++) {
        st = rs_round(&p, i, 1);
        if (st == SC_OK)
            st = ag_round(&ag, i, 1);
    }
    return st;
}

int sc_ring_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    ring_plan p = { c, a->x, NULL, a->out, a->count * (size_t)c->world,
                    chunk_elems(c, k->accsize), k->itemsize, k, a->op, 0 };
    size_t n = rounds(&p);
    int st = SC_OK;
    for (size_t i = 0; i < n && st == SC_OK; i++)
        st = rs_round(&p, i, 0);
    return st;
}

int sc_ring_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    /* Bytes as uint8: equal blocks of count bytes, chunked by whole slots. */
    size_t total = a->count * (size_t)c->world;
    ring_plan p = { c, a->x, a->out, NULL, total, chunk_elems(c, 1), 1, NULL, 0,
                    sc_use_stream(c, total) };
    size_t n = rounds(&p);
    int st = SC_OK;
    for (size_t i = 0; i < n && st == SC_OK; i++)
        st = ag_round(&p, i, 0);
    return st;
}
