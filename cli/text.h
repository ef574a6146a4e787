/* How the CLI prints bytes it did not write itself (keys, payloads, reasons,
 * IDs): text output escaped so a value can neither forge a line nor drive the
 * terminal; JSON strings exact. */
#ifndef KB_CLI_TEXT_H
#define KB_CLI_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <keybus/keybus.h>

/* `\\` for a backslash, `\n`, `\r`, `\t`, and `\xNN` for every other control
 * byte (below 0x20, 0x7f), for the bytes of invalid UTF-8 and for the C1
 * controls U+0080..U+009F; valid UTF-8 text passes unchanged. */
void kb_cli_escape(FILE *out, const void *data, size_t len);

/* A JSON string, quotes included (RFC 8259 escapes, bytes otherwise exact),
 * for text (names, IDs, reasons): a byte that is not part of valid UTF-8 is
 * written as U+FFFD, so the line stays UTF-8. Bytes that must survive
 * exactly go through kb_cli_json_bytes. */
void kb_cli_json_string(FILE *out, const void *data, size_t len);

/* `"name":"..."` for bytes that are valid UTF-8, else `"name_base64":"..."`
 * (RFC 4648 base64): binary keys and payloads survive exactly. */
void kb_cli_json_bytes(FILE *out, const char *name, const void *data, size_t len);

/* `"headers":[{"name":"…","value":"…"},…]` in order (`value_base64` for a
 * value that is not valid UTF-8); `[]` for none. */
void kb_cli_json_headers(FILE *out, const kb_header *h, size_t n);

/* `<TAB>header.NAME=VALUE` per header, in order, the value escaped. */
void kb_cli_text_headers(FILE *out, const kb_header *h, size_t n);

/* One event on stdout as `keybus consume` prints it (docs/cli.md): a
 * tab-separated text line, or with json one JSON object per line
 * (docs/schemas/keybus-consume.json). `partitions`: the topic's (0 on
 * mem://: no partition shown). The caller locks stdout when threads share
 * it. */
void kb_cli_event_print(const kb_event *ev, uint32_t partitions, bool json);

/* The CLI's own reason for a failure it returns as a KB_E* code (stdout
 * failed, lines skipped), for kb_cli_report; the library's error text is
 * the library's. Main thread only. */
void kb_cli_errf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* "keybus CMD: CLASS: text" on stderr when rc is not KB_OK, the text being
 * kb_cli_errf's when one was given since, else kb_last_error's; call it
 * before kb_close, whose own failure would replace kb_last_error's text. */
void kb_cli_report(const char *cmd, int rc);

#endif /* KB_CLI_TEXT_H */
