#include "hist.h"

#include <string.h>

static unsigned bucket_of(uint64_t v)
{
    if (v < (2u << KB_HIST_SUB_BITS))
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    if (msb > KB_HIST_MAX_MSB)
        return KB_HIST_BUCKETS - 1;
    unsigned shift = msb - KB_HIST_SUB_BITS;
    return ((shift + 1) << KB_HIST_SUB_BITS) + (unsigned)(v >> shift) - (1u << KB_HIST_SUB_BITS);
}

/* Highest value that lands in bucket i. */
static uint64_t bucket_top(unsigned i)
{
    if (i < (2u << KB_HIST_SUB_BITS))
        return i;
    unsigned shift = (i >> KB_HIST_SUB_BITS) - 1;
    uint64_t sub = (i & ((1u << KB_HIST_SUB_BITS) - 1)) + (1u << KB_HIST_SUB_BITS);
    return ((sub + 1) << shift) - 1;
}

void kb_hist_reset(kb_hist *h)
{
    memset(h, 0, sizeof *h);
}

void kb_hist_record(kb_hist *h, uint64_t ns)
{
    h->bucket[bucket_of(ns)]++;
    h->count++;
    if (ns > h->max)
        h->max = ns;
}

void kb_hist_merge(kb_hist *into, const kb_hist *from)
{
    for (unsigned i = 0; i < KB_HIST_BUCKETS; i++)
        into->bucket[i] += from->bucket[i];
    into->count += from->count;
    if (from->max > into->max)
        into->max = from->max;
}

uint64_t kb_hist_quantile(const kb_hist *h, double q)
{
    if (h->count == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.5);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < KB_HIST_BUCKETS; i++) {
        seen += h->bucket[i];
        if (seen >= rank) {
            uint64_t top = bucket_top(i);
            return top < h->max ? top : h->max;
        }
    }
    return h->max;
}

void kb_hist_write_cdf(const kb_hist *h, FILE *out)
{
    uint64_t seen = 0;
    for (unsigned i = 0; i < KB_HIST_BUCKETS && seen < h->count; i++) {
        if (h->bucket[i] == 0)
            continue;
        seen += h->bucket[i];
        uint64_t top = bucket_top(i);
        fprintf(out, "%.3f %.7f\n", (double)(top < h->max ? top : h->max) / 1e3,
                (double)seen / (double)h->count);
    }
}
