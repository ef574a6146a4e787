/* keybus-consumer-cost: what a durable pull consumer's creation costs on a
 * JetStream cluster, by replica count (plain nats.c, no keybus). Every claim of
 * a nats:// partition makes a consumer of the stream's replicas, so a moved
 * partition waits for one (docs/transports-nats.md, "What a consumer's
 * creation costs"). On a stream of REPLICAS, ROUNDS times, COUNT consumers are
 * made one after another (each with a subject of its own and a start
 * sequence, as keybus makes them) at R = REPLICAS, then at R1, and deleted;
 * each creation is timed from the request to its answer.
 *
 *   keybus-consumer-cost URL [COUNT (8)] [ROUNDS (3)] [REPLICAS (3)]
 *
 * Prints one line per replica count (median and worst, ms) and the same as a
 * JSON object per line on stdout ("json: {...}"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nats/nats.h>

#define STREAM "KB_consumer_cost"
#define MAX_TIMED 4096

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Make and time `count` consumers of `replicas`, then delete them; their
 * times appended to ms[*n]. False (said on stderr) on the first failure. */
static bool one_round(jsCtx *js, int round, int replicas, int count, double *ms, int *n)
{
    for (int i = 0; i < count && *n < MAX_TIMED; i++) {
        char name[64], subject[32];
        snprintf(name, sizeof name, "cost_r%d_%d_%d", replicas, round, i);
        snprintf(subject, sizeof subject, "cost.%d", i);
        jsConsumerConfig cc;
        jsConsumerConfig_Init(&cc);
        cc.Durable = name;
        cc.FilterSubject = subject;
        cc.AckPolicy = js_AckAll;
        cc.DeliverPolicy = js_DeliverByStartSequence;
        cc.OptStartSeq = 1;
        cc.Replicas = replicas;
        jsConsumerInfo *ci = NULL;
        jsErrCode jerr = 0;
        double t0 = now_ms();
        natsStatus s = js_AddConsumer(&ci, js, STREAM, &cc, NULL, &jerr);
        ms[(*n)++] = now_ms() - t0;
        jsConsumerInfo_Destroy(ci);
        if (s != NATS_OK) {
            fprintf(stderr, "keybus-consumer-cost: creating %s: %s (error %d)\n", name,
                    natsStatus_GetText(s), (int)jerr);
            return false;
        }
    }
    for (int i = 0; i < count; i++) {
        char name[64];
        snprintf(name, sizeof name, "cost_r%d_%d_%d", replicas, round, i);
        js_DeleteConsumer(js, STREAM, name, NULL, NULL);
    }
    return true;
}

static void report(int replicas, double *ms, int n, int stream_replicas)
{
    qsort(ms, (size_t)n, sizeof *ms, by_value);
    double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    printf("R%d consumer on an R%d stream: %d creations, median %.1f ms, worst %.1f ms\n",
           replicas, stream_replicas, n, median, ms[n - 1]);
    printf("json: {\"consumer_replicas\":%d,\"stream_replicas\":%d,\"creations\":%d,"
           "\"median_ms\":%.1f,\"worst_ms\":%.1f}\n",
           replicas, stream_replicas, n, median, ms[n - 1]);
}

/* The stream, the creations of each replica count, their report; 0 when
 * all went. */
static int measure(jsCtx *js, int count, int rounds, int replicas)
{
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char *subjects[] = {"cost.*"};
    sc.Name = STREAM;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Replicas = replicas;
    jsErrCode jerr = 0;
    js_DeleteStream(js, STREAM, NULL, NULL);   /* a run before left it: start alike */
    natsStatus s = js_AddStream(NULL, js, &sc, NULL, &jerr);
    if (s != NATS_OK) {
        fprintf(stderr, "keybus-consumer-cost: creating stream %s (R%d): %s (error %d)\n", STREAM,
                replicas, natsStatus_GetText(s), (int)jerr);
        return 1;
    }
    int asked[2] = {replicas, 1}, kinds = replicas > 1 ? 2 : 1, rc = 0;
    double *ms = malloc(MAX_TIMED * sizeof *ms);
    if (ms == NULL) {
        fprintf(stderr, "keybus-consumer-cost: out of memory\n");
        rc = 1;
    }
    for (int k = 0; ms != NULL && k < kinds && rc == 0; k++) {
        int n = 0;
        for (int r = 0; r < rounds && rc == 0; r++)
            if (!one_round(js, r, asked[k], count, ms, &n))
                rc = 1;
        if (rc == 0)
            report(asked[k], ms, n, replicas);
    }
    js_DeleteStream(js, STREAM, NULL, NULL);
    free(ms);
    return rc;
}

int main(int argc, char **argv)
{
    int count = argc > 2 ? atoi(argv[2]) : 8, rounds = argc > 3 ? atoi(argv[3]) : 3;
    int replicas = argc > 4 ? atoi(argv[4]) : 3;
    if (argc < 2 || argc > 5 || count < 1 || rounds < 1 || replicas < 1 || replicas > 5 ||
        count > MAX_TIMED / rounds) {
        fprintf(stderr, "usage: keybus-consumer-cost URL [COUNT (8)] [ROUNDS (3)] [REPLICAS (3)]\n");
        return 2;
    }
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 10000;   /* a creation is answered in well under a second: this is only a bound */
    natsStatus s = natsConnection_ConnectTo(&nc, argv[1]);
    if (s == NATS_OK)
        s = natsConnection_JetStream(&js, nc, &jo);
    int rc = s == NATS_OK ? measure(js, count, rounds, replicas) : 1;
    if (s != NATS_OK)
        fprintf(stderr, "keybus-consumer-cost: %s: %s\n", argv[1], natsStatus_GetText(s));
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    nats_Close();
    return rc;
}
