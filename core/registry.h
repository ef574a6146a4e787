/* Transports by URL scheme: built-ins, registered ones and plugins. */
#ifndef KB_CORE_REGISTRY_H
#define KB_CORE_REGISTRY_H

#include <stddef.h>

#include <keybus/transport.h>

/* The built-in transports, in scheme-lookup order: a source the build
 * generates from the transports it compiles in (each transport's
 * CMakeLists.txt names its ops tables; cmake/builtin_transports.c.in). */
extern const kb_transport_ops *const kb__builtin_transports[];
extern const size_t kb__builtin_transports_n;

/* The transport whose scheme is the first `len` bytes of `scheme`, or NULL. */
const kb_transport_ops *kb__transport_find(const char *scheme, size_t len);

/* Transports known now, built-ins first; the list only grows, and entries
 * below kb__transport_count() never change. Thread: any. */
size_t kb__transport_count(void);
const kb_transport_ops *kb__transport_at(size_t i);

/* "mem, redis, nats" into buf. */
void kb__transport_schemes(char *buf, size_t len);

/* dlopen and register each path of a comma-separated list. */
int kb__transport_load_plugins(const char *list, char *errstr, size_t errlen);

#endif /* KB_CORE_REGISTRY_H */
