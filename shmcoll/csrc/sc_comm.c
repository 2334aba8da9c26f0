/* Segment layout, attach/detach, barrier and the SPSC channel primitives.
 *
 *   [0, 4096)                header
 *   ranks                    world x sc_rank_block
 *   channels                 2 x world x world x sc_channel   (src * world + dst):
 *                            the collectives' table, then point-to-point's
 *   eager parts (page aligned)  world x 2 x SC_EAGER_BYTES (sc_eager_part)
 *   slots (page aligned)     2 x world x world x nslots x slot_bytes
 *
 * Point-to-point messages have channels of their own, so a message nobody has
 * received yet never stands in the way of a collective's data, nor the reverse.
 * Slot pages are only touched for the channels an algorithm uses, so the
 * all-pairs table costs address space, not memory.  The file is sized sparsely; the
 * control part (part buffers included) is reserved by the creator and each channel's
 * slots by its sender before their first touch (sc_reserve), so a full /dev/shm is an
 * error, not SIGBUS, and the pages are allocated under the writer's memory policy (its
 * NUMA node). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "sc_internal.h"
#include "sc_reduce.h"

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

size_t sc_off_ranks(void) { return round_up(sizeof(sc_header), SC_PAGE); }

size_t sc_off_channels(int world)
{
    return round_up(sc_off_ranks() + (size_t)world * sizeof(sc_rank_block), SC_LINE);
}

size_t sc_off_eager(int world)
{
    return round_up(sc_off_channels(world) + SC_TABLES * (size_t)world * world * sizeof(sc_channel),
                    SC_PAGE);
}

size_t sc_off_slots(int world)
{
    return sc_off_eager(world) + (size_t)world * 2 * SC_EAGER_BYTES;
}

size_t sc_channel_bytes(uint64_t slot_bytes, uint32_t nslots)
{
    return round_up((size_t)slot_bytes * nslots, SC_PAGE);
}

size_t sc_control_bytes(int world) { return sc_off_slots(world); }

int sc_reserve(int fd, size_t off, size_t len)
{
    if (fd < 0 || len == 0)
        return 0;
    int err;
    do
        err = posix_fallocate(fd, (off_t)off, (off_t)len);
    while (err == EINTR);
    /* A file system that cannot preallocate leaves the pages to first touch. */
    return err == EOPNOTSUPP || err == ENOSYS ? 0 : err;
}

int sc_reserve_channel(sc_comm *c, sc_endpoint *e)
{
    size_t len = sc_channel_bytes(c->slot_bytes, c->nslots);
    int err = sc_reserve(c->fd, (size_t)(e->slots - c->base), len);
    if (err) {
        SC_BLAME(c)->peer = e->peer;
        SC_BLAME(c)->what = "reserving shared memory for the channel to";
        return err == ENOSPC ? SC_ENOSPACE : SC_ENOMEM;
    }
    e->reserved = 1;
    return SC_OK;
}

size_t sc_segment_size(int world, const sc_params *p)
{
    return sc_off_slots(world) +
           SC_TABLES * (size_t)world * world * sc_channel_bytes(p->slot_bytes, p->nslots);
}

void *sc_map(int fd, size_t size, int *err)
{
    struct stat st;
    *err = 0;
    if (fstat(fd, &st) != 0) {
        *err = errno;
        return NULL;
    }
    /* Refuse segments another user could have planted or can read. */
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        *err = EPERM;
        return NULL;
    }
    if ((size_t)st.st_size < size) {
        *err = EINVAL;
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        *err = errno;
        return NULL;
    }
    return p;
}

void sc_unmap(void *base, size_t size)
{
    if (base)
        munmap(base, size);
}

int sc_format(void *base, size_t size, int world, const sc_params *p, uint64_t token, int creator_pid)
{
    if (world < 1 || world > SC_MAX_WORLD || p->nslots < 2 || p->slot_bytes < 64 ||
        p->slot_bytes % 64 != 0 || size < sc_segment_size(world, p))
        return SC_EINVAL;
    sc_header *h = base;
    memset(base, 0, sc_off_eager(world));  /* (part buffers are read only once written) */
    h->version = SC_LAYOUT_VERSION;
    h->world = (uint32_t)world;
    h->size = size;
    h->token = token;
    h->slot_bytes = p->slot_bytes;
    h->nslots = p->nslots;
    h->creator_pid = creator_pid;
    h->failed_rank = -1;
    /* The magic goes last: an attacher that sees it sees a complete header. */
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, SC_MAGIC, memory_order_release);
    return SC_OK;
}

static const sc_header *valid_header(const void *base, size_t size)
{
    const sc_header *h = base;
    if (!base || size < sizeof(sc_header))
        return NULL;
    if (atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != SC_MAGIC)
        return NULL;
    if (h->version != SC_LAYOUT_VERSION || h->world < 1 || h->world > SC_MAX_WORLD || h->size > size)
        return NULL;
    return h;
}

int sc_segment_world(const void *base, size_t size)
{
    const sc_header *h = valid_header(base, size);
    return h ? (int)h->world : -1;
}

int sc_segment_creator(const void *base, size_t size)
{
    const sc_header *h = valid_header(base, size);
    return h ? h->creator_pid : -1;
}

int sc_segment_pids(const void *base, size_t size, int32_t *pids, int max)
{
    const sc_header *h = valid_header(base, size);
    if (!h || sc_off_ranks() + h->world * sizeof(sc_rank_block) > size)
        return -1;
    const sc_rank_block *ranks = (const sc_rank_block *)((const char *)base + sc_off_ranks());
    int n = 0;
    if (n < max)
        pids[n++] = h->creator_pid;
    for (uint32_t r = 0; r < h->world && n < max; r++)
        pids[n++] = atomic_load_explicit((_Atomic int32_t *)&ranks[r].pid, memory_order_relaxed);
    return n;
}

/* The endpoints of table t (0: collectives, 1: point-to-point). */
static void init_endpoints(sc_comm *c, int t, sc_endpoint *send, sc_endpoint *recv)
{
    size_t chan_bytes = sc_channel_bytes(c->slot_bytes, c->nslots);
    size_t table = (size_t)t * c->world * c->world;
    sc_channel *chans = (sc_channel *)(c->base + sc_off_channels(c->world)) + table;
    char *slots = c->base + sc_off_slots(c->world) + table * chan_bytes;
    for (int peer = 0; peer < c->world; peer++) {
        size_t out_idx = (size_t)c->rank * c->world + peer;
        size_t in_idx = (size_t)peer * c->world + c->rank;
        send[peer] = (sc_endpoint){ .ch = &chans[out_idx], .slots = slots + out_idx * chan_bytes,
                                    .peer = peer };
        recv[peer] = (sc_endpoint){ .ch = &chans[in_idx], .slots = slots + in_idx * chan_bytes,
                                    .peer = peer };
    }
}

sc_comm *sc_attach(void *base, size_t size, int fd, int rank, int world, uint64_t token,
                   const sc_params *wait, int *status, int *last)
{
    const sc_header *h = valid_header(base, size);
    *last = 0;
    if (!h || h->token != token || (size_t)h->size != size) {
        *status = SC_ELAYOUT;
        return NULL;
    }
    if ((int)h->world != world || rank < 0 || rank >= world) {
        if ((int)h->world != world)
            sc_segment_refuse(base, size, rank, SC_REFUSE_WORLD, h->world, world);
        *status = SC_EINVAL;
        return NULL;
    }
    sc_params layout = { .slot_bytes = h->slot_bytes, .nslots = h->nslots };
    if (h->nslots < 2 || h->slot_bytes < 64 || sc_segment_size(world, &layout) > size) {
        *status = SC_ELAYOUT;
        return NULL;
    }
    sc_comm *c = calloc(1, sizeof(*c));
    sc_endpoint *eps = calloc(2 * SC_TABLES * (size_t)world, sizeof(sc_endpoint));
    char *scratch = malloc(2 * (size_t)h->slot_bytes);
    uint64_t *fan_read = calloc((size_t)world, sizeof(uint64_t));
    unsigned char *parts = malloc((size_t)world * SC_INLINE_BYTES);
    if (!c || !eps || !scratch || !fan_read || !parts) {
        free(c);
        free(eps);
        free(scratch);
        free(fan_read);
        free(parts);
        *status = SC_ENOMEM;
        return NULL;
    }
    c->base = base;
    c->fd = fd;
    c->size = size;
    c->hdr = (sc_header *)base;
    c->ranks = (sc_rank_block *)((char *)base + sc_off_ranks());
    c->rank = rank;
    c->world = world;
    c->slot_bytes = h->slot_bytes;
    c->nslots = h->nslots;
    c->params = *wait;
    c->send = eps;
    c->recv = eps + world;
    c->p2p_send = eps + 2 * world;
    c->p2p_recv = eps + 3 * world;
    c->scratch = scratch;
    c->fan_read = fan_read;
    c->parts = parts;
    c->eager = (char *)base + sc_off_eager(world);
    for (int k = 0; k < 2; k++)
        c->blame[k] = (sc_blame){ -1, -1, "" };

    sc_rank_block *me = &c->ranks[rank];
    int32_t expected = SC_RANK_EMPTY;
    if (!atomic_compare_exchange_strong(&me->state, &expected, SC_RANK_ATTACHED)) {
        sc_segment_refuse(base, size, rank, SC_REFUSE_RANK_TAKEN,
                          atomic_load_explicit(&me->pid, memory_order_acquire), getpid());
        free(eps);
        free(scratch);
        free(fan_read);
        free(parts);
        free(c);
        *status = SC_ERANKTAKEN;
        return NULL;
    }
    sc_cma_publish(c);
    atomic_store_explicit(&me->pid, (int32_t)getpid(), memory_order_release);
    init_endpoints(c, 0, c->send, c->recv);
    init_endpoints(c, 1, c->p2p_send, c->p2p_recv);
    /* First touch of our outgoing ring channel by its producer. */
    if (world > 1) {
        sc_endpoint *ring = &c->send[(rank + 1) % world];
        int st = sc_reserve_channel(c, ring);
        if (st != SC_OK) {
            struct statvfs sv;
            int64_t free_bytes = fstatvfs(fd, &sv) == 0 ? (int64_t)(sv.f_bavail * sv.f_frsize) : -1;
            sc_segment_refuse(base, size, rank, SC_REFUSE_NO_SPACE,
                              (int64_t)sc_channel_bytes(c->slot_bytes, c->nslots), free_bytes);
            sc_detach(c, 1);
            *status = st;
            return NULL;
        }
        memset(ring->slots, 0, (size_t)c->slot_bytes * c->nslots);
    }
    /* Every rank counts itself in: an increment, then a wake-up.  (Storing before + 1
     * after the increment let a rank preempted in between set the count back below a
     * later rank's, and the job waited for attachments that had all happened.) */
    uint64_t before = atomic_fetch_add_explicit(&c->hdr->attached.value, 1, memory_order_acq_rel);
    sc_wake(&c->hdr->attached);
    *last = (before + 1 == (uint64_t)world);
    *status = SC_OK;
    return c;
}

uint64_t sc_attached_count(const sc_comm *c)
{
    return atomic_load_explicit(&c->hdr->attached.value, memory_order_acquire);
}

int sc_wait_attached(sc_comm *c)
{
    return sc_wait_ge(c, &c->hdr->attached, (uint64_t)c->world, -1, "waiting for all ranks to attach", NULL);
}

void sc_abort_failed(sc_header *h, int failed_rank)
{
    if (atomic_load(&h->abort.value) != SC_ABORT_NONE)
        return;     /* the first reason recorded is the one every rank reports */
    h->failed_rank = failed_rank;
    uint64_t none = SC_ABORT_NONE;
    if (atomic_compare_exchange_strong(&h->abort.value, &none, SC_ABORT_FAILED))
        sc_signal(&h->abort, SC_ABORT_FAILED);
}

void sc_segment_abort(void *base, size_t size, int failed_rank)
{
    sc_header *h = (sc_header *)valid_header(base, size);
    if (h)
        sc_abort_failed(h, failed_rank);
}

void sc_segment_refuse(void *base, size_t size, int rank, int reason, int64_t expected, int64_t got)
{
    sc_header *h = (sc_header *)valid_header(base, size);
    if (!h)
        return;
    sc_refusal *r = &h->refusal;
    uint32_t unclaimed = 0;
    if (!atomic_compare_exchange_strong(&r->claimed, &unclaimed, 1))
        return;     /* the first refusal is the one every rank reports */
    r->rank = rank;
    r->reason = reason;
    r->expected = expected;
    r->got = got;
    uint64_t none = SC_ABORT_NONE;
    /* The release store publishes the whole record with the reason; a job already
     * aborted for another reason keeps that one. */
    if (atomic_compare_exchange_strong(&h->abort.value, &none, SC_ABORT_REFUSED))
        sc_signal(&h->abort, SC_ABORT_REFUSED);
}

void sc_segment_refusal(const void *base, size_t size, int64_t out[4])
{
    const sc_header *h = valid_header(base, size);
    out[0] = out[1] = out[2] = out[3] = 0;
    if (!h || atomic_load_explicit((_Atomic uint64_t *)&h->abort.value, memory_order_acquire) !=
                  SC_ABORT_REFUSED)
        return;
    out[0] = h->refusal.rank, out[1] = h->refusal.reason;
    out[2] = h->refusal.expected, out[3] = h->refusal.got;
}

void sc_request_close(sc_comm *c)
{
    if (c)
        atomic_store_explicit(&c->closing, 1, memory_order_release);
}

/* Wakes anyone asleep on a flag this rank would have written, so they notice at once
 * that it left or gave up. */
void sc_wake_peers(sc_comm *c)
{
    for (int peer = 0; peer < c->world; peer++) {
        sc_signal(&c->send[peer].ch->head, c->send[peer].seq);
        sc_signal(&c->recv[peer].ch->tail, c->recv[peer].seq);
        sc_signal(&c->p2p_send[peer].ch->head, c->p2p_send[peer].seq);
        sc_signal(&c->p2p_recv[peer].ch->tail, c->p2p_recv[peer].seq);
    }
    sc_signal(&c->ranks[c->rank].barrier, c->barrier_seq);
}

void sc_detach(sc_comm *c, int failed)
{
    if (!c)
        return;
    sc_rank_block *me = &c->ranks[c->rank];
    atomic_store_explicit(&me->state, failed ? SC_RANK_FAILED : SC_RANK_CLOSED, memory_order_release);
    sc_wake_peers(c);
    sc_p2p_free_stash(c);
    free(c->send);
    free(c->scratch);
    free(c->fan_read);
    free(c->parts);
    free(c->wide);
    free(c->peer_where);
    free(c->stage);
    free(c);
}

/* A barrier is a call that moves nothing: publishing it and checking every peer's
 * (which waits until that peer published this very call) is the whole of it. */
int sc_barrier(sc_comm *c)
{
    if (c->broken)
        return SC_EBROKEN;
    sc_call_begin(c, SC_COLL_BARRIER, 0, -1, -1, -1, -1, -1, -1, NULL, NULL, NULL, 0);
    for (int i = 1; i < c->world; i++) {
        int st = sc_call_check(c, (c->rank + i) % c->world);
        if (st != SC_OK) {
            c->broken = 1;
            return st;
        }
    }
    return SC_OK;
}

int sc_send_credit(sc_comm *c, sc_endpoint *e)
{
    if (e->seq - e->seen >= c->nslots)
        SC_TRY(sc_wait_ge(c, &e->ch->tail, e->seq - c->nslots + 1, e->peer,
                          "waiting for a free slot in the channel to", &e->seen));
    return SC_OK;
}

int sc_send_acquire(sc_comm *c, sc_endpoint *e, void **slot)
{
    if (!e->reserved)
        SC_TRY(sc_reserve_channel(c, e));
    SC_TRY(sc_send_credit(c, e));
    *slot = e->slots + (e->seq % c->nslots) * c->slot_bytes;
    return SC_OK;
}

void sc_send_commit(sc_endpoint *e)
{
    e->seq++;
    sc_signal(&e->ch->head, e->seq);
}

int sc_recv_acquire(sc_comm *c, sc_endpoint *e, const void **slot)
{
    SC_TRY(sc_call_check_once(c, e->peer));
    if (e->seen <= e->seq)
        SC_TRY(sc_wait_ge(c, &e->ch->head, e->seq + 1, e->peer, "waiting for data from", &e->seen));
    *slot = e->slots + (e->seq % c->nslots) * c->slot_bytes;
    return SC_OK;
}

void sc_recv_release(sc_endpoint *e)
{
    e->seq++;
    sc_signal(&e->ch->tail, e->seq);
}

void *sc_wide(sc_comm *c, size_t bytes)
{
    if (bytes > c->wide_bytes) {
        free(c->wide);
        c->wide = malloc(bytes);
        c->wide_bytes = c->wide ? bytes : 0;
    }
    return c->wide;
}

void sc_layout(int64_t out[9])
{
    out[0] = (int64_t)offsetof(sc_header, attached);
    out[1] = (int64_t)sc_off_ranks();
    out[2] = (int64_t)sizeof(sc_rank_block);
    out[3] = (int64_t)offsetof(sc_rank_block, calls);
    out[4] = (int64_t)sizeof(sc_call_slot);
    out[5] = (int64_t)offsetof(sc_call_slot, call);
    out[6] = (int64_t)offsetof(sc_rank_block, state);
    out[7] = (int64_t)offsetof(sc_rank_block, pid);
    out[8] = (int64_t)offsetof(sc_rank_block, cma);
}

int sc_error_peer(const sc_comm *c, int p2p) { return c->blame[p2p != 0].peer; }
int sc_error_waited(const sc_comm *c, int p2p) { return c->blame[p2p != 0].waited; }
const char *sc_error_what(const sc_comm *c, int p2p)
{
    const char *what = c->blame[p2p != 0].what;
    return what ? what : "";
}
