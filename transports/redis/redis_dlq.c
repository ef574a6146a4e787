/* Dead letters: queued for the keeper, stored with a fenced XADD+XACK into
 * kb:{topic}:dlq, listed and replayed to their partition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* The original entry's fields, every one as stored, plus these four last. */
#define F_PART "partition"
#define F_ID "orig_id"
#define F_ATTEMPTS "attempts"
#define F_REASON "reason"
#define KEYBUS_FIELDS 8   /* strings: the four names and their values */

/* Stored only while our lease holds, and the entry is acked in the same step.
 * The fields are copied from the entry itself on the server, so fields other
 * clients wrote and `a` are kept byte for byte; ARGV[4] counts the fields
 * sent along (k, d, h.*) for an entry the stream no longer holds (trimmed),
 * or is "ref": an entry over the limits, stored as a reference (keybus's
 * fields only; the entry stays in its stream until trimmed). */
static const char DEAD_LUA[] =
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "local n=tonumber(ARGV[4]) "
    "local f={} "
    "if n then local e=redis.call('xrange',KEYS[2],ARGV[3],ARGV[3]) "
    "if #e>0 then f=e[1][2] else f={unpack(ARGV,5,4+n)} end else n=0 end "
    "for i=5+n,#ARGV do f[#f+1]=ARGV[i] end "
    "redis.call('xadd',KEYS[3],'*',unpack(f)) "
    "redis.call('hdel',KEYS[4],ARGV[3]) "
    "return redis.call('xack',KEYS[2],ARGV[2],ARGV[3])";

/* A frame's event ("<entry ID>.<index>"): its fields are sent along (the
 * entry holds others' too), and the entry is acked with its last event, not
 * here. Its bit goes into the frame's progress record (KEYS[5]) in the same
 * step, as a plain entry's ack does: with its run record gone, a frame that
 * comes again after a crash would hand it to a handler as a first run. */
static const char DEAD_EVENT_LUA[] =
    KB_REDIS_PROGRESS_OR_LUA
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "redis.call('xadd',KEYS[3],'*',unpack(ARGV,5)) "
    "redis.call('hdel',KEYS[4],ARGV[3]) "
    "local e,j=string.match(ARGV[3],'^(.+)%.(%d+)$') j=tonumber(j) "
    "progress_or(KEYS[5],e,string.rep('\\0',math.floor(j/8))..string.char(2^(j%8))) "
    "return 1";

/* Packed fields: uint32 count of strings, then per string uint32 length + bytes. */
typedef struct packer {
    char *buf;
    size_t len, cap;
    uint32_t count;
    bool oom;
} packer;

static void put(packer *pk, const void *s, size_t n)
{
    if (pk->oom)
        return;
    if (kb_vec_reserve((void **)&pk->buf, &pk->cap, pk->len + 4 + n, 1) != KB_OK) {
        pk->oom = true;
        return;
    }
    uint32_t l = (uint32_t)n;
    memcpy(pk->buf + pk->len, &l, 4);
    if (n > 0)
        memcpy(pk->buf + pk->len + 4, s, n);
    pk->len += 4 + n;
    pk->count++;
}

static void put_str(packer *pk, const char *s)
{
    put(pk, s, strlen(s));
}

/* The script's arguments after the entry ID: how many fields follow that
 * stand in for a trimmed entry, those fields, then keybus's four. */
static char *finish(packer *pk, bool ref, uint32_t partition, const char *id, uint32_t attempts,
                    const char *reason)
{
    char num[3][16];
    snprintf(num[0], sizeof num[0], ref ? "ref" : "%u", pk->count);
    snprintf(num[1], sizeof num[1], "%u", partition);
    snprintf(num[2], sizeof num[2], "%u", attempts);
    put_str(pk, F_PART), put_str(pk, num[1]);
    put_str(pk, F_ID), put_str(pk, id);
    put_str(pk, F_ATTEMPTS), put_str(pk, num[2]);
    put_str(pk, F_REASON), put_str(pk, reason);
    uint32_t n = pk->count + 1, first = (uint32_t)strlen(num[0]);
    char *out = pk->oom ? NULL : malloc(4 + 4 + first + pk->len);
    if (out != NULL) {
        memcpy(out, &n, 4);
        memcpy(out + 4, &first, 4);
        memcpy(out + 8, num[0], first);
        memcpy(out + 8 + first, pk->buf, pk->len);
    }
    free(pk->buf);
    return out;
}

char *kb__redis_dead_pack(const kb_delivery *d, const char *reason)
{
    packer pk = {0};
    put_str(&pk, "k"), put(&pk, d->key, d->key_len);
    put_str(&pk, "d"), put(&pk, d->payload, d->payload_len);
    for (size_t i = 0; i < d->n_headers; i++) {   /* in order, for the replay */
        char f[KB_REDIS_HEADER_FIELD_MAX];
        snprintf(f, sizeof f, "%s%s", KB_REDIS_HEADER_PREFIX, d->headers[i].name);
        put_str(&pk, f), put(&pk, d->headers[i].value, d->headers[i].value_len);
    }
    return finish(&pk, false, d->partition, d->id, d->attempt, reason);
}

char *kb__redis_dead_pack_raw(const redisReply *fields, bool ref, uint32_t partition,
                              const char *id, uint32_t attempts, const char *reason)
{
    packer pk = {0};
    for (size_t i = 0; !ref && fields != NULL && fields->type == REDIS_REPLY_ARRAY &&
                       i + 1 < fields->elements; i += 2) {
        const redisReply *f = fields->element[i], *v = fields->element[i + 1];
        if (f->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING)
            put(&pk, f->str, f->len), put(&pk, v->str, v->len);
    }
    return finish(&pk, ref, partition, id, attempts, reason);
}

bool kb__redis_dead_append(redisContext *c, kb_transport *t, kb_redis_part *p,
                           const kb_redis_job *j)
{
    uint32_t n;
    memcpy(&n, j->dead, 4);
    const char **argv = malloc((11 + n) * sizeof *argv);
    size_t *lens = malloc((11 + n) * sizeof *lens);
    if (argv == NULL || lens == NULL) {
        free(argv);
        free(lens);
        return false;   /* dropped: the entry stays pending and comes back */
    }
    char runs[KB_REDIS_KEY_MAX];
    kb__redis_runs_key(runs, sizeof runs, p->tt->name, p->index);
    /* both scripts get the same keys (a plain entry's leaves KEYS[5] alone) */
    const char *script = strchr(j->id, '.') != NULL ? DEAD_EVENT_LUA : DEAD_LUA;
    const char *head[] = {"EVAL", script, "5", p->lease, p->stream, p->tt->dlq, runs, p->done,
                          t->token, t->group, j->id};
    size_t argc = 0;
    for (; argc < 11; argc++)
        argv[argc] = head[argc], lens[argc] = strlen(head[argc]);
    const char *at = j->dead + 4;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t l;
        memcpy(&l, at, 4);
        argv[argc] = at + 4;
        lens[argc++] = l;
        at += 4 + l;
    }
    redisAppendCommandArgv(c, (int)argc, argv, lens);
    free(argv);
    free(lens);
    return true;
}

/* Back in the partition and gone from the DLQ in one step, only if the entry
 * is still there: two replays of one ID add it once. The new entry's ID. */
static const char REPLAY_LUA[] =
    "if redis.call('xdel',KEYS[1],ARGV[1])==0 then return false end "
    "return redis.call('xadd',KEYS[2],'*',unpack(ARGV,2))";

static redisReply *ctl_cmd(kb_transport *t, int argc, const char **argv,
                           const size_t *lens)
{
    pthread_mutex_lock(&t->ctl_lock);
    redisReply *r = kb__redis_cmd(&t->ctl, argc, argv, lens);
    pthread_mutex_unlock(&t->ctl_lock);
    if (r == NULL)
        kb_errf(NULL, 0, "redis: %s is unreachable", t->where);
    else if (r->type == REDIS_REPLY_ERROR)
        kb_errf(NULL, 0, "redis %s: %s", argv[0], r->str);
    return r;
}

static int no_dead_queued(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->dead_queued) == 0;
}

/* One of keybus's four fields: the last ones, after the original entry's
 * (which may hold a field of the same name another client wrote). */
static const redisReply *own_field(const redisReply *f, const char *name)
{
    if (f->type != REDIS_REPLY_ARRAY)
        return NULL;
    size_t len = strlen(name);
    for (size_t i = f->elements & ~(size_t)1, end = i >= KEYBUS_FIELDS ? i - KEYBUS_FIELDS : 0;
         i > end; i -= 2) {
        const redisReply *n = f->element[i - 2], *v = f->element[i - 1];
        if (n->type == REDIS_REPLY_STRING && n->len == len && memcmp(n->str, name, len) == 0)
            return v->type == REDIS_REPLY_STRING ? v : NULL;
    }
    return NULL;
}

/* A partition out of range reads as the one its key hashes to (where a
 * replay sends it). */
kb_dead_letter kb__redis_dead_letter_of(const kb_transport *t, const redisReply *e,
                                        kb_header *headers)
{
    const redisReply *f = e->element[1];
    const redisReply *k = kb__redis_field(f, "k"), *d = kb__redis_field(f, "d"),
                     *p = own_field(f, F_PART), *oid = own_field(f, F_ID),
                     *n = own_field(f, F_ATTEMPTS), *why = own_field(f, F_REASON);
    size_t n_headers = 0;
    kb__redis_headers_of(f, headers, &n_headers, NULL, 0);   /* as stored, even if malformed */
    return (kb_dead_letter){
        .id = e->element[0]->str,
        .key = k ? k->str : "", .key_len = k ? k->len : 0,
        .payload = d ? d->str : "", .payload_len = d ? d->len : 0,
        .partition = kb__redis_number_below(p, t->partitions,
                                  k ? kb_partition_of(k->str, k->len, t->partitions) : 0),
        .original_id = oid ? oid->str : "",
        .attempts = kb__redis_number_below(n, UINT32_MAX, 0),
        .reason = why ? why->str : "",
        .time_ms = strtoll(e->element[0]->str, NULL, 10),   /* the ID's ms: when stored */
        .headers = n_headers > 0 ? headers : NULL, .n_headers = n_headers,
    };
}

int kb__redis_dead_letters(kb_transport *t, kb_transport_topic *tt, const char *after_id,
                           size_t max, kb_dead_letter_fn fn, void *opaque)
{
    if (after_id != NULL && after_id[0] != '\0' && !kb__redis_id_valid(after_id)) {
        kb_errf(NULL, 0, "kb_dead_letters %s: \"%.60s\" is not a Redis stream ID "
                "(<ms>-<seq>, decimal)", tt->name, after_id);
        return KB_EINVAL;
    }
    int known = kb__redis_topic_known(t, tt);
    if (known != KB_OK)
        return known;
    /* read your own dead letters: wait (bounded) for the keeper to store them */
    kb_signal_notify(t->keeper_wake);
    kb_signal_wait(t->settled, no_dead_queued, t, kb_deadline_ns(5000));
    const char *dlq = tt->dlq;
    char start[KB_REDIS_ID_MAX + 1], count[24];
    if (after_id != NULL && after_id[0] != '\0')
        snprintf(start, sizeof start, "(%s", after_id);
    else
        snprintf(start, sizeof start, "-");
    kb_header headers[KB_MAX_HEADERS];
    size_t seen = 0;
    while (seen < max) {
        size_t page = max - seen < 1000 ? max - seen : 1000;
        snprintf(count, sizeof count, "%zu", page);
        const char *argv[] = {"XRANGE", dlq, start, "+", "COUNT", count};
        redisReply *r = ctl_cmd(t, 6, argv, NULL);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
            kb__redis_reply_free(r);
            return KB_ETRANSPORT;
        }
        bool stop = r->elements < page;
        for (size_t i = 0; i < r->elements; i++) {
            const redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
                e->element[0]->type != REDIS_REPLY_STRING)
                continue;
            kb_dead_letter dl = kb__redis_dead_letter_of(t, e, headers);
            seen++;
            snprintf(start, sizeof start, "(%s", dl.id);
            if (fn(&dl, opaque) != 0) {
                kb__redis_reply_free(r);
                return KB_OK;
            }
        }
        kb__redis_reply_free(r);
        if (stop)
            break;
    }
    return KB_OK;
}

int kb__redis_dead_letter_replay(kb_transport *t, kb_transport_topic *tt, const char *id)
{
    const char *dlq = tt->dlq;
    if (!kb__redis_id_valid(id)) {
        kb_errf(NULL, 0, "kb_dead_letter_replay %s: \"%.60s\" is not a Redis stream ID "
                "(<ms>-<seq>, decimal)", tt->name, id);
        return KB_EINVAL;
    }
    const char *range[] = {"XRANGE", dlq, id, id};
    redisReply *r = ctl_cmd(t, 4, range, NULL);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        kb__redis_reply_free(r);
        return KB_ETRANSPORT;
    }
    if (r->elements == 0 || r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->elements < 2) {
        kb__redis_reply_free(r);
        kb_errf(NULL, 0, "redis: no dead letter %s in %s", id, dlq);
        return KB_ENOTFOUND;
    }
    const redisReply *f = r->element[0]->element[1];
    const redisReply *k = kb__redis_field(f, "k"), *d = kb__redis_field(f, "d");
    if (k == NULL || k->len == 0 || d == NULL) {
        const redisReply *oid = own_field(f, F_ID), *why = own_field(f, F_REASON);
        if (oid != NULL && why != NULL && k == NULL && d == NULL)
            kb_errf(NULL, 0, "redis: dead letter %s in %s is a reference to entry %.60s (%.200s); "
                    "nothing to replay", id, dlq, oid->str, why->str);
        else
            kb_errf(NULL, 0, "redis: dead letter %s in %s has no key or payload; not replayable",
                    id, dlq);
        kb__redis_reply_free(r);
        return KB_EINVAL;
    }
    uint32_t part = kb_partition_of(k->str, k->len, t->partitions);
    const char *stream = tt->parts[part].stream;
    /* k, d, a = 1, then the header fields byte for byte (a malformed one is
     * dead-lettered again, with its reason) */
    size_t cap = 12 + f->elements, argc = 12;
    const char **argv = malloc(cap * sizeof *argv);
    size_t *lens = malloc(cap * sizeof *lens);
    if (argv == NULL || lens == NULL) {
        free(argv);
        free(lens);
        kb__redis_reply_free(r);
        kb_errf(NULL, 0, "redis: out of memory replaying %s", id);
        return KB_ENOMEM;
    }
    const char *head[] = {"EVAL", REPLAY_LUA, "2", dlq, stream, id, "k", k->str, "d", d->str,
                          "a", "1"};
    for (size_t i = 0; i < 12; i++)
        argv[i] = head[i], lens[i] = strlen(head[i]);
    lens[7] = k->len;
    lens[9] = d->len;
    for (size_t i = 0; i + 1 < f->elements; i += 2) {
        const redisReply *n = f->element[i], *v = f->element[i + 1];
        if (n->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            strncmp(n->str, KB_REDIS_HEADER_PREFIX, strlen(KB_REDIS_HEADER_PREFIX)) == 0) {
            argv[argc] = n->str, lens[argc++] = n->len;
            argv[argc] = v->str, lens[argc++] = v->len;
        }
    }
    redisReply *x = ctl_cmd(t, (int)argc, argv, lens);
    int rc = KB_OK;
    if (x == NULL || x->type == REDIS_REPLY_ERROR) {
        rc = KB_ETRANSPORT;
    } else if (x->type != REDIS_REPLY_STRING) {
        kb_errf(NULL, 0, "redis: no dead letter %s in %s (replayed meanwhile)", id, dlq);
        rc = KB_ENOTFOUND;
    } else {
        kb__redis_pub_note(t, tt, part, x->str);   /* kb_drain waits for it too */
        const redisReply *was = own_field(f, F_PART);
        uint32_t said = kb__redis_number_below(was, UINT32_MAX, UINT32_MAX);
        if (said != part)
            kb_log(t->bus, KB_LOG_WARNING, "redis: dead letter %s of %s replayed to partition %u "
                   "(%s), where its key hashes, as %s; its partition field said \"%.24s\"", id,
                   tt->name, part, stream, x->str, was != NULL ? was->str : "");
        else
            kb_log(t->bus, KB_LOG_INFO, "redis: dead letter %s of %s replayed to partition %u "
                   "(%s) as %s", id, tt->name, part, stream, x->str);
    }
    kb__redis_reply_free(x);
    kb__redis_reply_free(r);
    free(argv);
    free(lens);
    return rc;
}

int kb__redis_dead_letter_delete(kb_transport *t, kb_transport_topic *tt, const char *id)
{
    if (!kb__redis_id_valid(id)) {
        kb_errf(NULL, 0, "kb_dead_letter_delete %s: \"%.60s\" is not a Redis stream ID "
                "(<ms>-<seq>, decimal)", tt->name, id);
        return KB_EINVAL;
    }
    const char *argv[] = {"XDEL", tt->dlq, id};
    redisReply *r = ctl_cmd(t, 3, argv, NULL);
    int rc = r == NULL || r->type != REDIS_REPLY_INTEGER ? KB_ETRANSPORT
             : r->integer == 1                          ? KB_OK
                                                        : KB_ENOTFOUND;
    if (rc == KB_ENOTFOUND)
        kb_errf(NULL, 0, "redis: no dead letter %s in %s", id, tt->dlq);
    kb__redis_reply_free(r);
    return rc;
}
