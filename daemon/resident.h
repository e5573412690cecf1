/* SPDX-License-Identifier: MIT */
/*
 * resident.h - checkpoints kept in the daemon's memory, so that a trainer
 * that crashed and restarts on this node loads its state at memory speed.
 *
 * A client that connects with PROTO_HELLO_RESIDENT gets, for each save, an
 * image: a memfd as large as its shard file, made (and populated) by the
 * shard job before the save's ACK.  The checksum pass that reads every slot
 * anyway (writer.c) copies the slot into the image at its file offset, so
 * when the rank's save commits the image holds the whole file as staged.
 * The image is keyed by (uid, job, rank):
 *
 *   FILLING --save committed, every extent copied--> READY
 *   FILLING --save failed / image broken--> SPARE
 *   READY   --a newer save of the key commits--> SPARE
 *   SPARE   --the key's next save, if large enough--> FILLING (no new
 *             allocation: populating gigabytes takes seconds here)
 *   any but FILLING --memory needed (arena, newer image)--> freed, oldest
 *             first (users.h: whose, and in which order)
 *
 * So a key holds at most two images: the newest committed one and the one
 * its next save fills (a save in progress never overwrites what a restart
 * could need).  Every image byte counts against arena_total, alongside the
 * staging arenas and load pools; arenas win: a HELLO that finds no room
 * evicts images, but another user's only while its own user stays within
 * arena_per_uid (users.h), and so does a newer image.  The job of a READY
 * or FILLING image stays its uid's (conn.h): a restart of the owner is
 * never locked out of its own image by another user taking the job name.
 *
 * Serving: RESIDENT_REQ(attempt id, checkpoint path hash, rank) from a
 * READY connection of the same uid and job gets a read-only descriptor of
 * the image (reopened through /proc/self/fd).  Read-only is not enough on
 * its own (a memfd's mode is 0777: any descriptor of it can be reopened
 * read-write through /proc), so images are sealed with F_SEAL_FUTURE_WRITE
 * once made: only the daemon's own mapping, made before the seal, can
 * write them; F_SEAL_SHRINK/GROW keep their size.  The bytes are the ones
 * the checksum pass copied and checksummed (the copy is what is
 * checksummed, writer.c), and the client checks every block against the
 * manifest's CRCs, the only authority.  A client that holds a descriptor
 * keeps the memory alive after the daemon frees the image (it then counts
 * as free in arena_total): as with arenas, the kernel's accounting is the
 * bound, not the daemon's.  A SPARE image being refilled while a client still reads
 * it (a newer save committed meanwhile) shows up there as a CRC mismatch.
 *
 * The loop owns every field; the shard job (a worker) only fills in the
 * mapping of an image it was handed in FILLING state, before the rank's
 * ACK, and the checksum jobs only write the bytes.
 */
#ifndef CKPTD_RESIDENT_H
#define CKPTD_RESIDENT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt.h"
#include "daemon/list.h"
#include "store/store.h"

struct server;
struct conn;
struct save;

enum image_state { IMAGE_SPARE, IMAGE_FILLING, IMAGE_READY };

struct image {
	struct list link;          /* in server.images, least recently used first */
	enum image_state state;
	uid_t uid;
	char job[CKPT_MAX_JOB_LEN + 1];
	uint32_t rank;
	int fd;                    /* -1 until made */
	uint8_t *map;              /* read-write mapping, cap bytes; NULL until made */
	uint64_t cap;              /* bytes reserved (and, once made, mapped) */
	uint64_t size;             /* file bytes it holds (FILLING, READY) */
	bool broken;               /* making it failed: never READY */
	/* READY: what it holds. */
	char attempt[STORE_ID_LEN + 1];
	char name[CKPT_MAX_NAME_LEN + 1];
	char *root;                /* the checkpoint root, owned */
	char where[STORE_ID_LEN + 1]; /* store_hash_hex of "root/name" */
	uint64_t step;
	int64_t ready_ms;
	uint32_t loads;            /* descriptors handed out */
};

/*
 * An image for a save of `size` file bytes by (uid, job, rank): the key's
 * SPARE image if it is large enough, else a new reservation (evicting
 * other images as images_make_room does, never the key's READY one).
 * Returned in FILLING state; if ->map is NULL the caller makes it
 * with image_make() on a worker.  NULL (reason in why) if arena_total has
 * no room: the save goes on without an image.
 */
struct image *image_take(struct server *srv, uid_t uid, const char *job, uint32_t rank,
			 uint64_t size, char *why, size_t whylen);

/* Worker: makes (allocates, populates, maps) an image taken without a
 * mapping.  0, or -errno (the image is marked broken). */
int image_make(struct image *img);

/*
 * The save that filled img is over (the rank is being freed: no slot and
 * no job of it is in flight).  committed: img becomes the key's READY
 * image, holding save s's file of that rank; any older READY image of the
 * key becomes SPARE.  Else img becomes SPARE.
 */
void image_finish(struct server *srv, struct image *img, const struct save *s, bool committed);

/* Save s committed: READY images of other saves at the same checkpoint
 * path (ROOT/NAME) hold what that path no longer has; they become SPARE. */
void images_replaced(struct server *srv, const struct save *s);

/* Frees images until `need` more bytes for uid fit in arena_total next to
 * the arenas, the pools and the other images; never one FILLING, and
 * another uid's only while uid stays within its share (users.h).  True if
 * they fit. */
bool images_make_room(struct server *srv, uid_t uid, uint64_t need);

/* True if a uid other than uid holds a READY or FILLING image of job (and
 * so owns the job: conn.h); its uid in *ret_owner. */
bool images_job_owner(const struct server *srv, const char *job, uid_t uid, uid_t *ret_owner);

/* RESIDENT_REQ from connection c. */
struct proto_resident_req;
void resident_on_req(struct conn *c, const struct proto_resident_req *m);

/* The status report's "resident" array (images of uid, all if all). */
void *resident_json(struct server *srv, uid_t uid, bool all);

/* Frees every image (shutdown). */
void images_free_all(struct server *srv);

#endif
