/* The Redis publish backlog (redis_backlog.c) on its own, no server: records
 * in chunks that never move, written, confirmed (popped), rewound after a
 * lost connection and filtered by drop_over (in place: a record it cannot
 * report stays), records written whole counted, copied into another
 * backlog, with their bytes checked each
 * time, and the chunks it holds bounded under a load that never lets it
 * empty. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/redis/redis_int.h"

#define KIB 1024
#define CHUNK_BYTES (256 * KIB)   /* redis_backlog.c's chunk */

static kb_redis_part part;   /* records of events name a partition; the backlog never reads it */

/* An XADD whose payload of `plen` bytes starts with `seq`'s digits: its
 * bytes in the backlog. */
static size_t add(kb_redis_backlog *bl, size_t seq, size_t plen)
{
    char *pay = malloc(plen);
    assert_non_null(pay);
    char digits[24];
    int dn = snprintf(digits, sizeof digits, "%zu", seq);
    memset(pay, 'x', plen);
    memcpy(pay, digits, (size_t)dn < plen ? (size_t)dn : plen);
    const char *argv[] = {"XADD", "s", "*", "k", "key", "d", pay};
    size_t lens[] = {4, 1, 1, 1, 3, 1, plen};
    assert_true(kb__redis_backlog_add(bl, &part, plen, 7, argv, lens));
    free(pay);
    return kb__redis_backlog_cmd_bytes(7, lens);
}

/* The oldest record is the XADD add() made of seq and plen. */
static void oldest_is(const kb_redis_backlog *bl, size_t seq, size_t plen)
{
    char head[64];
    int hn = snprintf(head, sizeof head, "*7\r\n$4\r\nXADD\r\n");
    const char *b = kb__redis_backlog_oldest(bl);
    assert_memory_equal(b, head, (size_t)hn);
    char tail[40];
    int tn = snprintf(tail, sizeof tail, "$1\r\nd\r\n$%zu\r\n", plen);
    size_t len = bl->rec[bl->first].len;
    const char *pay = b + len - 2 - plen;
    assert_memory_equal(pay - tn, tail, (size_t)tn);
    char digits[24];
    int dn = snprintf(digits, sizeof digits, "%zu", seq);
    assert_memory_equal(pay, digits, (size_t)dn < plen ? (size_t)dn : plen);
    assert_memory_equal(b + len - 2, "\r\n", 2);
}

/* Write everything unsent, `step` bytes at most at a time; the bytes. */
static size_t write_all(kb_redis_backlog *bl, size_t step)
{
    size_t total = 0, len;
    while (kb__redis_backlog_unsent(bl, &len), len > 0) {
        size_t w = len < step ? len : step;
        kb__redis_backlog_wrote(bl, w);
        total += w;
    }
    return total;
}

/* Chunks in the list and spare, and their bytes. */
static size_t chunks(const kb_redis_backlog *bl, size_t *bytes)
{
    size_t n = 0;
    *bytes = 0;
    for (const kb_redis_chunk *c = bl->oldest; c != NULL; c = c->next, n++)
        *bytes += c->cap;
    for (const kb_redis_chunk *c = bl->spare; c != NULL; c = c->next, n++)
        *bytes += c->cap;
    return n;
}

/* The backlog emptied, then a record bigger than a chunk and a small one:
 * once the big one is confirmed, a lost connection resends exactly the
 * small one, and drop_over keeps it intact. */
static void big_record_after_drain(void **state)
{
    (void)state;
    kb_redis_backlog bl;
    kb__redis_backlog_init(&bl, 4096 * KIB);
    add(&bl, 1, 100);
    write_all(&bl, SIZE_MAX);
    kb__redis_backlog_pop(&bl);
    assert_int_equal(bl.n, 0);

    size_t big = add(&bl, 2, 300 * KIB);
    size_t small = add(&bl, 3, 100);
    assert_int_equal(write_all(&bl, 64 * KIB), big + small);
    oldest_is(&bl, 2, 300 * KIB);
    assert_int_equal(kb__redis_backlog_pop(&bl).len, big);

    kb__redis_backlog_rewind(&bl);   /* a lost connection */
    size_t len;
    const char *b = kb__redis_backlog_unsent(&bl, &len);
    assert_int_equal(len, small);
    assert_ptr_equal(b, kb__redis_backlog_oldest(&bl));
    oldest_is(&bl, 3, 100);
    assert_int_equal(kb__redis_backlog_bytes(&bl), small);

    assert_int_equal(kb__redis_backlog_drop_over(&bl, SIZE_MAX, NULL, NULL), 0);
    assert_int_equal(bl.n, 1);
    oldest_is(&bl, 3, 100);
    kb__redis_backlog_unsent(&bl, &len);
    assert_int_equal(len, small);
    assert_int_equal(write_all(&bl, SIZE_MAX), small);
    kb__redis_backlog_pop(&bl);
    assert_int_equal(bl.n, 0);
    assert_int_equal(kb__redis_backlog_bytes(&bl), 0);
    kb__redis_backlog_free(&bl);
}

/* Records written whole, counted across chunks (what a transient refusal
 * waits for the replies of): none before a write, a record cut by a partial
 * write not counted, records past a chunk's end counted once that chunk and
 * theirs are written; after a pop the count starts at the new oldest; a
 * rewind writes none. Copies (a rebuilt backlog) hold the same bytes. */
static void written_records(void **state)
{
    (void)state;
    kb_redis_backlog bl;
    kb__redis_backlog_init(&bl, 4096 * KIB);
    size_t a = add(&bl, 1, 100);
    add(&bl, 2, 150 * KIB);
    add(&bl, 3, 150 * KIB);   /* a chunk of its own: the second is full */
    add(&bl, 4, 100);
    assert_int_equal(kb__redis_backlog_written(&bl), 0);
    size_t len;
    kb__redis_backlog_unsent(&bl, &len);
    kb__redis_backlog_wrote(&bl, a + 10);   /* the first, and 10 bytes of the second */
    assert_int_equal(kb__redis_backlog_written(&bl), 1);
    write_all(&bl, 4 * KIB);
    assert_int_equal(kb__redis_backlog_written(&bl), 4);
    kb__redis_backlog_pop(&bl);
    assert_int_equal(kb__redis_backlog_written(&bl), 3);
    kb__redis_backlog_rewind(&bl);
    assert_int_equal(kb__redis_backlog_written(&bl), 0);

    kb_redis_backlog copy;
    kb__redis_backlog_init(&copy, 4096 * KIB);
    while (bl.n > 0) {
        kb_redis_pubrec r = bl.rec[bl.first];
        assert_true(kb__redis_backlog_copy(&copy, &r, kb__redis_backlog_oldest(&bl)));
        kb__redis_backlog_pop(&bl);
    }
    assert_int_equal(copy.n, 3);
    oldest_is(&copy, 2, 150 * KIB);
    kb__redis_backlog_pop(&copy);
    oldest_is(&copy, 3, 150 * KIB);
    kb__redis_backlog_pop(&copy);
    oldest_is(&copy, 4, 100);
    kb__redis_backlog_pop(&copy);
    kb__redis_backlog_free(&copy);
    kb__redis_backlog_free(&bl);
}

/* drop_over's callback: refuses every third record over the limit (its
 * report found no memory), counting what it was shown. */
static bool every_third_stays(void *arg, const kb_redis_pubrec *r, const char *bytes)
{
    size_t *seen = arg;
    assert_non_null(bytes);
    assert_memory_equal(bytes, "*7\r\n", 4);
    assert_true(r->big > 100 * KIB);
    return (*seen)++ % 3 != 2;
}

/* Records of 100 B and of 150 KiB (a chunk holds one or two), written, the
 * first three confirmed, the connection lost: drop_over takes the big ones
 * its callback agrees to drop, in place, and what stays comes out whole, in
 * order, written again from the oldest; then the backlog empties and works
 * as before. */
static void drop_over_in_place(void **state)
{
    (void)state;
    kb_redis_backlog bl;
    kb__redis_backlog_init(&bl, 4096 * KIB);
    size_t plen[40], bytes[40];
    for (size_t i = 0; i < 40; i++) {
        plen[i] = i % 3 == 1 ? 150 * KIB : 100;
        bytes[i] = add(&bl, i, plen[i]);
    }
    write_all(&bl, 64 * KIB);
    for (size_t i = 0; i < 3; i++) {
        oldest_is(&bl, i, plen[i]);
        kb__redis_backlog_pop(&bl);
    }
    kb__redis_backlog_rewind(&bl);
    size_t seen = 0;
    uint64_t dropped = kb__redis_backlog_drop_over(&bl, 100 * KIB, every_third_stays, &seen);
    size_t over = 0, stays = 0, kept_bytes = 0;
    bool keep[40] = {false};
    for (size_t i = 3; i < 40; i++) {
        keep[i] = plen[i] <= 100 * KIB || over++ % 3 == 2;
        stays += keep[i];
        kept_bytes += keep[i] ? bytes[i] : 0;
    }
    assert_int_equal(seen, over);
    assert_int_equal(dropped, 37 - stays);
    assert_int_equal(bl.n, stays);
    assert_int_equal(kb__redis_backlog_bytes(&bl), kept_bytes);
    assert_int_equal(write_all(&bl, 10 * KIB), kept_bytes);
    for (size_t i = 3; i < 40; i++)
        if (keep[i]) {
            oldest_is(&bl, i, plen[i]);
            kb__redis_backlog_pop(&bl);
        }
    assert_int_equal(bl.n, 0);
    assert_int_equal(kb__redis_backlog_bytes(&bl), 0);
    /* all dropped, then the backlog in use again */
    add(&bl, 50, 150 * KIB);
    add(&bl, 51, 150 * KIB);
    assert_int_equal(kb__redis_backlog_drop_over(&bl, 100 * KIB, NULL, NULL), 2);
    assert_int_equal(bl.n, 0);
    assert_int_equal(write_all(&bl, SIZE_MAX), 0);
    size_t small = add(&bl, 52, 100);
    assert_int_equal(write_all(&bl, SIZE_MAX), small);
    oldest_is(&bl, 52, 100);
    kb__redis_backlog_pop(&bl);
    kb__redis_backlog_free(&bl);
}

/* Publishes of 1 B to 250 KiB (many of 129-256 KiB, which take a chunk
 * each) under a 1 MiB bound, confirmed from the oldest but never all, with
 * partial writes and now and then a lost connection: every record comes out
 * whole and in order, and the chunks held (in use and spare) stay within
 * twice the bound plus three chunks, though far more than that passes. */
static void steady_load_recycles_chunks(void **state)
{
    (void)state;
    const size_t bound = 1024 * KIB;
    kb_redis_backlog bl;
    kb__redis_backlog_init(&bl, bound);
    size_t plen[64];   /* payload lengths of the records held, by seq % 64 */
    size_t next = 0, done = 0, passed = 0, most = 0;
    uint32_t rnd = 12345;
    for (int round = 0; round < 3000; round++) {
        rnd = rnd * 1103515245u + 12345u;
        size_t p = (rnd >> 8) % 4 == 0 ? 1 + (rnd >> 4) % 64 : 1 + (rnd >> 4) % (250 * KIB);
        if (bl.n == 0 || kb__redis_backlog_bytes(&bl) + p + 64 <= bound) {
            assert_true(next - done < 64);
            plen[next % 64] = p;
            passed += add(&bl, next++, p);
        }
        write_all(&bl, 1 + (rnd >> 12) % (200 * KIB));
        if (round % 97 == 0) {   /* a lost connection: everything unconfirmed again */
            kb__redis_backlog_rewind(&bl);
            write_all(&bl, 100 * KIB);
        }
        while (bl.n > 1 && (kb__redis_backlog_bytes(&bl) > bound / 2 || (rnd >> 16) % 2)) {
            oldest_is(&bl, done, plen[done % 64]);
            kb__redis_backlog_pop(&bl);
            done++;
            rnd = rnd * 1103515245u + 12345u;
        }
        assert_true(bl.n > 0);
        size_t bytes;
        size_t n = chunks(&bl, &bytes);
        if (n > most)
            most = n;
        assert_true(bytes <= 2 * bound + 3 * CHUNK_BYTES);
        assert_true(bl.spares <= bound / CHUNK_BYTES);
    }
    assert_true(passed > 50 * bound);   /* the bound's worth many times over */
    assert_true(most <= 2 * bound / CHUNK_BYTES + 3);
    while (bl.n > 0) {
        oldest_is(&bl, done, plen[done % 64]);
        kb__redis_backlog_pop(&bl);
        done++;
    }
    assert_int_equal(done, next);
    size_t bytes;
    assert_true(chunks(&bl, &bytes) <= bound / CHUNK_BYTES + 1);   /* the spares trimmed */
    kb__redis_backlog_free(&bl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(big_record_after_drain),
        cmocka_unit_test(drop_over_in_place),
        cmocka_unit_test(written_records),
        cmocka_unit_test(steady_load_recycles_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
