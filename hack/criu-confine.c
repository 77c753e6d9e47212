/*
 * Path confinement for podsnap's static CRIU (hack/build-criu.sh links it with --wrap= for every libc
 * function CRIU resolves a path with).
 *
 * In namespace mode the agent runs CRIU as root with every capability inside a workload container's
 * mount namespace, its root the container's root (hack's _nsenter chroots it there). Every path of the
 * workload that CRIU opens, creates, links, binds or stats (open files, mapped files, cwd and root,
 * ghost and link-remap files, FIFOs, unix socket names, inotify watches) is then named by the workload,
 * and the workload owns every directory on the way: a symlink `/data/d -> /proc/self/cwd/../../proc/1`
 * made CRIU open the host's /proc/1/mem for a restored tenant. The kernel already stops `..` and absolute
 * symlinks at the process root; what crosses it is a magic link (/proc/PID/{cwd,root,fd/N,map_files/..}
 * of CRIU itself, whose cwd and image fds are the agent's directories) and a path resolved from a
 * starting point outside the root (the work dir, the images dir). So every path goes through `classify`:
 *
 *   TENANT   a start inside the process root (an absolute path, or a directory reachable from the root by
 *            `..`): resolved with openat2(RESOLVE_NO_MAGICLINKS). Nothing but a magic link leaves the root,
 *            so this keeps the whole walk, every symlink and `..` included, inside the container. A result
 *            on procfs under the CRIU process's own /proc/PID is refused too (its memory, its fds).
 *   PRIVATE  a start outside the root (the images and work dirs the agent hands over as /proc/self/fd/N):
 *            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS: only CRIU's own files there.
 *   PROC     CRIU's own /proc: an absolute "/proc..." path, or a start on procfs. CRIU needs the magic
 *            links there (map_files, fd, ns); no workload can create anything in procfs, and the paths CRIU
 *            records for workload files are canonical (d_path: a magic link is never in the middle of one).
 *
 * An operation on a name (mkdir, mknod, symlink, link, unlink, rename, utimes) resolves the parent that
 * way and acts on the last component relative to it, so a symlink at the last component is never followed.
 * An operation the kernel resolves itself from a path (chmod, inotify_add_watch, mount, umount) gets the
 * object resolved here, as /proc/self/fd/N. Unix socket names are the workload's own strings, not
 * canonical paths, and bind/connect take no descriptor: they run in a short-lived child with a private copy
 * of the mount table in which every procfs is detached and no descriptor but the socket is open, so no
 * magic link exists for the kernel's walk of the name.
 *
 * Whatever is refused fails with the errno the kernel gave (ELOOP, EXDEV) or EACCES, and an "Error
 * (podsnap confine)" line in CRIU's log naming the path: the agent's message quotes CRIU's first error.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_faccessat2
#define SYS_faccessat2 439
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* CRIU's logger (criu/log.c); weak, so compel's host tool links this file too */
extern void print_on_level(unsigned int loglevel, const char *format, ...) __attribute__((weak));
#define CONFINE_LOG_ERROR 1

static void refused(const char *path, const char *why)
{
	int saved = errno;
	if (print_on_level)
		print_on_level(CONFINE_LOG_ERROR, "Error (podsnap confine): %s: %s (not resolved inside the container's root)\n",
			       path ? path : "(null)", why);
	errno = saved;
}

enum kind { TENANT, PRIVATE, PROC };

struct ident {
	unsigned long long mnt, ino;
	unsigned int dev_major, dev_minor;
};

/* the CRIU process's own pid (in the namespace it runs in): set before main, inherited by its children */
static pid_t criu_pid;

__attribute__((constructor)) static void remember_pid(void)
{
	criu_pid = (pid_t)syscall(SYS_getpid);
}

static int ident_of(int dirfd, const char *path, int flags, struct ident *id)
{
	struct statx sx;

	if (syscall(SYS_statx, dirfd, path, flags | AT_STATX_SYNC_AS_STAT, STATX_INO | STATX_MNT_ID, &sx) < 0)
		return -1;
	id->mnt = sx.stx_mnt_id;
	id->ino = sx.stx_ino;
	id->dev_major = sx.stx_dev_major;
	id->dev_minor = sx.stx_dev_minor;
	return 0;
}

static int same(const struct ident *a, const struct ident *b)
{
	return a->mnt == b->mnt && a->ino == b->ino && a->dev_major == b->dev_major && a->dev_minor == b->dev_minor;
}

/* whether a directory is reachable from the process root by `..`, cached per (root, directory) */
#define CACHE 64
static struct {
	struct ident root, dir;
	int reachable;
} cache[CACHE];
static unsigned int cache_next;

static int reachable(int dirfd)
{
	struct ident root, start, cur, up;
	int fd, next, depth, result = 0;
	unsigned int i;

	if (ident_of(AT_FDCWD, "/", 0, &root) || ident_of(dirfd, "", AT_EMPTY_PATH, &start))
		return 0;
	for (i = 0; i < CACHE; i++)
		if (same(&cache[i].root, &root) && same(&cache[i].dir, &start))
			return cache[i].reachable;
	fd = (int)syscall(SYS_openat, dirfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	cur = start;
	for (depth = 0; depth < 4096; depth++) {
		if (same(&cur, &root)) {
			result = 1;
			break;
		}
		next = (int)syscall(SYS_openat, fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (next < 0)
			break;
		close(fd);
		fd = next;
		if (ident_of(fd, "", AT_EMPTY_PATH, &up) || same(&up, &cur))
			break; /* the top of the mount tree, never past the root: outside it */
		cur = up;
	}
	close(fd);
	i = cache_next++ % CACHE;
	cache[i].root = root;
	cache[i].dir = start;
	cache[i].reachable = result;
	return result;
}

static int on_procfs(int fd)
{
	struct statfs st;

	return syscall(SYS_fstatfs, fd, &st) == 0 && st.f_type == PROC_SUPER_MAGIC;
}

static int is_proc_path(const char *path)
{
	return strncmp(path, "/proc", 5) == 0 && (path[5] == '\0' || path[5] == '/');
}

static enum kind classify(int dirfd, const char *path)
{
	int base, kind;

	if (path[0] == '/')
		return is_proc_path(path) ? PROC : TENANT;
	base = dirfd;
	if (dirfd == AT_FDCWD) {
		base = (int)syscall(SYS_openat, AT_FDCWD, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (base < 0)
			return PRIVATE;
	}
	if (on_procfs(base))
		kind = PROC;
	else
		kind = reachable(base) ? TENANT : PRIVATE;
	if (base != dirfd)
		close(base);
	return kind;
}

static unsigned long long resolve_flags(enum kind kind)
{
	if (kind == PRIVATE)
		return RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
	return RESOLVE_NO_MAGICLINKS;
}

/* a TENANT result on procfs must not be a file of the CRIU process itself (its memory, fds, environment) */
static int foreign_proc(int fd)
{
	char link[64], target[4096];
	ssize_t n;
	long pid;
	char *end;

	if (!on_procfs(fd))
		return 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = syscall(SYS_readlinkat, AT_FDCWD, link, target, sizeof(target) - 1);
	if (n < 0)
		return 1;
	target[n] = '\0';
	if (strncmp(target, "/proc/", 6) != 0)
		return 0;
	pid = strtol(target + 6, &end, 10);
	return end != target + 6 && (*end == '/' || *end == '\0') && pid == criu_pid;
}

/* what open(2) takes from its flags; openat2 refuses the rest, where open(2) drops it (the flags CRIU
 * restores a file with come from /proc/PID/fdinfo and may hold kernel-internal bits) */
#define OPEN_FLAGS                                                                                           \
	(O_ACCMODE | O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC | O_APPEND | O_NONBLOCK | O_SYNC | O_DSYNC | O_ASYNC | \
	 O_DIRECT | O_LARGEFILE | O_DIRECTORY | O_NOFOLLOW | O_NOATIME | O_CLOEXEC | O_PATH | __O_TMPFILE)
#define PATH_FLAGS (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

/* O_TMPFILE holds O_DIRECTORY's bit: only all of its bits mean O_TMPFILE */
static int takes_mode(int flags)
{
	return (flags & O_CREAT) || (flags & __O_TMPFILE) == __O_TMPFILE;
}

static int resolve(int dirfd, const char *path, int flags, mode_t mode, enum kind kind)
{
	struct open_how how = { .resolve = resolve_flags(kind) };
	int fd;

	flags &= OPEN_FLAGS;
	if (flags & O_PATH)
		flags &= PATH_FLAGS;
	how.flags = (unsigned long long)(unsigned int)flags;
	if (takes_mode(flags))
		how.mode = mode & 07777;
	fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	if (fd < 0) {
		if (errno == ELOOP || errno == EXDEV)
			refused(path, errno == ELOOP ? "a magic link or symlink on the way" : "it leaves its directory");
		else if (errno == ENOSYS)
			refused(path, "this kernel has no openat2 (Linux 5.6+ is needed)");
		return -1;
	}
	if (kind == TENANT && foreign_proc(fd)) {
		close(fd);
		refused(path, "a file of the CRIU process's own /proc");
		errno = EACCES;
		return -1;
	}
	return fd;
}

/* an O_PATH descriptor of `path` as the rules say, following a last symlink unless `nofollow` */
static int object(int dirfd, const char *path, int nofollow)
{
	return resolve(dirfd, path, O_PATH | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0), 0, classify(dirfd, path));
}

/* the parent directory of `path` as the rules say; its last component in `last` (never "", "." or "..") */
static int parent(int dirfd, const char *path, char *last, size_t size)
{
	char buf[PATH_MAX];
	const char *dir;
	char *slash;
	size_t len = strlen(path);

	if (len == 0 || len >= sizeof(buf)) {
		errno = len ? ENAMETOOLONG : ENOENT;
		return -1;
	}
	memcpy(buf, path, len + 1);
	while (len > 1 && buf[len - 1] == '/')
		buf[--len] = '\0';
	slash = strrchr(buf, '/');
	if (slash == NULL) {
		dir = ".";
		snprintf(last, size, "%s", buf);
	} else {
		snprintf(last, size, "%s", slash + 1);
		if (slash == buf)
			slash[1] = '\0';
		else
			*slash = '\0';
		dir = buf;
	}
	if (!last[0] || !strcmp(last, ".") || !strcmp(last, "..")) {
		errno = EINVAL;
		return -1;
	}
	return resolve(dirfd, dir, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, classify(dirfd, path));
}

static void proc_fd_path(char *buf, size_t size, int fd)
{
	snprintf(buf, size, "/proc/self/fd/%d", fd);
}

#define CLOSE_KEEP_ERRNO(fd)                \
	do {                                \
		int saved_errno_ = errno;   \
		close(fd);                  \
		errno = saved_errno_;       \
	} while (0)

/* --- opens ------------------------------------------------------------------------------------------- */

static int confined_open(int dirfd, const char *path, int flags, mode_t mode)
{
	enum kind kind = classify(dirfd, path);

	if (kind == PROC)
		return (int)syscall(SYS_openat, dirfd, path, flags, mode);
	return resolve(dirfd, path, flags, mode, kind);
}

static mode_t mode_arg(int flags, va_list ap)
{
	return takes_mode(flags) ? (mode_t)va_arg(ap, int) : 0;
}

int __wrap_open64(const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;

	va_start(ap, flags);
	mode = mode_arg(flags, ap);
	va_end(ap);
	return confined_open(AT_FDCWD, path, flags, mode);
}

int __wrap_openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;

	va_start(ap, flags);
	mode = mode_arg(flags, ap);
	va_end(ap);
	return confined_open(dirfd, path, flags, mode);
}

int __wrap_creat64(const char *path, mode_t mode)
{
	return confined_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

static int fopen_flags(const char *mode)
{
	int flags;

	switch (mode[0]) {
	case 'r':
		flags = O_RDONLY;
		break;
	case 'w':
		flags = O_WRONLY | O_CREAT | O_TRUNC;
		break;
	case 'a':
		flags = O_WRONLY | O_CREAT | O_APPEND;
		break;
	default:
		return -1;
	}
	for (mode++; *mode; mode++) {
		if (*mode == '+')
			flags = (flags & ~O_ACCMODE) | O_RDWR;
		else if (*mode == 'e')
			flags |= O_CLOEXEC;
		else if (*mode == 'x')
			flags |= O_EXCL;
	}
	return flags;
}

FILE *__wrap_fopen64(const char *path, const char *mode)
{
	int flags = fopen_flags(mode), fd;
	FILE *f;

	if (flags < 0) {
		errno = EINVAL;
		return NULL;
	}
	fd = confined_open(AT_FDCWD, path, flags, 0666);
	if (fd < 0)
		return NULL;
	f = fdopen(fd, mode);
	if (f == NULL)
		CLOSE_KEEP_ERRNO(fd);
	return f;
}

FILE *__wrap_tmpfile64(void)
{
	int fd = confined_open(AT_FDCWD, "/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	FILE *f;

	if (fd < 0)
		return NULL;
	f = fdopen(fd, "w+");
	if (f == NULL)
		CLOSE_KEEP_ERRNO(fd);
	return f;
}

DIR *__wrap_opendir(const char *path)
{
	int fd = confined_open(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	DIR *d;

	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (d == NULL)
		CLOSE_KEEP_ERRNO(fd);
	return d;
}

int __wrap_scandir64(const char *path, struct dirent64 ***list, int (*filter)(const struct dirent64 *),
		     int (*compar)(const struct dirent64 **, const struct dirent64 **))
{
	int fd = confined_open(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0), n;

	if (fd < 0)
		return -1;
	n = scandirat64(fd, ".", list, filter, compar);
	CLOSE_KEEP_ERRNO(fd);
	return n;
}

/* glibc's nftw walks by path: only CRIU's own /proc may be walked that way */
int __wrap_nftw64(const char *path, int (*fn)(const char *, const struct stat64 *, int, struct FTW *), int nopenfd,
		  int flags)
{
	extern int __real_nftw64(const char *, int (*)(const char *, const struct stat64 *, int, struct FTW *), int,
				 int);

	if (!is_proc_path(path)) {
		refused(path, "a recursive walk by path");
		errno = EACCES;
		return -1;
	}
	return __real_nftw64(path, fn, nopenfd, flags);
}

/* CRIU walks cgroupfs this way, through /proc/self/fd/N of its own cgroupfs descriptor */
int __wrap_ftw64(const char *path, int (*fn)(const char *, const struct stat64 *, int), int nopenfd)
{
	extern int __real_ftw64(const char *, int (*)(const char *, const struct stat64 *, int), int);

	if (!is_proc_path(path)) {
		refused(path, "a recursive walk by path");
		errno = EACCES;
		return -1;
	}
	return __real_ftw64(path, fn, nopenfd);
}

/* --- stat-like ---------------------------------------------------------------------------------------- */

int __wrap_fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
	int fd, ret;

	if ((flags & AT_EMPTY_PATH) && path[0] == '\0')
		return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
	if (classify(dirfd, path) == PROC)
		return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
	fd = object(dirfd, path, flags & AT_SYMLINK_NOFOLLOW);
	if (fd < 0)
		return -1;
	ret = (int)syscall(SYS_newfstatat, fd, "", st, AT_EMPTY_PATH);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_stat64(const char *path, struct stat64 *st)
{
	return __wrap_fstatat64(AT_FDCWD, path, st, 0);
}

int __wrap_statfs64(const char *path, struct statfs64 *st)
{
	int fd, ret;

	if (classify(AT_FDCWD, path) == PROC)
		return (int)syscall(SYS_statfs, path, st);
	fd = object(AT_FDCWD, path, 0);
	if (fd < 0)
		return -1;
	ret = (int)syscall(SYS_fstatfs, fd, st);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_faccessat(int dirfd, const char *path, int mode, int flags)
{
	int fd, ret;

	if (classify(dirfd, path) == PROC)
		return (int)syscall(SYS_faccessat2, dirfd, path, mode, flags);
	fd = object(dirfd, path, flags & AT_SYMLINK_NOFOLLOW);
	if (fd < 0)
		return -1;
	ret = (int)syscall(SYS_faccessat2, fd, "", mode, AT_EMPTY_PATH | (flags & AT_EACCESS));
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_access(const char *path, int mode)
{
	return __wrap_faccessat(AT_FDCWD, path, mode, 0);
}

ssize_t __wrap_readlinkat(int dirfd, const char *path, char *buf, size_t size)
{
	ssize_t n;
	int fd;

	if (path[0] == '\0' || classify(dirfd, path) == PROC)
		return syscall(SYS_readlinkat, dirfd, path, buf, size);
	fd = object(dirfd, path, 1);
	if (fd < 0)
		return -1;
	n = syscall(SYS_readlinkat, fd, "", buf, size);
	CLOSE_KEEP_ERRNO(fd);
	return n;
}

ssize_t __wrap_readlink(const char *path, char *buf, size_t size)
{
	return __wrap_readlinkat(AT_FDCWD, path, buf, size);
}

/* --- where CRIU stands --------------------------------------------------------------------------------- */

int __wrap_chdir(const char *path)
{
	int fd, ret;

	if (classify(AT_FDCWD, path) == PROC)
		return (int)syscall(SYS_chdir, path);
	fd = resolve(AT_FDCWD, path, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, classify(AT_FDCWD, path));
	if (fd < 0)
		return -1;
	ret = (int)syscall(SYS_fchdir, fd);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_chroot(const char *path)
{
	int fd, cwd, ret;

	if (!strcmp(path, ".") || classify(AT_FDCWD, path) == PROC)
		return (int)syscall(SYS_chroot, path);
	fd = object(AT_FDCWD, path, 0);
	if (fd < 0)
		return -1;
	cwd = (int)syscall(SYS_openat, AT_FDCWD, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	ret = (int)syscall(SYS_fchdir, fd);
	if (ret == 0)
		ret = (int)syscall(SYS_chroot, ".");
	if (cwd >= 0) {
		int saved = errno;
		syscall(SYS_fchdir, cwd);
		close(cwd);
		errno = saved;
	}
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

/* --- names: the parent resolved here, the last component acted on relative to it ----------------------- */

#define AT_PARENT(dirfd, path, call)                                       \
	do {                                                               \
		char last_[NAME_MAX + 1];                                  \
		int pfd_, ret_;                                            \
		if (classify((dirfd), (path)) == PROC)                     \
			return -2; /* the caller passes it to the kernel */ \
		pfd_ = parent((dirfd), (path), last_, sizeof(last_));      \
		if (pfd_ < 0)                                              \
			return -1;                                         \
		ret_ = (int)(call);                                        \
		CLOSE_KEEP_ERRNO(pfd_);                                    \
		return ret_;                                               \
	} while (0)

static int at_mkdir(int dirfd, const char *path, mode_t mode)
{
	AT_PARENT(dirfd, path, syscall(SYS_mkdirat, pfd_, last_, mode));
}

int __wrap_mkdirat(int dirfd, const char *path, mode_t mode)
{
	int ret = at_mkdir(dirfd, path, mode);
	return ret == -2 ? (int)syscall(SYS_mkdirat, dirfd, path, mode) : ret;
}

int __wrap_mkdir(const char *path, mode_t mode)
{
	return __wrap_mkdirat(AT_FDCWD, path, mode);
}

static int at_mknod(int dirfd, const char *path, mode_t mode, dev_t dev)
{
	AT_PARENT(dirfd, path, syscall(SYS_mknodat, pfd_, last_, mode, dev));
}

int __wrap_mknod(const char *path, mode_t mode, dev_t dev)
{
	int ret = at_mknod(AT_FDCWD, path, mode, dev);
	return ret == -2 ? (int)syscall(SYS_mknodat, AT_FDCWD, path, mode, dev) : ret;
}

static int at_symlink(const char *target, int dirfd, const char *path)
{
	AT_PARENT(dirfd, path, syscall(SYS_symlinkat, target, pfd_, last_));
}

int __wrap_symlinkat(const char *target, int dirfd, const char *path)
{
	int ret = at_symlink(target, dirfd, path);
	return ret == -2 ? (int)syscall(SYS_symlinkat, target, dirfd, path) : ret;
}

int __wrap_symlink(const char *target, const char *path)
{
	return __wrap_symlinkat(target, AT_FDCWD, path);
}

static int at_unlink(int dirfd, const char *path, int flags)
{
	AT_PARENT(dirfd, path, syscall(SYS_unlinkat, pfd_, last_, flags));
}

int __wrap_unlinkat(int dirfd, const char *path, int flags)
{
	int ret = at_unlink(dirfd, path, flags);
	return ret == -2 ? (int)syscall(SYS_unlinkat, dirfd, path, flags) : ret;
}

int __wrap_unlink(const char *path)
{
	return __wrap_unlinkat(AT_FDCWD, path, 0);
}

int __wrap_rmdir(const char *path)
{
	return __wrap_unlinkat(AT_FDCWD, path, AT_REMOVEDIR);
}

int __wrap_remove(const char *path)
{
	int ret = __wrap_unlinkat(AT_FDCWD, path, 0);

	if (ret < 0 && errno == EISDIR)
		ret = __wrap_unlinkat(AT_FDCWD, path, AT_REMOVEDIR);
	return ret;
}

static int at_utimes(const char *path, const struct timespec ts[2])
{
	AT_PARENT(AT_FDCWD, path, syscall(SYS_utimensat, pfd_, last_, ts, AT_SYMLINK_NOFOLLOW));
}

int __wrap_lutimes(const char *path, const struct timeval tv[2])
{
	struct timespec ts[2], *tsp = NULL;
	int ret;

	if (tv) {
		ts[0].tv_sec = tv[0].tv_sec;
		ts[0].tv_nsec = tv[0].tv_usec * 1000;
		ts[1].tv_sec = tv[1].tv_sec;
		ts[1].tv_nsec = tv[1].tv_usec * 1000;
		tsp = ts;
	}
	ret = at_utimes(path, tsp);
	return ret == -2 ? (int)syscall(SYS_utimensat, AT_FDCWD, path, tsp, AT_SYMLINK_NOFOLLOW) : ret;
}

int __wrap_renameat(int odir, const char *opath, int ndir, const char *npath)
{
	char olast[NAME_MAX + 1], nlast[NAME_MAX + 1];
	int ofd, nfd, ret;

	if (classify(odir, opath) == PROC || classify(ndir, npath) == PROC)
		return (int)syscall(SYS_renameat2, odir, opath, ndir, npath, 0);
	ofd = parent(odir, opath, olast, sizeof(olast));
	if (ofd < 0)
		return -1;
	nfd = parent(ndir, npath, nlast, sizeof(nlast));
	if (nfd < 0) {
		CLOSE_KEEP_ERRNO(ofd);
		return -1;
	}
	ret = (int)syscall(SYS_renameat2, ofd, olast, nfd, nlast, 0);
	CLOSE_KEEP_ERRNO(ofd);
	CLOSE_KEEP_ERRNO(nfd);
	return ret;
}

int __wrap_rename(const char *opath, const char *npath)
{
	return __wrap_renameat(AT_FDCWD, opath, AT_FDCWD, npath);
}

int __wrap_linkat(int odir, const char *opath, int ndir, const char *npath, int flags)
{
	char olast[NAME_MAX + 1], nlast[NAME_MAX + 1];
	int ofd = -1, nfd, ret;
	const char *oname;
	int oflags;

	if (classify(ndir, npath) == PROC)
		return (int)syscall(SYS_linkat, odir, opath, ndir, npath, flags);
	if ((flags & AT_EMPTY_PATH) && opath[0] == '\0') {
		oname = "";
		oflags = AT_EMPTY_PATH;
	} else if (classify(odir, opath) == PROC) {
		/* CRIU links a file it holds through /proc/PID/fd/N: its own descriptor, not a path */
		oname = NULL;
		oflags = flags;
	} else if (flags & AT_SYMLINK_FOLLOW) {
		ofd = object(odir, opath, 0);
		if (ofd < 0)
			return -1;
		oname = "";
		oflags = AT_EMPTY_PATH;
	} else {
		ofd = parent(odir, opath, olast, sizeof(olast));
		if (ofd < 0)
			return -1;
		oname = olast;
		oflags = 0;
	}
	nfd = parent(ndir, npath, nlast, sizeof(nlast));
	if (nfd < 0) {
		if (ofd >= 0)
			CLOSE_KEEP_ERRNO(ofd);
		return -1;
	}
	if (oname == NULL)
		ret = (int)syscall(SYS_linkat, odir, opath, nfd, nlast, oflags);
	else if (ofd >= 0)
		ret = (int)syscall(SYS_linkat, ofd, oname, nfd, nlast, oflags);
	else
		ret = (int)syscall(SYS_linkat, odir, oname, nfd, nlast, oflags);
	if (ofd >= 0)
		CLOSE_KEEP_ERRNO(ofd);
	CLOSE_KEEP_ERRNO(nfd);
	return ret;
}

/* --- calls the kernel resolves itself: given the object resolved here, as /proc/self/fd/N --------------- */

int __wrap_fchmodat(int dirfd, const char *path, mode_t mode, int flags)
{
	char p[64];
	int fd, ret;

	if (classify(dirfd, path) == PROC)
		return (int)syscall(SYS_fchmodat, dirfd, path, mode);
	if (flags & AT_SYMLINK_NOFOLLOW) {
		errno = EOPNOTSUPP;
		return -1;
	}
	fd = object(dirfd, path, 0);
	if (fd < 0)
		return -1;
	proc_fd_path(p, sizeof(p), fd);
	ret = (int)syscall(SYS_fchmodat, AT_FDCWD, p, mode);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_chmod(const char *path, mode_t mode)
{
	return __wrap_fchmodat(AT_FDCWD, path, mode, 0);
}

int __wrap_fchownat(int dirfd, const char *path, uid_t uid, gid_t gid, int flags)
{
	int fd, ret;

	if (((flags & AT_EMPTY_PATH) && path[0] == '\0') || classify(dirfd, path) == PROC)
		return (int)syscall(SYS_fchownat, dirfd, path, uid, gid, flags);
	fd = object(dirfd, path, flags & AT_SYMLINK_NOFOLLOW);
	if (fd < 0)
		return -1;
	ret = (int)syscall(SYS_fchownat, fd, "", uid, gid, AT_EMPTY_PATH);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_inotify_add_watch(int ifd, const char *path, uint32_t mask)
{
	char p[64];
	int fd, ret;

	if (classify(AT_FDCWD, path) == PROC)
		return (int)syscall(SYS_inotify_add_watch, ifd, path, mask);
	fd = object(AT_FDCWD, path, mask & IN_DONT_FOLLOW);
	if (fd < 0)
		return -1;
	proc_fd_path(p, sizeof(p), fd);
	ret = (int)syscall(SYS_inotify_add_watch, ifd, p, mask & ~IN_DONT_FOLLOW);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_fanotify_mark(int fan, unsigned int flags, uint64_t mask, int dirfd, const char *path)
{
	int fd, ret;

	if (path == NULL || classify(dirfd, path) == PROC)
		return (int)syscall(SYS_fanotify_mark, fan, flags, mask, dirfd, path);
	fd = object(dirfd, path, flags & FAN_MARK_DONT_FOLLOW);
	if (fd < 0)
		return -1;
	ret = (int)syscall(SYS_fanotify_mark, fan, flags & ~FAN_MARK_DONT_FOLLOW, mask, fd, NULL);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_mount(const char *source, const char *target, const char *fstype, unsigned long flags, const void *data)
{
	char t[64], s[64];
	int tfd = -1, sfd = -1, ret;
	const char *src = source;

	if (target && classify(AT_FDCWD, target) != PROC) {
		tfd = object(AT_FDCWD, target, 0);
		if (tfd < 0)
			return -1;
		proc_fd_path(t, sizeof(t), tfd);
		target = t;
	}
	if (source && (flags & (MS_BIND | MS_MOVE)) && classify(AT_FDCWD, source) != PROC) {
		sfd = object(AT_FDCWD, source, 0);
		if (sfd < 0) {
			if (tfd >= 0)
				CLOSE_KEEP_ERRNO(tfd);
			return -1;
		}
		proc_fd_path(s, sizeof(s), sfd);
		src = s;
	}
	ret = (int)syscall(SYS_mount, src, target, fstype, flags, data);
	if (sfd >= 0)
		CLOSE_KEEP_ERRNO(sfd);
	if (tfd >= 0)
		CLOSE_KEEP_ERRNO(tfd);
	return ret;
}

int __wrap_umount2(const char *target, int flags)
{
	char t[64];
	int fd, ret;

	if (classify(AT_FDCWD, target) == PROC)
		return (int)syscall(SYS_umount2, target, flags);
	fd = object(AT_FDCWD, target, flags & UMOUNT_NOFOLLOW);
	if (fd < 0)
		return -1;
	proc_fd_path(t, sizeof(t), fd);
	ret = (int)syscall(SYS_umount2, t, flags & ~UMOUNT_NOFOLLOW);
	CLOSE_KEEP_ERRNO(fd);
	return ret;
}

int __wrap_umount(const char *target)
{
	return __wrap_umount2(target, 0);
}

int __wrap_pivot_root(const char *new_root, const char *put_old)
{
	(void)put_old;
	refused(new_root, "pivot_root (podsnap never restores mount namespaces)");
	errno = EPERM;
	return -1;
}

char *__wrap_mkdtemp(char *template)
{
	size_t len = strlen(template);
	unsigned char rnd[6];
	int tries, i;
	static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

	if (len < 6 || strcmp(template + len - 6, "XXXXXX")) {
		errno = EINVAL;
		return NULL;
	}
	for (tries = 0; tries < 100; tries++) {
		if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			return NULL;
		for (i = 0; i < 6; i++)
			template[len - 6 + i] = chars[rnd[i] % (sizeof(chars) - 1)];
		if (__wrap_mkdir(template, 0700) == 0)
			return template;
		if (errno != EEXIST)
			return NULL;
	}
	errno = EEXIST;
	return NULL;
}

/* --- unix socket names --------------------------------------------------------------------------------- */

/*
 * The kernel walks a socket's name itself, following every link on the way, and takes no descriptor. The
 * call runs in a child that holds nothing outside the container: a private copy of the mount table with
 * every procfs detached (no magic link left anywhere) and no descriptor but the socket. The socket is the
 * same object in both processes, so what the child binds or connects is the caller's.
 */
static int detach_procfs(void)
{
	char buf[1 << 16], *line, *save, points[64][PATH_MAX];
	ssize_t n, got = 0;
	int fd, count = 0, i;

	fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0; /* no procfs where we stand: nothing to detach */
	while ((n = read(fd, buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
		got += n;
	close(fd);
	buf[got] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char point[PATH_MAX], *sep = strstr(line, " - ");
		if (sep == NULL || strncmp(sep + 3, "proc ", 5) != 0)
			continue;
		if (sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 || count == 64)
			return -1;
		snprintf(points[count++], PATH_MAX, "%s", point);
	}
	for (i = count - 1; i >= 0; i--) /* mountinfo lists parents first */
		if (syscall(SYS_umount2, points[i], MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
			return -1;
	return 0;
}

static int socket_call(int connect_it, int sock, const struct sockaddr *addr, socklen_t len)
{
	const struct sockaddr_un *un = (const struct sockaddr_un *)addr;
	size_t off = offsetof(struct sockaddr_un, sun_path);
	char name[sizeof(un->sun_path) + 1];
	int status;
	pid_t pid;

	if (addr == NULL || addr->sa_family != AF_UNIX || len <= off || un->sun_path[0] == '\0')
		return (int)syscall(connect_it ? SYS_connect : SYS_bind, sock, addr, len);
	snprintf(name, sizeof(name), "%.*s", (int)(len - off), un->sun_path);
	if (is_proc_path(name) || (name[0] != '/' && classify(AT_FDCWD, name) != TENANT)) {
		refused(name, "a unix socket name outside the container");
		errno = EACCES;
		return -1;
	}
	pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
	if (pid < 0)
		return -1;
	if (pid == 0) {
		long r;
		if (syscall(SYS_unshare, CLONE_NEWNS) || syscall(SYS_mount, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    detach_procfs())
			_exit(EACCES);
		if (sock > 0)
			syscall(SYS_close_range, 0, (unsigned int)sock - 1, 0);
		syscall(SYS_close_range, (unsigned int)sock + 1, ~0U, 0);
		r = syscall(connect_it ? SYS_connect : SYS_bind, sock, addr, len);
		_exit(r == 0 ? 0 : (errno & 0xff));
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	if (!WIFEXITED(status)) {
		errno = EIO;
		return -1;
	}
	if (WEXITSTATUS(status) != 0) {
		errno = WEXITSTATUS(status);
		if (errno == ELOOP || errno == ENOENT || errno == EACCES)
			refused(name, connect_it ? "connect" : "bind");
		return -1;
	}
	return 0;
}

int __wrap_bind(int sock, const struct sockaddr *addr, socklen_t len)
{
	return socket_call(0, sock, addr, len);
}

int __wrap_connect(int sock, const struct sockaddr *addr, socklen_t len)
{
	return socket_call(1, sock, addr, len);
}
