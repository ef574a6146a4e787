/* fuzz_dlq_id's two files: the redis and mem:// IDs, and the nats ones. */
#ifndef KB_TESTS_FUZZ_DLQ_ID_H
#define KB_TESTS_FUZZ_DLQ_ID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decimal digits only, n of them (at least one), their value in *v; false
 * when something else is in s or the value needs more than 64 bits. */
bool fuzz_digits(const char *s, size_t n, uint64_t *v);
/* kb__nats_seq_parse on s, checked; aborts on a wrong answer. */
void fuzz_nats_id(const char *s);

#endif /* KB_TESTS_FUZZ_DLQ_ID_H */
