/* SPDX-License-Identifier: MIT */
/* users.c - the node shared fairly between uids (see users.h). */
#include "daemon/users.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/conn.h"
#include "daemon/loadio.h"
#include "daemon/resident.h"
#include "daemon/server.h"
#include "daemon/share.h"

void users_use(const struct server *srv, uid_t uid, struct users_use *ret)
{
	struct users_use u = { 0 };
	const struct list *p;

	list_for_each(p, &srv->conns)
	{
		const struct conn *c = list_entry(p, struct conn, link);

		if (c->creds.uid != uid)
			continue;
		u.conns += c->state != CONN_CLOSED;
		/* Reserved at HELLO, released when the connection is freed
		 * (conn.c): the same bytes arena_in_use counts. */
		u.arenas += c->arena_bytes;
	}
	list_for_each(p, &srv->images)
	{
		const struct image *img = list_entry(p, struct image, link);

		if (img->uid == uid)
			u.images += img->cap;
	}
	u.pools = share_bytes_of(srv, uid);
	*ret = u;
}

unsigned users_conns(const struct server *srv, uid_t uid)
{
	const struct list *p;
	unsigned n = 0;

	list_for_each(p, &srv->conns)
	{
		const struct conn *c = list_entry(p, struct conn, link);

		n += c->creds.uid == uid && c->state != CONN_CLOSED;
	}
	return n;
}

uint64_t users_staging(const struct server *srv, uid_t uid)
{
	struct users_use u;

	users_use(srv, uid, &u);
	return u.arenas + u.pools;
}

bool users_fit_total(const struct server *srv, uint64_t need)
{
	uint64_t used = srv->arena_in_use + srv->resident_bytes + srv->share_bytes;

	return used <= srv->cfg.arena_total && need <= srv->cfg.arena_total - used;
}

bool users_fit_staging(const struct server *srv, uid_t uid, uint64_t need)
{
	uint64_t staging = users_staging(srv, uid);

	return staging <= srv->cfg.arena_per_uid && need <= srv->cfg.arena_per_uid - staging;
}

static uint64_t held(const struct users_use *u)
{
	return u->arenas + u->pools + u->images;
}

bool users_may_evict(const struct server *srv, uid_t uid, uint64_t need)
{
	struct users_use u;
	uint64_t h;

	users_use(srv, uid, &u);
	h = held(&u);
	return h <= srv->cfg.arena_per_uid && need <= srv->cfg.arena_per_uid - h;
}

bool users_over_share(const struct server *srv, uid_t uid)
{
	struct users_use u;

	users_use(srv, uid, &u);
	return held(&u) > srv->cfg.arena_per_uid;
}

/* ---- admission ---------------------------------------------------------------- */

/* Whether c is the last live connection of its user's job with nothing
 * else of the job's in the daemon: closing it would free the job's name for
 * another user (conn_job_free_for), who could then keep the owner's
 * restart out. */
static bool holds_job(const struct server *srv, const struct conn *c)
{
	const struct list *p;
	uid_t owner;

	list_for_each(p, &srv->conns)
	{
		const struct conn *o = list_entry(p, struct conn, link);

		if (o != c && (o->state == CONN_ARENA || o->state == CONN_READY) &&
		    o->creds.uid == c->creds.uid && !strcmp(o->job, c->job))
			return false;
	}
	/* An image of the job of this user's keeps the name by itself. */
	return !(images_job_owner(srv, c->job, (uid_t)-1, &owner) && owner == c->creds.uid);
}

/* How readily an idle connection is closed for another: lower first.  -1:
 * never (something of it is in flight, its HELLO is being answered, or it
 * alone holds its job's name). */
static int idle_class(const struct server *srv, const struct conn *c)
{
	switch (c->state) {
	case CONN_NEW:
		return 0;
	case CONN_CONTROL:
		return 1;
	case CONN_READY:
		if (conn_saving(c) || loadio_active(c) || holds_job(srv, c))
			return -1;
		return 2;
	case CONN_ARENA:
	case CONN_CLOSED:
		break;
	}
	return -1;
}

static int cmp_uid(const void *a, const void *b)
{
	uid_t x = *(const uid_t *)a, y = *(const uid_t *)b;

	return x < y ? -1 : x > y;
}

/* Connections of uid: the length of its run in the sorted array. */
static unsigned count_of(const uid_t *uids, size_t n, uid_t uid)
{
	size_t lo = 0, hi = n, first;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (uids[mid] < uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	first = lo;
	hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (uids[mid] <= uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (unsigned)(lo - first);
}

static int64_t last_active(const struct conn *c)
{
	return c->last_msg_ms > c->accepted_ms ? c->last_msg_ms : c->accepted_ms;
}

struct conn *users_admission_victim(struct server *srv, uid_t uid, unsigned *ret_n)
{
	struct conn *best = NULL;
	unsigned best_n = 0, mine;
	int best_class = 0;
	size_t n = 0;
	uid_t *uids;
	struct list *p;

	/* Sorted uids of the open connections: every count in O(log n), so a
	 * full table of 65536 costs one sort per refused-or-admitted accept. */
	uids = malloc((srv->n_conns ? srv->n_conns : 1) * sizeof(*uids));
	if (!uids)
		return NULL;
	list_for_each(p, &srv->conns)
	{
		const struct conn *c = list_entry(p, struct conn, link);
		if (c->state != CONN_CLOSED && n < srv->n_conns)
			uids[n++] = c->creds.uid;
	}
	qsort(uids, n, sizeof(*uids), cmp_uid);
	mine = count_of(uids, n, uid);

	/* Of the uids with two more: the most readily closed class first,
	 * then the busiest uid, then the connection idle longest (ties: the
	 * first accepted, the list's order). */
	list_for_each(p, &srv->conns)
	{
		struct conn *c = list_entry(p, struct conn, link);
		unsigned cn;
		int cl;

		if (c->state == CONN_CLOSED || c->creds.uid == uid)
			continue;
		cn = count_of(uids, n, c->creds.uid);
		if (cn < mine + 2)
			continue;
		cl = idle_class(srv, c);
		if (cl < 0)
			continue;
		if (best && (cl > best_class || (cl == best_class && cn < best_n) ||
			     (cl == best_class && cn == best_n &&
			      last_active(c) >= last_active(best))))
			continue;
		best = c;
		best_n = cn;
		best_class = cl;
	}
	free(uids);
	if (best)
		*ret_n = best_n;
	return best;
}

/* ---- status ---------------------------------------------------------------------- */

struct row {
	uid_t uid;
	struct users_use u;
};

static int cmp_row(const void *a, const void *b)
{
	return cmp_uid(&((const struct row *)a)->uid, &((const struct row *)b)->uid);
}

static int append(json_t *a, uid_t uid, const struct users_use *u)
{
	json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I}", "uid", (json_int_t)uid, "connections",
			      (json_int_t)u->conns, "arena_bytes", (json_int_t)u->arenas,
			      "pool_bytes", (json_int_t)u->pools, "resident_bytes",
			      (json_int_t)u->images);

	return o && json_array_append_new(a, o) == 0 ? 0 : -ENOMEM;
}

static void count_pool(void *ud, uid_t uid, uint64_t bytes)
{
	(void)uid;
	(void)bytes;
	(*(size_t *)ud)++;
}

struct pool_rows {
	struct row *rows;
	size_t *n, cap;
};

static void add_pool(void *ud, uid_t uid, uint64_t bytes)
{
	struct pool_rows *pr = ud;

	if (*pr->n < pr->cap) {
		pr->rows[*pr->n].uid = uid;
		pr->rows[(*pr->n)++].u.pools = bytes;
	}
}

void *users_json(const struct server *srv, uid_t uid, bool all)
{
	json_t *a = json_array();
	struct row *rows;
	size_t n = 0, cap = 0;
	const struct list *p;

	if (!a)
		return NULL;
	if (!all) {
		struct users_use u;

		users_use(srv, uid, &u);
		if ((u.conns || held(&u)) && append(a, uid, &u) < 0)
			goto fail;
		return a;
	}
	/* Root: every uid with a connection (or an arena still in use), an
	 * image or a pool, summed through one sort rather than one walk per
	 * uid. */
	list_for_each(p, &srv->conns)
		cap++;
	list_for_each(p, &srv->images)
		cap++;
	share_each(srv, count_pool, &cap);
	rows = calloc(cap ? cap : 1, sizeof(*rows));
	if (!rows)
		goto fail;
	list_for_each(p, &srv->conns)
	{
		const struct conn *c = list_entry(p, struct conn, link);

		rows[n].uid = c->creds.uid;
		rows[n].u.conns = c->state != CONN_CLOSED;
		rows[n++].u.arenas = c->arena_bytes;
	}
	list_for_each(p, &srv->images)
	{
		const struct image *img = list_entry(p, struct image, link);

		rows[n].uid = img->uid;
		rows[n++].u.images = img->cap;
	}
	{
		struct pool_rows pr = { rows, &n, cap };

		share_each(srv, add_pool, &pr);
	}
	qsort(rows, n, sizeof(*rows), cmp_row);
	for (size_t i = 0; i < n;) {
		struct users_use u = { 0 };
		uid_t id = rows[i].uid;

		for (; i < n && rows[i].uid == id; i++) {
			u.conns += rows[i].u.conns;
			u.arenas += rows[i].u.arenas;
			u.images += rows[i].u.images;
			u.pools += rows[i].u.pools;
		}
		/* As a user's own view: only a uid with a connection or bytes. */
		if ((u.conns || held(&u)) && append(a, id, &u) < 0) {
			free(rows);
			goto fail;
		}
	}
	free(rows);
	return a;
fail:
	json_decref(a);
	return NULL;
}
