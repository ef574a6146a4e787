/* Administration calls (keybus.h, "Administration"): the checks, the gate
 * and the sorting around the transport's optional hooks, and the name sets
 * the hooks fill their answers with (kb_names_add). The transport reads the
 * broker; nothing here keeps state. */
#include <stdlib.h>
#include <string.h>

#include "bus_int.h"

#define KB_GROUP_MAX 128   /* the `group` key's longest value */

/* A group name as the `group` key takes it: 1..128 bytes, no whitespace or
 * control byte (the transport checks its own rules after). */
static int check_group(const char *group, const char *who)
{
    size_t len = group != NULL ? strlen(group) : 0;
    if (len == 0 || len > KB_GROUP_MAX) {
        kb_errf(NULL, 0, "%s: group length %zu not in 1..%d", who, len, KB_GROUP_MAX);
        return KB_EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)group[i];
        if (ch <= ' ' || ch == 0x7f) {
            kb_errf(NULL, 0, "%s: group has a space or control byte (0x%02x) at %zu", who, ch, i);
            return KB_EINVAL;
        }
    }
    return KB_OK;
}

/* The hook is there (else KB_ENOTFOUND naming the transport and what it
 * lacks, not the call: a command makes several) and the call may enter the
 * gate (else KB_ECLOSED). */
static int enter(kb_bus *b, const void *hook, const char *who)
{
    if (hook == NULL) {
        kb_errf(NULL, 0, "%s:// keeps no consumer groups or stored topics: this needs a "
                         "broker (redis:// or nats://)", b->ops->scheme);
        return KB_ENOTFOUND;
    }
    return kb__bus_enter(b, who) ? KB_OK : KB_ECLOSED;
}

/* The transport's state of `topic`, opened when this bus has not used it
 * (no broker round trip). Caller is in the gate. */
static kb_transport_topic *topic_state(kb_bus *b, const char *topic, int *rc)
{
    struct kb_topic *t = (struct kb_topic *)kb_topic_get(b, topic, NULL, 0);
    *rc = t != NULL ? KB_OK : kb_last_error_code();
    return t != NULL ? t->tt : NULL;
}

static int by_group_name(const void *a, const void *b)
{
    return strcmp(((const kb_group_info *)a)->name, ((const kb_group_info *)b)->name);
}

static int by_topic_name(const void *a, const void *b)
{
    return strcmp(((const kb_topic_info *)a)->name, ((const kb_topic_info *)b)->name);
}

static int by_string(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

bool kb_names_has(const kb_names *s, const char *name, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->v[i]) == len && memcmp(s->v[i], name, len) == 0)
            return true;
    return false;
}

int kb_names_add(kb_names *s, const char *name, size_t len)
{
    if (kb_names_has(s, name, len))
        return KB_OK;
    char *copy = strndup(name, len);
    if (copy == NULL || kb_vec_reserve((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v) != KB_OK) {
        free(copy);
        kb_errf(NULL, 0, "out of memory for a list of names");
        return KB_ENOMEM;
    }
    s->v[s->n++] = copy;
    return KB_OK;
}

void kb_names_free(kb_names *s)
{
    for (size_t i = 0; s->v != NULL && i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    *s = (kb_names){0};
}
int kb_groups(kb_bus *b, const char *topic, kb_group_info **out, size_t *n)
{
    if (b == NULL || out == NULL || n == NULL) {
        kb_errf(NULL, 0, "kb_groups: %s is NULL", b == NULL ? "bus" : "out");
        return KB_EINVAL;
    }
    *out = NULL;
    *n = 0;
    int rc = kb_topic_name_check(topic, NULL, 0);
    if (rc != KB_OK || (rc = enter(b, b->ops->groups, "kb_groups")) != KB_OK)
        return rc;
    kb_transport_topic *tt = topic_state(b, topic, &rc);
    if (tt != NULL)
        rc = b->ops->groups(b->t, tt, out, n);
    kb__bus_leave(b);
    if (rc != KB_OK) {
        kb_groups_free(*out, *n);
        *out = NULL;
        *n = 0;
        return rc;
    }
    if (*n > 1)
        qsort(*out, *n, sizeof **out, by_group_name);
    for (size_t i = 0; i < *n; i++)
        if ((*out)[i].n_consumers > 1)
            qsort((*out)[i].consumers, (*out)[i].n_consumers, sizeof(char *), by_string);
    return KB_OK;
}

void kb_groups_free(kb_group_info *groups, size_t n)
{
    for (size_t i = 0; groups != NULL && i < n; i++) {
        free(groups[i].name);
        kb_names_free(&(kb_names){groups[i].consumers, groups[i].n_consumers, 0});
    }
    free(groups);
}

int kb_group_delete(kb_bus *b, const char *topic, const char *group, unsigned flags)
{
    if (b == NULL) {
        kb_errf(NULL, 0, "kb_group_delete: bus is NULL");
        return KB_EINVAL;
    }
    int rc = kb_topic_name_check(topic, NULL, 0);
    if (rc != KB_OK || (rc = check_group(group, "kb_group_delete")) != KB_OK)
        return rc;
    if ((flags & ~KB_GROUP_DELETE_F_FORCE) != 0) {
        kb_errf(NULL, 0, "kb_group_delete: unknown flags 0x%x", flags);
        return KB_EINVAL;
    }
    if ((rc = enter(b, b->ops->group_delete, "kb_group_delete")) != KB_OK)
        return rc;
    kb_transport_topic *tt = topic_state(b, topic, &rc);
    if (tt != NULL)
        rc = b->ops->group_delete(b->t, tt, group, flags);
    kb__bus_leave(b);
    return rc;
}

int kb_topics(kb_bus *b, kb_topic_info **out, size_t *n)
{
    if (b == NULL || out == NULL || n == NULL) {
        kb_errf(NULL, 0, "kb_topics: %s is NULL", b == NULL ? "bus" : "out");
        return KB_EINVAL;
    }
    *out = NULL;
    *n = 0;
    int rc = enter(b, b->ops->topics, "kb_topics");
    if (rc != KB_OK)
        return rc;
    rc = b->ops->topics(b->t, out, n);
    kb__bus_leave(b);
    if (rc != KB_OK) {
        kb_topics_free(*out, *n);
        *out = NULL;
        *n = 0;
        return rc;
    }
    if (*n > 1)
        qsort(*out, *n, sizeof **out, by_topic_name);
    for (size_t i = 0; i < *n; i++)
        if ((*out)[i].n_groups > 1)
            qsort((*out)[i].groups, (*out)[i].n_groups, sizeof(char *), by_string);
    return KB_OK;
}

void kb_topics_free(kb_topic_info *topics, size_t n)
{
    for (size_t i = 0; topics != NULL && i < n; i++) {
        free(topics[i].name);
        kb_names_free(&(kb_names){topics[i].groups, topics[i].n_groups, 0});
    }
    free(topics);
}

int kb_peek(kb_bus *b, const char *topic, const char *group, size_t max, kb_peek_fn fn,
            void *opaque)
{
    if (b == NULL || fn == NULL) {
        kb_errf(NULL, 0, "kb_peek: %s is NULL", b == NULL ? "bus" : "fn");
        return KB_EINVAL;
    }
    int rc = kb_topic_name_check(topic, NULL, 0);
    if (rc != KB_OK)
        return rc;
    if (group == NULL)
        group = b->core.group;
    if ((rc = check_group(group, "kb_peek")) != KB_OK)
        return rc;
    if (max == 0 || max > KB_PEEK_MAX) {
        kb_errf(NULL, 0, "kb_peek: max %zu not in 1..%d", max, KB_PEEK_MAX);
        return KB_EINVAL;
    }
    if ((rc = enter(b, b->ops->peek, "kb_peek")) != KB_OK)
        return rc;
    kb_transport_topic *tt = topic_state(b, topic, &rc);
    if (tt != NULL)
        rc = b->ops->peek(b->t, tt, group, max, fn, opaque);
    kb__bus_leave(b);
    return rc;
}
