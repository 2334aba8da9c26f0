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

/* Fan-out.  A chunk for every peer goes into slot fan_sent % nslots of our channel to
 * ourselves.  Before writing it we take a credit in the channel to every peer; each
 * fanned chunk a peer reads is one item of its channel from us, consumed in order, so
 * a credit for this chunk means that peer released its item of the chunk nslots
 * earlier: the one whose slot we are about to reuse.  At world 2 there is one peer,
 * and the chunk goes through the channel as ever. */
static const char *fan_slot(const sc_comm *c, int owner, uint64_t n)
{
    size_t own_channel = (size_t)owner * c->world + owner;     /* table 0: collectives */
    const char *slots = c->base + sc_off_slots(c->world) +
                        own_channel * sc_channel_bytes(c->slot_bytes, c->nslots);
    return slots + (n % c->nslots) * c->slot_bytes;
}

int sc_put_all(sc_comm *c, const void *src, size_t bytes)
{
    int P = c->world;
    if (P < 3)
        return P == 2 ? sc_put(c, 1 - c->rank, src, bytes) : SC_OK;
    sc_endpoint *own = &c->send[c->rank];
    if (!own->reserved)
        SC_TRY(sc_reserve_channel(c, own));
    for (int i = 1; i < P; i++)
        SC_TRY(sc_send_credit(c, &c->send[(c->rank + i) % P]));
    memcpy((char *)fan_slot(c, c->rank, c->fan_sent), src, bytes);
    c->fan_sent++;
    for (int i = 1; i < P; i++)
        sc_send_commit(&c->send[(c->rank + i) % P]);
    return SC_OK;
}

int sc_recv_acquire_all(sc_comm *c, int peer, const void **slot)
{
    SC_TRY(sc_recv_acquire(c, &c->recv[peer], slot));
    if (c->world > 2)
        *slot = fan_slot(c, peer, c->fan_read[peer]);
    return SC_OK;
}

void sc_recv_release_all(sc_comm *c, int peer)
{
    sc_recv_release(&c->recv[peer]);
    c->fan_read[peer]++;
}

int sc_get_all(sc_comm *c, int peer, void *dst, size_t bytes, int stream)
{
    const void *slot;
    SC_TRY(sc_recv_acquire_all(c, peer, &slot));
    sc_out_copy(dst, slot, bytes, stream);
    sc_recv_release_all(c, peer);
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
