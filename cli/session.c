/* What every command shares: the global options (-c FILE, -X key=value)
 * and the configuration they make, opening and closing the bus, argument
 * checks and the exit status of a library result. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include <keybus/keybus.h>

#include "command.h"
#include "text.h"

/* -c FILE or -X key=value, applied in the order given. */
struct setting {
    char kind;
    char *arg;
};

static struct setting *settings;
static int n_settings;

bool kb_cli_settings_init(int argc)
{
    settings = calloc((size_t)argc + 1, sizeof *settings);
    return settings != NULL;
}

void kb_cli_settings_free(void)
{
    for (int i = 0; settings != NULL && i < n_settings; i++) {
        explicit_bzero(settings[i].arg, strlen(settings[i].arg));
        free(settings[i].arg);
    }
    free(settings);
    settings = NULL;
    n_settings = 0;
}

void kb_cli_hold_secret(void)
{
    static const struct rlimit none = {0, 0};
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    setrlimit(RLIMIT_CORE, &none);
}

/* Where the secret of a -X key=value starts, or NULL: the value of a key
 * named like a secret (the library's rule: token, password, secret in its
 * last part), a value with userinfo ('@'), and all of a word with no '='. */
static char *secret_part(char *kv)
{
    char *eq = strchr(kv, '=');
    if (eq == NULL)
        return kv;
    *eq = '\0';
    const char *dot = strrchr(kv, '.');
    const char *last = dot != NULL ? dot + 1 : kv;
    bool named = strstr(last, "token") != NULL || strstr(last, "password") != NULL ||
                 strstr(last, "secret") != NULL;
    *eq = '=';
    return named || strchr(eq + 1, '@') != NULL ? eq + 1 : NULL;
}

bool kb_cli_setting_add(char kind, char *value)
{
    char *copy = strdup(value);
    if (copy == NULL) {
        fprintf(stderr, "keybus: out of memory\n");
        return false;
    }
    settings[n_settings++] = (struct setting){kind, copy};
    char *secret = kind == 'X' ? secret_part(value) : NULL;
    if (secret != NULL && *secret != '\0') {
        memset(secret, '*', strlen(secret));
        kb_cli_hold_secret();
    }
    return true;
}

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

/* kb_conf_each shows a secret as "***", a URL's userinfo as "***@". */
static void note_secret(const char *key, const char *value, void *held)
{
    (void)key;
    if (strstr(value, "***") != NULL)
        *(bool *)held = true;
}

/* A KEYBUS_* variable kb_open may take a secret from. */
static bool secret_in_environment(void)
{
    extern char **environ;
    for (char **ev = environ; ev != NULL && *ev != NULL; ev++) {
        const char *eq = strchr(*ev, '=');
        if (strncmp(*ev, "KEYBUS_", 7) != 0 || eq == NULL)
            continue;
        char name[160];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *ev), *ev);
        if (strstr(name, "TOKEN") != NULL || strstr(name, "PASSWORD") != NULL ||
            strstr(name, "SECRET") != NULL || strchr(eq, '@') != NULL)
            return true;
    }
    return false;
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
    bool held = secret_in_environment();
    kb_conf_each(c, note_secret, &held);
    if (held)
        kb_cli_hold_secret();
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

char *kb_cli_global_option(int argc, char **argv, int i, char *kind, int *used)
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

int kb_cli_take_global_options(int argc, char **argv, int first)
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
        char *value = kb_cli_global_option(argc, argv, i, &kind, &used);
        if (used == 0) {
            argv[out++] = argv[i++];
            continue;
        }
        if (value == NULL) {
            fprintf(stderr, "keybus: -%c needs an argument (see: keybus --help)\n", kind);
            return -1;
        }
        if (!kb_cli_setting_add(kind, value))
            return -1;
        i += used;
    }
    argv[out] = NULL;
    return out;
}
