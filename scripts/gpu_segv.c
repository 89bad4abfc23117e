/* A native backtrace for a crash where no gdb is installed (the GPU image has none; cuda-gdb may be slow).
 * scripts/gpu_matrix.py compiles it (cc -shared -fPIC -O1 gpu_segv.c -o libgpu_segv.so -ldl) and reruns a crashing
 * cell with LD_PRELOAD=libgpu_segv.so: on SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT it writes the faulting address, the
 * program counter's library and offset (dladdr) and glibc's backtrace to stderr, then dies of the same signal. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static char altstack[1 << 17];

static void say(const char *text, int len) {
    if (len > 0 && write(2, text, (size_t)len) < 0) { /* nothing else can be done in a handler */ }
}

static void on_fatal(int sig, siginfo_t *si, void *raw) {
    char line[512];
    void *frames[64];
    int n = backtrace(frames, 64);
    say(line, snprintf(line, sizeof line, "gpu_segv: signal %d (%s), fault address %p, thread %ld\n", sig,
                       strsignal(sig), si->si_addr, (long)gettid()));
#if defined(__x86_64__)
    ucontext_t *uc = raw;
    void *pc = (void *)uc->uc_mcontext.gregs[REG_RIP];
    Dl_info info;
    if (dladdr(pc, &info) && info.dli_fname)
        say(line, snprintf(line, sizeof line, "gpu_segv: pc %p = %s + %#lx (%s)\n", pc, info.dli_fname,
                           (unsigned long)((char *)pc - (char *)info.dli_fbase), info.dli_sname ? info.dli_sname : "?"));
#else
    (void)raw;
#endif
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
