/* SPDX-License-Identifier: MIT */
/* nameset.c - seeded open-addressing name map (see nameset.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "format/nameset.h"

struct nameset_slot {
	const char *name; /* NULL: empty */
	uint32_t hash;
	uint32_t val;
};

static uint64_t seed;
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;

static void seed_init(void)
{
	uint64_t s = 0;

	/* Fall back to the clock if the entropy pool cannot answer at once:
	 * any unpredictable value will do, this is no cryptographic key. */
	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != (ssize_t)sizeof(s)) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		s = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
	}
	seed = s | 1;
}

/* FNV-1a over the bytes, from a secret starting point, then a final mix so
 * the low bits (the slot index) depend on every byte. */
static uint32_t hash_name(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull ^ seed;

	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 0x100000001b3ull;
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return (uint32_t)h;
}

int nameset_init(struct nameset *s, size_t max)
{
	size_t n = 16;

	pthread_once(&seed_once, seed_init);
	memset(s, 0, sizeof(*s));
	/* Keep the load factor at or below one half. */
	while (n < max * 2)
		n *= 2;
	s->slots = calloc(n, sizeof(*s->slots));
	if (!s->slots)
		return -ENOMEM;
	s->mask = n - 1;
	s->max = max;
	return 0;
}

void nameset_free(struct nameset *s)
{
	if (!s)
		return;
	free(s->slots);
	memset(s, 0, sizeof(*s));
}

int64_t nameset_get(const struct nameset *s, const char *name)
{
	uint32_t h;

	if (!s->slots)
		return -1;
	h = hash_name(name);
	for (size_t i = h & s->mask;; i = (i + 1) & s->mask) {
		const struct nameset_slot *sl = &s->slots[i];

		if (!sl->name)
			return -1;
		if (sl->hash == h && strcmp(sl->name, name) == 0)
			return sl->val;
	}
}

int nameset_reserve(struct nameset *s, size_t max)
{
	struct nameset bigger;
	int r;

	if (s->slots && max <= s->max)
		return 0;
	r = nameset_init(&bigger, max);
	if (r < 0)
		return r;
	if (s->slots) {
		/* Rehash: the slots keep their names, hashes and values. */
		for (size_t i = 0; i <= s->mask; i++) {
			const struct nameset_slot *sl = &s->slots[i];
			size_t j;

			if (!sl->name)
				continue;
			for (j = sl->hash & bigger.mask; bigger.slots[j].name; j = (j + 1) & bigger.mask)
				;
			bigger.slots[j] = *sl;
			bigger.count++;
		}
		free(s->slots);
	}
	*s = bigger;
	return 0;
}

int64_t nameset_put(struct nameset *s, const char *name, uint32_t val)
{
	uint32_t h = hash_name(name);

	for (size_t i = h & s->mask;; i = (i + 1) & s->mask) {
		struct nameset_slot *sl = &s->slots[i];

		if (!sl->name) {
			if (s->count >= s->max)
				return -1;
			sl->name = name;
			sl->hash = h;
			sl->val = val;
			s->count++;
			return -1;
		}
		if (sl->hash == h && strcmp(sl->name, name) == 0)
			return sl->val;
	}
}
