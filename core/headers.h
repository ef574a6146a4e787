/* Event headers: checking them against the limits, and their compact form
 * inside an event record (one block after key, payload and ID). */
#ifndef KB_CORE_HEADERS_H
#define KB_CORE_HEADERS_H

#include <stddef.h>
#include <stdint.h>

#include <keybus/keybus.h>

#define KB_MAX_HEADERS 64          /* limits.max_headers' ceiling */
#define KB_MAX_HEADER_NAME 64

/* KB_OK, or KB_EINVAL / KB_ETOOBIG with kb_last_error naming the header and
 * the rule (`what` starts the message: "kb_publish orders"). */
int kb__headers_check(const kb_header *h, size_t n, size_t max_n, size_t max_bytes,
                      const char *what);

/* Bytes the record block of these (checked) headers takes. */
size_t kb__headers_size(const kb_header *h, size_t n);

/* Write the block: per header, name length (1 byte), name, NUL, value length
 * (4 bytes, little-endian), value. */
void kb__headers_write(char *dst, const kb_header *h, size_t n);

/* Read n headers back from a block into out[0..n); names and values point
 * into the block. */
void kb__headers_read(const char *src, size_t n, kb_header *out);

#endif /* KB_CORE_HEADERS_H */
