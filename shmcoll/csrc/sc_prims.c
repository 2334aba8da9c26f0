/* sc_prims: the chunk-level primitives every schedule is written in, on top of the
 * channel operations of sc_comm.c.  A range moves in slot-sized cuts that the
 * sender and the receiver compute alike, so no length travels with the data. */
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"
#include "sc_reduce.h"

int sc_put(sc_comm *c, int peer, const void *src, size_t bytes)
{
    sc_endpoint *e = &c->send[peer];
    void *slot;
    SC_TRY(sc_send_acquire(c, e, &slot));
    memcpy(slot, src, bytes);
    sc_send_commit(e);
    return SC_OK;
}

int sc_get(sc_comm *c, int peer, void *dst, size_t bytes, int stream)
{
    sc_endpoint *e = &c->recv[peer];
    const void *slot;
    SC_TRY(sc_recv_acquire(c, e, &slot));
    sc_out_copy(dst, slot, bytes, stream);
    sc_recv_release(e);
    return SC_OK;
}

int sc_put_range(sc_comm *c, int peer, const void *src, size_t bytes)
{
    const char *from = src;
    for (size_t off = 0; off < bytes; off += c->slot_bytes)
        SC_TRY(sc_put(c, peer, from + off, sc_min(bytes - off, c->slot_bytes)));
    return SC_OK;
}

int sc_get_range(sc_comm *c, int peer, void *dst, size_t bytes, int stream)
{
    char *to = dst;
    for (size_t off = 0; off < bytes; off += c->slot_bytes)
        SC_TRY(sc_get(c, peer, to + off, sc_min(bytes - off, c->slot_bytes), stream));
    return SC_OK;
}

int sc_recv_reduce_send(sc_comm *c, int from, int to, const sc_kernels *k, const void *x, size_t n)
{
    sc_endpoint *in = &c->recv[from], *out = &c->send[to];
    const void *received;
    void *slot;
    SC_TRY(sc_recv_acquire(c, in, &received));
    SC_TRY(sc_send_acquire(c, out, &slot));
    k->mid(slot, received, x, n);
    sc_recv_release(in);
    sc_send_commit(out);
    return SC_OK;
}
