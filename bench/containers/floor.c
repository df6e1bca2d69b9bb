/* The syscall floor as a process of its own: what any scanner that starts, looks and exits has
 * to ask the kernel, and nothing more. It lists /proc, reads each process's mount namespace
 * link, keeps the first process of each namespace other than PID 1's, and per such container
 * opens its root (/proc/PID/root, O_PATH), openat2's dev/shm beneath it (RESOLVE_IN_ROOT |
 * RESOLVE_NO_SYMLINKS), fstatvfs'es it, and reads its memory cgroup's usage and limit (the
 * cgroup from /proc/PID/cgroup). It prints the number of containers measured.
 *
 *   floor [--cgroup-root DIR] [--under PREFIX] [--reps R]
 *
 * --cgroup-root: where the memory hierarchy is (default /sys/fs/cgroup: v2 there, else v1's
 * memory/ below it); --under: count only containers whose memory cgroup path starts with
 * PREFIX (the bench's own, when other containers run beside them; the hierarchy is still the
 * host's, where that path is); --reps: scans in one process (default 1; a process per scan is
 * what `check` is compared with). A container counts only once its usage and limit were read:
 * a floor that skipped them (a hierarchy where the paths are not) would be no floor.
 *
 * Built by bench/containers/run.sh: cc -O2 -o target/bench/floor bench/containers/floor.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_NS 65536

static unsigned long long seen[MAX_NS];
static int nseen;

static int was_seen(unsigned long long ns) {
    for (int i = 0; i < nseen; i++)
        if (seen[i] == ns) return 1;
    if (nseen < MAX_NS) seen[nseen++] = ns;
    return 0;
}

static unsigned long long ns_of(const char *pid) {
    char path[300], link[64];
    snprintf(path, sizeof path, "/proc/%s/ns/mnt", pid);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0) return 0;
    link[n] = 0;
    char *open = strchr(link, '[');
    return open ? strtoull(open + 1, NULL, 10) : 0;
}

/* The process's memory cgroup path: v2's "0::/path" or v1's "N:...memory...:/path". */
static int memcg_of(const char *pid, int v2, char *out, size_t size) {
    char path[300], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/cgroup", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        int wanted = v2 ? (c2 == c1 + 1 && line[0] == '0')
                        : (strstr(c1, "memory") != NULL && strstr(c1, "memory") < c2);
        if (wanted) {
            snprintf(out, size, "%s", c2 + 1);
            return 0;
        }
    }
    return -1;
}

/* The number in `file` of the open directory `dir` into *out; -1 when it cannot be read. */
static int read_u64(int dir, const char *file, unsigned long long *out) {
    char buf[64];
    int fd = openat(dir, file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    *out = strtoull(buf, NULL, 10);
    return 0;
}

static volatile unsigned long long sink;

static int scan(const char *hierarchy, int v2, const char *under) {
    nseen = 0;
    unsigned long long host = ns_of("1");
    DIR *proc = opendir("/proc");
    if (!proc) return -1;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(proc))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        unsigned long long ns = ns_of(e->d_name);
        if (!ns || ns == host || was_seen(ns)) continue;
        char cg[4096], dir_path[8192], root_path[300];
        if (memcg_of(e->d_name, v2, cg, sizeof cg) < 0) continue;
        if (under && strncmp(cg, under, strlen(under)) != 0) continue;
        snprintf(root_path, sizeof root_path, "/proc/%s/root", e->d_name);
        int root = open(root_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0) continue;
        struct open_how how = {
            .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
            .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        int shm = syscall(SYS_openat2, root, "dev/shm", &how, sizeof how);
        close(root);
        struct statvfs vfs = {0};
        if (shm >= 0) {
            fstatvfs(shm, &vfs);
            close(shm);
        }
        snprintf(dir_path, sizeof dir_path, "%s%s", hierarchy, cg);
        int dir = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        unsigned long long usage = 0, limit = 0;
        int read = -1;
        if (dir >= 0) {
            read = read_u64(dir, v2 ? "memory.current" : "memory.usage_in_bytes", &usage);
            /* v2's "max" reads as no number: the read is what counts. */
            read |= read_u64(dir, v2 ? "memory.max" : "memory.limit_in_bytes", &limit);
            close(dir);
        }
        if (read < 0) continue;
        sink += vfs.f_blocks + vfs.f_bfree + usage + limit;
        found++;
    }
    closedir(proc);
    return found;
}

int main(int argc, char **argv) {
    const char *root = "/sys/fs/cgroup", *under = NULL;
    int reps = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--cgroup-root")) root = argv[i + 1];
        else if (!strcmp(argv[i], "--under")) under = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: floor [--cgroup-root DIR] [--under PREFIX] [--reps R]\n"); return 2; }
    }
    char hierarchy[4096], probe[4096];
    snprintf(probe, sizeof probe, "%s/cgroup.controllers", root);
    int v2 = access(probe, F_OK) == 0;
    snprintf(hierarchy, sizeof hierarchy, v2 ? "%s" : "%s/memory", root);
    int found = 0;
    for (int r = 0; r < reps; r++) found = scan(hierarchy, v2, under);
    if (found < 0) { perror("floor: /proc"); return 2; }
    printf("%d\n", found);
    return 0;
}
