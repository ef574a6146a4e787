/* Test harness: the keybus command run as a child process, its stdout and
 * stderr captured whole. */
#ifndef KB_TEST_CLI_H
#define KB_TEST_CLI_H

#include <stddef.h>

typedef struct kb_test_cli_result {
    int status;               /* exit status; 128 + signal when killed */
    char out[65536], err[16384];
} kb_test_cli_result;

/* Run `cli` with args (NULL-terminated, at most 30), stdin from /dev/null,
 * in this process's environment; asserts it could be run. */
void kb_test_cli(kb_test_cli_result *r, const char *cli, const char *const *args);

/* kb_test_cli with "-X", `setting` after args (a broker's
 * "transport=URL": every command gets it after its own arguments). */
void kb_test_cli_x(kb_test_cli_result *r, const char *cli, const char *const *args,
                   const char *setting);

/* Lines (newline characters) in s. */
size_t kb_test_lines(const char *s);

/* `text` (JSON lines) matches docs/schemas/<schema> of the tree at
 * `source_dir`, and docs/formats.md names its fields (tests/check_schema.py);
 * asserts. */
void kb_test_check_schema(const char *source_dir, const char *schema, const char *text);

/* Publish events "0".."n-1" with keys k0..k<keys-1> in turn on a bus opened
 * on `url` with `settings` (NULL or key, value pairs), flushed and closed:
 * per key, payloads ascend. Asserts. */
void kb_test_publish_numbered(const char *url, const char *const *settings, const char *topic,
                              int n, int keys);

/* Run a shell command (printf format, at most 2047 bytes); its exit status,
 * -1 when it did not exit. */
int kb_test_sh(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#endif /* KB_TEST_CLI_H */
