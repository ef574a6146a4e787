/* Each partition's queue of acks and dead letters: executors and the reader
 * push, the keeper takes them in one go and sends them (redis_settle.c). */
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

static bool push(kb_transport *t, kb_redis_part *p, const char *id, char *dead,
                 uint32_t events, char *done)
{
    pthread_mutex_lock(&p->lock);
    if (kb_vec_reserve((void **)&p->jobs.v, &p->jobs.cap, p->jobs.n + 1, sizeof *p->jobs.v) !=
        KB_OK) {
        pthread_mutex_unlock(&p->lock);
        if (dead != NULL)   /* counted by the caller: kb_drain must not wait for it */
            atomic_fetch_sub(&t->dead_queued, 1);
        free(dead);   /* unacked: redelivered after a failover or restart */
        free(done);
        return false;
    }
    kb_redis_job *j = &p->jobs.v[p->jobs.n++];
    size_t n = strnlen(id, sizeof j->id - 1);   /* not snprintf: ~600 instructions an ack */
    memcpy(j->id, id, n);
    j->id[n] = '\0';
    j->dead = dead;
    j->events = events;
    j->done = done;
    j->again = false;
    j->held = false;
    pthread_mutex_unlock(&p->lock);
    if (atomic_fetch_add(&t->jobs_queued, 1) == 0)
        kb_signal_notify(t->keeper_wake);
    return true;
}

bool kb__redis_job_push(kb_transport *t, kb_redis_part *p, const char *id, char *dead,
                        uint32_t events)
{
    return push(t, p, id, dead, events, NULL);
}

void kb__redis_job_progress(kb_transport *t, kb_redis_part *p, const char *id, uint32_t events,
                            char *done)
{
    (void)push(t, p, id, NULL, events, done);   /* lost: more comes again, never less */
}

bool kb__redis_jobs_take(kb_transport *t, kb_redis_part *p)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->jobs.n;
    if (kb_vec_reserve((void **)&p->sending.v, &p->sending.cap, p->sending.n + n,
                       sizeof *p->sending.v) != KB_OK) {
        pthread_mutex_unlock(&p->lock);
        return false;   /* try again on the next loop */
    }
    if (n > 0)
        memcpy(p->sending.v + p->sending.n, p->jobs.v, n * sizeof *p->jobs.v);
    p->sending.n += n;
    p->jobs.n = 0;
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_sub(&t->jobs_queued, n);
    return true;
}

void kb__redis_jobs_free(kb_redis_jobs *j)
{
    for (size_t i = 0; i < j->n; i++) {
        free(j->v[i].dead);
        free(j->v[i].done);
    }
    free(j->v);
}

void kb__redis_settled(kb_transport *t)
{
    atomic_fetch_add(&t->settle_rounds, 1);
    kb_signal_notify(t->settled);
}
