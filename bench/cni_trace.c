/* A timing shim that stands in for one CNI plugin and logs every exec a runtime makes of it.
 *
 * Layout (made by bench/runtime_pods.py), TRACE being any directory:
 *   TRACE/bin/NAME    a copy of this program: the runtime's CNI bin dir is TRACE/bin
 *   TRACE/real/NAME   the plugin it stands for (a symlink to ours or Go's)
 *   TRACE/exec.log    one line appended per exec
 *
 * The shim finds its own path through /proc/self/exe (a runtime may exec it through a
 * symlink), runs TRACE/real/NAME with the same argv, environment, stdin, stdout and stderr,
 * waits for it and exits with its status. Then it appends, in one write(2) (O_APPEND: lines
 * of concurrent execs do not interleave):
 *   "NAME CNI_COMMAND CNI_CONTAINERID START_NS WALL_NS USER_US SYS_US MAXRSS_KIB STATUS"
 * START_NS is CLOCK_MONOTONIC, the clock of Python's time.monotonic_ns(), so the bench can
 * place each exec inside the runtime call it made. Wall time runs from before vfork to after
 * wait4, as in bench/spawn.c; the shim's own exec is outside it and alike for every plugin.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long micros(struct timeval tv) { return tv.tv_sec * 1000000LL + tv.tv_usec; }

static const char *env_or_dash(const char *key) {
    const char *v = getenv(key);
    return (v != NULL && *v != '\0' && strchr(v, ' ') == NULL) ? v : "-";
}

int main(int argc, char **argv) {
    (void)argc;
    char self[PATH_MAX], dirbuf[PATH_MAX], namebuf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        perror("cni_trace: /proc/self/exe");
        return 2;
    }
    self[n] = '\0';
    strcpy(dirbuf, self);
    strcpy(namebuf, self);
    const char *name = basename(namebuf);
    char *bin = dirname(dirbuf);  /* TRACE/bin */
    char *trace = dirname(bin);   /* TRACE */
    char real[PATH_MAX], log[PATH_MAX];
    snprintf(real, sizeof(real), "%s/real/%s", trace, name);
    snprintf(log, sizeof(log), "%s/exec.log", trace);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = vfork();
    if (pid < 0) {
        perror("cni_trace: vfork");
        return 2;
    }
    if (pid == 0) {
        execve(real, argv, environ);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("cni_trace: wait4");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long start = t0.tv_sec * 1000000000LL + t0.tv_nsec;
    long long wall = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    char line[512];
    int len = snprintf(line, sizeof(line), "%s %s %s %lld %lld %lld %lld %ld %d\n", name,
                       env_or_dash("CNI_COMMAND"), env_or_dash("CNI_CONTAINERID"), start, wall,
                       micros(ru.ru_utime), micros(ru.ru_stime), ru.ru_maxrss, status);
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)len) != len) {
            perror("cni_trace: log");
        }
        close(fd);
    }
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
