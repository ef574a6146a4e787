#include "help.h"

#include <string.h>

#define SYNOPSIS "keybus [-c FILE] [-X key=value]... COMMAND [ARGS] [-X key=value]..."

static const char description[] =
    "keybus is the command-line companion of the keybus library: it publishes,\n"
    "consumes and inspects topics on the transport the configuration names\n"
    "(mem://, redis://, nats://), with the same configuration as kb_open:\n"
    "defaults < -c FILE (INI) < KEYBUS_* environment < -X key=value.\n";

static const char options[] =
    "-c FILE          read an INI configuration file (before or after the command)\n"
    "-X key=value     set one configuration key (before or after the command)\n"
    "--               what follows is arguments, never options\n"
    "-h, --help       this text; after a command: that command's help\n"
    "-V, --version    print the version of keybus and of the library\n"
    "--man            print this text as the man page keybus.1\n";

/* One row per status of enum kb_cli_exit (command.h). */
static const struct {
    int status;
    const char *meaning;
} exits[] = {
    {KB_CLI_EXIT_OK, "success; produce/consume: the input or COUNT was done, or a signal "
                     "came, and the drain and close finished cleanly"},
    {KB_CLI_EXIT_ERROR, "the library failed (its class and text on stderr); produce: some "
                        "lines were skipped; consume on mem://: nothing to consume"},
    {KB_CLI_EXIT_USAGE, "bad arguments or configuration (one line on stderr); nothing was "
                        "connected"},
    {KB_CLI_EXIT_DEADLINE, "produce/consume: the --timeout-ms deadline cut the flush or the "
                           "drain short"},
    {KB_CLI_EXIT_NOT_FOUND, "not found (KB_ENOTFOUND): no such topic on the broker, dead "
                            "letter, or subscriber (publish on mem://)"},
};

void kb_cli_write_usage(FILE *out)
{
    fprintf(out, "usage: " SYNOPSIS "\n       keybus -h | --help | -V | --version | --man\n\n%s\n"
                 "options:\n",
            description);
    for (const char *s = options; *s != '\0';) {
        size_t n = strcspn(s, "\n");
        fprintf(out, "  %.*s\n", (int)n, s);
        s += n + (s[n] == '\n');
    }
    fputs("\ncommands:\n", out);
    for (const struct kb_cli_command *c = kb_cli_commands; c->name != NULL; c++)
        fprintf(out, "  %s%s%s\n      %s\n", c->name, c->synopsis[0] ? " " : "", c->synopsis,
                c->summary);
    fputs("\nexit status:\n", out);
    for (size_t i = 0; i < sizeof exits / sizeof *exits; i++)
        fprintf(out, "  %d  %s\n", exits[i].status, exits[i].meaning);
    fputs("\n`keybus help COMMAND` tells more about one command.\n", out);
}

int kb_cli_write_help(FILE *out, const struct kb_cli_command *cmd)
{
    fprintf(out, "usage: keybus [-c FILE] [-X key=value]... %s%s%s\n\n%s\n\n%s", cmd->name,
            cmd->synopsis[0] ? " " : "", cmd->synopsis, cmd->summary, cmd->help);
    return KB_CLI_EXIT_OK;
}

/* Text as roff: a leading '.' or '\'' escaped, backslashes doubled, '-' as
 * a minus so options can be searched and copied. */
static void roff(FILE *out, const char *s)
{
    bool line_start = true;
    for (; *s != '\0'; s++) {
        if (line_start && (*s == '.' || *s == '\''))
            fputs("\\&", out);
        if (*s == '\\')
            fputs("\\e", out);
        else if (*s == '-')
            fputs("\\-", out);
        else
            fputc(*s, out);
        line_start = *s == '\n';
    }
}

/* Lines of text as a man paragraph: a blank line starts a new one, lines
 * beginning with two spaces stay as written. */
static void roff_text(FILE *out, const char *text)
{
    fputs(".PP\n", out);
    for (const char *s = text; *s != '\0';) {
        size_t n = strcspn(s, "\n");
        if (n == 0) {
            fputs(".PP\n", out);
        } else if (strncmp(s, "  ", 2) == 0) {
            fputs(".nf\n", out);
            char line[1024];
            snprintf(line, sizeof line, "%.*s\n", (int)n, s);
            roff(out, line);
            fputs(".fi\n", out);
        } else {
            char line[1024];
            snprintf(line, sizeof line, "%.*s\n", (int)n, s);
            roff(out, line);
        }
        s += n + (s[n] == '\n');
    }
}

void kb_cli_write_man(FILE *out)
{
    fprintf(out, ".TH KEYBUS 1 \"\" \"keybus %s\" \"User Commands\"\n.SH NAME\n"
                 "keybus \\- publish, consume and inspect keybus topics\n.SH SYNOPSIS\n"
                 ".B keybus\n",
            KB_VERSION_STRING);
    roff(out, "[-c FILE] [-X key=value]... COMMAND [ARGS]\n");
    fputs(".SH DESCRIPTION\n", out);
    roff_text(out, description);
    fputs(".SH OPTIONS\n", out);
    for (const char *s = options; *s != '\0';) {
        size_t n = strcspn(s, "\n");
        const char *gap = strstr(s, "  ");   /* the option, then its text */
        size_t opt = gap != NULL && gap < s + n ? (size_t)(gap - s) : n;
        char buf[256];
        fputs(".TP\n.B ", out);
        snprintf(buf, sizeof buf, "%.*s\n", (int)opt, s);
        roff(out, buf);
        const char *rest = s + opt + strspn(s + opt, " ");
        snprintf(buf, sizeof buf, "%.*s\n", (int)(n - (size_t)(rest - s)), rest);
        roff(out, buf);
        s += n + (s[n] == '\n');
    }
    fputs(".SH COMMANDS\n", out);
    for (const struct kb_cli_command *c = kb_cli_commands; c->name != NULL; c++) {
        fprintf(out, ".SS \"%s%s", c->name, c->synopsis[0] ? " " : "");
        roff(out, c->synopsis);
        fputs("\"\n", out);
        roff_text(out, c->summary);
        roff_text(out, c->help);
    }
    fputs(".SH EXIT STATUS\n", out);
    for (size_t i = 0; i < sizeof exits / sizeof *exits; i++) {
        fprintf(out, ".TP\n.B %d\n", exits[i].status);
        roff(out, exits[i].meaning);
        fputc('\n', out);
    }
    fputs(".SH SEE ALSO\ndocs/cli.md, docs/formats.md and docs/CONFIGURATION.md of the keybus "
          "sources.\n",
          out);
}
