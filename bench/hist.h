/* HDR-style log-linear latency histogram: exact below 256 ns, then 128
 * sub-buckets per power of two (under 0.8% relative error), up to ~18 min.
 * One writer per histogram; runs merge them at the end. */
#ifndef KB_BENCH_HIST_H
#define KB_BENCH_HIST_H

#include <stdint.h>
#include <stdio.h>

#define KB_HIST_SUB_BITS 7
#define KB_HIST_MAX_MSB 40
#define KB_HIST_BUCKETS ((KB_HIST_MAX_MSB - KB_HIST_SUB_BITS + 2) << KB_HIST_SUB_BITS)

typedef struct kb_hist {
    uint64_t count;
    uint64_t max;
    uint64_t bucket[KB_HIST_BUCKETS];
} kb_hist;

void kb_hist_reset(kb_hist *h);
void kb_hist_record(kb_hist *h, uint64_t ns);
void kb_hist_merge(kb_hist *into, const kb_hist *from);
/* Value at quantile q in [0,1], as the highest value of its bucket (HDR's
 * "highest equivalent value"), in ns; 0 for an empty histogram. */
uint64_t kb_hist_quantile(const kb_hist *h, double q);
/* gnuplot data block: "latency_us cumulative_fraction" per non-empty bucket. */
void kb_hist_write_cdf(const kb_hist *h, FILE *out);

#endif
