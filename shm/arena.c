/* SPDX-License-Identifier: MIT */
/* arena.c - the staging arena: memfd creation, mapping, and slot allocation. */
#include "shm/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older glibc headers lack it */
#endif

uint64_t arena_slot_bytes(uint64_t bytes)
{
	uint64_t slot = ARENA_MAX_SLOT;

	while (slot > ARENA_MIN_SLOT && bytes / slot < 8)
		slot >>= 1;
	return slot;
}

uint64_t arena_round(uint64_t bytes)
{
	uint64_t r = bytes < ARENA_MIN_BYTES ? ARENA_MIN_BYTES : bytes;

	/* Rounding up to the slot size can raise the slot size of the result
	 * (63 MiB -> 64 MiB moves from 4 MiB to 8 MiB slots); the result is
	 * then still a multiple of the larger slot, but loop until the size
	 * is a whole number of its own slots rather than rely on that. */
	for (;;) {
		uint64_t slot = arena_slot_bytes(r);
		uint64_t up;

		if (r > UINT64_MAX - (slot - 1))
			return r - r % slot;
		up = (r + slot - 1) / slot * slot;
		if (up == r)
			return r;
		r = up;
	}
}

/*
 * Faults in every page of a shared mapping for writing.  MADV_POPULATE_WRITE
 * does it in one call; kernels without it get one write per page.  The write
 * stores back the byte it read, so populating never changes the contents.
 */
static int populate(void *addr, uint64_t bytes)
{
	if (madvise(addr, bytes, MADV_POPULATE_WRITE) == 0)
		return 0;
	if (errno == ENOMEM || errno == EFAULT)
		return -ENOMEM;

	long page = sysconf(_SC_PAGESIZE);
	volatile unsigned char *p = addr;

	if (page <= 0)
		page = 4096;
	for (uint64_t off = 0; off < bytes; off += (uint64_t)page)
		p[off] = p[off];
	return 0;
}

int arena_create(const char *name, uint64_t bytes, void **ret_addr)
{
	return arena_create_sealed(name, bytes, 0, ret_addr);
}

int arena_create_sealed(const char *name, uint64_t bytes, unsigned seals, void **ret_addr)
{
	void *addr;
	int fd, r;

	if (bytes == 0 || bytes > (uint64_t)SIZE_MAX / 2 || bytes > (uint64_t)INT64_MAX)
		return -EINVAL;
	fd = memfd_create(name ? name : "ckpt-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		/* EFBIG: over this process's file size limit (RLIMIT_FSIZE),
		 * which memfds obey too. */
		r = -errno;
		goto out_close;
	}
	addr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED) {
		r = -errno;
		goto out_close;
	}
	/* Where shmem THP is "advise", this gets 2 MiB pages (fewer faults and
	 * fewer pages to pin); where it is "never" it does nothing. */
	(void)madvise(addr, bytes, MADV_HUGEPAGE);
	/* Allocate every page up front: an arena the machine cannot back fails
	 * here with ENOSPC/ENOMEM, never later with SIGBUS, and allocating by
	 * fallocate is cheaper than faulting pages in one by one (~15% here). */
	if (fallocate(fd, 0, 0, (off_t)bytes) < 0) {
		r = errno == ENOSPC ? -ENOMEM : -errno;
		if (r != -EOPNOTSUPP)
			goto out_unmap;
	}
	r = populate(addr, bytes);
	if (r < 0)
		goto out_unmap;
	/* The client maps the same size: it must never change under it. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (int)seals) < 0) {
		r = -errno;
		goto out_unmap;
	}
	*ret_addr = addr;
	return fd;

out_unmap:
	munmap(addr, bytes);
out_close:
	close(fd);
	return r;
}

int arena_map(int fd, uint64_t bytes, void **ret_addr)
{
	struct stat st;
	void *addr;
	int r;

	if (fd < 0 || bytes == 0 || bytes > (uint64_t)SIZE_MAX / 2)
		return -EINVAL;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size != bytes)
		return -EBADMSG;
	addr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		return -errno;
	(void)madvise(addr, bytes, MADV_HUGEPAGE);
	r = populate(addr, bytes);
	if (r < 0) {
		munmap(addr, bytes);
		return r;
	}
	*ret_addr = addr;
	return 0;
}

/* ---- slot allocator ---- */

static inline bool slot_is_free(const struct arena_slots *s, uint32_t i)
{
	return (s->bits[i / 64] >> (i % 64)) & 1u;
}

int arena_slots_init(struct arena_slots *s, uint64_t arena_bytes, uint64_t slot_bytes)
{
	uint64_t n;
	size_t words;

	memset(s, 0, sizeof(*s));
	if (slot_bytes == 0 || arena_bytes < slot_bytes || arena_bytes % slot_bytes)
		return -EINVAL;
	n = arena_bytes / slot_bytes;
	if (n > INT32_MAX)
		return -EINVAL;
	words = (size_t)(n + 63) / 64;
	s->bits = calloc(words, sizeof(uint64_t));
	if (!s->bits)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++)
		s->bits[i / 64] |= 1ull << (i % 64);
	s->slot_bytes = slot_bytes;
	s->n_slots = (uint32_t)n;
	s->n_free = (uint32_t)n;
	return 0;
}

void arena_slots_free(struct arena_slots *s)
{
	if (!s)
		return;
	free(s->bits);
	s->bits = NULL;
	s->n_slots = s->n_free = 0;
}

int64_t arena_slots_take(struct arena_slots *s, uint32_t count)
{
	uint32_t n = s->n_slots;

	if (count == 0 || count > s->n_free)
		return -ENOSPC;

	if (count == 1) {
		/* The common case (one extent): first free bit, a word at a time. */
		for (size_t w = 0; w < ((size_t)n + 63) / 64; w++) {
			if (s->bits[w]) {
				uint32_t i = (uint32_t)(w * 64) + (uint32_t)__builtin_ctzll(s->bits[w]);
				s->bits[w] &= ~(1ull << (i % 64));
				s->n_free--;
				return i;
			}
		}
		return -ENOSPC;
	}

	/* First fit for a contiguous run (descriptors): linear scan. */
	uint32_t run = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (!slot_is_free(s, i)) {
			run = 0;
			continue;
		}
		if (++run == count) {
			uint32_t first = i + 1 - count;
			for (uint32_t j = first; j <= i; j++)
				s->bits[j / 64] &= ~(1ull << (j % 64));
			s->n_free -= count;
			return first;
		}
	}
	return -ENOSPC;
}

int arena_slots_put(struct arena_slots *s, uint32_t first, uint32_t count)
{
	if (count == 0 || first >= s->n_slots || count > s->n_slots - first)
		return -EINVAL;
	/* Check the whole range before changing anything, so a bad message
	 * leaves the allocator as it was. */
	for (uint32_t i = first; i < first + count; i++)
		if (slot_is_free(s, i))
			return -EINVAL;
	for (uint32_t i = first; i < first + count; i++)
		s->bits[i / 64] |= 1ull << (i % 64);
	s->n_free += count;
	return 0;
}
