/* Transports by URL scheme. */
#ifndef KB_CORE_REGISTRY_H
#define KB_CORE_REGISTRY_H

#include <stddef.h>

#include <keybus/transport.h>

/* The transport whose scheme is the first `len` bytes of `scheme`, or NULL. */
const kb_transport_ops *kb__transport_find(const char *scheme, size_t len);

/* "mem, redis, nats" into buf. */
void kb__transport_schemes(char *buf, size_t len);

#endif /* KB_CORE_REGISTRY_H */
