/* Inline and eager schedules: the direct schedules for calls so small that every
 * rank's part is published with the call record it publishes anyway.
 *
 * Every rank already publishes its call and checks every peer's before it returns
 * (sc_call.c), so a direct schedule of a small call paid for two exchanges: the
 * records, and the data through channel slots (a slot, its flag, its credit).
 * Here the part goes with the record, and the check that compares the calls is the
 * whole synchronisation: the call costs a barrier plus its copies.
 *   inline (at most SC_INLINE_BYTES)  the part is written into the record, in the
 *       record's own cache lines, and each peer copies it out in its check.  The check
 *       copies the record and confirms its sequence number afterwards, so the part
 *       read is this call's.
 *   eager (at most SC_EAGER_BYTES)  the part is written into this rank's part buffer
 *       for the call's parity before the record's flag is raised, and peers read it
 *       where it lies once they checked the record: the buffer is not written again
 *       before they are done with it (sc_eager_part).
 *
 * A reduction combines the parts in rank order 0..P-1, as one-shot AllReduce does
 * (csrc/sc_direct.c), so every rank computes the same bits, and the same bits as a
 * one-shot call.  Each peer's record is checked when its part is first needed
 * (part_ready), and a rank's own part is read where no source aliases out, in place
 * included (own_part). */
#include <string.h>

#include "sc_internal.h"
#include "sc_reduce.h"

size_t sc_inline_part_bytes(const sc_args *a, const sc_kernels *k, int world)
{
    size_t bytes = k ? a->count * k->itemsize : a->count;
    switch (a->collective) {
    case SC_COLL_REDUCE_SCATTER:    /* the whole x: each rank reduces its block of it */
    case SC_COLL_SCATTER:           /* the root's rows */
    case SC_COLL_ALLTOALL:          /* a row for every rank */
        return bytes * (size_t)world;
    default:                        /* x (AllGather, Gather: this rank's row) */
        return bytes;
    }
}

int sc_eager_publishes(const sc_args *a, int rank)
{
    return (a->collective != SC_COLL_BROADCAST && a->collective != SC_COLL_SCATTER) ||
           rank == a->root;
}

/* Where this rank reads its own part: inline, its copy beside the peers' in c->parts
 * (theirs are copied there by the checks of their records); eager, x itself where x
 * and out do not overlap (the copy in the part buffer is for the peers: reading x
 * back from there, lines the peers are reading at that moment, cost 7-60% more at
 * P = 2, 4-32 KiB), else that copy, so that no source aliases out. */
static const char *own_part(sc_comm *c, const sc_args *a, size_t part_bytes, size_t out_bytes)
{
    if (c->call.field[SC_FIELD_ALGORITHM] == SC_ALGO_DIRECT_INLINE) {
        memcpy(c->parts + (size_t)c->rank * SC_INLINE_BYTES, c->call.payload, SC_INLINE_BYTES);
        return (const char *)c->parts + (size_t)c->rank * SC_INLINE_BYTES;
    }
    const char *x = a->x, *out = a->out;
    if (x && (!out || x + part_bytes <= out || out + out_bytes <= x))
        return x;
    return sc_eager_part(c, c->rank, c->call_seq);
}

/* Rank q's part (own: this rank's, own_part), once q's record of this call was
 * checked.  Each peer is checked the first time its part is needed, in the order the
 * schedule needs them, so a rank combines or copies the parts of the peers that
 * arrived while later ones are still on their way (with ranks outnumbering cores,
 * not after the last one); sc_run checks the rest before returning. */
static int part_ready(sc_comm *c, int q, const char *own, const char **part)
{
    if (q == c->rank) {
        *part = own;
        return SC_OK;
    }
    SC_TRY(sc_call_check_once(c, q));
    if (c->call.field[SC_FIELD_ALGORITHM] == SC_ALGO_DIRECT_EAGER)
        *part = sc_eager_part(c, q, c->call_seq);
    else
        *part = (const char *)c->parts + (size_t)q * SC_INLINE_BYTES;
    return SC_OK;
}

/* out = part_0 (+) part_1 (+) ... (+) part_{P-1}, n elements from byte `off` of each,
 * in chunks that fit the accumulators.  Where the dtype is its own accumulator type,
 * part_0 is the first accumulator itself (one pass fewer; at P = 2 the only pass). */
static int reduce_parts(sc_comm *c, const sc_args *a, const sc_kernels *k, size_t off,
                        char *out, size_t n)
{
    int P = c->world;
    char *acc[2] = { c->scratch, c->scratch + c->slot_bytes };
    size_t chunk = c->slot_bytes / k->accsize, isz = k->itemsize;
    const char *own = own_part(c, a, sc_inline_part_bytes(a, k, P), n * isz), *part;
    for (size_t start = 0; start < n; start += chunk) {
        size_t m = sc_min(n - start, chunk), at = off + start * isz;
        SC_TRY(part_ready(c, 0, own, &part));
        const void *first = part + at;
        if (k->itemsize != k->accsize) {
            k->first(acc[0], first, m);
            first = acc[0];
        }
        for (int q = 1; q < P - 1; q++) {
            SC_TRY(part_ready(c, q, own, &part));
            k->mid(acc[q % 2], first, part + at, m);
            first = acc[q % 2];
        }
        SC_TRY(part_ready(c, P - 1, own, &part));
        k->last(out + start * isz, first, part + at, m, P);
    }
    return SC_OK;
}

/* Copies `bytes` from byte `off` of every rank's part to out + q * bytes, q = 0..P-1,
 * a peer's as soon as it arrived; or, where root >= 0, the root's part to out. */
static int copy_parts(sc_comm *c, const sc_args *a, size_t off, char *out, size_t bytes, int root)
{
    int P = c->world;
    size_t out_bytes = root >= 0 ? bytes : bytes * (size_t)P;
    const char *own = own_part(c, a, sc_inline_part_bytes(a, NULL, P), out_bytes), *part;
    if (!bytes)
        return SC_OK;
    if (root >= 0) {
        SC_TRY(part_ready(c, root, own, &part));
        memcpy(out, part + off, bytes);
        return SC_OK;
    }
    for (int i = 1; i <= P; i++) {      /* (ourselves last) */
        int q = (c->rank + i) % P;
        SC_TRY(part_ready(c, q, own, &part));
        memcpy(out + (size_t)q * bytes, part + off, bytes);
    }
    return SC_OK;
}

int sc_inline_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    return reduce_parts(c, a, k, 0, a->out, a->count);
}

int sc_inline_reduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    return c->rank == a->root ? reduce_parts(c, a, k, 0, a->out, a->count) : SC_OK;
}

int sc_inline_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    return reduce_parts(c, a, k, (size_t)c->rank * a->count * k->itemsize, a->out, a->count);
}

int sc_inline_broadcast(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    return c->rank == a->root ? SC_OK : copy_parts(c, a, 0, (char *)a->x, a->count, a->root);
}

int sc_inline_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    return copy_parts(c, a, 0, a->out, a->count, -1);
}

int sc_inline_gather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    return c->rank == a->root ? copy_parts(c, a, 0, a->out, a->count, -1) : SC_OK;
}

int sc_inline_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    return copy_parts(c, a, (size_t)c->rank * a->count, a->out, a->count, a->root);
}

int sc_inline_alltoall(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    return copy_parts(c, a, (size_t)c->rank * a->count, a->out, a->count, -1);
}
