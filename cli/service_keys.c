/* The keys that belong to the service whose file the CLI reads: its
 * metrics endpoint and its stats feed. A command started next to a running
 * service must not try to listen on the service's port. */
#include "command.h"

void kb_cli_drop_service_keys(kb_conf *c)
{
    /* values set in code win over the file and KEYBUS_*; both are valid */
    kb_conf_set(c, "metrics.listen", "", NULL, 0);
    kb_conf_set(c, "stats.interval_ms", "0", NULL, 0);
}
