/* keybus metrics: the Prometheus text of the bus, printed once. */
#ifndef KB_CLI_METRICS_CMD_H
#define KB_CLI_METRICS_CMD_H

#include <keybus/keybus.h>

/* `keybus metrics [TOPIC]...` on an open bus: looks up each named topic (a
 * new process knows none; on a broker their figures then come from the
 * broker), then prints kb_metrics_write's text on stdout. argv holds the
 * topics only. KB_OK, or the code of the call that failed (text in
 * kb_last_error), for the caller to report and turn into an exit status. */
int kb_cli_metrics(kb_bus *b, int argc, char **argv);

#endif /* KB_CLI_METRICS_CMD_H */
