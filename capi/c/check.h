/*
 * CHECK(cond, fmt, ...): the assertion of capi's C test programs. A failed check
 * prints where, the condition, the message and errno, and exits 1; `checks` counts
 * the checks that ran (each program prints it at the end).
 */
#ifndef CAPI_CHECK_H
#define CAPI_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static int checks;
#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		checks++;                                                       \
		if (!(cond)) {                                                  \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__,  \
				__LINE__, #cond);                               \
			fprintf(stderr, __VA_ARGS__);                           \
			fprintf(stderr, " (errno %d)\n", errno);                \
			exit(1);                                                \
		}                                                               \
	} while (0)

#endif
