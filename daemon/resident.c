/* SPDX-License-Identifier: MIT */
/* resident.c - images of committed saves kept in memory (see resident.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/conn.h"
#include "daemon/log.h"
#include "daemon/resident.h"
#include "daemon/save.h"
#include "daemon/server.h"
#include "daemon/users.h"
#include "shm/arena.h"
#include "shm/proto.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* Images are made in whole huge pages, so that THP (where shmem has it)
 * can back them and a spare fits the next save of a slightly larger size. */
#define IMAGE_ROUND (2ull << 20)

static bool same_key(const struct image *img, uid_t uid, const char *job, uint32_t rank)
{
	return img->uid == uid && img->rank == rank && strcmp(img->job, job) == 0;
}

/* Unmapping a populated gigabyte takes a good fraction of a second: a
 * worker does it (as conns_reap does for arenas), never the loop. */
struct unmap_job {
	struct work w;
	uint8_t *map;
	uint64_t cap;
	int fd;
};

static void unmap_run(struct work *w)
{
	struct unmap_job *j = (struct unmap_job *)w;

	if (j->map)
		munmap(j->map, j->cap);
	if (j->fd >= 0)
		close(j->fd);
}

static void unmap_done(struct work *w)
{
	free(w);
}

/* The bytes count as free at once: for the moment the worker takes to
 * unmap them, the daemon may hold up to that much more than arena_total. */
static void image_free(struct server *srv, struct image *img)
{
	if (img->map || img->fd >= 0) {
		struct unmap_job *j = calloc(1, sizeof(*j));
		if (j && !srv->stopping) {
			*j = (struct unmap_job){ .w = { .run = unmap_run, .done = unmap_done },
						 .map = img->map, .cap = img->cap, .fd = img->fd };
			workers_submit(&srv->arenas, &j->w);
		} else {
			free(j);
			if (img->map)
				munmap(img->map, img->cap);
			if (img->fd >= 0)
				close(img->fd);
		}
	}
	srv->resident_bytes -= img->cap;
	free(img->root);
	list_del(&img->link);
	free(img);
}

/* Moves img to the end of the list: the most recently used. */
static void touch(struct server *srv, struct image *img)
{
	list_del(&img->link);
	list_add_tail(&srv->images, &img->link);
}

/*
 * Frees images until `need` more bytes fit, for uid: spares first (they hold
 * nothing anyone can load), then READY images of uid itself and of uids
 * holding more than their share, then other READY images; oldest use first
 * in each pass.  Never a FILLING image, nor the READY image of key (uid,
 * job, rank) when job is not NULL, and another uid's image only while uid
 * stays within its share with the bytes it asks for (users.h): a user over
 * its share makes room out of its own images alone.
 */
static bool make_room(struct server *srv, uint64_t need, uid_t uid, const char *job,
		      uint32_t rank)
{
	for (int pass = 0; pass < 3 && !users_fit_total(srv, need); pass++) {
		/* (its own evictions may have brought uid back within its share) */
		bool may = users_may_evict(srv, uid, need);
		struct list *p, *t;

		list_for_each_safe(p, t, &srv->images)
		{
			struct image *img = list_entry(p, struct image, link);

			if (users_fit_total(srv, need))
				break;
			if (img->state == IMAGE_FILLING || (pass == 0 && img->state != IMAGE_SPARE))
				continue;
			if (img->state == IMAGE_READY && job && same_key(img, uid, job, rank))
				continue;
			if (img->uid != uid &&
			    (!may || (pass == 1 && !users_over_share(srv, img->uid))))
				continue;
			if (img->state == IMAGE_READY)
				log_info("resident: dropped the image of '%s/%s' (uid %u job '%s' "
					 "rank %u, %llu bytes) to make room for uid %u", img->root,
					 img->name, (unsigned)img->uid, img->job, img->rank,
					 (unsigned long long)img->size, (unsigned)uid);
			image_free(srv, img);
		}
	}
	return users_fit_total(srv, need);
}

bool images_make_room(struct server *srv, uid_t uid, uint64_t need)
{
	return make_room(srv, need, uid, NULL, 0);
}

struct image *image_take(struct server *srv, uid_t uid, const char *job, uint32_t rank,
			 uint64_t size, char *why, size_t whylen)
{
	struct image *spare = NULL, *img;
	uint64_t cap;
	struct list *p;

	list_for_each(p, &srv->images)
	{
		img = list_entry(p, struct image, link);
		if (!same_key(img, uid, job, rank))
			continue;
		if (img->state == IMAGE_FILLING) {
			/* Two saves of one rank at once: the later one goes
			 * without (a key holds two images at most). */
			snprintf(why, whylen, "another save of this rank is filling its image");
			return NULL;
		}
		if (img->state == IMAGE_SPARE)
			spare = img;
	}
	if (spare && !spare->broken && spare->map && spare->cap >= size) {
		spare->state = IMAGE_FILLING;
		spare->size = size;
		touch(srv, spare);
		return spare;
	}
	if (spare)
		image_free(srv, spare);
	if (size == 0 || size > UINT64_MAX - IMAGE_ROUND) {
		snprintf(why, whylen, "a %llu-byte shard has no image", (unsigned long long)size);
		return NULL;
	}
	cap = (size + IMAGE_ROUND - 1) / IMAGE_ROUND * IMAGE_ROUND;
	if (!make_room(srv, cap, uid, job, rank)) {
		bool mine = !users_may_evict(srv, uid, cap);
		snprintf(why, whylen,
			 "no room for a %llu-byte image: arenas %llu, images %llu and load pools "
			 "%llu of arena_total %llu bytes%s",
			 (unsigned long long)cap, (unsigned long long)srv->arena_in_use,
			 (unsigned long long)srv->resident_bytes,
			 (unsigned long long)srv->share_bytes,
			 (unsigned long long)srv->cfg.arena_total,
			 mine ? " (the user holds its share, arena_per_uid: other users' "
				"images stay)" : "");
		return NULL;
	}
	img = calloc(1, sizeof(*img));
	if (!img) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	img->state = IMAGE_FILLING;
	img->uid = uid;
	snprintf(img->job, sizeof(img->job), "%s", job);
	img->rank = rank;
	img->fd = -1;
	img->cap = cap;
	img->size = size;
	srv->resident_bytes += cap;
	list_add_tail(&srv->images, &img->link);
	return img;
}

int image_make(struct image *img)
{
	char name[64];
	void *addr;
	int fd;

	snprintf(name, sizeof(name), "ckptd-image-%u", img->rank);
	/* Clients get read-only descriptors, but any descriptor of a memfd
	 * (mode 0777) can be reopened read-write through /proc: the seal is
	 * what keeps every mapping but the daemon's own from writing. */
	fd = arena_create_sealed(name, img->cap, F_SEAL_FUTURE_WRITE, &addr);
	if (fd < 0) {
		img->broken = true;
		return fd;
	}
	img->fd = fd;
	img->map = addr;
	return 0;
}

bool images_job_owner(const struct server *srv, const char *job, uid_t uid, uid_t *ret_owner)
{
	const struct list *p;

	list_for_each(p, &srv->images)
	{
		const struct image *img = list_entry(p, struct image, link);

		/* A spare holds nothing to restore: it keeps no job. */
		if (img->state != IMAGE_SPARE && img->uid != uid && !strcmp(img->job, job)) {
			*ret_owner = img->uid;
			return true;
		}
	}
	return false;
}

/* The hash a client sends for checkpoint ROOT/NAME (proto.h). */
static void path_hash(const char *root, const char *name, char ret[STORE_ID_LEN + 1])
{
	char path[4096 + CKPT_MAX_NAME_LEN + 2];
	int n = snprintf(path, sizeof(path), "%s/%s", root, name);

	store_hash_hex(path, n > 0 && (size_t)n < sizeof(path) ? (size_t)n : 0, ret);
}

void images_replaced(struct server *srv, const struct save *s)
{
	struct list *p;

	list_for_each(p, &srv->images)
	{
		struct image *img = list_entry(p, struct image, link);

		if (img->state == IMAGE_READY && img->root && !strcmp(img->root, s->root) &&
		    !strcmp(img->name, s->key.name)) {
			log_info("resident: '%s/%s' was saved again: the image of rank %u of its "
				 "earlier save is dropped", img->root, img->name, img->rank);
			img->state = IMAGE_SPARE;
		}
	}
}

void image_finish(struct server *srv, struct image *img, const struct save *s, bool committed)
{
	struct list *p;

	if (!committed || img->broken || !img->map) {
		img->state = IMAGE_SPARE;
		img->size = 0;
		if (img->broken || !img->map)
			image_free(srv, img);
		return;
	}
	list_for_each(p, &srv->images)
	{
		struct image *o = list_entry(p, struct image, link);
		if (o != img && o->state == IMAGE_READY && same_key(o, img->uid, img->job, img->rank))
			o->state = IMAGE_SPARE;
	}
	free(img->root);
	img->root = strdup(s->root);
	if (!img->root) {
		img->state = IMAGE_SPARE;
		return;
	}
	img->state = IMAGE_READY;
	path_hash(s->root, s->key.name, img->where);
	snprintf(img->attempt, sizeof(img->attempt), "%s", s->id);
	snprintf(img->name, sizeof(img->name), "%s", s->key.name);
	img->step = s->key.step;
	img->ready_ms = now_ms();
	img->loads = 0;
	touch(srv, img);
	log_info("resident: '%s/%s' rank %u (job '%s', %llu bytes) is held in memory", img->root,
		 img->name, img->rank, img->job, (unsigned long long)img->size);
}

static void reply(struct conn *c, uint32_t token, int err, const struct image *img, int fd,
		  const char *msg)
{
	struct proto_resident_reply m;

	proto_init(&m.h, PROTO_RESIDENT_REPLY, sizeof(m));
	m.token = token;
	m.err = err;
	if (img) {
		m.size = img->size;
		m.step = img->step;
	}
	proto_set_msg(m.msg, msg);
	conn_send(c, &m, sizeof(m), fd);
}

void resident_on_req(struct conn *c, const struct proto_resident_req *m)
{
	struct server *srv = c->srv;
	struct image *found = NULL;
	char path[64];
	struct list *p;
	int fd;

	list_for_each(p, &srv->images)
	{
		struct image *img = list_entry(p, struct image, link);
		/* Only the user and job that saved it; any rank of that job
		 * (a resharded restart reads other ranks' files). */
		if (img->state == IMAGE_READY && img->uid == c->creds.uid && img->rank == m->rank &&
		    !strcmp(img->job, c->job) && !strcmp(img->attempt, m->attempt) &&
		    !strcmp(img->where, m->where)) {
			found = img;
			break;
		}
	}
	if (!found) {
		reply(c, m->token, -ENOENT, NULL, -1, "not resident");
		return;
	}
	/* A read-only descriptor of the same memfd; sealed against writes
	 * (other than the daemon's own mapping) and resizing, so even one
	 * reopened through /proc cannot change it. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", found->fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;
		log_warn("resident: cannot reopen an image read-only (%s): %s", path,
			 strerror(-err));
		reply(c, m->token, err, NULL, -1, "ckptd cannot hand out the image");
		return;
	}
	found->loads++;
	touch(srv, found);
	reply(c, m->token, 0, found, fd, "");
	close(fd);
	log_info("resident: client %u (job '%s') reads '%s/%s' rank %u from memory", c->id, c->job,
		 found->root, found->name, found->rank);
}

void *resident_json(struct server *srv, uid_t uid, bool all)
{
	json_t *a = json_array();
	int64_t now = now_ms();
	struct list *p;

	if (!a)
		return NULL;
	list_for_each(p, &srv->images)
	{
		const struct image *img = list_entry(p, struct image, link);
		json_t *o;

		if (img->state != IMAGE_READY || (!all && img->uid != uid))
			continue;
		o = json_pack("{s:s, s:I, s:I, s:s, s:s, s:I, s:s, s:I, s:f, s:I}", "job", img->job,
			      "uid", (json_int_t)img->uid, "rank", (json_int_t)img->rank, "root",
			      img->root, "name", img->name, "step", (json_int_t)img->step, "attempt",
			      img->attempt, "bytes", (json_int_t)img->size, "age_s",
			      (double)(now - img->ready_ms) / 1000.0, "loads",
			      (json_int_t)img->loads);
		if (!o || json_array_append_new(a, o) < 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

void images_free_all(struct server *srv)
{
	while (!list_empty(&srv->images))
		image_free(srv, list_entry(srv->images.next, struct image, link));
}
