/* keybus top TOPIC...: kb_stats of each topic once a second, as rates and
 * levels, in plain text (redrawn in place on a terminal, appended
 * otherwise). q on a terminal's stdin, SIGINT or SIGTERM ends it. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "command.h"
#include "text.h"

#define TOP_INTERVAL_MS 1000

struct sample {
    int rc;                    /* kb_stats's result */
    kb_topic_stats s;
    double at;                 /* seconds, monotonic */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Entries settled by the group: what is stored and neither pending nor
 * waiting. NATS counts pending and lag in messages (frames), so frames. */
static uint64_t settled(const kb_topic_stats *s)
{
    uint64_t stored = s->broker_frames ? s->broker_frames : s->broker_length;
    uint64_t open = s->broker_pending + s->broker_lag;
    return stored > open ? stored - open : 0;
}

static double rate(uint64_t now, uint64_t before, double seconds)
{
    return now > before && seconds > 0 ? (double)(now - before) / seconds : 0.0;
}

static void draw(char **topics, int n, const char *group, const struct sample *cur,
                 const struct sample *prev, bool tty)
{
    if (tty)
        fputs("\033[H\033[2J", stdout);   /* home, clear: a redraw in place */
    time_t wall = time(NULL);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", localtime(&wall));
    printf("keybus top %s  group ", when);
    kb_cli_escape(stdout, group, strlen(group));
    printf("  (every %d ms; q or Ctrl-C quits)\n", TOP_INTERVAL_MS);
    printf("%-32s %5s %12s %10s %10s %10s %10s %8s\n", "TOPIC", "PARTS", "LENGTH", "IN/s",
           "DONE/s", "PENDING", "LAG", "DLQ");
    for (int i = 0; i < n; i++) {
        const kb_topic_stats *s = &cur[i].s, *p = &prev[i].s;
        size_t len = strlen(topics[i]);
        kb_cli_escape(stdout, topics[i], len);
        printf("%*s", len < 32 ? (int)(32 - len) : 0, "");
        if (cur[i].rc != KB_OK) {
            printf(" %s\n", cur[i].rc == KB_ENOTFOUND ? "not found" : kb_strerror(cur[i].rc));
            continue;
        }
        bool first = prev[i].at == 0 || prev[i].rc != KB_OK;
        double dt = cur[i].at - prev[i].at;
        printf(" %5" PRIu32 " %12" PRIu64, s->partitions, s->broker_length);
        if (first)
            printf(" %10s %10s", "-", "-");
        else
            printf(" %10.1f %10.1f", rate(s->broker_length, p->broker_length, dt),
                   rate(settled(s), settled(p), dt));
        printf(" %10" PRIu64 " %10" PRIu64 " %8" PRIu64 "\n", s->broker_pending, s->broker_lag,
               s->dlq_length);
    }
    fflush(stdout);
}

/* Wait for the next tick: 1 to stop (q, a signal), 0 to draw again. */
static int wait_tick(int stop, int *input, double until)
{
    for (;;) {
        double left = until - now_s();
        if (left <= 0)
            return 0;
        struct pollfd pf[2] = {{.fd = stop, .events = POLLIN}, {.fd = *input, .events = POLLIN}};
        int n = poll(pf, *input >= 0 ? 2 : 1, (int)(left * 1000) + 1);
        if (n < 0 && errno != EINTR)
            return 1;
        if (n > 0 && (pf[0].revents & POLLIN))
            return 1;
        if (n > 0 && *input >= 0 && (pf[1].revents & (POLLIN | POLLHUP))) {
            char c;
            ssize_t got = read(*input, &c, 1);
            if (got == 1 && (c == 'q' || c == 'Q'))
                return 1;
            if (got <= 0)
                *input = -1;   /* stdin closed: only a signal stops */
        }
    }
}

int kb_cli_top(int argc, char **argv)
{
    if (argc < 2)
        return kb_cli_usage_error(argv[0], "wants at least one TOPIC");
    for (int i = 1; i < argc; i++) {
        int status = kb_cli_check_args(argv[0], 2, (char *[]){argv[0], argv[i], NULL}, 1, 1, 1,
                                       true);
        if (status != KB_CLI_EXIT_OK)
            return status;
    }
    /* blocked before kb_open, whose threads inherit the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int stop = -1, status = KB_CLI_EXIT_OK;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0 ||
        (stop = signalfd(-1, &set, SFD_CLOEXEC)) < 0) {
        perror("keybus top: signalfd");
        return KB_CLI_EXIT_ERROR;
    }
    char group[256];
    kb_bus *b = kb_cli_open_group(argv[0], group, sizeof group, &status);
    int n = argc - 1;
    struct sample *cur = calloc((size_t)n, sizeof *cur), *prev = calloc((size_t)n, sizeof *prev);
    if (b == NULL || cur == NULL || prev == NULL) {
        if (b != NULL)
            status = kb_cli_close(b, argv[0], KB_CLI_EXIT_ERROR);
        free(cur);
        free(prev);
        close(stop);
        return status == KB_CLI_EXIT_OK ? KB_CLI_EXIT_ERROR : status;
    }
    /* a terminal's keys one at a time, unechoed, restored at the end */
    int input = 0;
    struct termios saved;
    bool raw = isatty(0) && tcgetattr(0, &saved) == 0;
    if (raw) {
        struct termios t = saved;
        t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        t.c_cc[VMIN] = 1;
        t.c_cc[VTIME] = 0;
        tcsetattr(0, TCSANOW, &t);
    }
    /* a group nobody made would show every event as lag: refused, as by
     * stats (a topic not stored yet shows "not found" and may appear) */
    for (int i = 0; i < n && status == KB_CLI_EXIT_OK; i++) {
        kb_topic_stats s;
        if (kb_stats(b, argv[i + 1], &s) == KB_OK)
            status = kb_cli_status_of(argv[0], kb_cli_group_check(b, argv[i + 1], group));
    }
    bool tty = isatty(1);
    for (double next = now_s(); status == KB_CLI_EXIT_OK; next += TOP_INTERVAL_MS / 1000.0) {
        for (int i = 0; i < n; i++) {
            prev[i] = cur[i];
            cur[i].rc = kb_stats(b, argv[i + 1], &cur[i].s);
            cur[i].at = now_s();
        }
        draw(argv + 1, n, group, cur, prev, tty);
        if (ferror(stdout)) {
            fprintf(stderr, "keybus top: writing to stdout failed\n");
            status = KB_CLI_EXIT_ERROR;
            break;
        }
        if (wait_tick(stop, &input, next + TOP_INTERVAL_MS / 1000.0))
            break;
    }
    if (raw)
        tcsetattr(0, TCSANOW, &saved);
    free(cur);
    free(prev);
    close(stop);
    return kb_cli_close(b, argv[0], status);
}
