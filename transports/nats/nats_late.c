/* Renewals answered after their round gave up waiting: remembered for a
 * TTL, sorted by reply subject (rounds only count up, and a round's indices
 * rise), so an answer finds its renewal by binary search. */
#include <stdlib.h>
#include <string.h>

#include "nats_late.h"

struct kb_nats_late {
    uint32_t round, index;         /* its reply subject: <kv_inbox>.<round>.<index> */
    kb_nats_part *p;               /* NULL once answered */
    uint32_t leases_ended;         /* p's count when sent: a lease ended since is not renewed */
    int64_t sent_ns;
};

static bool is_renewal(const kb_nats_kv_op *k)
{
    return k->p != NULL && !k->get && k->expect != 0 && k->expect == k->p->lease_rev;
}

void kb__nats_late_keep(kb_transport *t, const kb_nats_kv_ops *ops, uint32_t round)
{
    int64_t now = kb_now_ns(), ttl = t->lease_ttl_ms * 1000000;
    size_t old = 0;
    while (old < t->kv_late_n && t->kv_late[old].sent_ns + ttl <= now)
        old++;
    if (old > 0) {
        memmove(t->kv_late, t->kv_late + old, (t->kv_late_n - old) * sizeof *t->kv_late);
        t->kv_late_n -= old;
    }
    for (size_t i = 0; i < ops->n; i++) {
        const kb_nats_kv_op *k = &ops->v[i];
        if (k->s != NATS_TIMEOUT || !is_renewal(k))
            continue;
        void *v = t->kv_late;
        if (kb_vec_reserve(&v, &t->kv_late_cap, t->kv_late_n + 1, sizeof *t->kv_late) != KB_OK)
            return;   /* only a late answer is not counted */
        t->kv_late = v;
        t->kv_late[t->kv_late_n++] = (struct kb_nats_late){round, (uint32_t)i, k->p,
                                                            k->p->leases_ended, ops->sent_ns};
    }
}

static int late_cmp(const void *key, const void *elem)
{
    const struct kb_nats_late *a = key, *b = elem;
    if (a->round != b->round)
        return a->round < b->round ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

void kb__nats_late_answered(kb_transport *t, uint32_t round, uint32_t index,
                            const kb_nats_kv_op *answer)
{
    struct kb_nats_late key = {.round = round, .index = index};
    if (t->kv_late_n == 0)
        return;   /* (no array to search yet) */
    struct kb_nats_late *l = bsearch(&key, t->kv_late, t->kv_late_n, sizeof *t->kv_late, late_cmp);
    if (l == NULL || l->p == NULL)
        return;
    kb_nats_part *p = l->p;
    l->p = NULL;
    if (answer->s != NATS_OK || p->leases_ended != l->leases_ended || p->lease_rev == 0 ||
        answer->rev < p->lease_rev)
        return;
    int64_t until = l->sent_ns + t->lease_ttl_ms * 1000000;
    kb_log(t->bus, KB_LOG_DEBUG, "nats %s: lease of %s: a renewal answered late (revision "
           "%llu) still counts", t->url_safe, p->subject, (unsigned long long)answer->rev);
    p->lease_rev = answer->rev;
    if (until > p->lease_until_ns)
        p->lease_until_ns = until;
}
