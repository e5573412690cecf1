/* SPDX-License-Identifier: MIT */
/*
 * loadio.h - reads for a client's load: files the client opened and lent
 * the daemon (LOAD_FILE), read with io_uring into the client's own arena
 * (LOAD_READ -> LOAD_DONE); proto.h has the messages.
 *
 * Why through the daemon: its arena is registered with io_uring and
 * pre-faulted, and it reads with O_DIRECT at the queue depth the disk
 * wants, where the library alone would read through the page cache into
 * buffers it touches for the first time.  Why the client's descriptor:
 * the kernel checked the client's right to read the file when the client
 * opened it; the daemon, which may run with privileges, never opens a
 * path for a client.
 *
 * What a hostile client can do: lend any descriptor (only regular files
 * open for reading are used; others fail each read with -EBADF/-EINVAL),
 * ask for reads into any part of its own arena (never a slot the daemon
 * holds for a save: that ends the connection, as does an EXTENT for a
 * slot a read still targets), and flood requests (each costs one io_uring
 * request: at most LOADIO_MAX_INFLIGHT reads and no more bytes than its
 * arena in flight, so what a client that hangs up leaves queued is bounded
 * like a save it leaves staged), and lend many descriptors: the daemon
 * keeps at most half its RLIMIT_NOFILE lent in all, and a quarter of that
 * per uid, so one user cannot take the descriptors every other client's
 * connection, arena and shard files need; a descriptor over the cap is
 * closed at once and its reads fail with -EMFILE (the library then reads
 * that file itself).  A descriptor is closed only once no read of it is
 * queued or in flight, so a number is never reused under a queued read.
 *
 * With PROTO_LOAD_SHARE a read may be answered in the uid's pool instead
 * (share.h): the bytes are read once for every loader of the uid that
 * wants them.  Such a read counts against the client's reads and bytes in
 * flight until its LOAD_RELEASE, so what one client pins is bounded by its
 * arena too; a release of a token that holds nothing ends the connection.
 */
#ifndef CKPTD_LOADIO_H
#define CKPTD_LOADIO_H

#include <stdbool.h>
#include <stdint.h>

#include "shm/proto.h"

struct conn;
struct proto_load_file;
struct proto_load_read;
struct proto_load_close;
struct proto_load_release;
struct proto_load_object;

/* Reads in flight per connection, at most. */
#define LOADIO_MAX_INFLIGHT PROTO_LOAD_INFLIGHT

struct store_ops;
struct store_arena;

/* Reads len bytes of fd at file_off into arena io at arena_off, in pieces
 * of 8 MiB (the disk wants many requests in flight); also the pool's reads
 * (share.c).  done runs once, perhaps inside this call: err 0 and the bytes
 * read (the whole pieces in order up to the first short one: the end of
 * the file), or -errno. */
void loadio_read_pieces(const struct store_ops *store, struct store_arena *io, int fd,
			uint64_t arena_off, uint64_t file_off, uint64_t len,
			void (*done)(void *owner, int err, uint64_t got), void *owner);

/* LOAD_FILE with its descriptor (taken over, even on failure: closed). */
void loadio_on_file(struct conn *c, const struct proto_load_file *m, int fd);
/* LOAD_OBJECT: a shard of an S3 checkpoint, read by ranged GETs on the
 * s3_reads workers (only below the config's S3 roots). */
void loadio_on_object(struct conn *c, const struct proto_load_object *m);
void loadio_on_read(struct conn *c, const struct proto_load_read *m);
void loadio_on_close(struct conn *c, const struct proto_load_close *m);
/* LOAD_RELEASE: the client is done with a read answered in the pool. */
void loadio_on_release(struct conn *c, const struct proto_load_release *m);
/* The connection closed: its pins in the pool go (reads still waiting for
 * the disk end when it answers). */
void loadio_closed(struct conn *c);
/* True while reads of c are queued or in flight (its arena must stay). */
bool loadio_busy(const struct conn *c);
/* True while c is loading: reads in flight or waiting, files or S3 objects
 * lent, bytes pinned in the pool (users.h never closes such a connection
 * for another). */
bool loadio_active(const struct conn *c);
/* The connection is being freed (not busy): closes what it lent. */
void loadio_free(struct conn *c);

#endif
