/* keybus: command-line companion of the library, its main. The global
 * options (-c FILE, -X key=value) may stand before or after the command
 * (session.c keeps them); the commands are the table in commands.c.
 * Arguments are checked before the bus opens. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <keybus/keybus.h>

#include "command.h"
#include "help.h"

int main(int argc, char **argv)
{
    /* A closed pipe (stdout, a broker's socket) is an error to report, not
     * a silent death */
    signal(SIGPIPE, SIG_IGN);
    if (!kb_cli_settings_init(argc))
        return KB_CLI_EXIT_ERROR;
    int first = 1;
    /* the options before the command; an unknown one is never echoed: it
     * may hold a secret */
    for (; first < argc && argv[first][0] == '-' && strcmp(argv[first], "--") != 0; first++) {
        const char *a = argv[first];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            kb_cli_write_usage(stdout);
            kb_cli_settings_free();
            return KB_CLI_EXIT_OK;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            printf("keybus %s (library %s)\n", KB_VERSION_STRING, kb_version());
            kb_cli_settings_free();
            return KB_CLI_EXIT_OK;
        }
        if (strcmp(a, "--man") == 0) {
            kb_cli_write_man(stdout);
            kb_cli_settings_free();
            return KB_CLI_EXIT_OK;
        }
        char kind = 0;
        int used = 0;
        char *value = kb_cli_global_option(argc, argv, first, &kind, &used);
        if (used == 0 || value == NULL) {
            kb_cli_settings_free();
            if (used == 0)
                return kb_cli_usage_error(NULL, "unknown option");
            fprintf(stderr, "keybus: -%c needs an argument (see: keybus --help)\n", kind);
            return KB_CLI_EXIT_USAGE;
        }
        if (!kb_cli_setting_add(kind, value)) {
            kb_cli_settings_free();
            return KB_CLI_EXIT_ERROR;
        }
        first += used - 1;
    }
    if (first < argc && strcmp(argv[first], "--") == 0)
        first++;
    int status;
    if (first >= argc) {
        status = kb_cli_usage_error(NULL, "no command");
    } else {
        const struct kb_cli_command *cmd = kb_cli_command_find(argv[first]);
        int n = cmd != NULL ? kb_cli_take_global_options(argc, argv, first + 1) : 0;
        if (cmd == NULL)
            status = kb_cli_usage_error(NULL, "unknown command");
        else if (n == -2)
            status = kb_cli_write_help(stdout, cmd);
        else if (n < 0)
            status = KB_CLI_EXIT_USAGE;
        else
            status = cmd->main(n - first, argv + first);
    }
    kb_cli_settings_free();
    return status;
}
