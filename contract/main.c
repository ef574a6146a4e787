/* keybus-contract: the transport contract (contract/cases.c) against any
 * transport, as its author runs it on an installed keybus:
 *
 *   keybus-contract [-p PLUGIN.so] [-X key=value]... [-K key=value]...
 *                   [-c CASE]... [-l] URL
 *
 * Each case runs in turn on the runner's thread; a failed check ends its
 * case (longjmp) and the next one starts. Prints a line per case and a
 * summary; exits 0 when none failed (skipped ones say why), 1 when some
 * failed, 2 on a usage or setup error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "check.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: keybus-contract [-p PLUGIN.so] [-X key=value]... [-K key=value]...\n"
            "                       [-c CASE]... [-l] URL\n"
            "Runs the transport contract against the transport URL names: a built-in\n"
            "one, or the plugin -p loads (transport.plugins).\n"
            "  -p PLUGIN.so  the transport's shared object (absolute path)\n"
            "  -X key=value  a setting for every bus the suite opens (the transport's\n"
            "                own keys, e.g. -X redis.block_ms=100)\n"
            "  -K key=value  a setting for the consumers of the crash case only\n"
            "                (kill_while_set_aside): how soon a killed consumer's\n"
            "                events are taken over, e.g. -K redis.lease_ttl_ms=1000\n"
            "  -c CASE       run only this case (repeatable)\n"
            "  -l            list the cases and exit\n"
            "Exit status: 0 when no case failed, 1 when one did, 2 on a usage error.\n");
}

/* key=value into the next two slots of kv (argv stays as it was: the
 * crash case's consumers get the same options). */
static int add_setting(const char **kv, size_t *n, size_t cap, const char *arg)
{
    const char *eq = strchr(arg, '=');
    char *key = eq != NULL && eq != arg && *n + 2 <= cap ? strndup(arg, (size_t)(eq - arg)) : NULL;
    if (key == NULL) {
        fprintf(stderr, "keybus-contract: %s: expected key=value\n", arg);
        return -1;
    }
    kv[(*n)++] = key;
    kv[(*n)++] = eq + 1;
    return 0;
}

/* The transport's table, after loading the plugin (the URL is checked too). */
static const kb_transport_ops *target_ops(const kc_target *t)
{
    kb_conf *c = kb_conf_new();
    char err[512];
    const kb_transport_ops *ops = NULL;
    if (c == NULL)
        fprintf(stderr, "keybus-contract: out of memory\n");
    else if (t->plugin != NULL &&
             kb_conf_set(c, "transport.plugins", t->plugin, err, sizeof err) != KB_OK)
        fprintf(stderr, "keybus-contract: %s\n", err);
    else if (kb_conf_set(c, "transport", t->url, err, sizeof err) != KB_OK)
        fprintf(stderr, "keybus-contract: %s\n", err);
    else {
        char scheme[64];
        snprintf(scheme, sizeof scheme, "%.*s", (int)strcspn(t->url, ":"), t->url);
        ops = kb_transport_find(scheme);
    }
    kb_conf_destroy(c);
    return ops;
}

/* One line on the table: what the cases will expect. */
static void say_hooks(const kb_transport_ops *ops)
{
    struct {
        const char *name;
        int set;
    } hooks[] = {
        {"drain", ops->drain != NULL},
        {"partition_stats", ops->partition_stats != NULL},
        {"dead_letters", ops->dead_letters != NULL},
        {"dead_letter_replay", ops->dead_letter_replay != NULL},
        {"dead_letter_delete", ops->dead_letter_delete != NULL},
        {"release", ops->release != NULL},
        {"still_owned", ops->still_owned != NULL},
        {"run_begins", ops->run_begins != NULL},
        {"stop_by", ops->stop_by != NULL},
    };
    printf("optional hooks:");
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
        printf(" %s%s", hooks[i].set ? "" : "-", hooks[i].name);
    printf("; flags:%s%s%s\n", ops->flags & KB_TRANSPORT_F_LOCAL ? " local" : "",
           ops->flags & KB_TRANSPORT_F_HEADERS ? " headers" : "",
           ops->flags & KB_TRANSPORT_F_SINGLE_FEEDER ? " single-feeder" : "");
}

int main(int argc, char **argv)
{
    static const char *settings[128], *crash[128];
    static const char *only[64];
    static kc_target target;
    size_t n_only = 0;
    int list = 0, first = 1;
    const char *child[3] = {NULL};
    if (argc >= 5 && strcmp(argv[1], "--child") == 0) {
        child[0] = argv[2], child[1] = argv[3], child[2] = argv[4];
        first = 5;
    }
    target.child_argv = argv + first;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "-l") == 0) {
            list = 1;
        } else if (a[0] == '-' && a[1] != '\0' && strchr("pXKc", a[1]) != NULL && a[2] == '\0') {
            if (v == NULL) {
                usage(stderr);
                return 2;
            }
            i++;
            if (a[1] == 'p')
                target.plugin = v;
            else if (a[1] == 'c' && n_only < 64)
                only[n_only++] = v;
            else if (a[1] == 'X' && add_setting(settings, &target.n_settings, 128, v) != 0)
                return 2;
            else if (a[1] == 'K' && add_setting(crash, &target.n_crash_settings, 128, v) != 0)
                return 2;
        } else if (a[0] != '-' && target.url == NULL) {
            target.url = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (list) {
        for (size_t i = 0; i < kc_n_cases; i++)
            printf("%s\n", kc_cases[i].name);
        return 0;
    }
    if (target.url == NULL) {
        usage(stderr);
        return 2;
    }
    target.settings = settings;
    target.crash_settings = crash;
    if ((target.ops = target_ops(&target)) == NULL)
        return 2;
    kc = &target;
    if (child[0] != NULL)
        return kc_child_main(child[0], child[1], child[2]);

    for (size_t k = 0; k < n_only; k++) {
        size_t i = 0;
        while (i < kc_n_cases && strcmp(kc_cases[i].name, only[k]) != 0)
            i++;
        if (i == kc_n_cases) {
            fprintf(stderr, "keybus-contract: no case %s (-l lists them)\n", only[k]);
            return 2;
        }
    }
    char shown[512];
    printf("keybus-contract %s: %s%s%s\n", kb_version(), kb_url_redact(target.url, shown,
           sizeof shown), target.plugin ? " from " : "", target.plugin ? target.plugin : "");
    say_hooks(target.ops);
    size_t count[3] = {0};
    for (size_t i = 0; i < kc_n_cases; i++) {
        int wanted = n_only == 0;
        for (size_t k = 0; k < n_only && !wanted; k++)
            wanted = strcmp(kc_cases[i].name, only[k]) == 0;
        if (wanted)
            count[kc_run_case(&kc_cases[i])]++;
    }
    printf("%s:// contract: %zu passed, %zu skipped, %zu failed\n", target.ops->scheme,
           count[KC_PASSED], count[KC_SKIPPED], count[KC_FAILED]);
    return count[KC_FAILED] == 0 ? 0 : 1;
}
