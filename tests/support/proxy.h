/* Test harness: a TCP proxy between keybus and a real broker that can stop
 * forwarding without closing anything — the network black-holes packets, the
 * connections stay open — and resume later. */
#ifndef KB_TEST_PROXY_H
#define KB_TEST_PROXY_H

typedef struct kb_test_proxy kb_test_proxy;

/* Listen on a free 127.0.0.1 port and forward every connection to
 * 127.0.0.1:target_port. NULL on failure (message on stderr). */
kb_test_proxy *kb_test_proxy_start(int target_port);

/* The port to connect to instead of the broker's. */
int kb_test_proxy_port(const kb_test_proxy *p);

/* on: stop moving bytes in both directions (connections stay open, new ones
 * are accepted and connected but carry nothing); off: forward again, the
 * bytes held meanwhile first. Returns when the proxy thread has applied it. */
void kb_test_proxy_blackhole(kb_test_proxy *p, int on);

/* Hold what is read from either side for ms before writing it on (0: at
 * once), from the next read on: a slow network or a loaded broker, nothing
 * lost. Reads queue behind each other, each held ms from when it was read,
 * up to 4 MiB per direction; then the proxy reads no more until some went. */
void kb_test_proxy_delay(kb_test_proxy *p, int ms);

/* The same for the connections accepted as the first+1-th and later only
 * (counted from 0, while none closed), also new ones: one client's second
 * connection cut, its first still forwarding. */
void kb_test_proxy_blackhole_from(kb_test_proxy *p, int first);

/* Close the connections accepted as the first+1-th and later, dropping the
 * bytes held for them (what the broker sent them is lost on the wire, as
 * when the node under a connection dies), then forward everything again:
 * their clients reconnect through the proxy. */
void kb_test_proxy_drop_from(kb_test_proxy *p, int first);

/* Black-hole every connection (as kb_test_proxy_blackhole on) right after
 * the proxy forwarded, whole, bytes a client sent that contain `needle` (in
 * one read of up to 64 KiB): the broker got the request, its answer is held.
 * Returns 0 once on, -1 if no such bytes came within timeout_ms (disarmed). */
int kb_test_proxy_blackhole_after(kb_test_proxy *p, const char *needle, int timeout_ms);

/* Close every connection and the listener; free. */
void kb_test_proxy_stop(kb_test_proxy *p);

#endif /* KB_TEST_PROXY_H */
