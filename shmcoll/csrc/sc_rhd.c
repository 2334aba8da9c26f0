/* Recursive halving/doubling AllReduce, ReduceScatter and AllGather (Thakur,
 * Rabenseifner & Gropp 2005).
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
 * ReduceScatter and AllGather are the two halves of the halving variant over real
 * blocks: virtual rank v's piece is the blocks of the ranks it stands for (2v and
 * 2v+1 among the folded pairs), so the odd rank of a pair finishes both blocks and
 * hands one to its neighbour, and a ReduceScatter then an AllGather combine every
 * element in the same order as the halving AllReduce.
 *
 * Partners always merge in the same operand order (lower virtual rank first), so
 * every rank computes the same bits.  Partial results travel in the accumulator
 * type; the vector being reduced lives in `out` (or, for float16/bfloat16, in a
 * float32 copy).  The first step reads our own operand straight from x, so an
 * out-of-place call never copies x into out first (a whole extra pass over M).
 * A swap sends chunk i then receives chunk i, so neither side is ever more than
 * one chunk ahead (nslots >= 2). */
#include <string.h>

#include "sc_internal.h"
#include "sc_reduce.h"

typedef struct rhd {
    sc_comm *c;
    const sc_kernels *k;
    char *acc;              /* the partial vector, count x accsize */
    const char *src;        /* where the next step reads our operand: x until the
                             * first merge (same type only), then acc */
    size_t count;
    int p2, v;              /* power-of-two group size and our rank in it */
    int rem;                /* ranks folded in before the power-of-two part */
    size_t block;           /* 0: count is cut in p2 pieces (AllReduce); else the
                             * elements of each rank's block (ReduceScatter,
                             * AllGather), and virtual rank v's piece is the blocks
                             * of the real ranks it stands for */
} rhd;

static int real_rank(const rhd *h, int v) { return v < h->rem ? 2 * v + 1 : v + h->rem; }

/* What to do with each received chunk: merge into acc, or copy into out. */
typedef struct sink {
    char *dst;
    const char *from;       /* our operand (merge only): dst, or x before the first */
    const sc_kernels *k;    /* NULL: copy */
    size_t elem;            /* bytes per element received */
    int received_first;     /* merge order: the received partial is the lower rank's */
} sink;

static void absorb(const sink *s, size_t off, const void *in, size_t bytes)
{
    char *d = s->dst + off;
    const char *f = s->from + off;
    if (!s->k)
        memcpy(d, in, bytes);
    else if (s->received_first)
        s->k->combine(d, in, f, bytes / s->elem);
    else
        s->k->combine(d, f, in, bytes / s->elem);
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

/* The first real block of virtual rank v's piece (v = p2: the end of the vector). */
static size_t first_block(const rhd *h, int v) { return v < h->rem ? 2 * (size_t)v : (size_t)(v + h->rem); }

/* Elements [off, off+len) of the pieces of virtual ranks [b0, b1). */
static void blocks(const rhd *h, int b0, int b1, size_t *off, size_t *len)
{
    size_t end, l;
    if (h->block) {
        *off = first_block(h, b0) * h->block;
        *len = first_block(h, b1) * h->block - *off;
        return;
    }
    sc_block_range(h->count, h->p2, b0, off, &l);
    if (b1 >= h->p2) {
        end = h->count;
    } else {
        sc_block_range(h->count, h->p2, b1, &end, &l);
    }
    *len = end - *off;
}

/* Our operand before the first step: x itself when it has the accumulator type,
 * else widened into acc; a rank with a folded-in neighbour merges its vector first. */
static int start(rhd *h, const char *x)
{
    size_t bytes = h->count * h->k->accsize;
    h->src = x;
    if (h->k->itemsize != h->k->accsize) {
        h->k->first(h->acc, x, h->count);
        h->src = h->acc;
    }
    if (h->c->rank < 2 * h->rem) {
        sink s = { h->acc, h->src, h->k, h->k->accsize, 1 };
        SC_TRY(swap(h->c, h->c->rank - 1, NULL, 0, bytes, &s));
        h->src = h->acc;
    }
    return SC_OK;
}

/* After the steps: acc holds the result even where there were none (a group of one). */
static void settle(rhd *h)
{
    if (h->src != h->acc)
        memcpy(h->acc, h->src, h->count * h->k->accsize);
    h->src = h->acc;
}

static int doubling(rhd *h)
{
    size_t a = h->k->accsize, bytes = h->count * a;
    for (int mask = 1; mask < h->p2; mask <<= 1) {
        int partner = h->v ^ mask;
        sink s = { h->acc, h->src, h->k, a, partner < h->v };
        SC_TRY(swap(h->c, real_rank(h, partner), h->src, bytes, bytes, &s));
        h->src = h->acc;
    }
    return SC_OK;
}

/* Recursive halving: afterwards acc holds our piece reduced over every rank. */
static int halve(rhd *h)
{
    size_t a = h->k->accsize, koff, klen, soff, slen;
    int lo = 0, hi = h->p2;
    for (int mask = h->p2 / 2; mask >= 1; mask >>= 1) {
        int partner = h->v ^ mask, mid = lo + (hi - lo) / 2;
        int keep_low = (h->v & mask) == 0;
        blocks(h, keep_low ? lo : mid, keep_low ? mid : hi, &koff, &klen);
        blocks(h, keep_low ? mid : lo, keep_low ? hi : mid, &soff, &slen);
        sink s = { h->acc + koff * a, h->src + koff * a, h->k, a, partner < h->v };
        SC_TRY(swap(h->c, real_rank(h, partner), h->src + soff * a, slen * a, klen * a, &s));
        h->src = h->acc;
        if (keep_low)
            hi = mid;
        else
            lo = mid;
    }
    return SC_OK;
}

/* Recursive doubling AllGather of the pieces in out (elements of `elem` bytes). */
static int gather_doubling(rhd *h, char *out, size_t elem)
{
    size_t koff, klen, soff, slen;
    for (int mask = 1; mask < h->p2; mask <<= 1) {
        int partner = h->v ^ mask, base = h->v & ~(mask - 1), pbase = partner & ~(mask - 1);
        blocks(h, base, base + mask, &soff, &slen);
        blocks(h, pbase, pbase + mask, &koff, &klen);
        sink s = { out + koff * elem, NULL, NULL, elem, 0 };
        SC_TRY(swap(h->c, real_rank(h, partner), out + soff * elem, slen * elem, klen * elem, &s));
    }
    return SC_OK;
}

/* Rabenseifner: halving ReduceScatter into acc, finish our block into out, then
 * doubling AllGather of out. */
static int halving(rhd *h, char *out, int world)
{
    size_t a = h->k->accsize, isz = h->k->itemsize, koff, klen;
    SC_TRY(halve(h));
    settle(h);
    blocks(h, h->v, h->v + 1, &koff, &klen);
    if (h->k->finishes || h->acc != out)
        h->k->finish(out + koff * isz, h->acc + koff * a, klen, world);
    return gather_doubling(h, out, isz);
}

/* Sends n elements of src to `peer` in the accumulator type (first) or finished
 * into the item type (finish, over `world` ranks), filling every slot: the
 * receiver reads whole slots (swap, sc_get_range), so a slot holds slot_bytes of
 * the type it carries — twice the elements once float16 or bfloat16 is finished. */
static int put_converted(sc_comm *c, int peer, const sc_kernels *k, const char *src, size_t n,
                        int finish, int world)
{
    size_t chunk = c->slot_bytes / (finish ? k->itemsize : k->accsize);
    size_t step = finish ? k->accsize : k->itemsize;
    sc_endpoint *e = &c->send[peer];
    for (size_t i = 0; i < n; i += chunk) {
        void *slot;
        SC_TRY(sc_send_acquire(c, e, &slot));
        if (finish)
            k->finish(slot, src + i * step, sc_min(n - i, chunk), world);
        else
            k->first(slot, src + i * step, sc_min(n - i, chunk));
        sc_send_commit(e);
    }
    return SC_OK;
}

/* Even ranks below 2·rem hand their vector (count elements) to the next rank and
 * wait for their result (result elements). */
static int sit_out(sc_comm *c, const sc_kernels *k, const char *x, char *out, size_t count,
                   size_t result)
{
    SC_TRY(put_converted(c, c->rank + 1, k, x, count, 0, c->world));
    return sc_get_range(c, c->rank + 1, out, result * k->itemsize, 0);
}

/* The group of p2 virtual ranks over P real ones; false for a rank that sits out. */
static int join_group(sc_comm *c, rhd *h)
{
    int P = c->world, p2 = 1;
    while (p2 * 2 <= P)
        p2 *= 2;
    h->c = c, h->p2 = p2, h->rem = P - p2;
    if (c->rank < 2 * h->rem && c->rank % 2 == 0)
        return 0;
    h->v = c->rank < 2 * h->rem ? c->rank / 2 : c->rank - h->rem;
    return 1;
}

static int no_memory(sc_comm *c)
{
    SC_BLAME(c)->peer = SC_BLAME(c)->waited = -1;
    SC_BLAME(c)->what = "allocating the accumulator";
    return SC_ENOMEM;
}

/* Recursive-halving ReduceScatter: the AllReduce's first half over real blocks, so
 * every element is combined in the same order as by the halving AllReduce. */
int sc_rhd_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    rhd h = { .k = k, .count = a->count * (size_t)c->world, .block = a->count };
    size_t asz = k->accsize, koff, klen;
    if (a->count == 0)
        return SC_OK;
    if (!join_group(c, &h))
        return sit_out(c, k, a->x, a->out, h.count, a->count);
    if (!(h.acc = sc_wide(c, h.count * asz)))
        return no_memory(c);
    SC_TRY(start(&h, a->x));
    SC_TRY(halve(&h));
    settle(&h);
    blocks(&h, h.v, h.v + 1, &koff, &klen);
    if (c->rank < 2 * h.rem) {      /* our piece is the neighbour's block and ours */
        SC_TRY(put_converted(c, c->rank - 1, k, h.acc + koff * asz, a->count, 1, c->world));
        koff += a->count;
    }
    k->finish(a->out, h.acc + koff * asz, a->count, c->world);
    return SC_OK;
}

/* Recursive-doubling AllGather (count: bytes per block); a rank that sits out sends
 * its block to the next one and gets the whole vector back. */
int sc_rhd_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    rhd h = { .count = a->count * (size_t)c->world, .block = a->count };
    char *out = a->out, *mine = out + (size_t)c->rank * a->count;
    if (mine != (const char *)a->x)
        memcpy(mine, a->x, a->count);
    if (a->count == 0)
        return SC_OK;
    if (!join_group(c, &h)) {
        SC_TRY(sc_put_range(c, c->rank + 1, mine, a->count));
        return sc_get_range(c, c->rank + 1, out, h.count, 0);
    }
    if (c->rank < 2 * h.rem)
        SC_TRY(sc_get_range(c, c->rank - 1, mine - a->count, a->count, 0));
    SC_TRY(gather_doubling(&h, out, 1));
    if (c->rank < 2 * h.rem)
        SC_TRY(sc_put_range(c, c->rank - 1, out, h.count));
    return SC_OK;
}

int sc_rhd_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    int P = c->world;
    rhd h = { .k = k, .count = a->count };
    size_t isz = k->itemsize, asz = k->accsize;
    char *out = a->out;
    if (a->count == 0)
        return SC_OK;
    if (!join_group(c, &h))
        return sit_out(c, k, a->x, out, a->count, a->count);
    h.acc = isz == asz ? out : sc_wide(c, a->count * asz);
    if (!h.acc)
        return no_memory(c);
    SC_TRY(start(&h, a->x));
    if (a->algo == SC_ALGO_RHD_HALVING) {
        SC_TRY(halving(&h, out, P));
    } else {
        SC_TRY(doubling(&h));
        settle(&h);
        if (k->finishes || h.acc != out)
            k->finish(out, h.acc, a->count, P);
    }
    if (c->rank < 2 * h.rem)       /* hand the result to the neighbour that sat out */
        SC_TRY(sc_put_range(c, c->rank - 1, out, a->count * isz));
    return SC_OK;
}
