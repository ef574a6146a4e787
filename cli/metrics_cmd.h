/* keybus metrics: the Prometheus text of the bus, printed once. */
#ifndef KB_CLI_METRICS_CMD_H
#define KB_CLI_METRICS_CMD_H

#include <keybus/keybus.h>

/* `keybus metrics [TOPIC]...` on an open bus: looks up each named topic,
 * or with none every topic the broker stores (kb_topics; a new process
 * knows none; on a broker their figures then come from the broker), then prints kb_metrics_write's text on stdout. KB_OK, or the code
 * of the call that failed (text in kb_last_error, or on stderr when the
 * CLI's own step failed), for the caller to turn into an exit status. */
int kb_cli_metrics_print(kb_bus *b, int ntopics, char **topics);

#endif /* KB_CLI_METRICS_CMD_H */
