#include <keybus/keybus.h>
#include <stdio.h>
#include <string.h>

static int on_order(const kb_event *ev, void *opaque)
{
    int *last = opaque;   /* events of one aggregate arrive in order */
    int seq = ((const char *)ev->payload)[0] - '0';
    if (seq == *last + 1)
        *last = seq;
    return KB_HANDLED;
}

int main(void)
{
    char err[256];
    kb_conf *conf = kb_conf_new();
    if (kb_conf_set(conf, "pool.workers", "1024", err, sizeof err) != KB_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kb_bus *bus = kb_open(conf, err, sizeof err);   /* mem:// unless KEYBUS_TRANSPORT says otherwise */
    if (bus == NULL) {
        fprintf(stderr, "kb_open: %s\n", err);
        kb_conf_destroy(conf);
        return 1;
    }
    /* every call returns KB_OK or a KB_E* code; kb_last_error() says why */
    int last = 0, rc = kb_subscribe(bus, "orders.events", on_order, &last);
    for (char seq = '1'; seq <= '3' && rc == KB_OK; seq++)
        rc = kb_publish(bus, "orders.events", "order-123", strlen("order-123"), &seq, 1);
    if (rc == KB_OK)
        rc = kb_drain(bus, 10000);   /* handled, on every transport (kb_flush: stored) */
    if (rc == KB_OK)
        printf("handled %d events of order-123 in order\n", last);
    else
        fprintf(stderr, "%s: %s\n", kb_strerror(rc), kb_last_error());
    if (kb_close(bus, 5000) != KB_OK) {
        fprintf(stderr, "kb_close: %s\n", kb_last_error());
        return 1;
    }
    return rc == KB_OK ? 0 : 1;
}
