/* Delivery reports of publishes. What a report needs (topic, partition, key,
 * ID or reason) is copied while pub_lock is held, since the backlog's bytes
 * are only valid then, and handed to the application once it is released:
 * its callback may publish, which takes pub_lock. A batch keeps its memory
 * and starts with room for one report of the longest key, so a batch that
 * cannot grow is sent and then takes the report: no accepted event goes
 * unreported for lack of memory. */
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define WHY_MAX 512   /* bytes of a reason kept, with the NUL (a server's error can be long) */

/* The keys of the XADD at buf[0, len) (RESP): the argument after "*" and
 * "k" of a plain entry, or every event's of a frame's body ("b"). With
 * `emit` NULL only counted (and their bytes summed into *bytes). */
static size_t xadd_keys(const char *buf, size_t len, size_t *bytes,
                        void (*emit)(void *arg, const char *key, size_t key_len), void *arg)
{
    const char *p = memchr(buf, '\n', len), *end = buf + len;
    const char *body = NULL;
    size_t body_len = 0;
    bool star = false;
    int field = 0;   /* the previous argument after "*" was a name: 'k', 'b' or 1 */
    *bytes = 0;
    while (p != NULL && ++p < end && *p == '$') {
        size_t n = strtoul(p + 1, NULL, 10);
        const char *data = memchr(p, '\n', (size_t)(end - p));
        if (data == NULL || ++data + n > end)
            return 0;
        if (field == 'k') {
            *bytes = n;
            if (emit != NULL)
                emit(arg, data, n);
            return 1;
        }
        if (field == 'b')
            body = data, body_len = n;
        if (star)
            field = field == 0 && n == 1 ? *data : field == 0 ? 1 : 0;
        star = star || (n == 1 && *data == '*');
        p = data + n + 1;   /* the '\n' after the argument */
    }
    kb_redis_frame f = {body, body + body_len, UINT32_MAX};
    kb_frame_event ev;
    size_t count = 0;
    while (body != NULL && kb__redis_frame_next(&f, &ev)) {
        *bytes += ev.key_len;
        count++;
        if (emit != NULL)
            emit(arg, ev.key, ev.key_len);
    }
    return count;
}

static bool room(kb_redis_reports *rs, size_t bytes, size_t slots)
{
    if (rs->n + slots > rs->cap &&
        kb_vec_reserve((void **)&rs->v, &rs->cap, rs->n + slots > rs->cap * 2 ? rs->n + slots
                                                                              : rs->cap * 2,
                       sizeof *rs->v) != KB_OK)
        return false;
    if (rs->len + bytes <= rs->bcap)
        return true;
    void *b = rs->bytes;
    if (kb_vec_reserve(&b, &rs->bcap, rs->len + bytes > rs->bcap * 2 ? rs->len + bytes : rs->bcap * 2,
                       1) != KB_OK)
        return false;
    rs->bytes = b;
    return true;
}

bool kb__redis_reports_init(kb_redis_reports *rs, size_t key_max, size_t events)
{
    /* as kb__redis_reports_fits asks, and as a whole frame's XADD asks:
     * its keys are within its body (key_max: the larger) */
    return room(rs, key_max + events * (KB_REDIS_ID_MAX + WHY_MAX + 2), events);
}

static size_t put(kb_redis_reports *rs, const void *s, size_t n)
{
    size_t at = rs->len;
    memcpy(rs->bytes + at, s, n);
    rs->len += n;
    return at;
}

struct keeping {
    kb_redis_reports *rs;
    kb_redis_part *p;
    int result;
    const char *id, *why;
    size_t id_len, why_len;
};

static void keep_one(void *arg, const char *key, size_t key_len)
{
    struct keeping *k = arg;
    kb_redis_reports *rs = k->rs;
    kb_redis_report *r = &rs->v[rs->n++];
    r->p = k->p;
    r->result = k->result;
    r->key_len = key_len;
    r->key = put(rs, key, key_len);
    r->id = put(rs, k->id, k->id_len);
    put(rs, "", 1);
    r->why = put(rs, k->why, k->why_len);
    put(rs, "", 1);
}

bool kb__redis_report_keep(kb_redis_reports *rs, kb_redis_part *p, const char *xadd, size_t len,
                           int result, const char *id, const char *why)
{
    struct keeping k = {rs, p, result, id, why, strnlen(id, KB_REDIS_ID_MAX - 1),
                        strnlen(why, WHY_MAX - 1)};
    size_t key_bytes;
    size_t n = xadd_keys(xadd, len, &key_bytes, NULL, NULL);
    if (n == 0)   /* not an XADD of ours: never, the backlog's own encoding */
        n = 1, key_bytes = 0;
    if (!room(rs, key_bytes + n * (k.id_len + k.why_len + 2), n))
        return false;
    if (xadd_keys(xadd, len, &key_bytes, keep_one, &k) == 0)
        keep_one(&k, "", 0);
    return true;
}

/* Send rs, each as it was kept, or failed with `code` and `why` when code
 * is not KB_OK. */
static void send_as(kb_transport *t, kb_redis_reports *rs, int code, const char *why)
{
    for (size_t i = 0; i < rs->n; i++) {
        const kb_redis_report *r = &rs->v[i];
        kb_delivery_report d = {.topic = r->p->tt->name, .key = rs->bytes + r->key,
                                .key_len = r->key_len, .partition = r->p->index,
                                .result = code != KB_OK ? code : r->result,
                                .id = code != KB_OK ? "" : rs->bytes + r->id,
                                .error = code != KB_OK ? why : rs->bytes + r->why};
        kb_bus_delivery_report(t->bus, &d);
    }
    rs->n = rs->len = 0;
}

void kb__redis_reports_send(kb_transport *t, kb_redis_reports *rs)
{
    send_as(t, rs, KB_OK, NULL);
}

void kb__redis_reports_fail(kb_transport *t, kb_redis_reports *rs, int code, const char *why)
{
    send_as(t, rs, code, why);
}

struct now {
    kb_transport *t;
    kb_redis_part *p;
    int code;
    const char *why;
};

static void now_one(void *arg, const char *key, size_t key_len)
{
    struct now *n = arg;
    kb_delivery_report d = {.topic = n->p->tt->name, .key = key, .key_len = key_len,
                            .partition = n->p->index, .result = n->code, .id = "",
                            .error = n->why};
    kb_bus_delivery_report(n->t->bus, &d);
}

void kb__redis_report_now(kb_transport *t, kb_redis_part *p, const char *xadd, size_t len,
                          int code, const char *why)
{
    struct now n = {t, p, code, why};
    size_t bytes;
    if (xadd_keys(xadd, len, &bytes, now_one, &n) == 0)
        now_one(&n, "", 0);
}

void kb__redis_report_key(kb_transport *t, kb_redis_part *p, const char *key, size_t key_len,
                          int code, const char *why)
{
    struct now n = {t, p, code, why};
    now_one(&n, key, key_len);
}

void kb__redis_reports_move(kb_redis_reports *to, kb_redis_reports *from, size_t i, int result,
                            const char *why)
{
    const kb_redis_report *r = &from->v[i];
    kb_redis_report *o = &to->v[to->n++];
    *o = *r;
    o->result = result;
    o->key = put(to, from->bytes + r->key, r->key_len);
    if (result == KB_OK) {
        o->id = put(to, from->bytes + r->id, strlen(from->bytes + r->id) + 1);
        o->why = put(to, "", 1);
    } else {
        size_t why_len = strnlen(why, WHY_MAX - 1);
        o->id = put(to, "", 1);
        o->why = put(to, why, why_len);
        put(to, "", 1);
    }
}

bool kb__redis_reports_fits(kb_redis_reports *rs, const kb_redis_reports *from, size_t i)
{
    return room(rs, from->v[i].key_len + KB_REDIS_ID_MAX + WHY_MAX + 2, 1);
}

void kb__redis_reports_free(kb_redis_reports *rs)
{
    free(rs->v);
    free(rs->bytes);
    memset(rs, 0, sizeof *rs);
}
