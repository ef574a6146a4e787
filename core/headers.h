/* Event headers: checking and the packed block are public
 * (keybus/transport.h); the record stores headers in that packed form. */
#ifndef KB_CORE_HEADERS_H
#define KB_CORE_HEADERS_H

#include <keybus/transport.h>

#endif /* KB_CORE_HEADERS_H */
