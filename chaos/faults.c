/* Faults inside one process of a chaos run, loaded with LD_PRELOAD (chaos/faults.py builds it):
 *
 * - clock skew: the wall clock (CLOCK_REALTIME, gettimeofday, time) is off by some nanoseconds;
 *   the monotonic clocks, which timeouts and sleeps use, are left alone;
 * - a slow disk: each write to a regular file sleeps some microseconds first.
 *
 * The run changes both at any moment through a small file this library maps read-only
 * (MQSPARK_CHAOS_CONTROL): two int64 values, the skew in nanoseconds and the delay per write in
 * microseconds. Without that variable, or with zeros in the file, every call passes straight through.
 * The same process tree shares the file: a Spark driver's JVM and Python workers inherit it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *control;

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_gettimeofday)(struct timeval *, void *);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);

/* The real functions are looked up at their first call: another library's constructor may call
 * them before this one's runs (Python 3.13's mimalloc reads the clock as it loads). */
#define RESOLVE(name) \
    if (real_##name == NULL) real_##name = dlsym(RTLD_NEXT, #name)

__attribute__((constructor)) static void start(void) {
    const char *path = getenv("MQSPARK_CHAOS_CONTROL");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *mapped = mmap(NULL, 2 * sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped != MAP_FAILED) control = mapped;
}

static int64_t skew(void) { return control == NULL ? 0 : control[0]; }

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + skew();
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    RESOLVE(clock_gettime);
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) && skew() != 0) shift(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    RESOLVE(gettimeofday);
    int rc = real_gettimeofday(tv, tz);
    if (rc == 0 && skew() != 0) {
        int64_t us = (int64_t)tv->tv_sec * 1000000 + tv->tv_usec + skew() / 1000;
        tv->tv_sec = us / 1000000;
        tv->tv_usec = us % 1000000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}

static void slow(int fd) {
    int64_t delay = control == NULL ? 0 : control[1];
    struct stat st;
    if (delay > 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) usleep((useconds_t)delay);
}

ssize_t write(int fd, const void *buf, size_t count) {
    slow(fd);
    RESOLVE(write);
    return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    slow(fd);
    RESOLVE(pwrite);
    return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    slow(fd);
    RESOLVE(pwrite64);
    return real_pwrite64(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    slow(fd);
    RESOLVE(writev);
    return real_writev(fd, iov, count);
}
