/* keybus metrics [TOPIC]...: kb_metrics_write once, on stdout; without a
 * TOPIC, of every topic the broker stores. */
#include <stdio.h>
#include <stdlib.h>

#include <keybus/keybus.h>

#include "metrics_cmd.h"

/* Without TOPICs: every topic the broker stores, looked up so its figures
 * show (none on mem://, which stores nothing outside a process). */
static int look_up_stored(kb_bus *b)
{
    kb_topic_info *all;
    size_t n;
    int rc = kb_topics(b, &all, &n);
    if (rc == KB_ENOTFOUND)
        return KB_OK;
    for (size_t i = 0; rc == KB_OK && i < n; i++)
        if (kb_topic_get(b, all[i].name, NULL, 0) == NULL)
            rc = kb_last_error_code();
    kb_topics_free(all, n);   /* NULL after a failure */
    return rc;
}

int kb_cli_metrics_print(kb_bus *b, int ntopics, char **topics)
{
    char err[512];
    int rc = ntopics == 0 ? look_up_stored(b) : KB_OK;
    if (rc != KB_OK)
        return rc;
    for (int i = 0; i < ntopics; i++) {
        if (kb_topic_get(b, topics[i], err, sizeof err) == NULL)
            return kb_last_error_code();
        /* a topic the broker does not store would have no samples: not found,
         * as for stats */
        kb_topic_stats s;
        if (kb_stats(b, topics[i], &s) == KB_ENOTFOUND)
            return KB_ENOTFOUND;
    }
    size_t need = 0;
    rc = kb_metrics_write(b, NULL, 0, &need);
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
