/* The operator's reads and the one removal (keybus.h, "Administration"):
 * the groups of a topic (XINFO GROUPS / XINFO CONSUMERS), the topics the
 * server stores (SCAN of kb:{*} keys), a group removed (XGROUP DESTROY,
 * refused while one of its consumers holds a lease) and a peek at what a
 * group would be handed next (XPENDING, then XRANGE of the pending IDs and
 * after the group's last-delivered-id: never XREADGROUP, which would
 * deliver). On the figures' connection under stats_lock, pipelined; nothing
 * is written but by XGROUP DESTROY. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* Run commands appended by `append` on the figures' connection; replies in
 * r[0..n). */
static int run(kb_transport *t, redisReply **r, size_t n,
               void (*append)(redisContext *c, void *arg), void *arg)
{
    pthread_mutex_lock(&t->stats_lock);
    redisContext *c = kb__redis_conn_get(&t->stats, NULL, 0);
    int rc = KB_ETRANSPORT;
    if (c == NULL)
        kb_errf(NULL, 0, "redis: %s is unreachable", t->where);
    else {
        append(c, arg);
        rc = kb__redis_stats_run(t, c, r, n);
    }
    pthread_mutex_unlock(&t->stats_lock);
    return rc;
}

static void free_replies(redisReply **r, size_t n)
{
    for (size_t i = 0; r != NULL && i < n; i++)
        kb__redis_reply_free(r[i]);
    free(r);
}

static uint64_t int_of(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? (uint64_t)r->integer : 0;
}

/* The consumer a lease value names (consumer#nonce), its length. */
static size_t holder_len(const redisReply *lease)
{
    return lease->type == REDIS_REPLY_STRING ? strcspn(lease->str, "#") : 0;
}

/* ---- groups ---- */

struct topic_arg {
    kb_transport *t;
    const char *topic;
};

/* Per partition: XLEN, XINFO GROUPS, the last ID, the lease. */
static void append_groups(redisContext *c, void *arg)
{
    const struct topic_arg *a = arg;
    for (uint32_t i = 0; i < a->t->partitions; i++) {
        redisAppendCommand(c, "XLEN kb:{%s}:p:%u", a->topic, i);
        redisAppendCommand(c, "XINFO GROUPS kb:{%s}:p:%u", a->topic, i);
        redisAppendCommand(c, "EVAL %s 1 kb:{%s}:p:%u", kb__redis_last_id_lua, a->topic, i);
        redisAppendCommand(c, "GET kb:{%s}:lease:%u", a->topic, i);
    }
}

struct consumers_arg {
    kb_transport *t;
    const char *topic;
    const kb_names *groups;
};

/* XINFO CONSUMERS of every group on every partition. */
static void append_consumers(redisContext *c, void *arg)
{
    const struct consumers_arg *a = arg;
    for (size_t g = 0; g < a->groups->n; g++)
        for (uint32_t i = 0; i < a->t->partitions; i++)
            redisAppendCommand(c, "XINFO CONSUMERS kb:{%s}:p:%u %s", a->topic, i,
                               a->groups->v[g]);
}

/* Add the consumers an XINFO CONSUMERS reply names. */
static int add_consumers(kb_names *s, const redisReply *r)
{
    int rc = KB_OK;
    for (size_t i = 0; rc == KB_OK && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *n = kb__redis_field(r->element[i], "name");
        if (n != NULL)
            rc = kb_names_add(s, n->str, n->len);
    }
    return rc;
}

/* Is lease value `lease` held by one of `consumers`? Leases are the topic's,
 * not a group's: a holder counts for the group that knows it as a consumer
 * (on any partition: a consumer appears on a partition when it first reads
 * there). */
static bool held_by(const kb_names *consumers, const redisReply *lease)
{
    size_t len = holder_len(lease);
    return len > 0 && kb_names_has(consumers, lease->str, len);
}

/* Group g's row of the answer: figures per partition, its consumers, and
 * the leases its consumers hold. `fig`: 4 replies per partition
 * (append_groups); `cons`: its XINFO CONSUMERS per partition. */
static int group_of(kb_transport *t, redisReply **fig, redisReply **cons, const char *name,
                    kb_group_info *out)
{
    kb_names consumers = {0};
    int rc = (out->name = strdup(name)) != NULL ? KB_OK : KB_ENOMEM;
    for (uint32_t i = 0; rc == KB_OK && i < t->partitions; i++) {
        redisReply **p = fig + 4 * (size_t)i;
        const redisReply *row = kb__redis_group_row_of(p[1], name);
        if (row == NULL)
            continue;
        kb_redis_group_info f = kb__redis_row_figures(row, int_of(p[0]), p[2]);
        out->partitions++;
        out->pending += f.pending;
        out->lag += f.lag;
        rc = add_consumers(&consumers, cons[i]);
    }
    for (uint32_t i = 0; rc == KB_OK && i < t->partitions; i++)
        out->leases += held_by(&consumers, fig[4 * (size_t)i + 3]);
    out->consumers = consumers.v;
    out->n_consumers = consumers.n;
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "redis: out of memory for the groups of a topic");
    return rc;
}

int kb__redis_groups(kb_transport *t, kb_transport_topic *tt, kb_group_info **out, size_t *n)
{
    int rc = kb__redis_topic_known(t, tt);
    if (rc != KB_OK)
        return rc;
    size_t nf = 4 * (size_t)t->partitions;
    redisReply **fig = calloc(nf, sizeof *fig);
    if (fig == NULL)
        return KB_ENOMEM;
    struct topic_arg ta = {t, tt->name};
    if ((rc = run(t, fig, nf, append_groups, &ta)) != KB_OK) {
        free(fig);
        return rc;
    }
    kb_names groups = {0};
    for (uint32_t i = 0; rc == KB_OK && i < t->partitions; i++) {
        const redisReply *g = fig[4 * (size_t)i + 1];
        for (size_t j = 0; rc == KB_OK && g->type == REDIS_REPLY_ARRAY && j < g->elements; j++) {
            const redisReply *name = kb__redis_field(g->element[j], "name");
            if (name != NULL)
                rc = kb_names_add(&groups, name->str, name->len);
        }
    }
    size_t nc = groups.n * t->partitions;
    redisReply **cons = nc > 0 ? calloc(nc, sizeof *cons) : NULL;
    if (rc == KB_OK && nc > 0 && cons == NULL)
        rc = KB_ENOMEM;
    struct consumers_arg ca = {t, tt->name, &groups};
    if (rc == KB_OK && nc > 0 && (rc = run(t, cons, nc, append_consumers, &ca)) != KB_OK) {
        free(cons);
        cons = NULL;
    }
    if (rc == KB_OK && groups.n > 0 && (*out = calloc(groups.n, sizeof **out)) == NULL)
        rc = KB_ENOMEM;
    for (size_t g = 0; rc == KB_OK && g < groups.n; g++) {
        (*n)++;
        rc = group_of(t, fig, cons + g * t->partitions, groups.v[g], &(*out)[g]);
    }
    free_replies(cons, cons != NULL ? nc : 0);
    free_replies(fig, nf);
    kb_names_free(&groups);
    return rc;
}

/* ---- group-delete ---- */

struct group_arg {
    kb_transport *t;
    const char *topic, *group;
};

/* Per partition: XINFO GROUPS, the group's consumers, the lease. */
static void append_group_state(redisContext *c, void *arg)
{
    const struct group_arg *a = arg;
    for (uint32_t i = 0; i < a->t->partitions; i++) {
        redisAppendCommand(c, "XINFO GROUPS kb:{%s}:p:%u", a->topic, i);
        redisAppendCommand(c, "XINFO CONSUMERS kb:{%s}:p:%u %s", a->topic, i, a->group);
        redisAppendCommand(c, "GET kb:{%s}:lease:%u", a->topic, i);
    }
}

/* Per partition: the group, and its progress records of frames (a group made
 * again under the name would otherwise skip the events they mark). */
static void append_destroy(redisContext *c, void *arg)
{
    const struct group_arg *a = arg;
    for (uint32_t i = 0; i < a->t->partitions; i++) {
        redisAppendCommand(c, "XGROUP DESTROY kb:{%s}:p:%u %s", a->topic, i, a->group);
        redisAppendCommand(c, "DEL kb:{%s}:done:%s:%u", a->topic, a->group, i);
    }
}

int kb__redis_group_delete(kb_transport *t, kb_transport_topic *tt, const char *group,
                           unsigned flags)
{
    int rc = kb__redis_topic_known(t, tt);
    if (rc != KB_OK)
        return rc;
    size_t n = 3 * (size_t)t->partitions;
    redisReply **r = calloc(n, sizeof *r);
    if (r == NULL)
        return KB_ENOMEM;
    struct group_arg a = {t, tt->name, group};
    if ((rc = run(t, r, n, append_group_state, &a)) != KB_OK) {
        free(r);
        return rc;
    }
    uint32_t found = 0;
    kb_names consumers = {0};
    for (uint32_t i = 0; rc == KB_OK && i < t->partitions; i++) {
        redisReply **p = r + 3 * (size_t)i;
        found += kb__redis_group_row_of(p[0], group) != NULL;
        rc = add_consumers(&consumers, p[1]);
    }
    for (uint32_t i = 0; rc == KB_OK && !(flags & KB_GROUP_DELETE_F_FORCE) && i < t->partitions;
         i++) {
        const redisReply *lease = r[3 * (size_t)i + 2];
        if (held_by(&consumers, lease)) {
            kb_errf(NULL, 0, "group %s of topic %s: partition %u is leased by its consumer "
                             "%.*s, a live member; stop it first (or force)",
                    group, tt->name, i, (int)holder_len(lease), lease->str);
            rc = KB_EINVAL;
        }
    }
    kb_names_free(&consumers);
    free_replies(r, n);
    if (rc != KB_OK)
        return rc;
    if (found == 0) {
        kb_errf(NULL, 0, "group %s does not exist on topic %s", group, tt->name);
        return KB_ENOTFOUND;
    }
    n = 2 * (size_t)t->partitions;
    if ((r = calloc(n, sizeof *r)) == NULL)
        return KB_ENOMEM;
    if ((rc = run(t, r, n, append_destroy, &a)) != KB_OK) {
        free(r);   /* run freed what it read */
        return rc;
    }
    for (uint32_t i = 0; rc == KB_OK && i < 2 * t->partitions; i++)
        if (r[i]->type == REDIS_REPLY_ERROR) {
            kb_errf(NULL, 0, "redis: %s on partition %u of %s: %s",
                    i % 2 == 0 ? "XGROUP DESTROY" : "DEL of the progress records", i / 2,
                    tt->name, r[i]->str);
            rc = KB_ETRANSPORT;
        }
    if (rc == KB_OK)
        kb_log(t->bus, KB_LOG_NOTICE, "redis: group %s of topic %s deleted on %u partitions",
               group, tt->name, found);
    free_replies(r, n);
    return rc;
}

/* ---- topics ---- */

/* The topic of a key kb:{T}:... (its pointer and length); false for other keys. */
static bool topic_of_key(const redisReply *k, const char **topic, size_t *len)
{
    if (k->type != REDIS_REPLY_STRING || k->len < 6 || strncmp(k->str, "kb:{", 4) != 0)
        return false;
    const char *end = strstr(k->str + 4, "}:");
    if (end == NULL)
        return false;
    *topic = k->str + 4;
    *len = (size_t)(end - *topic);
    char name[256];
    if (*len == 0 || *len >= sizeof name)
        return false;
    memcpy(name, *topic, *len);
    name[*len] = '\0';
    return kb_topic_name_check(name, NULL, 0) == KB_OK;
}

/* Every topic name a kb:{T}:... key holds (SCAN of the whole keyspace). */
static int scan_topics(kb_transport *t, kb_names *out)
{
    char cursor[32] = "0";
    int rc = KB_OK;
    do {
        /* COUNT: keys the server looks at per call, a round trip per 1000 */
        const char *argv[] = {"SCAN", cursor, "MATCH", "kb:{*}:*", "COUNT", "1000"};
        pthread_mutex_lock(&t->stats_lock);
        redisReply *r = kb__redis_cmd(&t->stats, 6, argv, NULL);
        pthread_mutex_unlock(&t->stats_lock);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            kb_errf(NULL, 0, "redis: SCAN on %s: %s", t->where,
                    r == NULL ? "no answer" : r->type == REDIS_REPLY_ERROR ? r->str
                                                                        : "unexpected reply");
            kb__redis_reply_free(r);
            return KB_ETRANSPORT;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        const redisReply *keys = r->element[1];
        for (size_t i = 0; rc == KB_OK && i < keys->elements; i++) {
            const char *topic;
            size_t len;
            if (topic_of_key(keys->element[i], &topic, &len))
                rc = kb_names_add(out, topic, len);
        }
        kb__redis_reply_free(r);
    } while (rc == KB_OK && strcmp(cursor, "0") != 0);
    return rc;
}

static void append_meta(redisContext *c, void *arg)
{
    const kb_names *topics = arg;
    for (size_t i = 0; i < topics->n; i++)
        redisAppendCommand(c, "HGET kb:{%s}:meta partitions", topics->v[i]);
}

struct parts_arg {
    const char *topic;
    uint32_t partitions;
};

static void append_parts(redisContext *c, void *arg)
{
    const struct parts_arg *a = arg;
    for (uint32_t i = 0; i < a->partitions; i++) {
        redisAppendCommand(c, "XLEN kb:{%s}:p:%u", a->topic, i);
        redisAppendCommand(c, "XINFO GROUPS kb:{%s}:p:%u", a->topic, i);
    }
}

/* One topic's length and groups over its stored partition count. */
static int topic_info(kb_transport *t, const redisReply *meta, kb_topic_info *out)
{
    unsigned long parts = meta->type == REDIS_REPLY_STRING ? strtoul(meta->str, NULL, 10) : 0;
    out->partitions = parts <= 4096 ? (uint32_t)parts : 0;   /* the `partitions` key's range */
    if (out->partitions == 0)
        return KB_OK;
    size_t n = 2 * (size_t)out->partitions;
    redisReply **r = calloc(n, sizeof *r);
    if (r == NULL)
        return KB_ENOMEM;
    struct parts_arg a = {out->name, out->partitions};
    int rc = run(t, r, n, append_parts, &a);
    if (rc != KB_OK) {
        free(r);
        return rc;
    }
    kb_names groups = {0};
    for (uint32_t i = 0; rc == KB_OK && i < out->partitions; i++) {
        out->length += int_of(r[2 * i]);
        const redisReply *g = r[2 * i + 1];
        for (size_t j = 0; rc == KB_OK && g->type == REDIS_REPLY_ARRAY && j < g->elements; j++) {
            const redisReply *name = kb__redis_field(g->element[j], "name");
            if (name != NULL)
                rc = kb_names_add(&groups, name->str, name->len);
        }
    }
    out->groups = groups.v;
    out->n_groups = groups.n;
    free_replies(r, n);
    return rc;
}

int kb__redis_topics(kb_transport *t, kb_topic_info **out, size_t *n)
{
    kb_names topics = {0};
    int rc = scan_topics(t, &topics);
    redisReply **meta = topics.n > 0 ? calloc(topics.n, sizeof *meta) : NULL;
    if (rc == KB_OK && topics.n > 0 && meta == NULL)
        rc = KB_ENOMEM;
    if (rc == KB_OK && topics.n > 0 && (rc = run(t, meta, topics.n, append_meta, &topics)) != KB_OK) {
        free(meta);
        meta = NULL;
    }
    if (rc == KB_OK && topics.n > 0 && (*out = calloc(topics.n, sizeof **out)) == NULL)
        rc = KB_ENOMEM;
    for (size_t i = 0; rc == KB_OK && i < topics.n; i++) {
        (*out)[i].name = topics.v[i];   /* taken */
        topics.v[i] = NULL;
        (*n)++;
        rc = topic_info(t, meta[i], &(*out)[i]);
    }
    free_replies(meta, meta != NULL ? topics.n : 0);
    kb_names_free(&topics);
    return rc;
}

/* ---- peek ---- */

/* An entry the group would be handed: where it is, and its run. */
typedef struct peeked {
    const redisReply *e;       /* [id, fields] */
    uint32_t partition, attempt;
} peeked;

/* By entry ID; equal IDs (one millisecond, two partitions) by partition. */
static int by_id(const void *a, const void *b)
{
    const peeked *x = a, *y = b;
    int c = kb__redis_id_cmp(x->e->element[0]->str, y->e->element[0]->str);
    return c != 0 ? c : (x->partition > y->partition) - (x->partition < y->partition);
}

struct peek_arg {
    kb_transport *t;
    const char *topic, *group;
    size_t max;
    redisReply **first;        /* round 1's replies: 2 per partition */
};

/* Round 1, per partition: XINFO GROUPS (the group's last-delivered-id) and
 * XPENDING's first `max` entries (an error when there is no group). */
static void append_peek_first(redisContext *c, void *arg)
{
    const struct peek_arg *a = arg;
    for (uint32_t i = 0; i < a->t->partitions; i++) {
        redisAppendCommand(c, "XINFO GROUPS kb:{%s}:p:%u", a->topic, i);
        redisAppendCommand(c, "XPENDING kb:{%s}:p:%u %s - + %llu", a->topic, i, a->group,
                           (unsigned long long)a->max);
    }
}

/* Where undelivered entries of partition i start for the group: "(ID"
 * after its last-delivered-id, "-" for a new group starting at the
 * earliest, NULL for one starting at the latest (nothing yet). */
static const char *undelivered_from(const struct peek_arg *a, uint32_t i, char *buf, size_t len)
{
    const redisReply *row = kb__redis_group_row_of(a->first[2 * i], a->group);
    const redisReply *last = row != NULL ? kb__redis_field(row, "last-delivered-id") : NULL;
    if (last != NULL) {
        snprintf(buf, len, "(%s", last->str);
        return buf;
    }
    if (row != NULL)
        return "-";
    return strcmp(a->t->group_start, "$") == 0 ? NULL : "-";
}

/* The pending IDs of partition i (XPENDING's extended form), or NULL. */
static const redisReply *pending_of(const struct peek_arg *a, uint32_t i)
{
    const redisReply *x = a->first[2 * i + 1];
    return x->type == REDIS_REPLY_ARRAY ? x : NULL;
}

/* Round 2, per partition: one XRANGE per pending ID, the runs recorded for
 * them, then the undelivered entries. */
static void append_peek_second(redisContext *c, void *arg)
{
    const struct peek_arg *a = arg;
    for (uint32_t i = 0; i < a->t->partitions; i++) {
        const redisReply *x = pending_of(a, i);
        char runs[KB_REDIS_KEY_MAX];
        kb__redis_runs_key(runs, sizeof runs, a->topic, i);
        for (size_t j = 0; x != NULL && j < x->elements; j++) {
            const char *id = x->element[j]->element[0]->str;
            redisAppendCommand(c, "XRANGE kb:{%s}:p:%u %s %s", a->topic, i, id, id);
            redisAppendCommand(c, "HGET %s %s", runs, id);
        }
        char buf[KB_REDIS_ID_MAX + 1];
        const char *from = undelivered_from(a, i, buf, sizeof buf);
        /* a group that starts at the latest has nothing yet: start after end */
        redisAppendCommand(c, "XRANGE kb:{%s}:p:%u %s %s COUNT %llu", a->topic, i,
                           from != NULL ? from : "+", from != NULL ? "+" : "-",
                           (unsigned long long)a->max);
    }
}

/* Is XPENDING's extended reply well formed (rows of [id, consumer, idle,
 * deliveries])? Rows of another form are not read. */
static bool pending_ok(const redisReply *x)
{
    for (size_t j = 0; j < x->elements; j++) {
        const redisReply *row = x->element[j];
        if (row->type != REDIS_REPLY_ARRAY || row->elements < 1 ||
            row->element[0]->type != REDIS_REPLY_STRING ||
            !kb__redis_id_valid(row->element[0]->str))
            return false;
    }
    return true;
}

/* Add the event an entry reply holds to v (an entry keybus would
 * dead-letter is left out: no handler would get it). */
static int add_entry(kb_transport *t, const redisReply *e, uint32_t part, uint32_t attempt,
                     peeked **v, size_t *n, size_t *cap)
{
    kb_redis_entry *en = malloc(sizeof *en);
    if (en == NULL)
        return KB_ENOMEM;
    int kind = kb__redis_entry_read(e, part, t->partitions, attempt, t->max_attempts, &t->lim, en);
    free(en);
    kb_redis_frame f;
    char why[160];
    bool frame = e->type == REDIS_REPLY_ARRAY && e->elements >= 2 &&
                 e->element[0]->type == REDIS_REPLY_STRING && kb__redis_is_frame(e->element[1]) &&
                 kb__redis_frame_open(e->element[1], &f, why, sizeof why) == 0;
    if (kind != KB_REDIS_ENTRY_EVENT && !frame)
        return KB_OK;
    if (kb_vec_reserve((void **)v, cap, *n + 1, sizeof **v) != KB_OK)
        return KB_ENOMEM;
    (*v)[(*n)++] = (peeked){e, part, attempt};
    return KB_OK;
}

/* Hand the events of frame entry v to fn (those keybus would dead-letter
 * left out), up to *left; false when fn asked to stop. */
static bool hand_out_frame(kb_transport *t, const char *topic, const peeked *v, size_t *left,
                           kb_peek_fn fn, void *opaque, kb_redis_event *ck)
{
    kb_redis_frame f;
    char why[160], id[KB_REDIS_EVENT_ID_MAX];
    kb_frame_event fe;
    kb__redis_frame_open(v->e->element[1], &f, why, sizeof why);   /* checked by add_entry */
    bool go = true;
    for (uint32_t j = 0; go && *left > 0 && kb__redis_frame_next(&f, &fe); j++) {
        if (kb__redis_event_read(&fe, v->partition, t->partitions, v->attempt, t->max_attempts,
                                 &t->lim, ck) != KB_REDIS_ENTRY_EVENT)
            continue;
        snprintf(id, sizeof id, "%s.%u", v->e->element[0]->str, j);
        kb_event ev = {.topic = topic, .key = fe.key, .key_len = fe.key_len,
                       .payload = fe.payload, .payload_len = fe.payload_len,
                       .attempt = ck->attempt, .id = id, .headers = ck->headers,
                       .n_headers = ck->n_headers};
        (*left)--;
        go = fn(&ev, opaque) == 0;
    }
    return go;
}

/* Sort the entries of one kind (pending, then undelivered) and hand up to
 * *left of their events to fn; false when fn asked to stop. */
static bool hand_out(kb_transport *t, const char *topic, peeked *v, size_t n, size_t *left,
                     kb_peek_fn fn, void *opaque)
{
    if (n > 1)
        qsort(v, n, sizeof *v, by_id);
    kb_redis_entry *en = malloc(sizeof *en);
    kb_redis_event *ck = malloc(sizeof *ck);
    bool go = en != NULL && ck != NULL;
    for (size_t i = 0; go && i < n && *left > 0; i++) {
        if (kb__redis_is_frame(v[i].e->element[1])) {
            go = hand_out_frame(t, topic, &v[i], left, fn, opaque, ck);
            continue;
        }
        kb__redis_entry_read(v[i].e, v[i].partition, t->partitions, v[i].attempt,
                             t->max_attempts, &t->lim, en);
        kb_event ev = {.topic = topic, .key = en->key->str, .key_len = en->key->len,
                       .payload = en->payload->str, .payload_len = en->payload->len,
                       .attempt = en->attempt, .id = en->id, .headers = en->headers,
                       .n_headers = en->n_headers};
        (*left)--;
        go = fn(&ev, opaque) == 0;
    }
    free(en);
    free(ck);
    return go;
}

/* Round 2's replies into the pending and undelivered lists. */
static int sort_out(const struct peek_arg *a, redisReply **r, peeked **pend, size_t *np,
                    peeked **fresh, size_t *nf)
{
    kb_transport *t = a->t;
    size_t k = 0, pcap = 0, fcap = 0;
    int rc = KB_OK;
    for (uint32_t i = 0; rc == KB_OK && i < t->partitions; i++) {
        const redisReply *x = pending_of(a, i);
        for (size_t j = 0; rc == KB_OK && x != NULL && j < x->elements; j++, k += 2) {
            const redisReply *range = r[k];   /* empty: deleted while pending */
            if (range->type == REDIS_REPLY_ARRAY && range->elements == 1) {
                /* the run its next delivery would be: recorded runs + 1 */
                long long runs = r[k + 1]->type == REDIS_REPLY_STRING
                                     ? strtoll(r[k + 1]->str, NULL, 10) : 0;
                uint32_t attempt = runs <= 0 ? 1 : runs < 1000000 ? (uint32_t)runs + 1 : 1000001;
                rc = add_entry(t, range->element[0], i, attempt, pend, np, &pcap);
            }
        }
        const redisReply *range = r[k++];
        for (size_t j = 0; rc == KB_OK && range->type == REDIS_REPLY_ARRAY && j < range->elements;
             j++)
            rc = add_entry(t, range->element[j], i, 1, fresh, nf, &fcap);
    }
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "redis: out of memory for a peek");
    return rc;
}

int kb__redis_peek(kb_transport *t, kb_transport_topic *tt, const char *group, size_t max,
                   kb_peek_fn fn, void *opaque)
{
    int rc = kb__redis_topic_known(t, tt);
    if (rc != KB_OK)
        return rc;
    size_t n1 = 2 * (size_t)t->partitions;
    struct peek_arg a = {t, tt->name, group, max, calloc(n1, sizeof(redisReply *))};
    if (a.first == NULL)
        return KB_ENOMEM;
    if ((rc = run(t, a.first, n1, append_peek_first, &a)) != KB_OK) {
        free(a.first);
        return rc;
    }
    size_t n2 = 0;
    for (uint32_t i = 0; i < t->partitions; i++) {
        const redisReply *x = pending_of(&a, i);
        if (x != NULL && !pending_ok(x)) {
            kb__redis_reply_free(a.first[2 * i + 1]);
            a.first[2 * i + 1] = NULL;
            kb_errf(NULL, 0, "redis: XPENDING of partition %u of %s: unexpected reply", i,
                    tt->name);
            rc = KB_ETRANSPORT;
            break;
        }
        n2 += 1 + (x != NULL ? 2 * x->elements : 0);
    }
    redisReply **r = rc == KB_OK ? calloc(n2, sizeof *r) : NULL;
    if (rc == KB_OK && r == NULL)
        rc = KB_ENOMEM;
    if (rc == KB_OK && (rc = run(t, r, n2, append_peek_second, &a)) != KB_OK) {
        free(r);
        r = NULL;
    }
    peeked *pend = NULL, *fresh = NULL;
    size_t np = 0, nf = 0, left = max;
    if (rc == KB_OK)
        rc = sort_out(&a, r, &pend, &np, &fresh, &nf);
    if (rc == KB_OK && hand_out(t, tt->name, pend, np, &left, fn, opaque))
        hand_out(t, tt->name, fresh, nf, &left, fn, opaque);
    free(pend);
    free(fresh);
    free_replies(r, r != NULL ? n2 : 0);
    free_replies(a.first, n1);
    return rc;
}
