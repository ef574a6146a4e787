/* The consumer group a reading command reports: the `group` key, as kb_open
 * will read it, so stats, partitions and top say whose pending and lag they
 * show (a default group nobody consumes with has everything as lag). */
#include <stdio.h>

#include "command.h"

kb_bus *kb_cli_open_group(const char *cmd, char *group, size_t len, int *status)
{
    kb_conf *c = kb_cli_conf_make(status);
    if (c == NULL)
        return NULL;
    char scheme[32];
    kb_cli_scheme(c, scheme, sizeof scheme);   /* applies KEYBUS_*, as kb_open will */
    if (kb_conf_get(c, "group", group, len) != KB_OK)
        snprintf(group, len, "?");
    return kb_cli_open_conf(cmd, c, status);
}
