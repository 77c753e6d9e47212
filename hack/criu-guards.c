/*
 * Link-time guards for podsnap's static CRIU (hack/build-criu.sh).
 *
 * The agent runs CRIU inside a workload container's mount namespace, as root with every capability,
 * so every file CRIU would execute or load from there is chosen by the workload: `sh`, `iptables`,
 * `ip`, `tar`, `apparmor_parser`, plugins in the plugin dir, and the NSS modules glibc loads for name
 * lookups. The build links CRIU with `--wrap=` for each entry point below, so these stubs replace
 * them and the static binary contains no code that can execute a program or load a shared object;
 * hack/build-criu.sh checks that with `nm`. CRIU features that need a helper program fail instead,
 * with the message below in CRIU's log; podsnap uses none of them (`network-lock skip`, `tcp-close`).
 */
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#define REFUSED "podsnap's static CRIU never executes programs or loads code"

static int refuse_exec(const char *what)
{
	dprintf(2, "%s: refused to run %s\n", REFUSED, what ? what : "(null)");
	errno = EPERM;
	return -1;
}

int __wrap_execvp(const char *file, char *const argv[])
{
	(void)argv;
	return refuse_exec(file);
}

int __wrap_execvpe(const char *file, char *const argv[], char *const envp[])
{
	(void)argv;
	(void)envp;
	return refuse_exec(file);
}

int __wrap_execve(const char *path, char *const argv[], char *const envp[])
{
	(void)argv;
	(void)envp;
	return refuse_exec(path);
}

int __wrap_execlp(const char *file, const char *arg, ...)
{
	(void)arg;
	return refuse_exec(file);
}

void *__wrap_dlopen(const char *file, int mode)
{
	(void)mode;
	dprintf(2, "%s: refused to load %s\n", REFUSED, file ? file : "(null)");
	return NULL;
}

char *__wrap_dlerror(void)
{
	return (char *)"plugins are disabled (" REFUSED ")";
}

void *__wrap_dlsym(void *handle, const char *symbol)
{
	(void)handle;
	(void)symbol;
	return NULL;
}

int __wrap_dlclose(void *handle)
{
	(void)handle;
	return 0;
}

/*
 * Name lookups (glibc's NSS loads modules named in the container's /etc/nsswitch.conf): only the page
 * server and lazy pages (--address) and libnet/libnl helpers that CRIU does not call use them.
 */
int __wrap_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res)
{
	(void)node;
	(void)service;
	(void)hints;
	(void)res;
	return EAI_FAIL;
}

void __wrap_freeaddrinfo(struct addrinfo *res)
{
	(void)res;
}

int __wrap_getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen, char *serv,
		       socklen_t servlen, int flags)
{
	(void)sa;
	(void)salen;
	(void)host;
	(void)hostlen;
	(void)serv;
	(void)servlen;
	(void)flags;
	return EAI_FAIL;
}

static struct hostent *no_host(void)
{
	h_errno = NO_RECOVERY;
	return NULL;
}

struct hostent *__wrap_gethostbyname(const char *name)
{
	(void)name;
	return no_host();
}

struct hostent *__wrap_gethostbyname2(const char *name, int af)
{
	(void)name;
	(void)af;
	return no_host();
}

struct hostent *__wrap_gethostbyaddr(const void *addr, socklen_t len, int type)
{
	(void)addr;
	(void)len;
	(void)type;
	return no_host();
}

struct protoent *__wrap_getprotobyname(const char *name)
{
	(void)name;
	return NULL;
}

struct protoent *__wrap_getprotobynumber(int proto)
{
	(void)proto;
	return NULL;
}
