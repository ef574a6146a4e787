/* Membership as it changes. A KV put or delete is a message on the bucket's
 * subject $KV.<bucket>.<key>, so a plain subscription there sees what every
 * process writes as it writes it. Rounds come every third of the lease TTL;
 * without this a joiner waited for the owner's next round to be seen, and for
 * the one after to be handed its partitions (about a TTL in all). Here a member
 * key never seen, a member's delete (a clean leave) or a lease's delete (a
 * hand-over) wakes the lease thread at once. What the watch saw also
 * corrects the round's roster, which is read from the stream and can miss a
 * write made just before it. Expiries (a process killed) send nothing: those
 * still wait for the TTL, as they must. */
#include <stdlib.h>
#include <string.h>

#include "nats_names.h"
#include "nats_watch.h"

static int cmp_key(const void *key, const void *seen)
{
    return strcmp(key, ((const kb_nats_seen *)seen)->key);
}

/* The entry of `key`, or NULL. Under watch_mu. */
static kb_nats_seen *find(kb_transport *t, const char *key)
{
    return t->watch_n > 0 ? bsearch(key, t->watch_seen, t->watch_n, sizeof *t->watch_seen, cmp_key)
                          : NULL;
}

/* The entry of `key`, inserted when absent (NULL: out of memory). Under watch_mu. */
static kb_nats_seen *seen_get(kb_transport *t, const char *key, bool *inserted)
{
    *inserted = false;
    kb_nats_seen *s = find(t, key);
    if (s != NULL)
        return s;
    void *v = t->watch_seen;
    char *copy = strdup(key);
    if (copy == NULL || kb_vec_reserve(&v, &t->watch_cap, t->watch_n + 1, sizeof *s) != KB_OK) {
        free(copy);
        return NULL;
    }
    t->watch_seen = v;
    size_t at = 0;
    while (at < t->watch_n && strcmp(t->watch_seen[at].key, key) < 0)
        at++;
    memmove(&t->watch_seen[at + 1], &t->watch_seen[at], (t->watch_n - at) * sizeof *s);
    t->watch_seen[at] = (kb_nats_seen){copy, 0, 0};
    t->watch_n++;
    *inserted = true;
    return &t->watch_seen[at];
}

/* Another member of a topic's group left (`key`, its member key): the
 * topic's acquisitions wait a moment for its replacement (nats_lease.c). */
static void member_left(kb_transport *t, const char *key, int64_t now)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        char prefix[2 * KB_NATS_NAME], mine[2 * KB_NATS_NAME];
        kb__nats_member_prefix(t, tp, prefix, sizeof prefix);
        kb__nats_member_key(t, tp, mine, sizeof mine);
        size_t pl = strlen(prefix);
        if (strncmp(key, prefix, pl) == 0 && strchr(key + pl, '.') == NULL &&
            strcmp(key, mine) != 0)
            atomic_store(&tp->member_left_ns, now);
    }
}

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *closure)
{
    (void)nc;
    (void)sub;
    kb_transport *t = closure;
    size_t bl = strlen(t->bucket);
    const char *subj = natsMsg_GetSubject(m), *op = NULL;
    const char *key = strlen(subj) > 5 + bl ? subj + 5 + bl : "";   /* after "$KV.<bucket>." */
    bool removal = natsMsgHeader_Get(m, "KV-Operation", &op) == NATS_OK;
    bool kick = false;
    if (strncmp(key, "m.", 2) == 0) {
        pthread_mutex_lock(&t->watch_mu);
        bool inserted = false;
        kb_nats_seen *s = seen_get(t, key, &inserted);
        int64_t now = kb_now_ns();
        if (s != NULL && removal) {
            kick = s->del_ns <= s->put_ns;   /* a leave, not a repeated delete */
            s->del_ns = now;
            if (kick && !inserted)   /* seen here before: its partitions were not ours */
                member_left(t, key, now);
        } else if (s != NULL) {
            size_t idl = strlen(t->id);
            bool mine = (size_t)natsMsg_GetDataLength(m) == idl &&
                        memcmp(natsMsg_GetData(m), t->id, idl) == 0;   /* heartbeats carry the name */
            kick = !mine && (inserted || s->del_ns > s->put_ns);   /* a joiner, or one back */
            s->put_ns = now;
        }
        pthread_mutex_unlock(&t->watch_mu);
    } else if (strncmp(key, "l.", 2) == 0) {
        kick = removal;   /* a lease released: its next owner takes it now */
    }
    if (kick) {
        kb_log(t->bus, KB_LOG_DEBUG, "nats %s: %s %s: a lease round now", t->url_safe, key,
               removal ? "deleted" : "came");
        kb__nats_lease_kick(t);
    }
    natsMsg_Destroy(m);
}

/* nats.c calls this once the subscription is closed and its last message
 * callback has returned: from then on nothing of the watch touches t. */
static void on_complete(void *closure)
{
    kb_transport *t = closure;
    atomic_store(&t->watch_done, 1);
    kb_signal_notify(t->nc_event);
}

natsStatus kb__nats_watch_start(kb_transport *t)
{
    if (t->watch_sub != NULL)
        return NATS_OK;
    char subj[96];
    snprintf(subj, sizeof subj, "$KV.%s.>", t->bucket);
    natsStatus s = natsConnection_Subscribe(&t->watch_sub, t->nc, subj, on_msg, t);
    if (s == NATS_OK)
        s = natsSubscription_SetOnCompleteCB(t->watch_sub, on_complete, t);
    if (s == NATS_OK)   /* every renewal passes here too: never drop one for a slow callback */
        s = natsSubscription_SetPendingLimits(t->watch_sub, -1, -1);
    return s;
}

bool kb__nats_watch_done(const kb_transport *t)
{
    return t->watch_sub == NULL || atomic_load(&t->watch_done);
}

void kb__nats_watch_prune(kb_transport *t)
{
    int64_t old = kb_now_ns() - 2 * t->lease_ttl_ms * 1000000;
    pthread_mutex_lock(&t->watch_mu);
    size_t o = 0;
    for (size_t i = 0; i < t->watch_n; i++) {
        kb_nats_seen *s = &t->watch_seen[i];
        if (s->put_ns < old && s->del_ns < old)
            free(s->key);
        else
            t->watch_seen[o++] = *s;
    }
    t->watch_n = o;
    pthread_mutex_unlock(&t->watch_mu);
}

static int verdict(const kb_transport *t, const kb_nats_seen *s, int64_t now)
{
    int64_t ttl = t->lease_ttl_ms * 1000000;
    if (s->del_ns > s->put_ns && now - s->del_ns < ttl)
        return 0;
    if (s->put_ns > s->del_ns && now - s->put_ns < ttl)
        return 1;
    return -1;
}

int kb__nats_watch_member(kb_transport *t, const char *key)
{
    pthread_mutex_lock(&t->watch_mu);
    kb_nats_seen *s = find(t, key);
    int v = s != NULL ? verdict(t, s, kb_now_ns()) : -1;
    pthread_mutex_unlock(&t->watch_mu);
    return v;
}

size_t kb__nats_watch_count(kb_transport *t)
{
    pthread_mutex_lock(&t->watch_mu);
    size_t n = t->watch_n;
    pthread_mutex_unlock(&t->watch_mu);
    return n;
}

void kb__nats_watch_members(kb_transport *t, const char *prefix,
                            void (*fn)(const char *key, void *arg), void *arg)
{
    size_t pl = strlen(prefix);
    int64_t now = kb_now_ns();
    pthread_mutex_lock(&t->watch_mu);
    for (size_t i = 0; i < t->watch_n; i++)
        if (strncmp(t->watch_seen[i].key, prefix, pl) == 0 &&
            verdict(t, &t->watch_seen[i], now) == 1)
            fn(t->watch_seen[i].key, arg);
    pthread_mutex_unlock(&t->watch_mu);
}

void kb__nats_watch_free(kb_transport *t)
{
    for (size_t i = 0; i < t->watch_n; i++)
        free(t->watch_seen[i].key);
    free(t->watch_seen);
    t->watch_seen = NULL;
    t->watch_n = t->watch_cap = 0;
}
