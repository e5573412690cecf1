/* SPDX-License-Identifier: MIT */
/* grow.h - growing arrays, shared by the format code. */
#ifndef CKPT_FORMAT_GROW_H
#define CKPT_FORMAT_GROW_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/*
 * Makes *arr (of `size`-byte elements, capacity *cap) hold at least `need`
 * elements, doubling from 16.  Returns 0, or -ENOMEM (leaving *arr and *cap
 * as they were).
 */
static inline int grow_array(void **arr, size_t *cap, size_t need, size_t size)
{
	size_t c = *cap ? *cap : 16;
	void *p;

	if (need <= *cap)
		return 0;
	while (c < need) {
		if (c > SIZE_MAX / 2)
			return -ENOMEM;
		c *= 2;
	}
	if (c > SIZE_MAX / size)
		return -ENOMEM;
	p = realloc(*arr, c * size);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = c;
	return 0;
}

#endif
