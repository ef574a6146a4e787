/* Error text: kb_errf and kb_err_clear are public (keybus/transport.h). */
#ifndef KB_CORE_ERR_H
#define KB_CORE_ERR_H

#include <keybus/transport.h>

#endif /* KB_CORE_ERR_H */
