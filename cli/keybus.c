/* keybus: command-line companion of the library. The global options (-c
 * FILE, -X key=value) may stand before or after the command; the commands
 * are the table in commands.c. Arguments are checked before the bus opens. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "command.h"
#include "help.h"
#include "text.h"

/* -c FILE or -X key=value, applied in the order given. */
struct setting {
    char kind;
    char *arg;
};

static struct setting *settings;
static int n_settings;

int kb_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (cmd != NULL)
        fprintf(stderr, "keybus %s: %s (see: keybus help %s)\n", cmd, text, cmd);
    else
        fprintf(stderr, "keybus: %s (see: keybus --help)\n", text);
    return KB_CLI_EXIT_USAGE;
}

int kb_cli_check_args(const char *cmd, int argc, char **argv, int first, int min, int max,
                      bool topic)
{
    int n = argc - first;
    if (n < min || n > max)
        return kb_cli_usage_error(cmd, "wrong number of arguments");
    char why[512];
    if (topic && n > 0 && kb_topic_name_check(argv[first], why, sizeof why) != KB_OK)
        return kb_cli_usage_error(cmd, "%s", why);
    return KB_CLI_EXIT_OK;
}

int kb_cli_flags(const char *cmd, int argc, char **argv, const char *const *names, size_t n,
                 bool *set)
{
    int out = 1;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-' || argv[i][1] == '\0') {
            argv[out++] = argv[i];
            continue;
        }
        size_t f = 0;
        while (f < n && strcmp(argv[i], names[f]) != 0)
            f++;
        if (f == n) {   /* not echoed: it may hold a secret */
            kb_cli_usage_error(cmd, "unknown option");
            return -1;
        }
        set[f] = true;
    }
    argv[out] = NULL;
    return out;
}

kb_conf *kb_cli_conf_make(int *status)
{
    kb_conf *c = kb_conf_new();
    if (c == NULL) {
        fprintf(stderr, "keybus: out of memory\n");
        *status = KB_CLI_EXIT_ERROR;
        return NULL;
    }
    char err[512];
    for (int i = 0; i < n_settings; i++) {
        int rc;
        if (settings[i].kind == 'c') {
            rc = kb_conf_load(c, settings[i].arg, err, sizeof err);
        } else {
            char *eq = strchr(settings[i].arg, '=');
            if (eq == NULL) {   /* never echoed: "nats.token:secret" is a typo for '=' */
                fprintf(stderr, "keybus: -X wants key=value (option %d has no '=')\n", i + 1);
                kb_conf_destroy(c);
                *status = KB_CLI_EXIT_USAGE;
                return NULL;
            }
            *eq = '\0';
            rc = kb_conf_set(c, settings[i].arg, eq + 1, err, sizeof err);
            *eq = '=';
        }
        if (rc != KB_OK) {
            fprintf(stderr, "keybus: %s\n", err);
            kb_conf_destroy(c);
            *status = rc == KB_ENOMEM ? KB_CLI_EXIT_ERROR : KB_CLI_EXIT_USAGE;
            return NULL;
        }
    }
    return c;
}

kb_bus *kb_cli_open_conf(const char *cmd, kb_conf *c, int *status)
{
    char err[512];
    kb_cli_drop_service_keys(c);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL) {
        int rc = kb_last_error_code();
        fprintf(stderr, "keybus %s: %s: %s\n", cmd, kb_strerror(rc), err);
        kb_conf_destroy(c);
        /* a value kb_open refused is bad configuration: nothing was connected */
        *status = rc == KB_EINVAL ? KB_CLI_EXIT_USAGE : KB_CLI_EXIT_ERROR;
    }
    return b;
}

kb_bus *kb_cli_open(const char *cmd, int *status)
{
    kb_conf *c = kb_cli_conf_make(status);
    return c == NULL ? NULL : kb_cli_open_conf(cmd, c, status);
}

void kb_cli_scheme(kb_conf *c, char *buf, size_t len)
{
    char conf_env[16] = "true", url[512] = "";
    kb_conf_get(c, "conf.env", conf_env, sizeof conf_env);
    if (strcmp(conf_env, "true") == 0)
        kb_conf_apply_env(c, NULL, 0);   /* a bad value fails kb_open, which says so */
    kb_conf_get(c, "transport", url, sizeof url);
    size_t n = strcspn(url, ":");
    snprintf(buf, len, "%.*s", (int)n, url);
}

int kb_cli_status_of(const char *cmd, int rc)
{
    if (rc == KB_OK)
        return KB_CLI_EXIT_OK;
    kb_cli_report(cmd, rc);
    return rc == KB_ENOTFOUND ? KB_CLI_EXIT_NOT_FOUND : KB_CLI_EXIT_ERROR;
}

int kb_cli_close(kb_bus *b, const char *cmd, int status)
{
    int closed = kb_close(b, 5000);
    if (closed == KB_OK)
        return status;
    fprintf(stderr, "keybus %s: close: %s: %s\n", cmd, kb_strerror(closed), kb_last_error());
    return status == KB_CLI_EXIT_OK ? KB_CLI_EXIT_ERROR : status;
}

/* -c FILE / -cFILE / -X KV / -XKV at argv[i]: its value (and *used, the
 * words it takes), or NULL when argv[i] is no global option. */
static char *global_option(int argc, char **argv, int i, char *kind, int *used)
{
    const char *a = argv[i];
    if (a[0] != '-' || (a[1] != 'c' && a[1] != 'X'))
        return NULL;
    *kind = a[1];
    if (a[2] != '\0') {
        *used = 1;
        return argv[i] + 2;
    }
    *used = 2;
    return i + 1 < argc ? argv[i + 1] : NULL;
}

/* Take the global options out of argv[first..argc) (up to a `--`, which is
 * dropped), into settings; the new argc, -1 after a usage error, or -2 for
 * -h / --help. */
static int take_global_options(int argc, char **argv, int first)
{
    int out = first;
    for (int i = first; i < argc;) {
        if (strcmp(argv[i], "--") == 0) {
            for (i++; i < argc; i++)
                argv[out++] = argv[i];
            break;
        }
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return -2;
        char kind = 0;
        int used = 0;
        char *value = global_option(argc, argv, i, &kind, &used);
        if (used == 0) {
            argv[out++] = argv[i++];
            continue;
        }
        if (value == NULL) {
            fprintf(stderr, "keybus: -%c needs an argument (see: keybus --help)\n", kind);
            return -1;
        }
        settings[n_settings++] = (struct setting){kind, value};
        i += used;
    }
    argv[out] = NULL;
    return out;
}

int main(int argc, char **argv)
{
    /* A closed pipe (stdout, a broker's socket) is an error to report, not
     * a silent death */
    signal(SIGPIPE, SIG_IGN);
    settings = calloc((size_t)argc + 1, sizeof *settings);
    if (settings == NULL)
        return KB_CLI_EXIT_ERROR;
    int first = 1;
    /* the options before the command; an unknown one is never echoed: it
     * may hold a secret */
    for (; first < argc && argv[first][0] == '-' && strcmp(argv[first], "--") != 0; first++) {
        const char *a = argv[first];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            kb_cli_write_usage(stdout);
            free(settings);
            return KB_CLI_EXIT_OK;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            printf("keybus %s (library %s)\n", KB_VERSION_STRING, kb_version());
            free(settings);
            return KB_CLI_EXIT_OK;
        }
        if (strcmp(a, "--man") == 0) {
            kb_cli_write_man(stdout);
            free(settings);
            return KB_CLI_EXIT_OK;
        }
        char kind = 0;
        int used = 0;
        char *value = global_option(argc, argv, first, &kind, &used);
        if (used == 0 || value == NULL) {
            free(settings);
            if (used == 0)
                return kb_cli_usage_error(NULL, "unknown option");
            fprintf(stderr, "keybus: -%c needs an argument (see: keybus --help)\n", kind);
            return KB_CLI_EXIT_USAGE;
        }
        settings[n_settings++] = (struct setting){kind, value};
        first += used - 1;
    }
    if (first < argc && strcmp(argv[first], "--") == 0)
        first++;
    int status;
    if (first >= argc) {
        status = kb_cli_usage_error(NULL, "no command");
    } else {
        const struct kb_cli_command *cmd = kb_cli_command_find(argv[first]);
        int n = cmd != NULL ? take_global_options(argc, argv, first + 1) : 0;
        if (cmd == NULL)
            status = kb_cli_usage_error(NULL, "unknown command");
        else if (n == -2)
            status = kb_cli_write_help(stdout, cmd);
        else if (n < 0)
            status = KB_CLI_EXIT_USAGE;
        else
            status = cmd->main(n - first, argv + first);
    }
    free(settings);
    return status;
}
