/* Test harness: the keybus command run as a child process, its stdout and
 * stderr captured whole. */
#ifndef KB_TEST_CLI_H
#define KB_TEST_CLI_H

typedef struct kb_test_cli_result {
    int status;               /* exit status; 128 + signal when killed */
    char out[65536], err[16384];
} kb_test_cli_result;

/* Run `cli` with args (NULL-terminated, at most 30), stdin from /dev/null,
 * in this process's environment; asserts it could be run. */
void kb_test_cli(kb_test_cli_result *r, const char *cli, const char *const *args);

/* Run a shell command (printf format, at most 2047 bytes); its exit status,
 * -1 when it did not exit. */
int kb_test_sh(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#endif /* KB_TEST_CLI_H */
