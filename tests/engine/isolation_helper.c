/*
 * The programs of tests/engine/test_criu_isolation.py, in one statically linked binary (a container
 * root filesystem without any libc needs nothing else). Built by the test with gcc -static(-pie).
 *
 *   helper pod ROOT       PID 1 of `unshare --pid --mount --uts --ipc --fork`: makes ROOT the root of its
 *                         mount namespace (pivot_root, /proc mounted, the host's tree detached), prints
 *                         "pod ready", then reaps orphans like a pod's pause process
 *   helper spawn [MODE]   (inside a pod) starts `helper MODE` (default worker) re-parented to PID 1 in its
 *                         own session, prints its PID
 *   helper worker         fills 32 MiB with bytes derived from a random token, writes /state/ready; on
 *                         SIGUSR1 appends "token checksum count" to /state/report
 *   helper tenant         a worker that also holds one of each path CRIU restores by name, under /data:
 *                         an open file (/data/open/f, O_RDWR), a shared mapping (/data/map/f), its cwd
 *                         (/data/cwd), a listening unix socket (/data/sock/s) and a ghost file (/data/ghost/g,
 *                         open and unlinked)
 *   helper anything-else  a trojan: records that it ran as /pwned/exec-NAME and fails
 *   (-DNOLIBC -shared)    a shared object whose constructor records /pwned/so-loaded: what a planted
 *                         ld.so.preload entry, libc, CRIU plugin or NSS module would run
 *   (-DNOLIBC -static)    an ELF interpreter that records /pwned/interp-ran (a planted ld-linux.so)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef NOLIBC
/* no libc: these run under any loader (a container's, static glibc's dlopen) or as a loader */
static long raw(long n, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return ret;
}

static void mark(const char *path)
{
	long fd = raw(SYS_open, (long)path, O_WRONLY | O_CREAT, 0644);
	if (fd >= 0)
		raw(SYS_close, fd, 0, 0);
}

__attribute__((constructor)) static void loaded(void)
{
	mark("/pwned/so-loaded");
}

void _start(void)
{
	mark("/pwned/interp-ran");
	raw(SYS_exit_group, 127, 0, 0);
}
#else
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define MEM_BYTES (32u << 20)

static void die(const char *what)
{
	fprintf(stderr, "isolation_helper: %s: %s\n", what, strerror(errno));
	exit(111);
}

static void on_child(int sig)
{
	(void)sig;
}

__attribute__((noreturn)) static void pod(const char *root)
{
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
		die("make / private");
	if (mount(root, root, NULL, MS_BIND | MS_REC, NULL))
		die("bind the root");
	if (chdir(root))
		die("chdir root");
	if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		die("mount proc");
	mkdir(".oldroot", 0700);
	if (syscall(SYS_pivot_root, ".", ".oldroot"))
		die("pivot_root");
	if (chdir("/"))
		die("chdir /");
	if (umount2("/.oldroot", MNT_DETACH))
		die("detach the old root");
	rmdir("/.oldroot");
	struct sigaction sa = { .sa_handler = on_child };
	sigaction(SIGCHLD, &sa, NULL);
	sigset_t chld, none;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &none);
	sigdelset(&none, SIGCHLD);
	printf("pod ready\n");
	fflush(stdout);
	for (;;) {
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		sigsuspend(&none); /* until the next orphan exits */
	}
}

static int spawn(const char *self, const char *mode)
{
	int pfd[2];
	if (pipe(pfd))
		die("pipe");
	pid_t mid = fork();
	if (mid < 0)
		die("fork");
	if (mid == 0) {
		setsid();
		pid_t w = fork();
		if (w < 0)
			die("fork worker");
		if (w == 0) {
			close(pfd[0]);
			close(pfd[1]);
			for (int fd = 0; fd < 3; fd++)
				close(fd);
			execl(self, self, mode, (char *)NULL);
			_exit(112);
		}
		dprintf(pfd[1], "%d\n", (int)w);
		_exit(0);
	}
	close(pfd[1]);
	char buf[32] = { 0 };
	ssize_t n = read(pfd[0], buf, sizeof(buf) - 1);
	waitpid(mid, NULL, 0);
	if (n <= 0)
		die("read the worker's pid");
	fputs(buf, stdout);
	return 0;
}

static volatile sig_atomic_t asked;
static void on_usr1(int sig)
{
	(void)sig;
	asked = 1;
}

static uint64_t checksum(const unsigned char *mem, size_t len)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < len; i += 64)
		h = (h ^ mem[i]) * 1099511628211ull;
	return h;
}

static void write_file(const char *path, const char *text, int flags)
{
	int fd = open(path, O_WRONLY | O_CREAT | flags, 0644);
	if (fd < 0)
		die(path);
	if (write(fd, text, strlen(text)) < 0)
		die(path);
	close(fd);
}

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

/* what `helper tenant` holds; the test replaces one of these directories with a symlink in the restore pod */
static void hold_paths(void)
{
	static char *map;
	int fd = open("/data/open/f", O_RDWR);
	if (fd < 0)
		die("/data/open/f");
	int mfd = open("/data/map/f", O_RDWR);
	if (mfd < 0)
		die("/data/map/f");
	map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (map == MAP_FAILED)
		die("mmap /data/map/f");
	close(mfd);
	int sk = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un addr = { .sun_family = AF_UNIX, .sun_path = "/data/sock/s" };
	if (sk < 0 || bind(sk, (struct sockaddr *)&addr, sizeof(addr)) || listen(sk, 1))
		die("bind /data/sock/s");
	int g = open("/data/ghost/g", O_RDWR | O_CREAT | O_EXCL, 0600);
	if (g < 0 || write(g, "ghost\n", 6) != 6 || unlink("/data/ghost/g"))
		die("/data/ghost/g");
	if (chdir("/data/cwd"))
		die("chdir /data/cwd");
}

__attribute__((noreturn)) static void worker(int tenant)
{
	uint64_t token;
	if (getrandom(&token, sizeof(token), 0) != sizeof(token))
		die("getrandom");
	unsigned char *mem = malloc(MEM_BYTES);
	if (!mem)
		die("malloc");
	for (size_t i = 0; i < MEM_BYTES; i++)
		mem[i] = (unsigned char)((token >> ((i % 8) * 8)) + i / 4096);
	struct sigaction sa = { .sa_handler = on_usr1 };
	sigaction(SIGUSR1, &sa, NULL);
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigprocmask(SIG_BLOCK, &block, &old);
	char line[128];
	if (tenant)
		hold_paths();
	snprintf(line, sizeof(line), "%016llx %d\n", (unsigned long long)token, (int)getpid());
	write_file("/state/ready.tmp", line, O_TRUNC);
	rename("/state/ready.tmp", "/state/ready");
	for (unsigned count = 1;; count++) {
		while (!asked)
			sigsuspend(&old);
		asked = 0;
		snprintf(line, sizeof(line), "%016llx %016llx %u\n", (unsigned long long)token,
			 (unsigned long long)checksum(mem, MEM_BYTES), count);
		write_file("/state/report", line, O_APPEND);
	}
}

static int trojan(const char *argv0)
{
	const char *name = strrchr(argv0, '/');
	name = name ? name + 1 : argv0;
	char path[256];
	snprintf(path, sizeof(path), "/pwned/exec-%s", name);
	write_file(path, "ran\n", O_TRUNC);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "pod"))
		pod(argv[2]);
	if (argc >= 2 && !strcmp(argv[1], "spawn"))
		return spawn(argv[0], argc >= 3 ? argv[2] : "worker");
	if (argc >= 2 && !strcmp(argv[1], "worker"))
		worker(0);
	if (argc >= 2 && !strcmp(argv[1], "tenant"))
		worker(1);
	return trojan(argc > 0 ? argv[0] : "unknown");
}
#endif
