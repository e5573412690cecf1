/* SPDX-License-Identifier: MIT */
/* dtype.c - element type names and sizes (safetensors spelling). */
#include <errno.h>
#include <string.h>

#include "ckpt.h"
#include "format/dtype.h"

static const struct {
	const char *name;
	size_t size;
} dtypes[CKPT_DTYPE_COUNT] = {
	[CKPT_BOOL] = { "BOOL", 1 },
	[CKPT_U8] = { "U8", 1 },
	[CKPT_I8] = { "I8", 1 },
	[CKPT_I16] = { "I16", 2 },
	[CKPT_U16] = { "U16", 2 },
	[CKPT_I32] = { "I32", 4 },
	[CKPT_U32] = { "U32", 4 },
	[CKPT_I64] = { "I64", 8 },
	[CKPT_U64] = { "U64", 8 },
	[CKPT_F16] = { "F16", 2 },
	[CKPT_BF16] = { "BF16", 2 },
	[CKPT_F32] = { "F32", 4 },
	[CKPT_F64] = { "F64", 8 },
	[CKPT_F8_E4M3] = { "F8_E4M3", 1 },
	[CKPT_F8_E5M2] = { "F8_E5M2", 1 },
};

CKPT_API const char *ckpt_dtype_name(enum ckpt_dtype dtype)
{
	if ((unsigned)dtype >= CKPT_DTYPE_COUNT)
		return NULL;
	return dtypes[dtype].name;
}

CKPT_API size_t ckpt_dtype_size(enum ckpt_dtype dtype)
{
	if ((unsigned)dtype >= CKPT_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].size;
}

int dtype_from_name(const char *s)
{
	if (!s)
		return -EINVAL;
	for (unsigned i = 0; i < CKPT_DTYPE_COUNT; i++)
		if (strcmp(s, dtypes[i].name) == 0)
			return (int)i;
	return -EINVAL;
}
