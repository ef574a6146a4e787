/* keybus loads into a running process with dlopen(RTLD_NOW | RTLD_LOCAL) —
 * as another language's runtime loads it — after other libraries took the
 * static TLS room, resolves its API with dlsym and handles 10,000 events on
 * mem://. argv[1]: the libkeybus.so to load, then TLS hogs, largest first.
 * ctest runs it on the build tree's copy (test_dlopen) and on an installed
 * one (dlopen_installed, tests/plugin.cmake). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <keybus/keybus.h>

static const char *lib_path;
static char **hogs;
static int n_hogs;

struct api {
    kb_conf *(*conf_new)(void);
    kb_bus *(*open)(kb_conf *, char *, size_t);
    int (*subscribe)(kb_bus *, const char *, kb_handler_fn, void *);
    kb_topic *(*topic_get)(kb_bus *, const char *, char *, size_t);
    int (*publish_to)(kb_topic *, const void *, size_t, const void *, size_t);
    int (*drain)(kb_bus *, int);
    int (*close)(kb_bus *, int);
};

static int count(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((_Atomic int *)opaque, 1);
    return KB_HANDLED;
}

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (p == NULL)
        fail_msg("dlsym %s: %s", name, dlerror());
    return p;
}

static void loads_and_handles_events(void **state)
{
    (void)state;
    int loaded = 0;
    for (int i = 0; i < n_hogs; i++)   /* until the static TLS room is (nearly) gone */
        loaded += dlopen(hogs[i], RTLD_NOW | RTLD_LOCAL) != NULL;
    assert_true(loaded > 0);
    assert_true(loaded < n_hogs);      /* some did not fit: the room is used up */
    void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        fail_msg("dlopen %s: %s", lib_path, dlerror());
    struct api a;
    *(void **)&a.conf_new = sym(lib, "kb_conf_new");
    *(void **)&a.open = sym(lib, "kb_open");
    *(void **)&a.subscribe = sym(lib, "kb_subscribe");
    *(void **)&a.topic_get = sym(lib, "kb_topic_get");
    *(void **)&a.publish_to = sym(lib, "kb_publish_to");
    *(void **)&a.drain = sym(lib, "kb_drain");
    *(void **)&a.close = sym(lib, "kb_close");

    char err[256];
    kb_bus *b = a.open(a.conf_new(), err, sizeof err);
    assert_non_null(b);
    _Atomic int handled = 0;
    assert_int_equal(a.subscribe(b, "loaded", count, &handled), KB_OK);
    kb_topic *t = a.topic_get(b, "loaded", err, sizeof err);
    assert_non_null(t);
    for (int i = 0; i < 10000; i++) {
        char key[16];
        int len = snprintf(key, sizeof key, "k%d", i % 100);
        int rc;
        while ((rc = a.publish_to(t, key, (size_t)len, &i, sizeof i)) == KB_EFULL)
            ;
        assert_int_equal(rc, KB_OK);
    }
    assert_int_equal(a.drain(b, 30000), KB_OK);
    assert_int_equal(handled, 10000);
    assert_int_equal(a.close(b, 5000), KB_OK);
    /* liburcu's threads may still run code of the library: leave it loaded */
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_dlopen LIBKEYBUS_SO TLS_HOG_SO...\n");
        return 2;
    }
    lib_path = argv[1];
    hogs = argv + 2;
    n_hogs = argc - 2;
    const struct CMUnitTest tests[] = {cmocka_unit_test(loads_and_handles_events)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
