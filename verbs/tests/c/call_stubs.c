/* Calls stubs of the library argv[1] through dlsym(3) for tests/symbols.rs: each argument is
 * NAME:KIND, KIND one of the stub kinds of build.rs (errno, minus_one, neg_errno, null, void,
 * zero, noop, sysfs_path). Each stub is called twice with no arguments (a stub ignores them)
 * and its return and errno are checked. Prints one line per name; exits 0 when every check
 * holds, 1 otherwise, 2 on a usage or load error. A stub that aborts kills the program, which
 * the test sees. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int check(const char *kind, intptr_t r, int err, char *why, size_t n)
{
	if (!strcmp(kind, "errno"))
		return (int)r == EOPNOTSUPP && err == EOPNOTSUPP ? 0 : (snprintf(why, n, "int %d errno %d", (int)r, err), 1);
	if (!strcmp(kind, "minus_one"))
		return (int)r == -1 && err == EOPNOTSUPP ? 0 : (snprintf(why, n, "int %d errno %d", (int)r, err), 1);
	if (!strcmp(kind, "neg_errno"))
		return r == -EOPNOTSUPP && err == EOPNOTSUPP ? 0 : (snprintf(why, n, "ssize %ld errno %d", (long)r, err), 1);
	if (!strcmp(kind, "null"))
		return r == 0 && err == EOPNOTSUPP ? 0 : (snprintf(why, n, "pointer %#lx errno %d", (long)r, err), 1);
	if (!strcmp(kind, "zero"))
		return r == 0 && err == EOPNOTSUPP ? 0 : (snprintf(why, n, "value %ld errno %d", (long)r, err), 1);
	if (!strcmp(kind, "void"))
		return err == EOPNOTSUPP ? 0 : (snprintf(why, n, "errno %d", err), 1);
	if (!strcmp(kind, "noop"))
		return 0;
	if (!strcmp(kind, "sysfs_path"))
		return r && !strcmp((const char *)r, "/sys") ? 0 : (snprintf(why, n, "not \"/sys\""), 1);
	snprintf(why, n, "unknown kind %s", kind);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s LIB NAME:KIND...\n", argv[0]);
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 2;
	}
	int bad = 0;
	for (int i = 2; i < argc; i++) {
		char name[256], why[128] = "";
		snprintf(name, sizeof(name), "%s", argv[i]);
		char *kind = strchr(name, ':');
		if (!kind) {
			fprintf(stderr, "bad argument %s\n", argv[i]);
			return 2;
		}
		*kind++ = '\0';
		void *sym = dlsym(h, name);
		if (!sym) {
			printf("FAIL %s: not exported\n", name);
			bad = 1;
			continue;
		}
		intptr_t (*f)(void) = (intptr_t (*)(void))sym;
		int failed = 0;
		for (int round = 0; round < 2 && !failed; round++) {
			errno = 0;
			intptr_t r = f();
			int err = errno;
			failed = check(kind, r, err, why, sizeof(why));
		}
		printf("%s %s:%s%s%s\n", failed ? "FAIL" : "ok", name, kind, failed ? " " : "", why);
		bad |= failed;
	}
	return bad;
}
