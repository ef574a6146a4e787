/* The crash journal (runs.c): which delivery each executor is running, in a
 * file mapped shared, so the run of a process killed inside a handler is
 * still counted by the next process on this host. */
#ifndef KB_CORE_RUNS_H
#define KB_CORE_RUNS_H

#include <stdint.h>

typedef struct kb_runs kb_runs;

/* At kb_open of a transport that records runs: `configured` (runs.dir as
 * resolved; empty: the default) exists (made if missing) and belongs to
 * this user, so a bad setting fails kb_open even
 * where the journal itself starts only at the first subscribe. KB_OK or
 * KB_ETRANSPORT naming the directory. Thread: open's. */
int kb__runs_dir_check(const char *configured, char *errstr, size_t errlen);

/* Executor `slot` starts run `attempt` of delivery `id`. Plain stores into
 * the mapping: no system call. Thread: executor `slot` only. */
void kb__runs_begin(kb_runs *j, uint32_t slot, const char *topic, uint32_t partition,
                    const char *id, uint32_t attempt);
/* Its handler returned. Thread: executor `slot` only. */
void kb__runs_end(kb_runs *j, uint32_t slot);
/* At kb_close, after the executors stopped: nothing runs any more, so the
 * journal is deleted and its lock dropped. NULL: nothing. */
void kb__runs_close(kb_runs *j);

#endif /* KB_CORE_RUNS_H */
