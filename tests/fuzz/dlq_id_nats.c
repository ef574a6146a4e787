/* fuzz_dlq_id, nats: a replay ID is a stream sequence, 1 or more. */
#include <stdlib.h>
#include <string.h>

#include "../../transports/nats/nats_msg.h"
#include "dlq_id.h"

void fuzz_nats_id(const char *s)
{
    uint64_t got = 0, want = 0;
    bool ok = kb__nats_seq_parse(s, &got);
    bool shape = fuzz_digits(s, strlen(s), &want) && want != 0;
    if (ok != shape || (ok && got != want))
        abort();
}
