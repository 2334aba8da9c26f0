/* Direct (one-shot) AllReduce: every rank publishes its vector to every peer and
 * reduces all P vectors itself, in rank order 0..P-1, so every rank computes the
 * same bits.  One synchronisation per chunk instead of the ring's 2(P-1) chained
 * steps: the latency algorithm, for small messages and for ranks that outnumber
 * cores (where each chained step can cost a context switch).
 *
 * Chunk c on rank r: send x[c] to every peer; acc = x_0[c]; acc (+)= x_q[c] for
 * q = 1..P-2; out[c] = acc (+) x_{P-1}[c].  A rank blocked sending to q waits for
 * q to finish an earlier chunk, which only needs chunks sent even earlier, so
 * the waits cannot form a cycle (nslots >= 2). */
#include <string.h>

#include "sc_internal.h"
#include "sc_reduce.h"

/* Source q of chunk `start`: our own input, or the slot peer q sent us. */
static int acquire_source(sc_comm *c, int q, const char *own, const void **src)
{
    if (q == c->rank) {
        *src = own;
        return SC_OK;
    }
    return sc_recv_acquire(c, &c->recv[q], src);
}

static void release_source(sc_comm *c, int q)
{
    if (q != c->rank)
        sc_recv_release(&c->recv[q]);
}

static int publish(sc_comm *c, const char *own, size_t bytes)
{
    for (int i = 1; i < c->world; i++) {
        sc_endpoint *e = &c->send[(c->rank + i) % c->world];
        void *slot;
        int st = sc_send_acquire(c, e, &slot);
        if (st != SC_OK)
            return st;
        memcpy(slot, own, bytes);
        sc_send_commit(e);
    }
    return SC_OK;
}

static int reduce_chunk(sc_comm *c, const sc_kernels *k, const char *own, char *dst, size_t n)
{
    int P = c->world, st;
    const void *src;
    char *acc = c->scratch, *next = c->scratch + c->slot_bytes;
    if ((st = acquire_source(c, 0, own, &src)))
        return st;
    k->first(acc, src, n);
    release_source(c, 0);
    for (int q = 1; q < P - 1; q++) {
        if ((st = acquire_source(c, q, own, &src)))
            return st;
        k->mid(next, acc, src, n);
        release_source(c, q);
        char *t = acc;
        acc = next, next = t;
    }
    if ((st = acquire_source(c, P - 1, own, &src)))
        return st;
    k->last(dst, acc, src, n, P);
    release_source(c, P - 1);
    return SC_OK;
}

int sc_allreduce_direct(sc_comm *c, const void *x, void *out, size_t count, int dtype, int op)
{
    const sc_kernels *k;
    int done, st = sc_begin_reduction(c, SC_COLL_ALLREDUCE, 1, x, out, count, dtype, op, &k, &done);
    if (st != SC_OK || done)
        return st;
    size_t chunk = c->slot_bytes / k->accsize;
    for (size_t start = 0; start < count; start += chunk) {
        size_t n = count - start < chunk ? count - start : chunk;
        const char *own = (const char *)x + start * k->itemsize;
        st = publish(c, own, n * k->itemsize);
        if (st == SC_OK)
            st = reduce_chunk(c, k, own, (char *)out + start * k->itemsize, n);
        if (st != SC_OK) {
            c->broken = 1;
            return st;
        }
    }
    return SC_OK;
}
