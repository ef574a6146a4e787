/* Filling frames on the publish path (all under pub_lock): an event goes
 * into its partition's open frame, which becomes one XADD in the backlog when
 * it holds redis.publish_batch events, when the next event would take its
 * body past the size budget, at once when the partition was quiet for
 * redis.publish_linger_us (sparse traffic pays no delay), or when the sender
 * looks: once it is a linger old, or as soon as nothing written waits for
 * the server's reply (the frames fill while the server works, so a frame
 * holds what came during a round trip, and an idle sender adds no delay). The server's work per entry (parse, the
 * stream's radix tree, the reply, the read, the ack) is divided among the
 * frame's events. A frame of one event goes out as a plain entry (k, d, a,
 * h.*), which any client reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

int kb__redis_xadd_args(const kb_transport *t, const kb_redis_part *p, const kb_msg *m,
                        kb_redis_args *a)
{
    int n = 0;
#define ARG(s, l) (a->argv[n] = (s), a->lens[n] = (l), n++)
    ARG("XADD", 4);
    ARG(p->stream, strlen(p->stream));
    if (t->maxlen > 0) {   /* approximate trimming: whole macro nodes, cheap */
        snprintf(a->maxlen, sizeof a->maxlen, "%lld", (long long)t->maxlen);
        ARG("MAXLEN", 6);
        ARG("~", 1);
        ARG(a->maxlen, strlen(a->maxlen));
    }
    ARG("*", 1);
    if (m == NULL)   /* a frame's fields follow */
        return n;
    ARG("k", 1);
    ARG(m->key, m->key_len);
    ARG("d", 1);
    ARG(m->payload_len ? m->payload : "", m->payload_len);
    ARG("a", 1);
    ARG("1", 1);
#undef ARG
    return n + (int)kb__redis_headers_args(m->headers, m->n_headers, a->names, a->argv + n,
                                           a->lens + n);
}

/* Bytes of body a frame may hold: a consumer copies a field up to
 * limits.max_payload_bytes, and the server takes an argument up to its
 * proto-max-bulk-len (or, where it is hidden, up to the size of the
 * frames it took after dropping the connection over a larger one). */
static size_t budget(const kb_transport *t)
{
    size_t max = t->lim.payload;
    if (t->frame_max > 0 && t->frame_max < max)
        max = t->frame_max;
    return t->bulk_max > 0 && (size_t)t->bulk_max < max ? (size_t)t->bulk_max : max;
}

/* `count` events of p laid out at buf[0, len) into bl as one XADD: a plain
 * entry for one, else a frame; false when out of memory. */
static bool put_entry(const kb_transport *t, kb_redis_backlog *bl, kb_redis_part *p,
                      const char *buf, size_t len, uint32_t count)
{
    kb_redis_args a;
    char countstr[16];   /* argv points here until the backlog copied it */
    int n = 0;
    size_t big;
    if (count == 1) {
        kb_redis_frame fr = {buf, buf + len, 1};
        kb_frame_event ev;
        kb_header h[KB_MAX_HEADERS];
        char names[KB_MAX_HEADERS * (KB_MAX_HEADER_NAME + 1)];
        kb__redis_frame_next(&fr, &ev);
        int nh = kb_frame_event_headers(&ev, h, KB_MAX_HEADERS, names);
        kb_msg m = {ev.key, ev.key_len, ev.payload, ev.payload_len, 0, h, nh > 0 ? (size_t)nh : 0};
        n = kb__redis_xadd_args(t, p, &m, &a);
        big = ev.key_len > ev.payload_len ? ev.key_len : ev.payload_len;
    } else {
        snprintf(countstr, sizeof countstr, "%u", count);
        n = kb__redis_xadd_args(t, p, NULL, &a);
        const char *more[] = {"f", "1", "n", countstr, "b", buf};
        const size_t lens[] = {1, 1, 1, strlen(countstr), 1, len};
        for (int i = 0; i < 6; i++)
            a.argv[n] = more[i], a.lens[n++] = lens[i];
        big = len;
    }
    if (!kb__redis_backlog_add(bl, p, big, n, a.argv, a.lens))
        return false;
    bl->rec[(bl->first + bl->n - 1) % bl->rcap].events = count;
    return true;
}

/* The open frame of p into the backlog as one XADD; false when out of memory
 * (it stays open, tried again later). */
static bool emit(kb_transport *t, kb_redis_part *p, int64_t now)
{
    kb_redis_pframe *f = &p->frame;
    if (!put_entry(t, &t->backlog, p, f->buf, f->len, f->count))
        return false;
    t->frames_bytes -= f->len;
    t->frames_open--;
    f->len = 0;
    f->count = 0;
    f->last_send_ns = now;
    return true;
}

int kb__redis_batch_add(kb_transport *t, kb_redis_part *p, const kb_msg *m, bool *opened)
{
    kb_redis_pframe *f = &p->frame;
    size_t need = kb_frame_event_size(m, true);
    *opened = false;
    /* the clock only when a frame opens or goes: an open frame is never
     * quiet (it would be due) */
    if (f->count > 0 && f->len + need > budget(t) && !emit(t, p, kb_now_ns()))
        return KB_ENOMEM;
    if (kb_vec_reserve((void **)&f->buf, &f->cap, f->len + need, 1) != KB_OK)
        return KB_ENOMEM;
    kb_frame_event_put(f->buf + f->len, m, true);
    f->len += need;
    t->frames_bytes += need;
    int64_t now = f->count == 0 || f->count + 1 >= (uint32_t)t->publish_batch ? kb_now_ns() : 0;
    if (f->count++ == 0) {
        f->first_ns = now;
        t->frames_open++;
        *opened = true;
        if (now + t->linger_ns < t->frames_due_ns)
            t->frames_due_ns = now + t->linger_ns;
    }
    if (f->count >= (uint32_t)t->publish_batch ||
        (f->count == 1 && now - f->last_send_ns >= t->linger_ns)) {
        emit(t, p, now);   /* out of memory: stays open for the sender */
        *opened = false;
    }
    return KB_OK;
}

int64_t kb__redis_frames_due(kb_transport *t, bool all)
{
    int64_t next = INT64_MAX;
    if (t->frames_open == 0)
        return next;
    int64_t now = kb_now_ns();
    if (!all && now < t->frames_due_ns)
        return t->frames_due_ns;   /* none due yet: no walk over every partition */
    for (kb_transport_topic *tt = atomic_load(&t->opened); tt != NULL && t->frames_open > 0;
         tt = tt->opened_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            kb_redis_pframe *f = &tt->parts[i].frame;
            if (f->count == 0)
                continue;
            int64_t due = f->first_ns + t->linger_ns;
            if ((all || due <= now) && emit(t, &tt->parts[i], now))
                continue;
            if (due < next)
                next = due;
        }
    t->frames_due_ns = next;
    return next;
}

/* The body of a frame's XADD (RESP at buf[0, len)): its last argument. */
static bool xadd_body(const char *buf, size_t len, const char **body, size_t *body_len)
{
    const char *end = buf + len, *p = memchr(buf, '\n', len);
    *body = NULL;
    while (p != NULL && ++p < end && *p == '$') {
        size_t n = strtoul(p + 1, NULL, 10);
        const char *data = memchr(p, '\n', (size_t)(end - p));
        if (data == NULL || ++data + n > end)
            return false;
        *body = data;
        *body_len = n;
        p = data + n + 1;   /* the '\n' after the argument */
    }
    return *body != NULL;
}

struct split {
    kb_transport *t;
    kb_redis_backlog *to;
    size_t max;
    bool ok;
};

/* r into s->to: as it is, or, a frame over s->max, as entries of its events
 * in order, each as large as fits. */
static void split_one(void *arg, const kb_redis_pubrec *r, const char *bytes)
{
    struct split *s = arg;
    const char *body;
    size_t len;
    if (!s->ok)
        return;
    if (r->p == NULL || r->events < 2 || r->big <= s->max || !xadd_body(bytes, r->len, &body, &len)) {
        s->ok = kb__redis_backlog_copy(s->to, r, bytes);
        return;
    }
    kb_redis_frame f = {body, body + len, r->events};
    kb_frame_event ev;
    const char *start = body;   /* the events gathered for the next entry */
    uint32_t count = 0;
    for (const char *at = body; s->ok && kb__redis_frame_next(&f, &ev); at = f.p, count++)
        if (count > 0 && (size_t)(f.p - start) > s->max) {
            s->ok = put_entry(s->t, s->to, r->p, start, (size_t)(at - start), count);
            start = at;
            count = 0;
        }
    if (s->ok && count > 0)
        s->ok = put_entry(s->t, s->to, r->p, start, (size_t)(f.p - start), count);
}

bool kb__redis_frames_split(kb_transport *t, size_t max)
{
    kb_redis_backlog *bl = &t->backlog;
    bool over = false;
    for (size_t i = 0; i < bl->n && !over; i++) {
        const kb_redis_pubrec *r = &bl->rec[(bl->first + i) % bl->rcap];
        over = r->p != NULL && r->events > 1 && r->big > max;
    }
    if (!over)
        return false;
    kb_redis_backlog to;
    kb__redis_backlog_init(&to, t->buffer_bytes);
    struct split s = {t, &to, max, true};
    kb__redis_backlog_each(bl, split_one, &s);
    if (!s.ok) {
        kb__redis_backlog_free(&to);
        return false;
    }
    kb__redis_backlog_free(bl);
    *bl = to;
    return true;
}

void kb__redis_frames_each(kb_transport *t, void (*fn)(void *arg, kb_redis_part *p,
                                                         const kb_frame_event *ev), void *arg)
{
    for (kb_transport_topic *tt = atomic_load(&t->opened); tt != NULL; tt = tt->opened_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            kb_redis_pframe *f = &tt->parts[i].frame;
            kb_redis_frame fr = {f->buf, f->buf + f->len, f->count};
            kb_frame_event ev;
            while (kb__redis_frame_next(&fr, &ev))
                fn(arg, &tt->parts[i], &ev);
        }
}
