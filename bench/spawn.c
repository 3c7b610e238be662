/* Run one program the way a runtime execs a CNI plugin; report its wall time and peak RSS.
 *
 *   spawn REPORT_FD PROGRAM [ARG...]
 *
 * stdin, stdout and stderr are the program's own. When it has exited, one line goes to
 * REPORT_FD: "<wall ns> <ru_maxrss KiB> <user us> <sys us> <wait status>".
 *
 * Why a C program: a child's ru_maxrss includes the resident memory of the process it was
 * forked from (at exec the kernel folds the old mm's high-water mark into the new one), so a
 * plugin exec'd straight from the Python bench would report the bench's RSS whenever that is
 * larger. Forked from this few-hundred-KiB process, the figure is the plugin's own. The
 * clock starts before vfork and stops after wait4: process creation, exec, the plugin's
 * work and its exit, and nothing of the (Python) caller.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long micros(struct timeval tv) { return tv.tv_sec * 1000000LL + tv.tv_usec; }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spawn REPORT_FD PROGRAM [ARG...]\n");
        return 2;
    }
    int report = atoi(argv[1]);
    if (fcntl(report, F_SETFD, FD_CLOEXEC) != 0) {
        perror("spawn: report fd");
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = vfork();
    if (pid < 0) {
        perror("spawn: vfork");
        return 2;
    }
    if (pid == 0) {
        execve(argv[2], argv + 2, environ);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("spawn: wait4");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long ns = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    dprintf(report, "%lld %ld %lld %lld %d\n", ns, ru.ru_maxrss, micros(ru.ru_utime),
            micros(ru.ru_stime), status);
    return 0;
}
