/* dlvsym probe for tests/symbols.rs: loads the library argv[1] and looks up each argument
 * NAME@VERSION (expected to resolve) or !NAME@VERSION (expected NOT to resolve) with
 * dlvsym(3). Prints one line per lookup; exits 0 when every expectation holds, 1 otherwise,
 * 2 when the library cannot be loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s LIB [!]NAME@VERSION...\n", argv[0]);
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 2;
	}
	int bad = 0;
	for (int i = 2; i < argc; i++) {
		char buf[256];
		const char *arg = argv[i];
		int want = 1;
		if (arg[0] == '!') {
			want = 0;
			arg++;
		}
		snprintf(buf, sizeof(buf), "%s", arg);
		char *at = strchr(buf, '@');
		if (!at) {
			fprintf(stderr, "bad argument %s\n", arg);
			return 2;
		}
		*at = '\0';
		void *p = dlvsym(h, buf, at + 1);
		int ok = (p != NULL) == want;
		printf("%s %s@%s %s\n", ok ? "ok" : "FAIL", buf, at + 1,
		       p ? "found" : "not found");
		bad |= !ok;
	}
	return bad;
}
