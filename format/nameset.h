/* SPDX-License-Identifier: MIT */
/*
 * nameset.h - a fixed-size hash map from borrowed NUL-terminated names to
 * small integers, for finding duplicate or matching names among many items
 * in O(n).  Open addressing with linear probing; the hash is seeded per
 * process so a peer cannot choose names that all collide.
 */
#ifndef CKPT_FORMAT_NAMESET_H
#define CKPT_FORMAT_NAMESET_H

#include <stddef.h>
#include <stdint.h>

struct nameset_slot;

struct nameset {
	struct nameset_slot *slots;
	size_t mask;
	size_t count, max;
};

/* Sizes the set for up to `max` names.  Returns 0 or -ENOMEM. */
int nameset_init(struct nameset *s, size_t max);
/* Accepts a zeroed set. */
void nameset_free(struct nameset *s);

/*
 * Looks `name` up; if absent, adds it with value `val` (the set borrows the
 * string, which must outlive it) and returns -1.  If present, returns the
 * value stored with it and changes nothing.  Adding more than `max` names
 * is a bug (returns -1 without adding).
 */
int64_t nameset_put(struct nameset *s, const char *name, uint32_t val);

/* The value stored with `name`, or -1 if absent (or the set is zeroed). */
int64_t nameset_get(const struct nameset *s, const char *name);

/* Makes room for at least `max` names (a zeroed set is initialised), keeping
 * what is in it.  Returns 0 or -ENOMEM (the set is unchanged). */
int nameset_reserve(struct nameset *s, size_t max);

#endif
