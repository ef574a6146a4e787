/* Publishes nats.c holds, found by their message: its publish-ack callback
 * and its list of unacked publishes hand back the natsMsg alone, which
 * carries nothing of ours, so each message sent is remembered here with its
 * backlog item until then. Open addressing over the message's address
 * (linear probing, removal by shifting back: no tombstones), under one
 * mutex: a put and a take per message, both short. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <keybus/transport.h>

#include "nats_flight.h"

struct slot {
    const void *msg;   /* NULL: free */
    void *pub;
};

struct kb_nats_flight {
    pthread_mutex_t mu;
    struct slot *slots;
    size_t mask;       /* slots - 1, a power of two minus one */
    size_t used;
};

kb_nats_flight *kb__nats_flight_new(void)
{
    kb_nats_flight *f = calloc(1, sizeof *f);
    if (f == NULL || (f->slots = calloc(1024, sizeof *f->slots)) == NULL) {
        free(f);
        return NULL;
    }
    f->mask = 1023;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

void kb__nats_flight_free(kb_nats_flight *f)
{
    if (f == NULL)
        return;
    pthread_mutex_destroy(&f->mu);
    free(f->slots);
    free(f);
}

static size_t home(const kb_nats_flight *f, const void *msg)
{
    return (size_t)kb_mix64((uint64_t)(uintptr_t)msg) & f->mask;
}

static void insert(kb_nats_flight *f, const void *msg, void *pub)
{
    size_t i = home(f, msg);
    while (f->slots[i].msg != NULL)
        i = (i + 1) & f->mask;
    f->slots[i] = (struct slot){msg, pub};
    f->used++;
}

/* Twice the slots, at half load: probes stay short. */
static int grow(kb_nats_flight *f)
{
    struct slot *old = f->slots;
    size_t n = f->mask + 1;
    struct slot *slots = calloc(2 * n, sizeof *slots);
    if (slots == NULL)
        return KB_ENOMEM;
    f->slots = slots;
    f->mask = 2 * n - 1;
    f->used = 0;
    for (size_t i = 0; i < n; i++)
        if (old[i].msg != NULL)
            insert(f, old[i].msg, old[i].pub);
    free(old);
    return KB_OK;
}

int kb__nats_flight_put(kb_nats_flight *f, const void *msg, void *pub)
{
    pthread_mutex_lock(&f->mu);
    int rc = 2 * (f->used + 1) > f->mask + 1 ? grow(f) : KB_OK;
    if (rc == KB_OK)
        insert(f, msg, pub);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

void *kb__nats_flight_take(kb_nats_flight *f, const void *msg)
{
    void *pub = NULL;
    pthread_mutex_lock(&f->mu);
    size_t i = home(f, msg);
    while (f->slots[i].msg != NULL && f->slots[i].msg != msg)
        i = (i + 1) & f->mask;
    if (f->slots[i].msg != NULL) {
        pub = f->slots[i].pub;
        f->used--;
        /* shift back the entries after it that probed past i */
        for (size_t j = (i + 1) & f->mask; f->slots[j].msg != NULL; j = (j + 1) & f->mask) {
            size_t h = home(f, f->slots[j].msg);
            if (((j - h) & f->mask) >= ((j - i) & f->mask)) {
                f->slots[i] = f->slots[j];
                i = j;
            }
        }
        f->slots[i] = (struct slot){NULL, NULL};
    }
    pthread_mutex_unlock(&f->mu);
    return pub;
}
