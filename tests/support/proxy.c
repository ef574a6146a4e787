/* A black-hole-capable TCP proxy: one thread, poll(2), non-blocking sockets,
 * a buffer per direction. While black-holed it neither reads nor writes, so
 * the kernel buffers fill and the peers see silence, not a reset; delayed,
 * it holds each read for a while before writing it. */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAIRS 64
#define BUF 65536

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct chunk {              /* one read, not yet written on whole */
    struct chunk *next;
    size_t len, off;
    int64_t ready_ns;       /* not written before (kb_test_proxy_delay) */
    char data[];
};

struct half {               /* bytes read from `from`, not yet written to `to`, oldest first */
    struct chunk *head, *tail;
    size_t held;
};

struct pair {
    int fd[2];              /* 0: client side, 1: broker side; -1 when closed */
    struct half dir[2];     /* dir[i]: from fd[i] to fd[1 - i] */
    bool matched;           /* dir[0] holds the needle (blackhole_after) */
};

struct kb_test_proxy {
    int listen_fd, port, target_port;
    int wake[2];            /* self-pipe: a command is waiting */
    _Atomic int blackhole, applied, stop;   /* blackhole: 0, or 1 + the first pair cut */
    _Atomic int drop;                       /* 0, or 1 + the first pair to close */
    _Atomic int armed;      /* blackhole_after: watching for the needle */
    _Atomic int delay_ms;   /* each read held this long before it is written */
    char needle[256];
    pthread_t thread;
    struct pair pairs[MAX_PAIRS];
};

/* Bytes a direction holds before it reads no more: one read at a time
 * unless delayed, so a black-holed peer's silence fills the kernel's buffers. */
static size_t hold_max(const kb_test_proxy *p)
{
    return atomic_load(&p->delay_ms) > 0 ? 64 * (size_t)BUF : 1;
}

static void nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int connect_target(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    nonblocking(fd);
    return fd;
}

static void pair_close(struct pair *pr)
{
    for (int i = 0; i < 2; i++) {
        if (pr->fd[i] >= 0)
            close(pr->fd[i]);
        pr->fd[i] = -1;
        for (struct chunk *c = pr->dir[i].head, *next; c != NULL; c = next) {
            next = c->next;
            free(c);
        }
        pr->dir[i] = (struct half){NULL, NULL, 0};
    }
    pr->matched = false;
}

static void accept_one(kb_test_proxy *p)
{
    int c = accept(p->listen_fd, NULL, NULL);
    if (c < 0)
        return;
    int s = connect_target(p->target_port);
    struct pair *free_pair = NULL;
    for (int i = 0; i < MAX_PAIRS && free_pair == NULL; i++)
        if (p->pairs[i].fd[0] < 0)
            free_pair = &p->pairs[i];
    if (s < 0 || free_pair == NULL) {
        close(c);
        if (s >= 0)
            close(s);
        return;
    }
    nonblocking(c);
    free_pair->fd[0] = c;
    free_pair->fd[1] = s;
}

/* Move what can move on one direction; -1 when that side closed. */
static int pump(kb_test_proxy *p, struct pair *pr, int i, short revents_from, short revents_to)
{
    struct half *h = &pr->dir[i];
    if (h->held < hold_max(p) && (revents_from & (POLLIN | POLLHUP | POLLERR))) {
        struct chunk *c = malloc(sizeof *c + BUF);
        ssize_t n = c != NULL ? read(pr->fd[i], c->data, BUF) : -1;
        int err = errno;
        if (n <= 0)
            free(c);
        if (c == NULL || n == 0 || (n < 0 && err != EAGAIN && err != EINTR))
            return -1;
        if (n > 0) {
            *c = (struct chunk){NULL, (size_t)n, 0,
                                now_ns() + atomic_load(&p->delay_ms) * 1000000LL};
            if (h->tail != NULL)
                h->tail->next = c;
            else
                h->head = c;
            h->tail = c;
            h->held += (size_t)n;
            pr->matched = i == 0 && atomic_load(&p->armed) &&
                          memmem(c->data, c->len, p->needle, strlen(p->needle)) != NULL;
        }
    }
    (void)revents_to;   /* a write that cannot go yet is EAGAIN, tried again */
    while (h->head != NULL && now_ns() >= h->head->ready_ns) {
        struct chunk *c = h->head;
        /* a peer gone meanwhile: an error, not SIGPIPE for the test process */
        ssize_t n = send(pr->fd[1 - i], c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (n <= 0)
            break;
        c->off += (size_t)n;
        h->held -= (size_t)n;
        if (c->off < c->len)
            break;
        h->head = c->next;
        if (h->head == NULL)
            h->tail = NULL;
        free(c);
    }
    return 0;
}

static void *proxy_main(void *arg)
{
    kb_test_proxy *p = arg;
    struct pollfd fds[2 + 2 * MAX_PAIRS];
    while (!atomic_load(&p->stop)) {
        int drop = atomic_load(&p->drop);
        for (int i = drop - 1; drop > 0 && i < MAX_PAIRS; i++)
            pair_close(&p->pairs[i]);
        if (drop > 0)
            atomic_store(&p->drop, 0);
        int blackhole = atomic_load(&p->blackhole);
        atomic_store(&p->applied, blackhole);
        int cut_from = blackhole > 0 ? blackhole - 1 : MAX_PAIRS;
        int64_t now = now_ns(), next_ready = INT64_MAX;
        nfds_t n = 0;
        fds[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
        for (int i = 0; i < MAX_PAIRS; i++) {
            struct pair *pr = &p->pairs[i];
            bool cut = i >= cut_from;
            for (int k = 0; k < 2; k++) {
                short ev = 0;
                if (!cut && pr->fd[k] >= 0) {
                    if (pr->dir[k].held < hold_max(p))
                        ev |= POLLIN;          /* room to read from this side */
                    const struct chunk *due = pr->dir[1 - k].head;
                    if (due != NULL && due->ready_ns <= now)
                        ev |= POLLOUT;         /* bytes waiting for this side */
                    else if (due != NULL && due->ready_ns < next_ready)
                        next_ready = due->ready_ns;   /* held: wake when due */
                }
                fds[n++] = (struct pollfd){.fd = cut ? -1 : pr->fd[k], .events = ev};
            }
        }
        int wait_ms = next_ready == INT64_MAX ? 1000 : (int)((next_ready - now) / 1000000) + 1;
        if (poll(fds, n, wait_ms < 1000 ? wait_ms : 1000) < 0 && errno != EINTR)
            break;
        if (fds[0].revents & POLLIN) {
            char drain[64];
            while (read(p->wake[0], drain, sizeof drain) > 0)
                ;
        }
        if (fds[1].revents & POLLIN)
            accept_one(p);
        for (int i = 0; i < cut_from; i++) {
            struct pair *pr = &p->pairs[i];
            if (pr->fd[0] < 0)
                continue;
            short r0 = fds[2 + 2 * i].revents, r1 = fds[3 + 2 * i].revents;
            if (pump(p, pr, 0, r0, r1) != 0 || pump(p, pr, 1, r1, r0) != 0)
                pair_close(pr);
            /* the request is out whole; its answer is not read before the
             * next poll, which the black hole applies to */
            if (pr->matched && pr->dir[0].head == NULL && atomic_exchange(&p->armed, 0)) {
                atomic_store(&p->blackhole, 1);
                pr->matched = false;
            }
        }
    }
    return NULL;
}

kb_test_proxy *kb_test_proxy_start(int target_port)
{
    kb_test_proxy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    for (int i = 0; i < MAX_PAIRS; i++)
        p->pairs[i].fd[0] = p->pairs[i].fd[1] = -1;
    p->target_port = target_port;
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(p->listen_fd, 64) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0 || pipe(p->wake) != 0) {
        perror("proxy");
        if (p->listen_fd >= 0)
            close(p->listen_fd);
        free(p);
        return NULL;
    }
    fcntl(p->wake[0], F_SETFL, O_NONBLOCK);
    p->port = ntohs(a.sin_port);
    if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
        close(p->listen_fd);
        free(p);
        return NULL;
    }
    return p;
}

int kb_test_proxy_port(const kb_test_proxy *p)
{
    return p->port;
}

static void blackhole_set(kb_test_proxy *p, int v)
{
    atomic_store(&p->blackhole, v);
    while (atomic_load(&p->applied) != v) {
        (void)!write(p->wake[1], "x", 1);
        usleep(1000);   /* the proxy thread's loop turns within a poll round */
    }
}

void kb_test_proxy_blackhole(kb_test_proxy *p, int on)
{
    blackhole_set(p, on ? 1 : 0);
}

void kb_test_proxy_delay(kb_test_proxy *p, int ms)
{
    atomic_store(&p->delay_ms, ms);
}

void kb_test_proxy_blackhole_from(kb_test_proxy *p, int first)
{
    blackhole_set(p, first + 1);
}

void kb_test_proxy_drop_from(kb_test_proxy *p, int first)
{
    atomic_store(&p->drop, first + 1);
    while (atomic_load(&p->drop) != 0) {
        (void)!write(p->wake[1], "x", 1);
        usleep(1000);
    }
    blackhole_set(p, 0);
}

int kb_test_proxy_blackhole_after(kb_test_proxy *p, const char *needle, int timeout_ms)
{
    snprintf(p->needle, sizeof p->needle, "%s", needle);
    atomic_store(&p->armed, 1);
    for (int waited = 0; atomic_load(&p->applied) != 1; waited++) {
        if (waited >= timeout_ms && atomic_exchange(&p->armed, 0))
            return -1;
        usleep(1000);
    }
    return 0;
}

void kb_test_proxy_stop(kb_test_proxy *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stop, 1);
    (void)!write(p->wake[1], "x", 1);
    pthread_join(p->thread, NULL);
    for (int i = 0; i < MAX_PAIRS; i++)
        pair_close(&p->pairs[i]);
    close(p->listen_fd);
    close(p->wake[0]);
    close(p->wake[1]);
    free(p);
}
