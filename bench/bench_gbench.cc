// Micro-benchmarks over the C API: FNV-1a, one lane's enqueue/dequeue,
// submit-to-handle with 1 and 2 producers, the naive mutex pool beside it, and
// what one kb_publish_to costs: time and heap allocations.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "mpool.h"

// The malloc hook: every heap allocation of the process, any thread, is
// counted on its way to glibc, so allocations per publish include what the
// executors allocate for the events they handle.
extern "C" {
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
}
namespace {
std::atomic<uint64_t> g_allocs{0}, g_alloc_bytes{0};
void count_alloc(size_t n)
{
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    g_alloc_bytes.fetch_add(n, std::memory_order_relaxed);
}
}  // namespace
extern "C" {
void *malloc(size_t n)
{
    count_alloc(n);
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size)
{
    count_alloc(n * size);
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n)
{
    count_alloc(n);
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t align, size_t n)
{
    count_alloc(n);
    return __libc_memalign(align, n);
}
void *memalign(size_t align, size_t n)
{
    count_alloc(n);
    return __libc_memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    count_alloc(n);
    void *p = __libc_memalign(align, n);
    if (p == nullptr)
        return 12;   // ENOMEM
    *out = p;
    return 0;
}
}

namespace {

constexpr int kBatch = 1000;      // items per iteration in the pool benchmarks
constexpr int kAggregates = 100;

std::vector<std::string> make_keys()
{
    std::vector<std::string> keys;
    for (int i = 0; i < kAggregates; i++)
        keys.push_back("order-" + std::to_string(i));
    return keys;
}
const std::vector<std::string> g_keys = make_keys();
int g_item;                       // the pools route pointers; nothing is dereferenced

int handle_noop(void *, uint32_t, void *) { return KB_HANDLED; }
void mhandle_noop(void *, void *) {}

kb_pool *new_pool(uint32_t lanes, uint32_t threads, int single_producer)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = lanes;
    o.threads = threads;
    o.capacity = 4096;            // a whole batch fits: measures the path, not backpressure
    o.single_producer = single_producer;
    o.handle = handle_noop;
    char err[256];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    if (p == nullptr) {
        std::fprintf(stderr, "kb_pool_new: %s\n", err);
        std::abort();
    }
    return p;
}

void BM_fnv1a32(benchmark::State &state)
{
    std::string key(static_cast<size_t>(state.range(0)), 'k');
    for (auto _ : state)
        benchmark::DoNotOptimize(kb_fnv1a32(key.data(), key.size()));
    state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_fnv1a32)->Arg(8)->Arg(16)->Arg(64)->Arg(256);

// One lane, one executor: kBatch enqueues then the executor drains them.
// range(0): 1 = SPSC ring (broker consumer loops), 0 = MPSC enqueue (mem://).
void BM_lane_enqueue_dequeue(benchmark::State &state)
{
    kb_pool *p = new_pool(1, 1, static_cast<int>(state.range(0)));
    for (auto _ : state) {
        for (int i = 0; i < kBatch; i++)
            kb_pool_submit_hash(p, 0, &g_item, -1);
        kb_pool_flush(p, -1);
    }
    state.SetItemsProcessed(state.iterations() * kBatch);
    kb_pool_destroy(p, -1);
}
BENCHMARK(BM_lane_enqueue_dequeue)->ArgName("spsc")->Arg(1)->Arg(0)->UseRealTime();

// Submit-to-handle over 1024 lanes and 100 keys; benchmark threads are the
// producers, range(0) the executors. Each iteration ends when its batch (and
// whatever the other producer submitted before) is handled.
kb_pool *g_pool;
kb_mpool *g_mpool;

void setup_pool(const benchmark::State &state)
{
    g_pool = new_pool(1024, static_cast<uint32_t>(state.range(0)), 0);
}
void teardown_pool(const benchmark::State &) { kb_pool_destroy(g_pool, -1); }

void BM_pool_submit_to_handle(benchmark::State &state)
{
    for (auto _ : state) {
        for (int i = 0; i < kBatch; i++) {
            const std::string &k = g_keys[static_cast<size_t>(i % kAggregates)];
            kb_pool_submit(g_pool, k.data(), k.size(), &g_item, -1);
        }
        kb_pool_flush(g_pool, -1);
    }
    state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_pool_submit_to_handle)->ArgName("executors")->Arg(1)->Arg(2)
    ->Setup(setup_pool)->Teardown(teardown_pool)->Threads(1)->Threads(2)->UseRealTime();

void setup_mpool(const benchmark::State &state)
{
    g_mpool = kb_mpool_new(static_cast<uint32_t>(state.range(0)), 4096, mhandle_noop, nullptr);
    if (g_mpool == nullptr)
        std::abort();
}
void teardown_mpool(const benchmark::State &) { kb_mpool_destroy(g_mpool); }

void BM_mutex_submit_to_handle(benchmark::State &state)
{
    for (auto _ : state) {
        for (int i = 0; i < kBatch; i++) {
            const std::string &k = g_keys[static_cast<size_t>(i % kAggregates)];
            kb_mpool_submit(g_mpool, kb_fnv1a32(k.data(), k.size()), &g_item);
        }
        kb_mpool_flush(g_mpool);
    }
    state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_mutex_submit_to_handle)->ArgName("executors")->Arg(1)->Arg(2)
    ->Setup(setup_mpool)->Teardown(teardown_mpool)->Threads(1)->Threads(2)->UseRealTime();

int handle_event_noop(const kb_event *, void *) { return KB_HANDLED; }

// One kb_publish_to of a range(0)-byte payload over 100 keys on mem://, with
// the default configuration, the executors handling concurrently. After a
// warm-up, heap allocations and bytes per publish are the steady state; the
// origin's Go pool spent 11 allocations and 601 B per event.
void BM_publish_to(benchmark::State &state)
{
    char err[256];
    kb_bus *bus = kb_open(kb_conf_new(), err, sizeof err);
    if (bus == nullptr || kb_subscribe(bus, "bench.publish", handle_event_noop, nullptr) != KB_OK) {
        std::fprintf(stderr, "kb_open/kb_subscribe: %s\n", bus ? kb_last_error() : err);
        std::abort();
    }
    kb_topic *topic = kb_topic_get(bus, "bench.publish", err, sizeof err);
    std::vector<unsigned char> payload(static_cast<size_t>(state.range(0)), 0x5a);
    auto publish = [&](size_t i) {
        const std::string &k = g_keys[i % kAggregates];
        while (kb_publish_to(topic, k.data(), k.size(), payload.data(), payload.size()) == KB_EFULL)
            ;
    };
    for (size_t i = 0; i < 1000000; i++)   // lanes fill up: records and magazines reach steady state
        publish(i);
    kb_flush(bus, -1);
    uint64_t allocs0 = g_allocs.load(), bytes0 = g_alloc_bytes.load();
    size_t i = 0;
    for (auto _ : state)
        publish(i++);
    kb_flush(bus, -1);
    double n = static_cast<double>(state.iterations());
    state.counters["allocs_per_publish"] = static_cast<double>(g_allocs.load() - allocs0) / n;
    state.counters["bytes_per_publish"] = static_cast<double>(g_alloc_bytes.load() - bytes0) / n;
    state.counters["origin_allocs"] = 11;
    state.counters["origin_bytes"] = 601;
    kb_close(bus, -1);
}
BENCHMARK(BM_publish_to)->ArgName("payload_bytes")->Arg(64)->Arg(256)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
