/* libFuzzer target: kb_url_parse and kb_url_redact on any text. A parsed
 * URL with a password is redacted to something holding "***". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/transport.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char err[256], out[8192], small[12];
    kb_url *u = kb_url_parse(text, err, sizeof err);
    kb_url_redact(text, out, sizeof out);
    kb_url_redact(text, small, sizeof small);
    if (u != NULL) {
        if ((u->password != NULL || u->user != NULL) && strstr(out, "***") == NULL)
            abort();   /* userinfo shown */
        if (u->port < 0 || u->port > 65535 || u->host == NULL || u->path == NULL)
            abort();
        kb_url_free(u);
    }
    free(text);
    return 0;
}
