/* keybus-torture: consumer processes, a paced producer and a nemesis on a
 * schedule drawn from a seed, then a checker over the recorded history
 * (docs/testing.md, "Torture"). Files of one run, all in its directory:
 *   producer.log     P <mono_ns> <key> <seq> <rc>      one per kb_publish (rc 0: accepted)
 *                    D <mono_ns> <key> <result>        one per delivery report
 *                    W <start_ns> <end_ns> <flush_rc> <drain_rc> <drained_ns>
 *                    the producing window, kb_flush's and kb_drain's results, when the
 *                    latter returned
 *   c<slot>-<n>.log  H <mono_ns> <wall_ns> <name> <pid> <key> <seq> <attempt>
 *                    one write(2) per handled event, before the handler returns
 *   nemesis.log      N <mono_ns> <what> <target> <departures>
 *                    X <mono_ns> <pid> <when> exit|signal <code>   a consumer crashed
 *   run.conf         the parameters the checker needs (key value lines) */
#ifndef KB_TORTURE_H
#define KB_TORTURE_H

#include <stdint.h>
#include <stdio.h>

#define KB_TORTURE_TOPIC "torture"
#define KB_TORTURE_MAX_SLOTS 16

/* The nemesis's moves. */
typedef enum kb_torture_op {
    KB_T_KILL9,        /* consumer kill -9 (restarted later) */
    KB_T_TERM,         /* consumer SIGTERM: kb_close (restarted later) */
    KB_T_JOIN,         /* a new consumer process */
    KB_T_LEAVE,        /* consumer SIGTERM, not restarted */
    KB_T_START,        /* (re)start a consumer slot: the second half of KILL9 / TERM */
    KB_T_NODE_KILL,    /* broker node kill -9 (restarted later) */
    KB_T_NODE_DOWN,    /* broker node kill -9, left down for the rest of the run */
    KB_T_NODE_START,   /* broker node restarted */
    KB_T_CUT,          /* connections to a node black-holed by the proxy */
    KB_T_HEAL,         /* the proxy forwards again */
} kb_torture_op;

typedef struct kb_torture_step {
    int64_t at_ms;     /* from the start of the nemesis */
    kb_torture_op op;
    int target;        /* consumer slot or broker node; -1: every node (a cut) */
    uint32_t order;    /* drawn n-th: breaks ties in time */
} kb_torture_step;

typedef struct kb_torture_plan {
    kb_torture_step *steps;
    size_t n, cap;
} kb_torture_plan;

/* The schedule of a run, a function of its arguments only: `nodes` broker
 * nodes (3: a cluster that keeps its quorum with one down; 1: a single
 * server, never left down), `consumers` slots up at the start, at most
 * `max_slots`, actions every min_gap..max_gap ms for `duration_ms`. */
int kb_torture_plan_make(kb_torture_plan *p, uint64_t seed, int nodes, int consumers,
                         int max_slots, int64_t duration_ms, int min_gap_ms, int max_gap_ms);
void kb_torture_plan_free(kb_torture_plan *p);
const char *kb_torture_op_name(kb_torture_op op);

/* What the checker needs to know of the run (run.conf). */
typedef struct kb_torture_params {
    char broker[16];             /* "nats" or "redis" */
    uint32_t partitions;
    uint32_t keys;
    uint32_t max_ack_pending;    /* NATS: nats.max_ack_pending */
    uint32_t publish_batch;      /* NATS: nats.publish_batch */
    uint32_t ack_interval_ms;    /* NATS: nats.ack_interval_ms */
    uint32_t rtt_ms;             /* the round trip in the duplicate bound (generous) */
    int64_t max_pause_ms;        /* exit non-zero above it */
    uint64_t seed;
} kb_torture_params;

int kb_torture_params_write(const char *dir, const kb_torture_params *p);
int kb_torture_params_read(const char *dir, kb_torture_params *p);

/* What the checker found (torture_check.c says how each is counted). */
typedef struct kb_torture_result {
    uint64_t accepted, handled, distinct, lost, unhandled, phantom, order_violations,
        duplicates, duplicate_bound,   /* duplicate_bound: NATS only, else 0 */
        crashes;                       /* consumers crashed, sanitizer reports */
    int64_t max_pause_ms;
} kb_torture_result;

/* Read the history in `dir`, print the findings on `out` (text, or one JSON
 * document when json is set) and the summary line, fill *res (may be NULL).
 * Returns 0 when nothing was lost, no order was broken and no pause passed
 * max_pause_ms, 1 when something was, 2 when the history could not be read. */
int kb_torture_check(const char *dir, const kb_torture_params *p, int json, FILE *out,
                     kb_torture_result *res);

/* Monotonic and wall clock, in ns. */
int64_t kb_torture_mono_ns(void);
int64_t kb_torture_wall_ns(void);

/* splitmix64: the schedule's and the producer's random numbers. */
uint64_t kb_torture_rand(uint64_t *state);

#endif /* KB_TORTURE_H */
