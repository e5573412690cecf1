/* SPDX-License-Identifier: MIT */
/*
 * abi.c - reading structs the caller filled in, whatever header version it
 * was compiled with (the rules are in ckpt.h, "ABI and versions").
 *
 * The same contract as the kernel's copy_struct_from_user() for openat2()
 * and clone3(): an older caller's struct is shorter, and the fields it does
 * not have read as zero; a newer caller's struct is longer, and is accepted
 * only if it asks for nothing beyond what this library knows (every unknown
 * byte zero).  Struct layouts have no implicit padding (checked below), so
 * "every unknown byte zero" is the same as "every unknown field zero".
 */
#include <errno.h>
#include <string.h>

#include "client/internal.h"

/* No implicit padding in the public structs on 64-bit targets: a field
 * appended later must never land in bytes an older caller left
 * uninitialised.  (On 32-bit targets the pointers are smaller and the
 * layouts differ, which the size field copes with.) */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(struct ckpt_connect_opts) == 4 * 4 + 2 * 8 + 3 * 8 + 2 * 4, "padding");
_Static_assert(sizeof(struct ckpt_save_opts) == 2 * 4 + 2 * 8 + 8, "padding");
_Static_assert(sizeof(struct ckpt_tensor) == 2 * 4 + 5 * 8 + 4 * 4 + 8, "padding");
_Static_assert(sizeof(struct ckpt_load_dst) == 4 * 4 + 4 * 8, "padding");
_Static_assert(sizeof(struct ckpt_load_tensor) == 2 * 4 + 2 * 8 + 2 * 4 + 8, "padding");
_Static_assert(sizeof(struct ckpt_load_stats) == 2 * 4 + 7 * 8 + 4 * 4, "padding");
#endif
_Static_assert(sizeof(enum ckpt_dtype) == 4 && sizeof(enum ckpt_device) == 4 &&
	       sizeof(enum ckpt_cuda_pin) == 4,
	       "enums in public structs must stay 4 bytes");

const struct abi_struct abi_connect_opts = {
	"struct ckpt_connect_opts", "CKPT_CONNECT_OPTS_INIT", sizeof(struct ckpt_connect_opts),
	CKPT_CONNECT_OPTS_SIZE_VER0,
};
const struct abi_struct abi_save_opts = {
	"struct ckpt_save_opts", "CKPT_SAVE_OPTS_INIT", sizeof(struct ckpt_save_opts),
	CKPT_SAVE_OPTS_SIZE_VER0,
};
const struct abi_struct abi_tensor = {
	"struct ckpt_tensor", "CKPT_TENSOR_INIT", sizeof(struct ckpt_tensor),
	CKPT_TENSOR_SIZE_VER0,
};

const struct abi_struct abi_load_dst = {
	"struct ckpt_load_dst", "CKPT_LOAD_DST_INIT", sizeof(struct ckpt_load_dst),
	sizeof(struct ckpt_load_dst),
};
const struct abi_struct abi_load_tensor = {
	"struct ckpt_load_tensor", "CKPT_LOAD_TENSOR_INIT", sizeof(struct ckpt_load_tensor),
	sizeof(struct ckpt_load_tensor),
};

int abi_copy_in(const struct abi_struct *t, void *dst, const void *src, const char *fn)
{
	uint32_t size;

	memcpy(&size, src, sizeof(size)); /* every such struct starts with it */
	if (size < t->min_size) {
		cli_set_error("%s: %s has size %u, at least %zu: initialise it with %s (a program "
			      "written for libckpt 0.1 must be updated)", fn, t->name, size,
			      t->min_size, t->init);
		return -EINVAL;
	}
	if (size > ABI_MAX_STRUCT) {
		cli_set_error("%s: %s has size %u, more than any version of it can have", fn,
			      t->name, size);
		return -E2BIG;
	}
	if (size > t->size) {
		const unsigned char *extra = (const unsigned char *)src + t->size;
		for (size_t i = 0; i < size - t->size; i++) {
			if (extra[i]) {
				cli_set_error("%s: %s has %u bytes, of which libckpt %s "
					      "knows %zu, and byte %zu is set: the program "
					      "uses a field of a newer libckpt", fn, t->name,
					      size, ckpt_version(), t->size, t->size + i);
				return -E2BIG;
			}
		}
		memcpy(dst, src, t->size);
		return 0;
	}
	memcpy(dst, src, size);
	memset((char *)dst + size, 0, t->size - size);
	return 0;
}
