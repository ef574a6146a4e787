/* keybus metrics [TOPIC]...: kb_metrics_write once, on stdout. */
#include <stdio.h>
#include <stdlib.h>

#include <keybus/keybus.h>

#include "metrics_cmd.h"

int kb_cli_metrics_print(kb_bus *b, int ntopics, char **topics)
{
    char err[512];
    for (int i = 0; i < ntopics; i++) {
        if (kb_topic_get(b, topics[i], err, sizeof err) == NULL)
            return kb_last_error_code();
        /* a topic the broker does not store would have no samples: not found,
         * as for stats */
        kb_topic_stats s;
        int rc = kb_stats(b, topics[i], &s);
        if (rc == KB_ENOTFOUND)
            return rc;
    }
    size_t need = 0;
    int rc = kb_metrics_write(b, NULL, 0, &need);
    /* the text may grow between the two calls (events, a new topic) */
    while (rc == KB_ETOOBIG) {
        char *text = malloc(need);
        if (text == NULL) {
            fprintf(stderr, "keybus metrics: out of memory for %zu bytes\n", need);
            return KB_ENOMEM;
        }
        rc = kb_metrics_write(b, text, need, &need);
        if (rc == KB_OK && (fputs(text, stdout) == EOF || fflush(stdout) != 0)) {
            fprintf(stderr, "keybus metrics: cannot write to stdout\n");
            rc = KB_EINVAL;
        }
        free(text);
    }
    return rc;
}
