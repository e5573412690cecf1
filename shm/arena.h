/* SPDX-License-Identifier: MIT */
/*
 * arena.h - the shared-memory staging arena.
 *
 * The daemon creates one arena per client (a memfd), sized from the client's
 * wish and capped by its config, and sends the fd.  Both map it shared.  The
 * arena is cut into equal slots (arena_slot_bytes()); the client fills slots
 * and hands them to the daemon one at a time (see proto.h), so there is no
 * shared-memory control structure at all: the socket carries ownership.
 *
 * Pages are touched once when the arena is made (daemon) and once when the
 * client maps it: first-touch page faults cost ~30x a warm copy here, and
 * must never be paid during a save.
 */
#ifndef CKPT_SHM_ARENA_H
#define CKPT_SHM_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARENA_MIN_BYTES   (4ull << 20)
#define ARENA_MAX_SLOT    (8ull << 20)
#define ARENA_MIN_SLOT    (1ull << 20) /* == LAYOUT_CRC_BLOCK */

/*
 * Slot size for an arena of `bytes`: the largest power of two in
 * [ARENA_MIN_SLOT, ARENA_MAX_SLOT] that leaves at least 8 slots, or
 * ARENA_MIN_SLOT.  arena_round() rounds a wanted size up to a whole number of
 * slots and at least ARENA_MIN_BYTES.
 */
uint64_t arena_slot_bytes(uint64_t bytes);
uint64_t arena_round(uint64_t bytes);

/*
 * Creates an arena memfd of `bytes` (already rounded), advises transparent
 * huge pages, populates every page, and maps it; the mapping is returned in
 * *ret_addr (munmap(addr, bytes) to undo).  `name` labels the memfd
 * (/proc/PID/fd).  Returns the fd (O_CLOEXEC, sealed against shrinking) or
 * -errno; -ENOMEM if the memory is not there.
 */
int arena_create(const char *name, uint64_t bytes, void **ret_addr);

/* The same, adding `seals` (F_SEAL_*) to those; they apply after the
 * mapping returned is made, so F_SEAL_FUTURE_WRITE leaves it writable
 * while refusing writes through every other mapping, write() or
 * descriptor of the memfd, reopened ones included. */
int arena_create_sealed(const char *name, uint64_t bytes, unsigned seals, void **ret_addr);

/*
 * Maps an arena fd received from the daemon (checks its size is `bytes`) and
 * pre-faults the mapping for writing.  Returns 0 and *ret_addr, or -errno
 * (-EBADMSG if the fd is not a memfd of that size).
 */
int arena_map(int fd, uint64_t bytes, void **ret_addr);

/* ---- the client's slot allocator (not thread-safe; callers lock) ---- */

struct arena_slots {
	uint64_t slot_bytes;
	uint32_t n_slots;
	uint32_t n_free;
	uint64_t *bits;   /* 1 = free */
};

int arena_slots_init(struct arena_slots *s, uint64_t arena_bytes, uint64_t slot_bytes);
void arena_slots_free(struct arena_slots *s);
/* Takes `count` contiguous free slots; returns the first slot index, or
 * -ENOSPC if no such run is free now. */
int64_t arena_slots_take(struct arena_slots *s, uint32_t count);
/* Returns slots [first, first + count).  Returns -EINVAL if any of them is
 * already free or out of range (a daemon bug or a forged message). */
int arena_slots_put(struct arena_slots *s, uint32_t first, uint32_t count);

#endif
