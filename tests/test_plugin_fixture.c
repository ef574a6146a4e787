/* Plugins that must not load: built once with KB_FIXTURE_ABI (an entry
 * returning a table for another transport ABI) and once with
 * KB_FIXTURE_NO_ENTRY (a shared object that exports no entry at all), the
 * second time with KB_FIXTURE_MARKER too: its constructor creates the file
 * named by KB_TEST_MARKER, which shows whether any of its code ran. */
#include <keybus/transport.h>

#ifdef KB_FIXTURE_MARKER
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void kb_fixture_mark(void)
{
    const char *path = getenv("KB_TEST_MARKER");
    int fd = path != NULL ? open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) : -1;
    if (fd >= 0)
        close(fd);
}
#endif

#ifdef KB_FIXTURE_NO_ENTRY
int kb_fixture_not_a_plugin(void);
int kb_fixture_not_a_plugin(void)
{
    return 0;
}
#else
static const kb_transport_ops old_ops = {
    .abi_version = KB_FIXTURE_ABI,
    .scheme = "old",
};

const kb_transport_ops *kb_transport_plugin(void);
const kb_transport_ops *kb_transport_plugin(void)
{
    return &old_ops;
}
#endif
