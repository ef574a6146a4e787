#include <keybus/keybus.h>

const char *kb_version(void)
{
    return KB_VERSION_STRING;
}
