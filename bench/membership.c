/* keybus-membership: the processes of scripts/bench-membership.sh, the
 * service pattern of a membership change measured on real brokers (a paced
 * producer, consumer processes that join, leave and restart). Public API
 * only; every setting but the URL and the consumer name comes from KEYBUS_*
 * (kb_open applies them). Times are CLOCK_MONOTONIC seconds, one clock for
 * every process of a run, so their logs can be merged.
 *
 *   keybus-membership consume URL TOPIC NAME LOG
 *       handle TOPIC as consumer NAME until SIGTERM, then kb_close; one line
 *       per handled event appended to LOG: "time key seq NAME attempt"
 *   keybus-membership produce URL TOPIC RATE KEYS SECONDS SUMMARY
 *       publish RATE events/s over KEYS keys for SECONDS (event i: key
 *       "k<i % KEYS>", payload its sequence i / KEYS + 1), then kb_flush (again
 *       for up to 60 s until it confirms everything) and kb_drain; SUMMARY
 *       gets "keys K", "published N", "first T", "last T", "flush RC T" and
 *       "drain RC T" lines
 *   keybus-membership now
 *       print the clock (for the script's marks)
 * Library log lines go to stderr with the time and NAME. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

static volatile sig_atomic_t stopping;
static const char *who = "";
static int log_fd = -1;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static void on_log(int level, const char *msg, void *opaque)
{
    (void)opaque;
    fprintf(stderr, "%.3f %s L%d %s\n", now_s(), who, level, msg);
}

/* One write per line on an O_APPEND descriptor: handler threads never mix
 * their lines. */
static int on_event(const kb_event *ev, void *opaque)
{
    (void)opaque;
    char line[256];
    int kl = ev->key_len < 64 ? (int)ev->key_len : 64;
    int pl = ev->payload_len < 32 ? (int)ev->payload_len : 32;
    int n = snprintf(line, sizeof line, "%.4f %.*s %.*s %s %u\n", now_s(), kl,
                     (const char *)ev->key, pl, (const char *)ev->payload, who, ev->attempt);
    return write(log_fd, line, (size_t)n) == n ? KB_HANDLED : KB_RETRY;
}

/* A bus on `url` named `name`, KEYBUS_* applied; a loaded cluster can refuse
 * the first JetStream calls, so kb_open is tried for up to 10 s. */
static kb_bus *open_bus(const char *url, const char *name)
{
    char err[512];
    for (int i = 0; i < 40; i++) {
        kb_conf *c = kb_conf_new();
        if (c == NULL)
            return NULL;
        kb_conf_set_log(c, on_log, NULL);
        if (kb_conf_set(c, "transport", url, err, sizeof err) != KB_OK ||
            kb_conf_set(c, "consumer", name, err, sizeof err) != KB_OK) {
            fprintf(stderr, "%s: %s\n", name, err);
            kb_conf_destroy(c);
            return NULL;
        }
        kb_bus *b = kb_open(c, err, sizeof err);
        if (b != NULL)
            return b;
        kb_conf_destroy(c);   /* kb_open takes it only on success */
        fprintf(stderr, "%.3f %s kb_open: %s\n", now_s(), name, err);
        usleep(250000);
    }
    return NULL;
}

static int consume(const char *url, const char *topic, const char *log)
{
    log_fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (log_fd < 0) {
        perror(log);
        return 2;
    }
    kb_bus *b = open_bus(url, who);
    if (b == NULL)
        return 3;
    if (kb_subscribe(b, topic, on_event, NULL) != KB_OK) {
        fprintf(stderr, "%s: kb_subscribe: %s\n", who, kb_last_error());
        return 4;
    }
    fprintf(stderr, "%.3f %s subscribed\n", now_s(), who);
    while (!stopping)
        usleep(10000);
    double t = now_s();
    int rc = kb_close(b, 20000);
    fprintf(stderr, "%.3f %s kb_close %d in %.3f s\n", now_s(), who, rc, now_s() - t);
    close(log_fd);
    return rc == KB_OK ? 0 : 1;
}

static int produce(const char *url, const char *topic, double rate, long keys, double secs,
                   const char *summary)
{
    FILE *out = fopen(summary, "w");
    if (out == NULL) {
        perror(summary);
        return 2;
    }
    kb_bus *b = open_bus(url, who);
    if (b == NULL)
        return 3;
    char err[256];
    kb_topic *tp = kb_topic_get(b, topic, err, sizeof err);
    if (tp == NULL) {
        fprintf(stderr, "%s: %s\n", topic, err);
        return 4;
    }
    long sent = 0;
    double start = now_s(), first = 0, last = 0;
    while (!stopping && now_s() - start < secs) {
        long due = (long)((now_s() - start) * rate);
        for (; sent < due && !stopping; sent++) {
            char key[32], payload[32];
            int kl = snprintf(key, sizeof key, "k%ld", sent % keys);
            int pl = snprintf(payload, sizeof payload, "%ld", sent / keys + 1);
            int rc;
            /* a full pool or a publish window waiting out an election: the
             * same event again, so every key's sequence stays gapless */
            while ((rc = kb_publish_to(tp, key, (size_t)kl, payload, (size_t)pl)) != KB_OK &&
                   !stopping) {
                fprintf(stderr, "%.3f %s kb_publish: %d %s\n", now_s(), who, rc, kb_last_error());
                usleep(10000);
            }
            if (rc != KB_OK)
                break;
            last = now_s();
            if (first == 0)
                first = last;
        }
        usleep(1000);
    }
    fprintf(out, "keys %ld\npublished %ld\nfirst %.4f\nlast %.4f\n", keys, sent, first, last);
    /* a replica or a stream leader still coming back: confirmed later */
    int rc = KB_ETIMEDOUT;
    for (double until = now_s() + 60; rc != KB_OK && now_s() < until;)
        if ((rc = kb_flush(b, 10000)) != KB_OK) {
            fprintf(stderr, "%.3f %s kb_flush: %d %s\n", now_s(), who, rc, kb_last_error());
            sleep(1);
        }
    fprintf(out, "flush %d %.4f\n", rc, now_s());
    rc = kb_drain(b, 120000);
    fprintf(out, "drain %d %.4f\n", rc, now_s());
    if (rc != KB_OK)
        fprintf(stderr, "%.3f %s kb_drain: %d %s\n", now_s(), who, rc, kb_last_error());
    fclose(out);
    return kb_close(b, 10000) == KB_OK && rc == KB_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (argc == 2 && strcmp(argv[1], "now") == 0) {
        printf("%.4f\n", now_s());
        return 0;
    }
    if (argc == 6 && strcmp(argv[1], "consume") == 0) {
        who = argv[4];
        return consume(argv[2], argv[3], argv[5]);
    }
    if (argc == 8 && strcmp(argv[1], "produce") == 0 && atof(argv[4]) > 0 && atol(argv[5]) > 0) {
        who = "producer";
        return produce(argv[2], argv[3], atof(argv[4]), atol(argv[5]), atof(argv[6]), argv[7]);
    }
    fprintf(stderr, "usage: keybus-membership consume URL TOPIC NAME LOG\n"
                    "       keybus-membership produce URL TOPIC RATE KEYS SECONDS SUMMARY\n"
                    "       keybus-membership now\n");
    return 2;
}
