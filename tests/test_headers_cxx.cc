// The public headers compile as C++, and a program written only from them works.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
extern "C" {
#include <cmocka.h>   // cmocka 1.1 has no C++ guards
}

#include <atomic>
#include <cstring>

#include <keybus/keybus.h>
#include <keybus/pool.h>
#include <keybus/transport.h>
#include <keybus/kit.h>

#include "support/check.h"

static std::atomic<int> seen{0};

static void publish_and_handle_from_cxx(void **)
{
    char err[256];
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "pool.threads", "1", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    auto handler = [](const kb_event *ev, void *) -> int {
        if (ev->key_len == 9 && std::memcmp(ev->key, "order-123", 9) == 0)
            seen++;
        return KB_HANDLED;
    };
    kb_assert_ok(kb_subscribe(b, "orders.events", handler, nullptr));
    kb_assert_ok(kb_publish(b, "orders.events", "order-123", 9, "{}", 2));
    kb_assert_ok(kb_flush(b, 5000));
    assert_int_equal(seen.load(), 1);
    kb_assert_ok(kb_close(b, 1000));
    assert_int_equal(kb_fnv1a32("a", 1), 0xe40c292cu);
}

int main()
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(publish_and_handle_from_cxx)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
