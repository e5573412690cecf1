/* SPDX-License-Identifier: MIT */
/* jread.h - reading numbers out of parsed (jansson) JSON, strictly. */
#ifndef CKPT_FORMAT_JREAD_H
#define CKPT_FORMAT_JREAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* True, with *ret set, if j is a non-negative JSON integer (not a real). */
static inline bool jread_u64(const json_t *j, uint64_t *ret)
{
	json_int_t v;

	if (!json_is_integer(j))
		return false;
	v = json_integer_value(j);
	if (v < 0)
		return false;
	*ret = (uint64_t)v;
	return true;
}

#endif
