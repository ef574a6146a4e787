/* A consumer process for the multi-process Redis fault tests:
 *   redis_consumer_proc URL TOPIC CONSUMER LOGFILE LEASE_TTL_MS HANDLER_DELAY_US
 * Appends "key seq CONSUMER FLAG ID ATTEMPT\n" per handled event to LOGFILE (O_APPEND:
 * lines of all processes interleave in the order they were handled) and runs
 * until SIGTERM. FLAG is 'p' when the process was paused (SIGSTOP) while the
 * handler ran — the lease check before the handler could not stop that one —
 * else '-'.
 *   redis_consumer_proc --produce URL TOPIC KEYS PER_KEY
 * publishes seq 1..PER_KEY of keys 0..KEYS-1 (round robin), flushes and exits
 * (bench/run-all.sh: the multi-process Redis run). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/child.h"
#include "support/tracker.h"

static int log_fd;
static useconds_t delay_us;
static const char *name;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    long long t0 = now_ms();
    if (delay_us > 0)
        usleep(delay_us);
    char line[200];
    int n = snprintf(line, sizeof line, "%u %u %s %c %s %u\n", key, seq, name,
                     now_ms() - t0 > 500 ? 'p' : '-', ev->id, ev->attempt);
    if (write(log_fd, line, (size_t)n) != n)
        return KB_RETRY;
    return KB_HANDLED;
}

static int produce(char **argv)
{
    const char *const kv[] = {"transport", argv[2], NULL};
    kb_bus *b = kb_test_child_open(kv);
    if (b == NULL)
        return 2;
    uint32_t keys = (uint32_t)strtoul(argv[4], NULL, 10), per_key = (uint32_t)strtoul(argv[5], NULL, 10);
    int rc = KB_OK;
    for (uint32_t s = 1; s <= per_key && rc == KB_OK; s++)
        for (uint32_t k = 0; k < keys && rc == KB_OK; k++)
            while ((rc = kb_tracker_publish(b, argv[3], k, s, 64)) == KB_EFULL)
                ;
    if (rc == KB_OK)
        rc = kb_flush(b, 60000);
    if (rc != KB_OK)
        fprintf(stderr, "publish: %s (%s)\n", kb_strerror(rc), kb_last_error());
    kb_close(b, 10000);
    return rc == KB_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--produce") == 0)
        return produce(argv);
    if (argc != 7) {
        fprintf(stderr, "usage: %s URL TOPIC CONSUMER LOGFILE LEASE_TTL_MS DELAY_US\n", argv[0]);
        return 2;
    }
    log_fd = open(argv[4], O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (log_fd < 0) {
        perror(argv[4]);
        return 2;
    }
    delay_us = (useconds_t)atoi(argv[6]);
    name = argv[3];
    const char *const kv[] = {"transport", argv[1], "consumer", argv[3],
                              "redis.lease_ttl_ms", argv[5], "pool.threads", "2",
                              "retry.backoff_ms", "1", "retry.max_backoff_ms", "4",
                              "pool.queue_capacity", "64", NULL};
    int rc = kb_test_child_consume(kv, argv[2], handler);
    close(log_fd);
    return rc;
}
