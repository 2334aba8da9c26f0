/* All-to-all: block q of rank r's x goes to rank q, where it lands as block r.
 *
 * Direct (large messages): P-1 pairwise exchanges, chunk-major as the other direct
 * schedules (sc_direct.c): for chunk i a rank first sends to every peer, staggered
 * (r+1, r+2, ...) so that no rank is every sender's first target, then receives from
 * every peer (r-1, r-2, ...).  The same argument keeps it free of deadlock: a rank
 * blocked sending chunk i waits for a receiver still on chunk i-2 or earlier, which
 * waits only for chunks sent even earlier.  alltoallv is the same schedule over
 * per-pair byte ranges (a pair with nothing to move is skipped).
 *
 * Bruck (small messages, Bruck et al. 1997): ⌈log2 P⌉ steps instead of P-1.  Blocks
 * are first rotated so that local block i is the one bound for rank r+i; at step k
 * every block whose index has bit k set moves to rank r+2^k (packed into one
 * message), so after the last step block i has travelled i ranks and local block i
 * is the one rank r-i sent; a final rotation puts it at out[r-i].  Each step sends
 * about half the vector, which is cheaper than P-1 handshakes only while blocks are
 * small: the cost model chooses. */
#include <stdlib.h>
#include <string.h>

#include "sc_copy.h"
#include "sc_internal.h"

int sc_direct_alltoall(sc_comm *c, const sc_args *a, const struct sc_kernels *k)
{
    (void)k;
    int P = c->world, r = c->rank;
    size_t b = a->count;
    const char *x = a->x;
    char *out = a->out;
    int stream = sc_use_stream(c, b * (size_t)P);
    sc_out_copy(out + (size_t)r * b, x + (size_t)r * b, b, stream);
    for (size_t off = 0; off < b; off += c->slot_bytes) {
        size_t n = sc_min(b - off, c->slot_bytes);
        for (int j = 1; j < P; j++) {
            int q = (r + j) % P;
            SC_TRY(sc_put(c, q, x + (size_t)q * b + off, n));
        }
        for (int j = 1; j < P; j++) {
            int q = (r - j + P) % P;
            SC_TRY(sc_get(c, q, out + (size_t)q * b + off, n, stream));
        }
    }
    return SC_OK;
}

/* alltoallv: a->layout holds, in bytes, the send offsets, send lengths, receive
 * offsets and receive lengths, P of each; the ranks agreed on them beforehand. */
int sc_direct_alltoallv(sc_comm *c, const sc_args *a, const struct sc_kernels *k)
{
    (void)k;
    int P = c->world, r = c->rank;
    const uint64_t *soff = a->layout, *slen = soff + P, *roff = slen + P, *rlen = roff + P;
    const char *x = a->x;
    char *out = a->out;
    size_t longest = 0, total = 0;
    for (int q = 0; q < P; q++) {
        longest = sc_max(longest, sc_max(slen[q], rlen[q]));
        total += rlen[q];
    }
    int stream = sc_use_stream(c, total);
    sc_out_copy(out + roff[r], x + soff[r], rlen[r], stream);
    for (size_t off = 0; off < longest; off += c->slot_bytes) {
        for (int j = 1; j < P; j++) {
            int q = (r + j) % P;
            if (off < slen[q])
                SC_TRY(sc_put(c, q, x + soff[q] + off, sc_min(slen[q] - off, c->slot_bytes)));
        }
        for (int j = 1; j < P; j++) {
            int q = (r - j + P) % P;
            if (off < rlen[q])
                SC_TRY(sc_get(c, q, out + roff[q] + off, sc_min(rlen[q] - off, c->slot_bytes),
                              stream));
        }
    }
    return SC_OK;
}

/* Sends `bytes` to `to` while receiving as many from `from`, cut by cut: every rank
 * sends and receives the same amount, so a rank is at most one cut ahead. */
static int shift(sc_comm *c, int to, int from, const char *snd, char *rcv, size_t bytes)
{
    for (size_t off = 0; off < bytes; off += c->slot_bytes) {
        size_t n = sc_min(bytes - off, c->slot_bytes);
        SC_TRY(sc_put(c, to, snd + off, n));
        SC_TRY(sc_get(c, from, rcv + off, n, 0));
    }
    return SC_OK;
}

static int bruck_steps(sc_comm *c, char *tmp, char *pack, size_t b)
{
    int P = c->world, r = c->rank;
    for (int bit = 1; bit < P; bit <<= 1) {
        size_t m = 0;
        for (int i = 0; i < P; i++)
            if (i & bit)
                memcpy(pack + m++ * b, tmp + (size_t)i * b, b);
        char *unpack = pack + m * b;
        SC_TRY(shift(c, (r + bit) % P, (r - bit + P) % P, pack, unpack, m * b));
        m = 0;
        for (int i = 0; i < P; i++)
            if (i & bit)
                memcpy(tmp + (size_t)i * b, unpack + m++ * b, b);
    }
    return SC_OK;
}

int sc_bruck_alltoall(sc_comm *c, const sc_args *a, const struct sc_kernels *k)
{
    (void)k;
    int P = c->world, r = c->rank;
    size_t b = a->count, half = (size_t)(P / 2 + 1);
    if (b == 0)
        return SC_OK;
    /* the rotated vector, then room for one packed message each way */
    char *tmp = malloc(((size_t)P + 2 * half) * b);
    if (!tmp) {
        SC_BLAME(c)->peer = SC_BLAME(c)->waited = -1;
        SC_BLAME(c)->what = "allocating the all-to-all's workspace";
        return SC_ENOMEM;
    }
    const char *x = a->x;
    char *out = a->out;
    for (int i = 0; i < P; i++)
        memcpy(tmp + (size_t)i * b, x + (size_t)((i + r) % P) * b, b);
    int st = bruck_steps(c, tmp, tmp + (size_t)P * b, b);
    if (st == SC_OK)
        for (int i = 0; i < P; i++)
            memcpy(out + (size_t)((r - i + P) % P) * b, tmp + (size_t)i * b, b);
    free(tmp);
    return st;
}
