/* The plan of a run: scenario names and aggregate keys (kb_plan_count, asked
 * per event, is inline in bench.h). The driver and the collector read it. */
#include <stdio.h>

#include "bench.h"

const char *kb_scenario_name(kb_scenario s)
{
    static const char *const names[] = {"single", "multi", "mixed"};
    return names[s];
}

/* The origin's figures over NATS JetStream (seed 001). Its table gives the mixed
 * case 16.6 events/s (60 events in 3.61 s); we compare it with the stricter
 * 13,850 events/s of the multi case instead. */
double kb_scenario_origin_eps(kb_scenario s)
{
    return s == KB_SC_SINGLE ? 4695.0 : 13850.0;
}

size_t kb_plan_key(const kb_plan *p, uint32_t agg, char out[KB_BENCH_KEY_MAX])
{
    static const char *const prefix[] = {"order-", "user-", "product-sku-"};
    const char *pre = p->scenario == KB_SC_MIXED ? prefix[agg % 3] : prefix[0];
    return (size_t)snprintf(out, KB_BENCH_KEY_MAX, "%s%u", pre, agg);
}
