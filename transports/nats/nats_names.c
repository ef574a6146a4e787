/* Broker names, nats.c status texts, thread starts and the lease thread's wake-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_names.h"

const char *kb__nats_reason(natsStatus s)
{
    const char *text = nats_GetLastError(NULL);
    if (text == NULL || text[0] == '\0')
        return natsStatus_GetText(s);
    const char *after = text[0] == '(' ? strstr(text, "): ") : NULL;   /* "(conn.c:1905): " */
    return after != NULL ? after + 3 : text;
}

int kb__nats_errf(const char *what, natsStatus s, jsErrCode jerr)
{
    const char *text = nats_GetLastError(NULL);
    kb_errf(NULL, 0, "nats: %s: %s%s%s (jetstream error %d)", what, natsStatus_GetText(s),
            text ? ": " : "", text ? text : "", (int)jerr);
    return s == NATS_NO_MEMORY ? KB_ENOMEM : s == NATS_TIMEOUT ? KB_ETIMEDOUT : KB_ETRANSPORT;
}

/* Dots become '_', and a hash of the original name keeps "a.b" and "a_b" apart. */
void kb__nats_stream_name(char *buf, size_t len, const char *topic)
{
    int n = snprintf(buf, len, "KB_%s", topic);
    for (int i = 3; i < n && (size_t)i < len; i++)
        if (buf[i] == '.')
            buf[i] = '_';
    size_t o = strlen(buf);
    snprintf(buf + o, len - o, "_%08x", kb_fnv1a32(topic, strlen(topic)));
}

long kb__nats_part_token(const kb_transport *t, const char *s)
{
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 9 || s[n] != '\0' || (s[0] == '0' && n > 1))
        return -1;   /* not as keybus writes it: no sign, blank or leading zero */
    unsigned long v = strtoul(s, NULL, 10);
    return v < t->partitions ? (long)v : -1;
}

long kb__nats_subject_part(const kb_transport *t, const char *topic, const char *subj)
{
    size_t tl = strlen(topic);
    if (strncmp(subj, "kb.", 3) != 0 || strncmp(subj + 3, topic, tl) != 0 || subj[3 + tl] != '.')
        return -1;
    return kb__nats_part_token(t, subj + 4 + tl);
}

/* s is one or more decimal digits and nothing else. */
static bool all_digits(const char *s)
{
    size_t n = strspn(s, "0123456789");
    return n > 0 && s[n] == '\0';
}

long kb__nats_consumer_part(const kb_transport *t, const char *name)
{
    size_t gl = strlen(t->group);
    if (strncmp(name, t->group, gl) != 0 || name[gl] != '_')
        return -1;
    const char *n = name + gl + 1, *rev = n + strspn(n, "0123456789");
    if (rev == n || *rev != '_' || !all_digits(rev + 1))
        return -1;   /* not <group>_<n>_<rev>: another group's, or a wide one */
    unsigned long part = strtoul(n, NULL, 10);
    return part < t->partitions ? (long)part : -1;
}

bool kb__nats_consumer_wide(const kb_transport *t, const char *name)
{
    size_t gl = strlen(t->group);
    return strncmp(name, t->group, gl) == 0 && strncmp(name + gl, "_w_", 3) == 0 &&
           all_digits(name + gl + 3);
}

/* A consumer that has acked nothing yet reports AckFloor.Stream 0 even though
 * it started at OptStartSeq (nats-server 2.9), so its floor is OptStartSeq - 1.
 * Trusting the reported 0 replayed whole partitions: with a stable
 * consumer name a restarted process takes its leases back at once, so an
 * incarnation killed before its first ack left only such a consumer behind
 * (the older ones were deleted), and the next one started the partition again
 * at sequence 1. */
uint64_t kb__nats_floor_of(const jsConsumerInfo *ci)
{
    uint64_t start = ci->Config != NULL && ci->Config->DeliverPolicy == js_DeliverByStartSequence &&
                             ci->Config->OptStartSeq > 0
                         ? ci->Config->OptStartSeq - 1
                         : 0;
    return ci->AckFloor.Stream > start ? ci->AckFloor.Stream : start;
}

uint64_t kb__nats_pending_below_floor(const jsConsumerInfo *ci)
{
    uint64_t floor = ci->AckFloor.Stream, last = ci->Delivered.Stream;
    uint64_t above = last > floor ? last - floor : 0;
    return ci->NumAckPending > 0 && (uint64_t)ci->NumAckPending > above
               ? (uint64_t)ci->NumAckPending - above
               : 0;
}

natsConnection *kb__nats_feed_conn(kb_transport *t)
{
    natsConnection *f = atomic_load(&t->feed_nc);
    return f != NULL ? f : t->nc;
}

int kb__nats_never(void *arg)
{
    (void)arg;
    return 0;
}

int kb__nats_thread_start(kb_thread **th, const char *name, void *(*fn)(void *), void *arg,
                          char *errstr, size_t errlen)
{
    int rc = kb_thread_start(th, name, fn, arg);
    if (rc != KB_OK) {
        char why[160];
        snprintf(why, sizeof why, "%s", kb_last_error());
        kb_errf(errstr, errlen, "nats: cannot start thread %s: %s", name, why);
    }
    return rc;
}

void kb__nats_lease_kick(kb_transport *t)
{
    atomic_store(&t->lease_kick, 1);
    kb_signal_notify(t->lease_wake);
}

void kb__nats_member_prefix(const kb_transport *t, const kb_nats_topic *tp, char *buf, size_t len)
{
    snprintf(buf, len, "m.%s.%s.", tp->stream, t->group);
}

/* KV keys allow [-/_=.a-zA-Z0-9]: anything else in the consumer name becomes '_'. */
void kb__nats_member_key(const kb_transport *t, const kb_nats_topic *tp, char *buf, size_t len)
{
    kb__nats_member_prefix(t, tp, buf, len);
    size_t o = strlen(buf);
    for (const char *p = t->id; *p && o + 1 < len; p++) {
        char ch = *p;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '-' || ch == '_' || ch == '=';
        buf[o++] = ok ? ch : '_';
    }
    buf[o] = '\0';
}
