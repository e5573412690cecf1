/* SPDX-License-Identifier: MIT */
/*
 * users.h - the node shared fairly between users (uids): what each holds of
 * arena_total and of max_clients, and the rules that keep one user from
 * starving the others.  A uid is the unit of fairness (the kernel vouches
 * for it on the socket); one user's jobs share that user's part.
 *
 * Memory.  arena_total holds three things: staging arenas (conn.h), load
 * pools (share.h) and resident images (resident.h).  Arenas and pools are
 * held while they are used and cannot be taken back, so they are capped per
 * uid: arena_per_uid (unset: half of arena_total, at least arena_max).  A
 * HELLO whose arena would take its uid past the cap gets a smaller arena, or
 * is refused if not even the smallest fits ("no room for a staging arena:
 * uid U's arenas and load pools use ... of arena_per_uid"); a pool that
 * would is not made (the loads read on their own).  Images are a cache:
 * room for an arena or a newer image is made by evicting them, but a uid
 * evicts another uid's image (or idle pool) only while everything it holds
 * (arenas, pools and images) plus what it asks for fits in arena_per_uid.
 * Past its share, a uid makes room only out of its own images and pools;
 * so one user can never push another's restart copy out of memory by
 * asking for more than its share.  Victims, oldest use first: spare images
 * (they hold nothing to load), then READY images of the asking uid and of
 * uids above their share, then any others it may evict.
 *
 * Connections.  max_clients_per_uid caps each uid.  When all max_clients
 * connections are taken, a new connection of uid U does not simply lose to
 * whoever came first: if a uid V holds at least two more connections than
 * U and has an idle one, that connection is closed (told why, with
 * -EMFILE) and U's is accepted.  Idle means nothing of it is in flight: a
 * connection that has not said HELLO yet, a control connection (ckptctl)
 * between requests, or a client connection with its arena made, no save
 * (no rank of it staging, writing or waiting for its commit) and no load
 * (no read in flight or waiting, no file lent, no pool bytes pinned).  A
 * connection with a save or a load in flight is never closed for another.
 * Which one: those never HELLO'd first, then control ones, then idle
 * trainers (a trainer between saves loses its connection only when no
 * garbage is left); within that, the busiest uid's; then the one idle
 * longest.  "At least two more" keeps the swap from making U the busier
 * one, so two uids cannot take a slot back and forth.  So users that keep
 * re-opening idle connections hold no more of the table than anyone else:
 * a trainer of a new user gets in at once.
 *
 * Everything here runs on the loop thread.
 */
#ifndef CKPTD_USERS_H
#define CKPTD_USERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct server;
struct conn;

/* What one uid holds now (bytes count against arena_total). */
struct users_use {
	unsigned conns;     /* connections open (not closed) */
	uint64_t arenas;    /* arenas of its connections, also of closed ones
	                     * whose arenas the daemon still writes from */
	uint64_t pools;     /* its load pools (share.h), made or being made */
	uint64_t images;    /* its resident images (resident.h), any state */
};

void users_use(const struct server *srv, uid_t uid, struct users_use *ret);

/* Open (not closed) connections of uid. */
unsigned users_conns(const struct server *srv, uid_t uid);

/* Bytes of uid that count against arena_per_uid: arenas and pools. */
uint64_t users_staging(const struct server *srv, uid_t uid);

/* Whether `need` more bytes fit in arena_total next to the arenas, images
 * and pools; and whether uid's staging (arenas and pools) stays within
 * arena_per_uid with `need` more. */
bool users_fit_total(const struct server *srv, uint64_t need);
bool users_fit_staging(const struct server *srv, uid_t uid, uint64_t need);

/* True if uid, asking for `need` more bytes, may have room made for it out
 * of other uids' images and idle pools (see above); its own it may always
 * use. */
bool users_may_evict(const struct server *srv, uid_t uid, uint64_t need);

/* True if uid holds more than arena_per_uid (arenas, pools and images). */
bool users_over_share(const struct server *srv, uid_t uid);

/*
 * max_clients is reached and a connection of uid arrives: the connection
 * to close for it (see above), or NULL if every uid with two more
 * connections than uid has none idle (then uid is refused).  *ret_n is the
 * victim's uid's connections.  Returns NULL also when out of memory.
 */
struct conn *users_admission_victim(struct server *srv, uid_t uid, unsigned *ret_n);

/* The status report's "users" array: one object per uid that holds
 * anything (of uid alone unless all).  NULL when out of memory. */
void *users_json(const struct server *srv, uid_t uid, bool all);

#endif
