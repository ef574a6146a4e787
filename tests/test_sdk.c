/* The transport SDK's shared mechanisms (include/keybus/transport.h): the one
 * rendezvous ranking both brokers use, the growable array, error text, URL
 * redaction, and the checks on a transport's ops table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/transport.h>

#include "support/check.h"

#define PARTS 4096

static void owners(const char *const *members, size_t n, long *out)
{
    for (uint32_t p = 0; p < PARTS; p++)
        out[p] = kb_rendezvous_owner(members, n, p);
}

/* A member joining takes about 1/(n+1) of the partitions, and only from the
 * others; one leaving moves only its own; the order of the list does not
 * matter; the spread is even. */
static void rendezvous_moves_little_and_agrees(void **state)
{
    (void)state;
    const char *four[] = {"host-a-1", "host-b-2", "host-c-3", "host-d-4"};
    const char *five[] = {"host-a-1", "host-b-2", "host-c-3", "host-d-4", "host-e-5"};
    const char *shuffled[] = {"host-c-3", "host-a-1", "host-d-4", "host-b-2"};
    static long before[PARTS], after[PARTS], other_order[PARTS];
    owners(four, 4, before);
    owners(five, 5, after);
    owners(shuffled, 4, other_order);
    size_t moved = 0, per_member[4] = {0};
    for (uint32_t p = 0; p < PARTS; p++) {
        if (after[p] != before[p]) {
            moved++;
            assert_int_equal(after[p], 4);   /* only to the newcomer */
        }
        per_member[before[p]]++;
        assert_string_equal(shuffled[other_order[p]], four[before[p]]);
    }
    /* 1/5 of 4096 is 819: wide slack, it is a hash */
    assert_in_range(moved, PARTS / 5 - 200, PARTS / 5 + 200);
    for (int m = 0; m < 4; m++)
        assert_in_range(per_member[m], PARTS / 4 - 250, PARTS / 4 + 250);
    /* the newcomer leaves again: exactly its partitions go back */
    long again[PARTS];
    owners(four, 4, again);
    assert_memory_equal(again, before, sizeof again);
    assert_int_equal(kb_rendezvous_owner(four, 0, 7), -1);
    /* a name given twice ties with itself: the same index wins everywhere */
    const char *twins[] = {"same", "same"};
    assert_int_equal(kb_rendezvous_owner(twins, 2, 3), 0);
}

static void vec_grows_and_keeps(void **state)
{
    (void)state;
    int *v = NULL;
    size_t cap = 0;
    for (int i = 0; i < 1000; i++) {
        kb_assert_ok(kb_vec_reserve((void **)&v, &cap, (size_t)i + 1, sizeof *v));
        v[i] = i;
    }
    assert_true(cap >= 1000);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(v[i], i);
    size_t huge = cap;
    assert_int_equal(kb_vec_reserve((void **)&v, &huge, SIZE_MAX / 2, sizeof *v), KB_ENOMEM);
    assert_int_equal(huge, cap);   /* unchanged on failure */
    free(v);
    assert_true(kb_mix64(1) != kb_mix64(2));
}

/* A name set keeps each name once, in the order first added, copied. */
static void names_keep_each_once(void **state)
{
    (void)state;
    kb_names s = {0};
    kb_assert_ok(kb_names_add(&s, "billing-x", 7));
    kb_assert_ok(kb_names_add(&s, "audit", 5));
    kb_assert_ok(kb_names_add(&s, "billing", 7));
    kb_assert_ok(kb_names_add(&s, "bill", 4));
    assert_int_equal(s.n, 3);
    assert_string_equal(s.v[0], "billing");
    assert_string_equal(s.v[1], "audit");
    assert_string_equal(s.v[2], "bill");
    assert_true(kb_names_has(&s, "audit", 5));
    assert_false(kb_names_has(&s, "audi", 4));
    kb_names_free(&s);
    assert_int_equal(s.n, 0);
    assert_null(s.v);
}

static void error_text_may_quote_itself(void **state)
{
    (void)state;
    kb_errf(NULL, 0, "first reason");
    char err[128];
    kb_errf(err, sizeof err, "outer: %s", kb_last_error());
    assert_string_equal(err, "outer: first reason");
    assert_string_equal(kb_last_error(), "outer: first reason");
    kb_err_clear();
    assert_string_equal(kb_last_error(), "");
}

static void redaction_hides_every_password_form(void **state)
{
    (void)state;
    const char *urls[] = {
        "redis://:hunter2@h:6379/0", "redis://user:hunter2@h", "redis://user:hunter2",
        "redis://:hunter2", "redis:/:hunter2@10.0.0.5:6379", "nats://hunter2@h:4222",
        "redis://u:hun/ter2@h", NULL};
    char out[256];
    for (size_t i = 0; urls[i] != NULL; i++) {
        kb_url_redact(urls[i], out, sizeof out);
        if (strstr(out, "hunter2") != NULL || strstr(out, "ter2") != NULL)
            fail_msg("%s redacted to %s", urls[i], out);
    }
    assert_string_equal(kb_url_redact("redis://h:6379/2", out, sizeof out), "redis://h:6379/2");
    assert_string_equal(kb_url_redact("nats://[::1]:4222", out, sizeof out), "nats://[::1]:4222");
}

static int no_open(kb_transport **t, kb_bus *b, const kb_conf *c, char *e, size_t n)
{
    (void)t, (void)b, (void)c, (void)e, (void)n;
    return KB_ETRANSPORT;
}
static int no_topic(kb_transport *t, const char *n, kb_transport_topic **o, char *e, size_t l)
{
    (void)t, (void)n, (void)o, (void)e, (void)l;
    return KB_ETRANSPORT;
}
static int no_sub(kb_transport *t, kb_transport_topic *tt, kb_sink *s)
{
    (void)t, (void)tt, (void)s;
    return KB_ETRANSPORT;
}
static int no_dead(kb_transport *t, const kb_delivery *d, const char *r)
{
    (void)t, (void)d, (void)r;
    return KB_ETRANSPORT;
}
static int no_close(kb_transport *t, int64_t deadline)
{
    (void)t, (void)deadline;
    return KB_OK;
}

static const kb_conf_prop bad_default[] = {
    {"toy.knob", KB_CONF_INT, "0", 1, 100, "below its own minimum", NULL},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL, NULL},
};
static const kb_conf_prop good_props[] = {
    {"toy.knob", KB_CONF_INT, "7", 1, 100, "a knob", NULL},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL, NULL},
};

/* Tables that would break later confs are refused at registration; a
 * transport registered after a conf was made still gets its keys at kb_open;
 * schemes compare without case. */
static void transport_tables_are_checked(void **state)
{
    (void)state;
    kb_transport_ops ops = {
        .abi_version = KB_TRANSPORT_ABI, .scheme = "toy", .flags = KB_TRANSPORT_F_LOCAL,
        .props = bad_default, .open = no_open, .topic_open = no_topic, .subscribe = no_sub,
        .dead_letter = no_dead, .close = no_close,
    };
    assert_int_equal(kb_transport_register(&ops), KB_EINVAL);
    static kb_transport_ops broker;
    broker = ops;
    broker.flags = 0;
    broker.props = good_props;
    assert_int_equal(kb_transport_register(&broker), KB_EINVAL);   /* no publish, no stop */
    kb_conf *later = kb_conf_new();   /* nothing half-registered poisons later confs */
    assert_non_null(later);
    kb_conf_destroy(later);

    kb_conf *early = kb_conf_new();
    static kb_transport_ops good;
    good = ops;
    good.props = good_props;
    kb_assert_ok(kb_transport_register(&good));
    char err[256];
    kb_assert_ok(kb_conf_set(early, "transport", "TOY://", err, sizeof err));
    assert_null(kb_open(early, err, sizeof err));      /* the toy refuses to open... */
    assert_int_equal(kb_conf_int(early, "toy.knob"), 7);   /* ...with its defaults in */
    kb_conf_destroy(early);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rendezvous_moves_little_and_agrees),
        cmocka_unit_test(vec_grows_and_keeps),
        cmocka_unit_test(names_keep_each_once),
        cmocka_unit_test(error_text_may_quote_itself),
        cmocka_unit_test(redaction_hides_every_password_form),
        cmocka_unit_test(transport_tables_are_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
