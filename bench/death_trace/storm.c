/* SIGBUS storm for bench/death_trace/race.py: forks RATE children a second for SECS seconds;
 * each maps a one-page file it has truncated to nothing and touches it: a page-fault SIGBUS
 * (BUS_ADRERR), as the kernel sends a process that touches a mapped page past the file's end. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void fault(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 0) != 0) _exit(1);
    volatile char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) _exit(1);
    p[0] = 1; /* SIGBUS */
    _exit(0);
}

int main(int argc, char **argv) {
    int rate = argc > 1 ? atoi(argv[1]) : 1000, secs = argc > 2 ? atoi(argv[2]) : 30;
    const char *path = argc > 3 ? argv[3] : "/tmp/shmlink-storm";
    long total = (long)rate * secs, done = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < total; i++) {
        /* Paced: child i starts at i / rate seconds. */
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            double t = (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
            if (t * rate >= i) break;
            struct timespec nap = {0, 200000};
            nanosleep(&nap, NULL);
        }
        pid_t pid = fork();
        if (pid == 0) fault(path);
        while (waitpid(-1, NULL, WNOHANG) > 0) done++;
    }
    while (wait(NULL) > 0) done++;
    clock_gettime(CLOCK_MONOTONIC, &now);
    printf("%ld faults in %.1f s\n", total,
           (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9);
    return 0;
}
