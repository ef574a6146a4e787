/* The nemesis's schedule: drawn from the seed alone, by playing the moves
 * against a model of which consumers and nodes are up, so the same seed and
 * arguments give the same steps whatever the run's timings. A node is left
 * down only in the second half: no node can be killed after it (the cluster
 * keeps its quorum), and the first half kills and restarts them. */
#include <stdlib.h>
#include <string.h>

#include "torture.h"

uint64_t kb_torture_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t between(uint64_t *rs, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(kb_torture_rand(rs) % (uint64_t)(hi - lo + 1));
}

const char *kb_torture_op_name(kb_torture_op op)
{
    static const char *const names[] = {"kill9", "term", "join", "leave", "start",
                                        "node-kill9", "node-left-down", "node-start", "cut", "heal"};
    return names[op];
}

static int add(kb_torture_plan *p, int64_t at, kb_torture_op op, int target)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        kb_torture_step *s = realloc(p->steps, cap * sizeof *s);
        if (s == NULL)
            return -1;
        p->steps = s;
        p->cap = cap;
    }
    p->steps[p->n] = (kb_torture_step){at, op, target, (uint32_t)p->n};
    p->n++;
    return 0;
}

static int by_time(const void *a, const void *b)
{
    const kb_torture_step *x = a, *y = b;
    if (x->at_ms != y->at_ms)
        return x->at_ms < y->at_ms ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

enum { W_KILL9 = 20, W_TERM = 15, W_JOIN = 8, W_LEAVE = 8, W_NODE_KILL = 15, W_NODE_DOWN = 6,
       W_CUT = 15 };

int kb_torture_plan_make(kb_torture_plan *p, uint64_t seed, int nodes, int consumers,
                         int max_slots, int64_t duration_ms, int min_gap_ms, int max_gap_ms)
{
    memset(p, 0, sizeof *p);
    if (max_slots > KB_TORTURE_MAX_SLOTS || consumers < 1 || consumers > max_slots)
        return -1;
    uint64_t rs = seed;
    /* up_from[s]: the slot's process is up from then on; INT64_MAX: no process */
    int64_t up_from[KB_TORTURE_MAX_SLOTS];
    for (int s = 0; s < max_slots; s++)
        up_from[s] = s < consumers ? 0 : INT64_MAX;
    int64_t node_up_from = 0, cut_until = 0;
    int left_down = 0;
    for (int64_t t = between(&rs, min_gap_ms, max_gap_ms); t < duration_ms;
         t += between(&rs, min_gap_ms, max_gap_ms)) {
        int live[KB_TORTURE_MAX_SLOTS], n_live = 0, n_free = 0;
        for (int s = 0; s < max_slots; s++) {
            if (up_from[s] <= t)
                live[n_live++] = s;
            n_free += up_from[s] == INT64_MAX;
        }
        int w[7] = {
            n_live >= 2 ? W_KILL9 : 0, n_live >= 2 ? W_TERM : 0, n_free > 0 ? W_JOIN : 0,
            n_live >= 2 ? W_LEAVE : 0, !left_down && node_up_from <= t ? W_NODE_KILL : 0,
            nodes > 1 && !left_down && node_up_from <= t && t >= duration_ms / 2 ? W_NODE_DOWN : 0,
            cut_until <= t ? W_CUT : 0};
        int total = 0;
        for (int i = 0; i < 7; i++)
            total += w[i];
        if (total == 0)
            continue;
        int pick = (int)between(&rs, 0, total - 1), op = 0;
        while (pick >= w[op])
            pick -= w[op++];
        int64_t back = t + between(&rs, 1000, 5000);
        if (back > duration_ms)
            back = duration_ms;
        int rc = 0;
        if (op == 0 || op == 1 || op == 3) {
            int s = live[between(&rs, 0, n_live - 1)];
            static const kb_torture_op ops[] = {KB_T_KILL9, KB_T_TERM, 0, KB_T_LEAVE};
            rc = add(p, t, ops[op], s);
            if (op == 3) {
                up_from[s] = INT64_MAX;
            } else {
                rc |= add(p, back, KB_T_START, s);
                up_from[s] = back;
            }
        } else if (op == 2) {
            int s = 0;
            while (up_from[s] != INT64_MAX)
                s++;
            rc = add(p, t, KB_T_JOIN, s);
            up_from[s] = t;
        } else if (op == 4 || op == 5) {
            int node = (int)between(&rs, 0, nodes - 1);
            rc = add(p, t, op == 4 ? KB_T_NODE_KILL : KB_T_NODE_DOWN, node);
            if (op == 4) {
                rc |= add(p, back, KB_T_NODE_START, node);
                node_up_from = back;
            } else {
                left_down = 1;
            }
        } else {
            /* one node's connections, or (one time in three) every node's */
            int node = nodes > 1 && between(&rs, 0, 2) > 0 ? (int)between(&rs, 0, nodes - 1) : -1;
            rc = add(p, t, KB_T_CUT, node) | add(p, back, KB_T_HEAL, node);
            cut_until = back;
        }
        if (rc != 0) {
            kb_torture_plan_free(p);
            return -1;
        }
    }
    qsort(p->steps, p->n, sizeof *p->steps, by_time);
    return 0;
}

void kb_torture_plan_free(kb_torture_plan *p)
{
    free(p->steps);
    memset(p, 0, sizeof *p);
}
