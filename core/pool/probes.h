/* USDT trace points (docs/tracing.md): provider "keybus". Each is a single
 * nop in the code until perf or bpftrace attaches to it; the arguments are
 * values already in registers. Built without <sys/sdt.h> they vanish. */
#ifndef KB_CORE_PROBES_H
#define KB_CORE_PROBES_H

#ifdef KB_HAVE_SDT
#include <sys/sdt.h>
#define KB_PROBE2(name, a, b) STAP_PROBE2(keybus, name, a, b)
#define KB_PROBE3(name, a, b, c) STAP_PROBE3(keybus, name, a, b, c)
#define KB_PROBE4(name, a, b, c, d) STAP_PROBE4(keybus, name, a, b, c, d)
#define KB_PROBE5(name, a, b, c, d, e) STAP_PROBE5(keybus, name, a, b, c, d, e)
#else
#define KB_PROBE2(name, a, b) ((void)0)
#define KB_PROBE3(name, a, b, c) ((void)0)
#define KB_PROBE4(name, a, b, c, d) ((void)0)
#define KB_PROBE5(name, a, b, c, d, e) ((void)0)
#endif

#endif /* KB_CORE_PROBES_H */
