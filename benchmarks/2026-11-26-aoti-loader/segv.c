/* LD_PRELOAD: on SIGSEGV print the native backtrace (dynamic symbols) to stderr. */
#define _GNU_SOURCE
#include <signal.h>
#include <execinfo.h>
#include <unistd.h>
static void on_segv(int sig) { void *frames[64]; int n = backtrace(frames, 64); backtrace_symbols_fd(frames, n, 2); _exit(139); }
__attribute__((constructor)) static void install(void) { struct sigaction sa = {0}; sa.sa_handler = on_segv; sigaction(SIGSEGV, &sa, 0); }
