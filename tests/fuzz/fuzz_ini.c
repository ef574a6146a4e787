/* libFuzzer target: the INI reader of kb_conf_load, on the input as a file's
 * text (kb__conf_load_text). */
#include <stdint.h>
#include <string.h>

#include <keybus/keybus.h>

#include "core/conf_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* transport.plugins dlopens what it names: not for a fuzzer to choose */
    if (memmem(data, size, "plugins", 7) != NULL)
        return 0;
    kb_conf *c = kb_conf_new();
    if (c == NULL)
        return 0;
    char err[256];
    kb__conf_load_text(c, "fuzz.ini", (const char *)data, size, err, sizeof err);
    kb_conf_destroy(c);
    return 0;
}
