/* Plugins that must not load: built once with KB_FIXTURE_ABI (an entry
 * returning a table for another transport ABI) and once with
 * KB_FIXTURE_NO_ENTRY (a shared object that exports no entry at all). */
#include <keybus/transport.h>

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
