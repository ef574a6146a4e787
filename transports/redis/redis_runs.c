/* Handler runs on the server: hash kb:{T}:runs:N, field = entry ID, value =
 * the runs of that entry begun so far. Written before a run only when the
 * entry was delivered before (a sweep found it pending) or is being retried,
 * and by the crash-journal adoption at open; read by the sweep (the attempt
 * is runs + 1); deleted by the fenced ack and dead-letter scripts. An entry
 * that only sat in a read batch of a process that died has no record, so it
 * costs no attempt. */
#include <stdio.h>

#include "redis_int.h"

#define RUNS_TTL_MS KB_REDIS_RECORD_TTL_MS

/* Only ever raised: a late adoption must not lower a newer count. */
static const char RUN_LUA[] =
    "local n = tonumber(redis.call('hget',KEYS[1],ARGV[1]) or '0') "
    "if tonumber(ARGV[2]) > n then redis.call('hset',KEYS[1],ARGV[1],ARGV[2]) end "
    "redis.call('pexpire',KEYS[1],ARGV[3]) return 1";

/* Pure readers of the runs a sweep's script returned (redis_sweep.c), for
 * the delivery (redis_deliver.c), below both. The attempt of claimed entry i: its recorded handler runs + 1 (an entry
 * that only sat in a dead process's read batch has none). */
uint32_t kb__redis_sweep_attempt(const redisReply *runs, size_t i)
{
    long long n = i < runs->elements && runs->element[i]->type == REDIS_REPLY_INTEGER
                      ? runs->element[i]->integer : 0;
    return n <= 0 ? 1 : n < 1000000 ? (uint32_t)n + 1 : 1000001;   /* saturate, never reset */
}

uint32_t kb__redis_sweep_event_attempt(const redisReply *runs, size_t i, uint32_t j)
{
    const redisReply *e = i < runs->elements ? runs->element[i] : NULL;
    if (e == NULL || e->type != REDIS_REPLY_ARRAY)
        return 1;
    return kb__redis_sweep_attempt(e, j);
}

void kb__redis_runs_key(char *out, size_t len, const char *topic, uint32_t part)
{
    snprintf(out, len, "kb:{%s}:runs:%u", topic, part);
}

/* "At least `attempt` runs of entry `id` began", on the control connection. */
static int record(kb_transport *t, const char *topic, uint32_t part, const char *id,
                  uint32_t attempt)
{
    char key[KB_REDIS_KEY_MAX], n[16];
    kb__redis_runs_key(key, sizeof key, topic, part);
    snprintf(n, sizeof n, "%u", attempt);
    const char *argv[] = {"EVAL", RUN_LUA, "1", key, id, n, RUNS_TTL_MS};
    pthread_mutex_lock(&t->ctl_lock);
    redisReply *r = kb__redis_cmd(&t->ctl, 7, argv, NULL);
    pthread_mutex_unlock(&t->ctl_lock);
    int rc = r != NULL && r->type == REDIS_REPLY_INTEGER ? KB_OK : KB_ETRANSPORT;
    if (rc != KB_OK)
        kb_errf(NULL, 0, "redis: run %u of %s entry %s not recorded on %s: %s", attempt, key, id,
                t->where, r == NULL ? "no answer" : r->type == REDIS_REPLY_ERROR ? r->str
                                                                                  : "unexpected reply");
    kb__redis_reply_free(r);
    return rc;
}

void kb__redis_run_begins(kb_transport *t, const kb_delivery *d)
{
    if (record(t, d->topic, d->partition, d->id, d->attempt) != KB_OK)
        kb_log(t->bus, KB_LOG_WARNING, "%s (the crash journal still holds it)", kb_last_error());
}

static int adopt(void *opaque, const kb_run *run)
{
    return record(opaque, run->topic, run->partition, run->id, run->attempt);
}

int kb__redis_runs_start(kb_transport *t, char *errstr, size_t errlen)
{
    char broker[320];
    snprintf(broker, sizeof broker, "%s/%d", t->where, t->db);
    return kb_bus_runs_journal(t->bus, broker, adopt, t, errstr, errlen);
}
