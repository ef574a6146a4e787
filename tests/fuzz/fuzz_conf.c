/* libFuzzer target: kb_conf_set with any key and value ("key=value": the
 * input up to its first '=' is the key), then kb_conf_get of that key. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *eq = strchr(text, '=');
    const char *value = "";
    if (eq != NULL) {
        *eq = '\0';
        value = eq + 1;
    }
    /* transport.plugins dlopens what it names: not for a fuzzer to choose */
    if (strcmp(text, "transport.plugins") != 0) {
        kb_conf *c = kb_conf_new();
        char err[256], buf[64];
        if (c != NULL) {
            kb_conf_set(c, text, value, err, sizeof err);
            kb_conf_get(c, text, buf, sizeof buf);
            kb_conf_destroy(c);
        }
    }
    free(text);
    return 0;
}
