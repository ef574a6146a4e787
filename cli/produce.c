/* keybus produce TOPIC [-K DELIM] [--timeout-ms MS]: one event per line of
 * stdin, KEY DELIM PAYLOAD (the first DELIM splits; the payload may hold
 * more). A signal stops reading; the complete lines already read are still
 * published, then everything is flushed within the deadline. */
#include "command.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text.h"

#define READ_CHUNK 65536

struct producer {
    kb_topic *topic;
    const char *delim;
    size_t delim_len;
    uint64_t line, published, skipped;
};

/* Publish one line (without its newline); KB_OK also for a skipped line. */
static int produce_line(struct producer *p, const char *line, size_t len, int stop)
{
    p->line++;
    const char *d = memmem(line, len, p->delim, p->delim_len);
    if (d == NULL || d == line) {
        fprintf(stderr, "keybus produce: line %llu skipped: %s\n", (unsigned long long)p->line,
                d == NULL ? "no delimiter" : "empty key");
        p->skipped++;
        return KB_OK;
    }
    size_t key_len = (size_t)(d - line), off = key_len + p->delim_len;
    for (;;) {
        int rc = kb_publish_to(p->topic, line, key_len, line + off, len - off);
        if (rc == KB_OK) {
            p->published++;
            return KB_OK;
        }
        if (rc == KB_ETOOBIG || rc == KB_EINVAL) {
            fprintf(stderr, "keybus produce: line %llu skipped: %s\n",
                    (unsigned long long)p->line, kb_last_error());
            p->skipped++;
            return KB_OK;
        }
        /* a full backlog: the transport said so after its own wait; try
         * again unless a signal asks to stop (KB_ECLOSED: stopped) */
        struct pollfd pf = {.fd = stop, .events = POLLIN};
        if (rc != KB_EFULL)
            return rc;
        if (poll(&pf, 1, 0) > 0)
            return KB_ECLOSED;
    }
}

/* Publish every complete line in buf[0..*len) and keep the rest. */
static int produce_lines(struct producer *p, char *buf, size_t *len, int stop)
{
    size_t start = 0;
    int rc = KB_OK;
    for (char *nl; rc == KB_OK && (nl = memchr(buf + start, '\n', *len - start)) != NULL;) {
        rc = produce_line(p, buf + start, (size_t)(nl - (buf + start)), stop);
        start = (size_t)(nl - buf) + 1;
    }
    memmove(buf, buf + start, *len - start);
    *len -= start;
    return rc;
}

/* Read stdin until EOF or a signal, publishing line by line. */
static int read_input(struct producer *p, int stop)
{
    size_t cap = READ_CHUNK, len = 0;
    char *buf = malloc(cap);
    int rc = buf == NULL ? KB_ENOMEM : KB_OK;
    while (rc == KB_OK) {
        struct pollfd pf[2] = {{.fd = stop, .events = POLLIN}, {.fd = 0, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            kb_cli_errf("waiting for input: %s", strerror(errno));
            rc = KB_ETRANSPORT;
            break;
        }
        if (pf[0].revents & POLLIN)
            break;   /* SIGINT or SIGTERM: stop intake */
        if (cap - len < READ_CHUNK) {
            char *more = realloc(buf, cap * 2);
            if (more == NULL) {
                rc = KB_ENOMEM;
                break;
            }
            buf = more;
            cap *= 2;
        }
        ssize_t n = read(0, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            kb_cli_errf("reading stdin: %s", strerror(errno));
            rc = KB_ETRANSPORT;
            break;
        }
        if (n == 0) {   /* EOF: a last line without its newline */
            if (len > 0)
                rc = produce_line(p, buf, len, stop);
            break;
        }
        len += (size_t)n;
        rc = produce_lines(p, buf, &len, stop);
    }
    free(buf);
    if (rc == KB_ENOMEM)
        kb_cli_errf("out of memory for an input line");
    return rc == KB_ECLOSED ? KB_OK : rc;   /* a signal while the backlog was full */
}

int kb_cli_produce(kb_bus *b, const struct kb_cli_stream *s, int stop, int *closed)
{
    char err[512];
    struct producer p = {.delim = s->delim, .delim_len = strlen(s->delim)};
    int rc = KB_EINVAL;   /* the text is kb_last_error's */
    if ((p.topic = kb_topic_get(b, s->topic, err, sizeof err)) != NULL)
        rc = read_input(&p, stop);
    /* what was published is stored (brokers) or handled (mem) before exit */
    int flushed = p.topic != NULL ? kb_flush(b, s->timeout_ms) : KB_OK;
    if (rc == KB_OK)
        rc = flushed;
    if (rc == KB_OK && p.skipped > 0) {
        kb_cli_errf("%llu lines skipped", (unsigned long long)p.skipped);
        rc = KB_EINVAL;
    }
    kb_cli_report("produce", rc);
    *closed = kb_close(b, s->timeout_ms);
    fprintf(stderr, "keybus produce: %llu events published, %llu lines skipped\n",
            (unsigned long long)p.published, (unsigned long long)p.skipped);
    return rc;
}
