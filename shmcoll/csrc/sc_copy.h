/* Copies into the destination array of a collective.
 *
 * A large result is written once and not read again by this rank soon, so
 * streaming (non-temporal) stores skip the read-for-ownership of every
 * destination line and leave the cache to the channel slots; small results are
 * better left in the cache for the caller, so they use memcpy. */
#ifndef SC_COPY_H
#define SC_COPY_H

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

static inline void sc_stream_copy(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
}

/* Streaming stores are weakly ordered: fence before anything publishes them. */
static inline void sc_stream_fence(void) { _mm_sfence(); }
#else
static inline void sc_stream_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static inline void sc_stream_fence(void) {}
#endif

static inline void sc_out_copy(void *dst, const void *src, size_t n, int stream)
{
    if (stream)
        sc_stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

#endif
