/* Settling deliveries: the executors' ack, dead_letter, release and
 * still_owned, and the keeper's job of sending what they queued: fenced XACKs
 * in batches and one fenced XADD+XACK per dead letter, pipelined over every
 * partition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define ACKS_PER_CALL 1000   /* ids per XACK or HDEL: a bounded argv */

/* ---- executor threads ---- */

/* The bus hands back the delivery's topic (d->tt); its cookie is the lease
 * epoch it was read under, or its frame's state (kb__redis_cookie_*). */
static kb_redis_part *delivery_part(const kb_delivery *d)
{
    kb_transport_topic *tt = d->tt;
    return d->partition < tt->nparts ? &tt->parts[d->partition] : NULL;
}

void kb__redis_frame_unref(kb_transport *t, kb_redis_part *p, kb_redis_fstate *fs)
{
    if (atomic_fetch_sub(&fs->refs, 1) != 1)
        return;
    if (!atomic_load(&fs->released)) {
        (void)kb__redis_job_push(t, p, fs->id, NULL, fs->events);   /* lost: stays pending */
    } else {   /* back unacked: what was settled is skipped when it comes again */
        bool any = false;
        for (uint32_t w = 0; !any && w < (fs->events + 63) / 64; w++)
            any = atomic_load(&fs->settled[w]) != 0;
        if (any)
            kb__redis_progress_queue(t, p, fs);
    }
    free(fs);
}

static void settle(kb_transport *t, const kb_delivery *d, char *dead)
{
    kb_redis_part *p = delivery_part(d);
    if (p == NULL) {
        free(dead);
        return;
    }
    /* the push comes first: the keeper hands a lease back only once inflight
     * is 0, and then finds every job of the partition queued. A frame's event
     * queues its dead letter alone (the entry's ack comes with its last
     * event, after it). */
    kb_redis_fstate *fs = kb__redis_cookie_frame(d->cookie);
    bool queued = true;
    if (fs == NULL || dead != NULL)   /* false: out of memory, the entry comes again */
        queued = kb__redis_job_push(t, p, d->id, dead, 0);
    if (fs != NULL) {
        if (queued)
            kb__redis_progress_note(t, p, fs, d);
        else   /* its dead letter was lost: the frame stays pending and comes again */
            atomic_store(&fs->released, true);
        kb__redis_frame_unref(t, p, fs);
    }
    atomic_fetch_sub(&p->inflight, 1);
}

int kb__redis_ack(kb_transport *t, const kb_delivery *d)
{
    settle(t, d, NULL);
    return KB_OK;
}

int kb__redis_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    char *dead = kb__redis_dead_pack(d, reason);
    if (dead == NULL) {
        kb__redis_release(t, d);
        kb_errf(NULL, 0, "redis: out of memory for a dead letter");
        return KB_ENOMEM;   /* left unacked: redelivered later */
    }
    atomic_fetch_add(&t->dead_queued, 1);
    settle(t, d, dead);
    return KB_OK;
}

void kb__redis_release(kb_transport *t, const kb_delivery *d)
{
    kb_redis_part *p = delivery_part(d);
    if (p == NULL)
        return;
    kb_redis_fstate *fs = kb__redis_cookie_frame(d->cookie);
    if (fs != NULL) {   /* the frame stays pending too */
        atomic_store(&fs->released, true);
        kb__redis_frame_unref(t, p, fs);
    }
    atomic_fetch_sub(&p->inflight, 1);   /* stays pending on the broker */
}

/* Executor, just before the handler: is the lease the entry was read under
 * still ours? Local only (no round trip): the partition is not free, its local
 * deadline (TTL minus a fifth, see redis_lease.c) is ahead, and it was not lost
 * and taken again since the read (the epoch in the cookie). */
int kb__redis_still_owned(kb_transport *t, const kb_delivery *d)
{
    kb_redis_part *p = delivery_part(d);
    if (p == NULL)
        return 0;
    kb_redis_fstate *fs = kb__redis_cookie_frame(d->cookie);
    uint32_t epoch = fs != NULL ? fs->epoch : (uint32_t)((uintptr_t)d->cookie >> 1);
    if (atomic_load(&p->epoch) != epoch || !kb__redis_lease_valid(p)) {
        atomic_fetch_add_explicit(&t->unowned, 1, memory_order_relaxed);
        return 0;
    }
    return 1;
}

/* ---- the keeper's job ---- */

/* Fencing without a script. A partition's acks are sent only when a read of
 * its lease (MGET), made after a WATCH of that lease, shows our token; they
 * run in one MULTI/EXEC, which the server refuses as a whole if a watched lease
 * changed in between (expired, taken): then nothing is acked, everything is
 * tried again, and the next MGET tells. Entries' run records (redis_runs.c)
 * go with their acks when one of the pass's hashes exists (it rarely does): a
 * record is written before its handler runs, so before its ack is queued and
 * before this EXISTS. A Lua script made the same check per call, but passing
 * it 1,000 IDs cost the server more than the XACK itself (Lua strings both
 * ways: 0.75-1.35 us per ID against 0.45-0.5 for a plain XACK,
 * bench/throughput.md). */

typedef struct fence {
    kb_redis_part *p;
    bool acks;                /* has ack jobs */
    bool ours;                /* the lease showed our token */
    bool runs;                /* its run-record hash may exist: HDEL with the acks */
    bool done;                /* its frames' progress hash may exist: HDEL with the acks */
    char runs_key[KB_REDIS_KEY_MAX];
} fence;

/* Every ack of the pass is kept to be sent next time, none counted as
 * fenced (the dead letters go on). */
static void acks_again(fence *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; f[i].acks && j < f[i].p->sending.n; j++)
            f[i].p->sending.v[j].again |= f[i].p->sending.v[j].dead == NULL;
        f[i].acks = false;
    }
}

/* WATCH the lease of every partition with acks, then MGET them and ask
 * whether any of their run-record hashes EXISTS: 3 commands, not a GET and
 * an EXISTS per partition (the server pays per command). When one exists
 * (rare: see redis_runs.c) every such partition's records go with its acks.
 * Only a lease seen nil or another's fences the acks: a refused command
 * (LOADING after a restart, say) keeps them all for the next pass. False:
 * the connection failed. */
static bool fence_check(kb_transport *t, redisContext *c, fence *f, size_t n)
{
    size_t watched = 0;
    for (size_t i = 0; i < n; i++)
        watched += f[i].acks;
    if (watched == 0)
        return true;
    const char **argv = malloc((1 + 2 * watched) * sizeof *argv);
    if (argv == NULL) {   /* out of memory: every ack is sent next time */
        acks_again(f, n);
        return true;
    }
    /* frames' progress records (redis_progress.c) are asked about alike */
    static const char *const cmd[] = {"WATCH", "MGET", "EXISTS", "EXISTS"};
    for (int k = 0; k < 4; k++) {
        size_t argc = 0;
        argv[argc++] = cmd[k];
        for (size_t i = 0; i < n; i++)
            if (f[i].acks)
                argv[argc++] = k < 2 ? f[i].p->lease : k == 2 ? f[i].runs_key : f[i].p->done;
        redisAppendCommandArgv(c, (int)argc, argv, NULL);
    }
    free(argv);
    redisReply *r[4] = {NULL, NULL, NULL, NULL};
    bool alive = true;
    for (int k = 0; k < 4 && alive; k++)
        if (redisGetReply(c, (void **)&r[k]) != REDIS_OK) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            alive = false;
        }
    bool refused = alive && (r[0]->type == REDIS_REPLY_ERROR || r[1]->type != REDIS_REPLY_ARRAY ||
                             r[2]->type != REDIS_REPLY_INTEGER || r[3]->type != REDIS_REPLY_INTEGER);
    if (refused) {
        const redisReply *e = r[0]->type == REDIS_REPLY_ERROR ? r[0] : r[1]->type == REDIS_REPLY_ERROR ? r[1]
                              : r[2]->type == REDIS_REPLY_ERROR ? r[2] : r[3];
        if (!t->check_refused)   /* once per spell, not every retry */
            kb_log(t->bus, KB_LOG_WARNING, "redis: the lease check before acks was refused, retrying: %s",
                   e->type == REDIS_REPLY_ERROR ? e->str : "an unexpected reply");
        acks_again(f, n);
        redisReply *u = redisCommand(c, "UNWATCH");   /* what WATCH took, if it did */
        if (u == NULL) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            alive = false;
        }
        kb__redis_reply_free(u);
    } else if (alive) {
        const redisReply *m = r[1];
        bool runs = r[2]->integer > 0, done = r[3]->integer > 0;
        for (size_t i = 0, j = 0; i < n; i++) {
            if (!f[i].acks)
                continue;
            const redisReply *y = j < m->elements ? m->element[j] : NULL;   /* an array: not refused */
            f[i].ours = y != NULL && y->type == REDIS_REPLY_STRING && strcmp(y->str, t->token) == 0;
            f[i].runs = runs;
            f[i].done = done;
            j++;
        }
    }
    if (alive)
        t->check_refused = refused;
    for (int k = 0; k < 4; k++)
        kb__redis_reply_free(r[k]);
    return alive;
}

/* A frame's ack and progress go only after the dead letters of its events
 * ("<entry ID>.<j>") were stored: a dead letter of an event acks nothing, so
 * an ack or a bit that reached the server first would lose the event if its
 * dead letter then failed. Held jobs wait for a later pass. */
static bool is_entry_of(const kb_redis_job *j, const char *id, size_t len)
{
    return strncmp(j->id, id, len) == 0 && j->id[len] == '\0';
}

static bool hold_frames(kb_redis_jobs *js)
{
    bool any = false;
    for (size_t i = 0; i < js->n; i++) {
        const char *dot = js->v[i].dead != NULL ? strrchr(js->v[i].id, '.') : NULL;
        for (size_t k = 0; dot != NULL && k < js->n; k++) {
            kb_redis_job *j = &js->v[k];
            if (j->dead == NULL && (j->events > 0 || j->done != NULL) &&
                is_entry_of(j, js->v[i].id, (size_t)(dot - js->v[i].id)))
                any = j->held = j->again = true;
        }
    }
    return any;
}

/* The dead letter of event job `ev` was fenced: its frame's held ack and
 * progress are dropped, the entry left pending for the next owner. */
static void drop_held(kb_redis_jobs *js, const kb_redis_job *ev)
{
    const char *dot = strrchr(ev->id, '.');
    for (size_t k = 0; dot != NULL && k < js->n; k++)
        if (js->v[k].held && is_entry_of(&js->v[k], ev->id, (size_t)(dot - ev->id)))
            js->v[k].again = false;
}

/* One command sent for jobs [from, to) of a partition's `sending`. */
typedef struct sent_cmd {
    kb_redis_part *p;
    size_t from, to;
} sent_cmd;

typedef struct sent_list {
    sent_cmd *v;
    size_t n, cap;
    size_t cmds;   /* replies to read; differs from n only when out of memory */
    bool oom;
} sent_list;

static void sent_add(sent_list *l, kb_redis_part *p, size_t from, size_t to)
{
    l->cmds++;
    if (l->oom)
        return;
    if (kb_vec_reserve((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) != KB_OK) {
        l->oom = true;
        return;
    }
    l->v[l->n++] = (sent_cmd){p, from, to};
}

/* Queue one command, encoded here: hiredis's own formatting (sds appends,
 * a strlen per argument) took the keeper ~650 instructions per ack. False
 * when out of memory. */
static bool append_argv(redisContext *c, int argc, const char **argv, size_t *lens)
{
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    size_t len = kb__redis_backlog_cmd_bytes(argc, lens);
    char *cmd = malloc(len);
    if (cmd == NULL)
        return false;
    kb__redis_cmd_put(cmd, argc, argv, lens);
    int rc = redisAppendFormattedCommand(c, cmd, len);
    free(cmd);
    return rc == REDIS_OK;
}

/* Queue `cmd key [group] id...` for the ack jobs of f->p (only those of
 * frames: `frames`) in batches. A batch left out (out of memory) is marked
 * to be sent again. */
static void append_ids(redisContext *c, const fence *f, const char *cmd, const char *key,
                       const char *group, bool frames, sent_list *tx)
{
    const char *argv[3 + ACKS_PER_CALL];
    size_t lens[3 + ACKS_PER_CALL];
    const kb_redis_jobs *js = &f->p->sending;
    size_t head = group != NULL ? 3 : 2, argc = 0, from = 0;
    for (size_t i = 0; i <= js->n; i++) {
        bool end = i == js->n;
        if (argc > head && (end || argc == head + ACKS_PER_CALL)) {
            if (append_argv(c, (int)argc, argv, lens))
                sent_add(tx, f->p, from, i);
            else
                for (size_t j = from; j < i; j++)
                    js->v[j].again |= js->v[j].dead == NULL;
            argc = 0;
        }
        if (end)
            break;
        if (js->v[i].dead != NULL || js->v[i].done != NULL || js->v[i].held ||
            (frames && js->v[i].events == 0))
            continue;
        if (argc == 0) {
            from = i;
            argv[argc++] = cmd;
            argv[argc++] = key;
            if (group != NULL)
                argv[argc++] = group;
        }
        argv[argc++] = js->v[i].id;
    }
}

/* Merge into the record the progress of f->p's frames that have a job for
 * it (the hash's expiry renewed with it): OR, not HSET, since a frame's
 * dead letters set their bits on the server themselves (redis_dlq.c). Rare:
 * most frames settle sooner and get no record. */
static void append_progress(redisContext *c, const fence *f, sent_list *tx)
{
    static const char MERGE_LUA[] = KB_REDIS_PROGRESS_OR_LUA "progress_or(KEYS[1],ARGV[1],ARGV[2])";
    const kb_redis_jobs *js = &f->p->sending;
    for (size_t i = 0; i < js->n; i++) {
        const kb_redis_job *j = &js->v[i];
        if (j->done == NULL || j->held)
            continue;
        const char *argv[] = {"EVAL", MERGE_LUA, "1", f->p->done, j->id, j->done};
        size_t lens[] = {4, sizeof MERGE_LUA - 1, 1, strlen(f->p->done), strlen(j->id),
                         (j->events + 7) / 8};
        if (redisAppendCommandArgv(c, 6, argv, lens) == REDIS_OK)
            sent_add(tx, f->p, i, i + 1);
        else
            f->p->sending.v[i].again = true;
    }
}

/* HDEL the run records of the events of f->p's frame acks ("<ID>.<index>"),
 * one command per frame. */
static void append_event_runs(redisContext *c, const fence *f, sent_list *tx)
{
    const kb_redis_jobs *js = &f->p->sending;
    for (size_t i = 0; i < js->n; i++) {
        const kb_redis_job *j = &js->v[i];
        if (j->dead != NULL || j->done != NULL || j->held || j->events == 0)
            continue;
        size_t argc = 2 + j->events, len = strlen(j->id);
        const char **argv = malloc(argc * sizeof *argv);
        size_t *lens = malloc(argc * sizeof *lens);
        char *ids = malloc((size_t)j->events * KB_REDIS_EVENT_ID_MAX);
        bool ok = argv != NULL && lens != NULL && ids != NULL;
        if (ok) {
            argv[0] = "HDEL";
            argv[1] = f->runs_key;
            for (uint32_t e = 0; e < j->events; e++) {
                char *id = ids + (size_t)e * KB_REDIS_EVENT_ID_MAX;
                snprintf(id, KB_REDIS_EVENT_ID_MAX, "%.*s.%u", (int)len, j->id, e);
                argv[2 + e] = id;
            }
            ok = append_argv(c, (int)argc, argv, lens);
        }
        if (ok)
            sent_add(tx, f->p, i, i + 1);
        else
            f->p->sending.v[i].again = true;   /* out of memory: the ack goes again */
        free(argv);
        free(lens);
        free(ids);
    }
}

/* Mark the acks, or the dead letters, among jobs [from, to) of a sent
 * command to be sent again (a batch of acks may span dead letters sent on
 * their own). */
static void again_range(const sent_cmd *sc, bool dead)
{
    for (size_t j = sc->from; j < sc->to; j++)
        if ((sc->p->sending.v[j].dead != NULL) == dead)
            sc->p->sending.v[j].again = true;
}

/* Forget what the server settled; keep what it refused for now. */
static bool jobs_done(kb_transport *t, kb_redis_part *p)
{
    size_t kept = 0;
    for (size_t i = 0; i < p->sending.n; i++) {
        kb_redis_job *j = &p->sending.v[i];
        if (j->again) {
            j->again = j->held = false;
            p->sending.v[kept++] = *j;
        } else if (j->dead != NULL) {
            free(j->dead);
            atomic_fetch_sub(&t->dead_queued, 1);
        } else {
            free(j->done);
        }
    }
    p->sending.n = kept;
    return kept > 0;
}

static void note_fenced(kb_transport *t)
{
    if (atomic_fetch_add(&t->fenced, 1) == 0)
        kb_log(t->bus, KB_LOG_WARNING, "redis: acks refused for a partition whose lease this process "
               "lost; the new owner redelivers those entries");
}

/* The transaction's replies: MULTI, one +QUEUED per command, EXEC. False
 * when the connection failed; `again` when something must be sent again and
 * the sent list cannot say what (out of memory). */
static bool read_tx(kb_transport *t, redisContext *c, const sent_list *tx, bool *again)
{
    bool refused = false;
    redisReply *r = NULL;
    for (size_t k = 0; k < tx->cmds + 2; k++) {
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            return false;
        }
        if (k == tx->cmds + 1) {   /* EXEC */
            if (r->type == REDIS_REPLY_ARRAY) {
                for (size_t i = 0; i < r->elements && i < tx->n; i++)
                    if (r->element[i]->type == REDIS_REPLY_ERROR) {
                        again_range(&tx->v[i], false);
                        if (!refused)
                            kb_log(t->bus, KB_LOG_WARNING, "redis: acks refused, retrying: %s",
                                   r->element[i]->str);
                        refused = true;
                    }
            } else {
                /* nil: a watched lease changed (the next MGET tells); an error
                 * (EXECABORT after LOADING, say): try it all again */
                for (size_t i = 0; i < tx->n; i++)
                    again_range(&tx->v[i], false);
                refused = true;
            }
        }
        kb__redis_reply_free(r);
    }
    *again |= refused && tx->oom;
    return true;
}

/* One pass; true when it held frames' acks back and was read to the end. */
static bool send_pass(kb_transport *t)
{
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    t->jobs_unsent = true;   /* until every reply is read */
    if (c == NULL)
        return false;
    bool held = false, read = false;
    fence *f = NULL;
    size_t n = 0, cap = 0;
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            kb_redis_part *p = &tt->parts[i];
            if (!kb__redis_jobs_take(t, p) || p->sending.n == 0)
                continue;
            if (kb_vec_reserve((void **)&f, &cap, n + 1, sizeof *f) != KB_OK)
                goto out;   /* jobs_unsent: taken again next time */
            fence *e = &f[n++];
            *e = (fence){.p = p};
            held |= hold_frames(&p->sending);
            for (size_t j = 0; j < p->sending.n && !e->acks; j++)
                e->acks = p->sending.v[j].dead == NULL && !p->sending.v[j].held;
            kb__redis_runs_key(e->runs_key, sizeof e->runs_key, tt->name, p->index);
        }
    if (!fence_check(t, c, f, n))
        goto out;
    sent_list tx = {NULL, 0, 0, 0, false}, dead = {NULL, 0, 0, 0, false};
    bool watching = false, any = false;
    for (size_t i = 0; i < n; i++) {
        watching |= f[i].acks;
        any |= f[i].acks && f[i].ours;
    }
    if (any) {
        redisAppendCommand(c, "MULTI");
        for (size_t i = 0; i < n; i++)
            if (f[i].acks && f[i].ours) {
                append_progress(c, &f[i], &tx);
                append_ids(c, &f[i], "XACK", f[i].p->stream, t->group, false, &tx);
                if (f[i].runs) {
                    append_ids(c, &f[i], "HDEL", f[i].runs_key, NULL, false, &tx);
                    append_event_runs(c, &f[i], &tx);
                }
                if (f[i].done)
                    append_ids(c, &f[i], "HDEL", f[i].p->done, NULL, true, &tx);
            }
        redisAppendCommand(c, "EXEC");
    } else if (watching) {
        redisAppendCommand(c, "UNWATCH");
    }
    for (size_t i = 0; i < n; i++) {
        if (f[i].acks && !f[i].ours)
            note_fenced(t);   /* dropped below: the new owner has them */
        kb_redis_part *p = f[i].p;
        for (size_t j = 0; j < p->sending.n; j++) {
            kb_redis_job *jb = &p->sending.v[j];
            if (jb->dead == NULL)
                continue;
            if (kb__redis_dead_append(c, t, p, jb))
                sent_add(&dead, p, j, j + 1);
            else
                jb->again = true;
        }
    }
    bool again = false;
    if (any && !read_tx(t, c, &tx, &again))
        goto out_lists;
    for (size_t got = 0; got < (watching && !any ? 1 : 0) + dead.cmds; got++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            /* everything stays in `sending`: resent after the reconnect (XACK is idempotent) */
            kb__redis_conn_fail(&t->kc, c->errstr);
            goto out_lists;
        }
        size_t d = got - (watching && !any ? 1 : 0);
        if (watching && !any && got == 0) {
            /* UNWATCH */
        } else if (r->type == REDIS_REPLY_INTEGER && r->integer < 0) {
            note_fenced(t);
            if (d < dead.n)
                drop_held(&dead.v[d].p->sending, &dead.v[d].p->sending.v[dead.v[d].from]);
            else
                again = true;   /* unmapped (out of memory): all is resent below */
        } else if (r->type == REDIS_REPLY_ERROR) {
            /* LOADING after a restart and the like: try again, or the entries
             * would sit handled but pending on the server */
            if (d < dead.n)
                again_range(&dead.v[d], true);
            else
                again = true;   /* unmapped (out of memory): all is resent below */
            kb_log(t->bus, KB_LOG_WARNING, "redis: a dead letter was refused, retrying: %s", r->str);
        }
        kb__redis_reply_free(r);
    }
    if ((tx.oom || dead.oom) && again) {
        t->jobs_unsent = true;   /* cannot tell which failed: resend all (XACK is idempotent) */
        goto out_lists;
    }
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++)
            again |= jobs_done(t, &tt->parts[i]);
    t->jobs_unsent = again;
    read = true;
    if (tx.cmds + dead.cmds > 0 || n > 0)
        kb__redis_settled(t);   /* kb_drain and kb_dead_letters look again */
out_lists:
    free(tx.v);
    free(dead.v);
out:
    free(f);
    return held && read;
}

void kb__redis_settle_send(kb_transport *t)
{
    if (send_pass(t))   /* the held acks follow their dead letters at once */
        send_pass(t);
}
