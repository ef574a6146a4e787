/* Test harness for membership changes under load: the processes of
 * keybus-membership (bench/membership.c; a paced producer and consumer
 * processes that log every handled event with the time) started in a temp
 * dir, and the history they leave checked: lost events, per-key order,
 * duplicates, the longest pause of one partition. Settings reach the
 * processes through KEYBUS_* in the test's environment. Main thread only. */
#ifndef KB_TEST_MEMBERSHIP_H
#define KB_TEST_MEMBERSHIP_H

#include <stddef.h>
#include <sys/types.h>

#define KB_TEST_MSHIP_NAMES 8

typedef struct kb_test_mship {
    const char *prog;   /* keybus-membership */
    char url[256];
    char topic[64];
    char dir[128];      /* logs: NAME.log, NAME.err, summary */
    pid_t c1, c2;       /* the two consumer processes running (-1: none) */
    pid_t spawned[16];  /* every process started, killed by kb_test_mship_cleanup */
    int nspawned;
} kb_test_mship;

/* The service: a producer at 250 events/s over 100 keys for 12 s, 16
 * partitions (KEYBUS_PARTITIONS, set by kb_test_mship_init with
 * KEYBUS_GROUP); c1, and c2 unless the change is a join, share the
 * partitions 2 s before it starts; the change is made 4 s into it. */
#define KB_TEST_MSHIP_PARTITIONS 16
typedef enum {
    KB_TEST_MSHIP_JOIN,      /* c2 starts */
    KB_TEST_MSHIP_LEAVE,     /* c2 stopped with SIGTERM */
    KB_TEST_MSHIP_ROLLING,   /* c1 stopped with SIGTERM and started again (as c1b), 4 s
                                later c2 (as c2b): a rolling deploy */
    KB_TEST_MSHIP_OTHER      /* a function makes it (a broker node killed) */
} kb_test_mship_change;
/* Makes an OTHER change, saying what it was in `said`. */
typedef void (*kb_test_mship_fn)(kb_test_mship *m, void *opaque, char *said, size_t len);

typedef struct kb_test_history {
    long published, handled, distinct, lost, order_violations, duplicates;
    int flush_rc, drain_rc;        /* the producer's kb_flush and kb_drain (-100: none) */
    double drain_s;                /* kb_drain's return after the last publish */
    double last_handled_s;         /* the last event handled a first time, after the
                                      last publish */
    double pause;                  /* longest gap between two handled events of one
                                      partition, from `since` into the publishing */
    unsigned pause_partition, over_2s;   /* ... and partitions that paused over 2 s */
    double pause_from;             /* when the longest began, from `since` */
    char names[KB_TEST_MSHIP_NAMES][32];
    long by_name[KB_TEST_MSHIP_NAMES];   /* handled events per consumer process */
} kb_test_history;

/* A fresh temp dir for the logs of `topic` on `url`, KEYBUS_PARTITIONS and
 * KEYBUS_GROUP set for the processes. 0 or -1. */
int kb_test_mship_init(kb_test_mship *m, const char *prog, const char *url, const char *topic);

/* Kill (SIGKILL) the processes still running, remove the logs and the dir. */
void kb_test_mship_cleanup(kb_test_mship *m);

/* A consumer process named `name`, once it has subscribed (up to 60 s): its
 * pid, or -1 (its stderr printed). */
pid_t kb_test_mship_consumer(kb_test_mship *m, const char *name);

/* The producer: `rate` events/s over `keys` keys for `seconds`, then
 * kb_flush and kb_drain; its pid. */
pid_t kb_test_mship_producer(kb_test_mship *m, int rate, int keys, int seconds);

/* SIGTERM and wait (up to 60 s, then SIGKILL): the exit status, -1 when killed. */
int kb_test_mship_stop(pid_t pid);

/* Wait for `pid` to exit (up to timeout_s, then SIGKILL): the exit status or -1. */
int kb_test_mship_wait(pid_t pid, int timeout_s);

/* CLOCK_MONOTONIC seconds: the clock of the processes' logs. */
double kb_test_mship_now(void);

/* One case: the service above on `url` through `prog` (keybus-membership)
 * with `change` (OTHER: made by `fn`), its history printed; asserts that
 * the processes start and exit cleanly, kb_flush and kb_drain return KB_OK,
 * nothing is lost or out of order, and no partition pauses over `bound`
 * seconds from 1 s before the change (60 s in sanitizer builds: they only
 * show that handling resumes). kb_test_mship_cleanup afterwards, also when
 * it failed. */
void kb_test_mship_case(kb_test_mship *m, const char *prog, const char *url,
                        kb_test_mship_change change, kb_test_mship_fn fn, void *opaque,
                        double bound);

/* Read the summary and every NAME.log of the dir into `h`, partitions as
 * kb_partition_of(key, partitions), pauses counted from `since` (a time of
 * kb_test_mship_now). 0, or -1 when there is no summary. */
int kb_test_mship_history(const kb_test_mship *m, unsigned partitions, double since,
                          kb_test_history *h);

/* The history in one line on stdout, after `what`. */
void kb_test_mship_print(const char *what, const kb_test_history *h);

#endif /* KB_TEST_MEMBERSHIP_H */
