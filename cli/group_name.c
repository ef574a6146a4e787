/* The consumer group a reading command reports: the `group` key, as kb_open
 * will read it, so stats, partitions and top say whose pending and lag they
 * show (a default group nobody consumes with has everything as lag), and
 * refuse a group that does not exist. */
#include <stdio.h>
#include <string.h>

#include "command.h"
#include "text.h"

kb_bus *kb_cli_open_conf_group(const char *cmd, kb_conf *c, char *group, size_t len,
                               int *status)
{
    char scheme[32];
    kb_cli_scheme(c, scheme, sizeof scheme);   /* applies KEYBUS_*, as kb_open will */
    if (kb_conf_get(c, "group", group, len) != KB_OK)
        snprintf(group, len, "?");
    return kb_cli_open_conf(cmd, c, status);
}

kb_bus *kb_cli_open_group(const char *cmd, char *group, size_t len, int *status)
{
    kb_conf *c = kb_cli_conf_make(status);
    return c != NULL ? kb_cli_open_conf_group(cmd, c, group, len, status) : NULL;
}

int kb_cli_group_find(kb_bus *b, const char *topic, const char *group, bool *exists)
{
    kb_group_info *g;
    size_t n;
    *exists = false;
    int rc = kb_groups(b, topic, &g, &n);
    for (size_t i = 0; rc == KB_OK && i < n && !*exists; i++)
        *exists = strcmp(g[i].name, group) == 0;
    if (rc == KB_OK)
        kb_groups_free(g, n);
    return rc;
}

int kb_cli_group_check(kb_bus *b, const char *topic, const char *group)
{
    bool exists;
    /* a transport without groups (a plugin) cannot tell: the figures stand */
    if (kb_cli_group_find(b, topic, group, &exists) != KB_OK || exists)
        return KB_OK;
    kb_cli_errf("group %s does not exist on topic %s", group, topic);
    return KB_ENOTFOUND;
}
