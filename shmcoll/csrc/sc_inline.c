/* Inline schedules: the direct schedules for calls so small that every rank's part
 * (at most SC_INLINE_BYTES) rides in the call record it publishes anyway.
 *
 * Every rank already publishes its call and checks every peer's before it returns
 * (sc_call.c), so a direct schedule of a few bytes paid for two exchanges: the
 * records, and the data through channel slots (a slot, its flag, its credit).
 * Here the part is written into the record before its flag is raised, and each peer
 * copies it out in the same check that compares the calls: the whole call is one
 * exchange of records, its cost a barrier's.  The check copies the record and
 * confirms its sequence number afterwards, so the part read is this call's.
 *
 * A reduction combines the parts in rank order 0..P-1, as one-shot AllReduce does
 * (csrc/sc_direct.c), so every rank computes the same bits, and the same bits as a
 * one-shot call.  Own part: the copy in this rank's own record, so no source aliases
 * out (in place included). */
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

/* Every peer's call checked, its part copied into c->parts (and ours beside them). */
static int exchange_parts(sc_comm *c)
{
    memcpy(c->parts + (size_t)c->rank * SC_INLINE_BYTES, c->call.payload, SC_INLINE_BYTES);
    return sc_call_check_all(c);
}

static const unsigned char *part_of(const sc_comm *c, int q)
{
    return c->parts + (size_t)q * SC_INLINE_BYTES;
}

/* out = part_0 (+) part_1 (+) ... (+) part_{P-1}, n elements from byte `off` of each. */
static void reduce_parts(sc_comm *c, const sc_kernels *k, size_t off, void *out, size_t n)
{
    int P = c->world;
    char *acc[2] = { c->scratch, c->scratch + c->slot_bytes };
    k->first(acc[0], part_of(c, 0) + off, n);
    for (int q = 1; q < P - 1; q++)
        k->mid(acc[q % 2], acc[(q - 1) % 2], part_of(c, q) + off, n);
    k->last(out, acc[(P - 2) % 2], part_of(c, P - 1) + off, n, P);
}

int sc_inline_allreduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    SC_TRY(exchange_parts(c));
    if (a->count)
        reduce_parts(c, k, 0, a->out, a->count);
    return SC_OK;
}

int sc_inline_reduce(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    SC_TRY(exchange_parts(c));
    if (a->count && c->rank == a->root)
        reduce_parts(c, k, 0, a->out, a->count);
    return SC_OK;
}

int sc_inline_reduce_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    SC_TRY(exchange_parts(c));
    if (a->count)
        reduce_parts(c, k, (size_t)c->rank * a->count * k->itemsize, a->out, a->count);
    return SC_OK;
}

int sc_inline_broadcast(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(exchange_parts(c));
    if (a->count && c->rank != a->root)
        memcpy((void *)a->x, part_of(c, a->root), a->count);
    return SC_OK;
}

int sc_inline_allgather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(exchange_parts(c));
    for (int q = 0; q < c->world && a->count; q++)
        memcpy((char *)a->out + (size_t)q * a->count, part_of(c, q), a->count);
    return SC_OK;
}

int sc_inline_gather(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(exchange_parts(c));
    for (int q = 0; q < c->world && a->count && c->rank == a->root; q++)
        memcpy((char *)a->out + (size_t)q * a->count, part_of(c, q), a->count);
    return SC_OK;
}

int sc_inline_scatter(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(exchange_parts(c));
    if (a->count)
        memcpy(a->out, part_of(c, a->root) + (size_t)c->rank * a->count, a->count);
    return SC_OK;
}

int sc_inline_alltoall(sc_comm *c, const sc_args *a, const sc_kernels *k)
{
    (void)k;
    SC_TRY(exchange_parts(c));
    for (int q = 0; q < c->world && a->count; q++)
        memcpy((char *)a->out + (size_t)q * a->count,
               part_of(c, q) + (size_t)c->rank * a->count, a->count);
    return SC_OK;
}
