/* Recursive halving/doubling AllReduce (Thakur, Rabenseifner & Gropp 2005).
 *
 * Over p2 = the largest power of two <= P ranks:
 *   doubling (small n)   log2 p2 steps; at step k partners v and v^2^k swap their
 *                        whole partial vectors and both merge them
 *   halving (large n)    Rabenseifner: a recursive-halving ReduceScatter (each step
 *                        swaps half of the remaining range, n/2 + n/4 + ...), then a
 *                        recursive-doubling AllGather of the finished blocks
 * P not a power of two: the first 2·(P - p2) ranks pair up first; the even one
 * sends its vector to the odd one and sits out, receiving the result at the end.
 *
 * Partners always merge in the same operand order (lower virtual rank first), so
 * every rank computes the same bits.  Partial results travel in the accumulator
 * type; the vector being reduced lives in `out` (or, for float16/bfloat16, in a
 * float32 copy).  A swap sends chunk i then receives chunk i, so neither side is
 * ever more than one chunk ahead (nslots >= 2). */
#include <string.h>

#include "sc_internal.h"
#include "sc_reduce.h"

typedef struct rhd {
    sc_comm *c;
    const sc_kernels *k;
    char *acc;              /* the partial vector, count x accsize */
    size_t count;
    int p2, v;              /* power-of-two group size and our rank in it */
    int rem;                /* ranks folded in before the power-of-two part */
} rhd;

static int real_rank(const rhd *h, int v) { return v < h->rem ? 2 * v + 1 : v + h->rem; }

/* What to do with each received chunk: merge into acc, or copy into out. */
typedef struct sink {
    char *dst;
    const sc_kernels *k;    /* NULL: copy */
    size_t elem;            /* bytes per element received */
    int received_first;     /* merge order: the received partial is the lower rank's */
} sink;

static void absorb(const sink *s, size_t off, const void *in, size_t bytes)
{
    char *d = s->dst + off;
    if (!s->k)
        memcpy(d, in, bytes);
    else if (s->received_first)
        s->k->combine(d, in, d, bytes / s->elem);
    else
        s->k->combine(d, d, in, bytes / s->elem);
}

/* Sends sbytes from snd to peer while receiving rbytes from it into s. */
static int swap(sc_comm *c, int peer, const char *snd, size_t sbytes, size_t rbytes, const sink *s)
{
    size_t step = c->slot_bytes / s->elem * s->elem;
    for (size_t off = 0; off < sbytes || off < rbytes; off += step) {
        if (off < sbytes)
            SC_TRY(sc_put(c, peer, snd + off, sc_min(sbytes - off, step)));
        if (off < rbytes) {
            const void *in;
            SC_TRY(sc_recv_acquire(c, &c->recv[peer], &in));
            absorb(s, off, in, sc_min(rbytes - off, step));
            sc_recv_release(&c->recv[peer]);
        }
    }
    return SC_OK;
}

/* Elements [off, off+len) of blocks [b0, b1) when count is cut into p2 blocks. */
static void blocks(const rhd *h, int b0, int b1, size_t *off, size_t *len)
{
    size_t end, l;
    sc_block_range(h->count, h->p2, b0, off, &l);
    if (b1 >= h->p2) {
        end = h->count;
    } else {
        sc_block_range(h->count, h->p2, b1, &end, &l);
    }
    *len = end - *off;
}

static int doubling(rhd *h)
{
    size_t a = h->k->accsize, bytes = h->count * a;
    for (int mask = 1; mask < h->p2; mask <<= 1) {
        int partner = h->v ^ mask;
        sink s = { h->acc, h->k, a, partner < h->v };
        SC_TRY(swap(h->c, real_rank(h, partner), h->acc, bytes, bytes, &s));
    }
    return SC_OK;
}

/* Rabenseifner: halving ReduceScatter into acc, finish our block into out, then
 * doubling AllGather of out. */
static int halving(rhd *h, char *out, int world)
{
    size_t a = h->k->accsize, isz = h->k->itemsize, koff, klen, soff, slen;
    int lo = 0, hi = h->p2;
    for (int mask = h->p2 / 2; mask >= 1; mask >>= 1) {
        int partner = h->v ^ mask, mid = lo + (hi - lo) / 2;
        int keep_low = (h->v & mask) == 0;
        blocks(h, keep_low ? lo : mid, keep_low ? mid : hi, &koff, &klen);
        blocks(h, keep_low ? mid : lo, keep_low ? hi : mid, &soff, &slen);
        sink s = { h->acc + koff * a, h->k, a, partner < h->v };
        SC_TRY(swap(h->c, real_rank(h, partner), h->acc + soff * a, slen * a, klen * a, &s));
        if (keep_low)
            hi = mid;
        else
            lo = mid;
    }
    blocks(h, h->v, h->v + 1, &koff, &klen);
    if (h->k->finishes || h->acc != out)
        h->k->finish(out + koff * isz, h->acc + koff * a, klen, world);
    for (int mask = 1; mask < h->p2; mask <<= 1) {
        int partner = h->v ^ mask, base = h->v & ~(mask - 1), pbase = partner & ~(mask - 1);
        blocks(h, base, base + mask, &soff, &slen);
        blocks(h, pbase, pbase + mask, &koff, &klen);
        sink s = { out + koff * isz, NULL, isz, 0 };
        SC_TRY(swap(h->c, real_rank(h, partner), out + soff * isz, slen * isz, klen * isz, &s));
    }
    return SC_OK;
}

/* Even ranks below 2·rem hand their vector to the next rank and wait for the result. */
static int sit_out(sc_comm *c, const sc_kernels *k, const char *x, char *out, size_t count)
{
    size_t chunk = c->slot_bytes / k->accsize, isz = k->itemsize;
    sc_endpoint *e = &c->send[c->rank + 1];
    for (size_t i = 0; i < count; i += chunk) {
        void *slot;
        SC_TRY(sc_send_acquire(c, e, &slot));
        k->first(slot, x + i * isz, sc_min(count - i, chunk));
        sc_send_commit(e);
    }
    return sc_get_range(c, c->rank + 1, out, count * isz, 0);
}

int sc_rhd_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    int P = c->world, p2 = 1;
    while (p2 * 2 <= P)
        p2 *= 2;
    rhd h = { c, k, NULL, a->count, p2, 0, P - p2 };
    size_t isz = k->itemsize, asz = k->accsize;
    char *out = a->out;
    if (a->count == 0)
        return SC_OK;
    if (c->rank < 2 * h.rem && c->rank % 2 == 0)
        return sit_out(c, k, a->x, out, a->count);
    h.v = c->rank < 2 * h.rem ? c->rank / 2 : c->rank - h.rem;

    h.acc = isz == asz ? out : sc_wide(c, a->count * asz);
    if (!h.acc) {
        c->err_peer = -1;
        c->err_what = "allocating the float32 accumulator";
        return SC_ENOMEM;
    }
    if (isz == asz && out != a->x)
        memcpy(out, a->x, a->count * isz);
    else if (isz != asz)
        k->first(h.acc, a->x, a->count);
    if (c->rank < 2 * h.rem) {      /* merge the even neighbour's vector first */
        sink s = { h.acc, k, asz, 1 };
        SC_TRY(swap(c, c->rank - 1, NULL, 0, a->count * asz, &s));
    }
    if (a->algo == SC_ALGO_RHD_HALVING) {
        SC_TRY(halving(&h, out, P));
    } else {
        SC_TRY(doubling(&h));
        if (k->finishes || h.acc != out)
            k->finish(out, h.acc, a->count, P);
    }
    if (c->rank < 2 * h.rem)       /* hand the result to the neighbour that sat out */
        SC_TRY(sc_put_range(c, c->rank - 1, out, a->count * isz));
    return SC_OK;
}
