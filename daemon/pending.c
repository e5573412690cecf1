/* SPDX-License-Identifier: MIT */
/* pending.c - records of spilled saves owed a commit (pending.h). */
#include "daemon/pending.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/crc32c.h"
#include "format/desc.h"
#include "store/fsutil.h"

#define SAVE_FILE "save.json"
#define SAVE_FORMAT "ckpt-spill-save-1"
#define SAVE_MAX (64u << 10)
#define REC_MAGIC "CKPTSPL1"
#define REC_VERSION 1u
/* A descriptor, its CRCs (one per MiB of a shard up to 2^40 bytes) and the
 * header: what a record may hold. */
#define REC_CRCS_MAX (1ull << 20)
#define REC_MAX ((uint64_t)DESC_MAX_BYTES + 4 * REC_CRCS_MAX + 4096)

/* The record's head; the descriptor, n_crcs u32 and a CRC32C of everything
 * before it follow.  Host byte order: it never leaves this machine. */
struct rec_head {
	char magic[8];
	uint32_t version;
	uint32_t rank;
	uint64_t extent;
	uint64_t desc_len;
	uint64_t n_crcs;
};
_Static_assert(sizeof(struct rec_head) == 40, "rec_head is packed as written");

/* save.json is rewritten by each rank's record job; gen keeps the newest. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void rec_name(uint32_t rank, char *buf, size_t len)
{
	snprintf(buf, len, "rank-%05u.rec", rank);
}

static bool id_ok(const char *id)
{
	if (strlen(id) != STORE_ID_LEN)
		return false;
	for (const char *p = id; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

/* <state_dir>/spill/<id>, made if `make`: an fd or -errno. */
static int save_dir(const char *state_dir, const char *id, bool make)
{
	int sfd, pfd, dfd, r;

	sfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd < 0)
		return -errno;
	if (make && mkdirat(sfd, PENDING_DIR, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		close(sfd);
		return r;
	}
	pfd = openat(sfd, PENDING_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(sfd);
	if (pfd < 0)
		return -errno;
	if (make && mkdirat(pfd, id, 0700) < 0) {
		if (errno != EEXIST) {
			r = -errno;
			close(pfd);
			return r;
		}
	} else if (make) {
		/* A new name in spill/: durable before anything says so. */
		fsync(pfd);
	}
	dfd = openat(pfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	r = dfd < 0 ? -errno : dfd;
	close(pfd);
	return r;
}

static int write_rec(int dfd, uint32_t rank, uint64_t extent, const struct layout *l,
		     const uint32_t *crcs)
{
	struct rec_head h = { .version = REC_VERSION, .rank = rank, .extent = extent };
	char name[32], *desc = NULL, *buf;
	size_t desc_len = 0, len;
	uint32_t crc;
	int r;

	r = desc_build(l, &desc, &desc_len);
	if (r < 0)
		return r;
	memcpy(h.magic, REC_MAGIC, sizeof(h.magic));
	h.desc_len = desc_len;
	h.n_crcs = l->n_crcs;
	len = sizeof(h) + desc_len + (size_t)l->n_crcs * 4 + 4;
	buf = malloc(len);
	if (!buf) {
		free(desc);
		return -ENOMEM;
	}
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), desc, desc_len);
	if (l->n_crcs)
		memcpy(buf + sizeof(h) + desc_len, crcs, (size_t)l->n_crcs * 4);
	crc = crc32c(buf, len - 4, 0);
	memcpy(buf + len - 4, &crc, 4);
	free(desc);
	rec_name(rank, name, sizeof(name));
	r = fs_write_file_at(dfd, name, buf, len, FS_ATOMIC);
	free(buf);
	return r;
}

static json_t *save_json(const char *id, const struct store_key *k, const char *root,
			 const struct creds *o, const uint32_t *local, size_t n_local,
			 uint64_t gen)
{
	json_t *groups = json_array(), *ranks = json_array();

	for (uint32_t i = 0; groups && i < o->n_groups; i++)
		json_array_append_new(groups, json_integer(o->groups[i]));
	for (size_t i = 0; ranks && i < n_local; i++)
		json_array_append_new(ranks, json_integer(local[i]));
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, "
			 "s:I}",
			 "format", SAVE_FORMAT, "id", id, "root", root, "job", k->job, "run", k->run,
			 "name", k->name, "step", (json_int_t)k->step, "attempt",
			 (json_int_t)k->attempt, "world", (json_int_t)k->world, "uid",
			 (json_int_t)o->uid, "gid", (json_int_t)o->gid, "umask",
			 (json_int_t)o->umask, "groups", groups ? groups : json_array(), "local",
			 ranks ? ranks : json_array(), "gen", (json_int_t)gen);
}

/* save.json of a gen below `gen` (or none) is replaced. */
static int write_save(int dfd, json_t *j, uint64_t gen)
{
	char *text = NULL, *old = NULL;
	size_t len;
	int r;

	pthread_mutex_lock(&g_lock);
	if (fs_read_file_at(dfd, SAVE_FILE, SAVE_MAX, &old, &len) == 0) {
		json_t *o = json_loadb(old, len, 0, NULL);
		json_int_t was = json_integer_value(json_object_get(o, "gen"));
		json_decref(o);
		free(old);
		if (was >= 0 && (uint64_t)was > gen) {
			pthread_mutex_unlock(&g_lock);
			return 0;
		}
	}
	text = json_dumps(j, JSON_COMPACT);
	r = text ? fs_write_file_at(dfd, SAVE_FILE, text, strlen(text), FS_ATOMIC) : -ENOMEM;
	pthread_mutex_unlock(&g_lock);
	free(text);
	return r;
}

int pending_record(const char *state_dir, const char *id, const struct store_key *k,
		   const char *root, const struct creds *owner, const uint32_t *local,
		   size_t n_local, uint64_t gen, uint32_t rank, uint64_t extent,
		   const struct layout *l, const uint32_t *crcs, char *err, size_t errlen)
{
	json_t *j;
	int dfd, r;

	dfd = save_dir(state_dir, id, true);
	if (dfd < 0) {
		snprintf(err, errlen, "cannot make '%s/%s/%s': %s", state_dir, PENDING_DIR, id,
			 strerror(-dfd));
		return dfd;
	}
	r = write_rec(dfd, rank, extent, l, crcs);
	if (r < 0) {
		snprintf(err, errlen, "cannot record rank %u in '%s/%s/%s': %s", rank, state_dir,
			 PENDING_DIR, id, strerror(-r));
		goto out;
	}
	j = save_json(id, k, root, owner, local, n_local, gen);
	r = j ? write_save(dfd, j, gen) : -ENOMEM;
	json_decref(j);
	/* The new names, durable with their contents. */
	if (r == 0 && fsync(dfd) < 0)
		r = -errno;
	if (r < 0)
		snprintf(err, errlen, "cannot record the save in '%s/%s/%s': %s", state_dir,
			 PENDING_DIR, id, strerror(-r));
out:
	close(dfd);
	return r;
}

void pending_remove(const char *state_dir, const char *id)
{
	char path[4096];
	int pfd;

	if (!id_ok(id) ||
	    (size_t)snprintf(path, sizeof(path), "%s/%s", state_dir, PENDING_DIR) >= sizeof(path))
		return;
	pfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0)
		return;
	if (fs_rm_rf_at(pfd, id) == 0)
		fsync(pfd);
	close(pfd);
}

bool pending_exists(const char *state_dir, const char *id)
{
	int dfd;

	if (!id_ok(id))
		return false;
	dfd = save_dir(state_dir, id, false);
	if (dfd < 0)
		return false;
	close(dfd);
	return true;
}

void pending_free(struct pending_save *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n_ranks; i++) {
		layout_free(&p->ranks[i].layout);
		free(p->ranks[i].crcs);
	}
	free(p->ranks);
	free(p->local);
	free(p);
}

static bool str_into(json_t *o, const char *key, char *buf, size_t len)
{
	const char *v = json_string_value(json_object_get(o, key));

	return v && strlen(v) < len && snprintf(buf, len, "%s", v) >= 0;
}

static bool u64_of(json_t *o, const char *key, uint64_t max, uint64_t *ret)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    (uint64_t)json_integer_value(v) > max)
		return false;
	*ret = (uint64_t)json_integer_value(v);
	return true;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static int load_save(int dfd, const char *id, struct pending_save *p, char *why, size_t whylen)
{
	char *text = NULL, idc[STORE_ID_LEN + 1];
	json_t *j, *a;
	uint64_t v;
	size_t len;
	int r;

	r = fs_read_file_at(dfd, SAVE_FILE, SAVE_MAX, &text, &len);
	if (r == -ENOENT)
		return -ENODATA;
	if (r < 0) {
		snprintf(why, whylen, "%s: %s", SAVE_FILE, strerror(-r));
		return r;
	}
	j = json_loadb(text, len, 0, NULL);
	free(text);
	r = -EBADMSG;
	if (!json_is_object(j) || !json_is_string(json_object_get(j, "format")) ||
	    strcmp(json_string_value(json_object_get(j, "format")), SAVE_FORMAT) ||
	    !str_into(j, "id", p->id, sizeof(p->id)) || strcmp(p->id, id) ||
	    !str_into(j, "root", p->root, sizeof(p->root)) ||
	    !str_into(j, "job", p->key.job, sizeof(p->key.job)) ||
	    !str_into(j, "run", p->key.run, sizeof(p->key.run)) ||
	    !str_into(j, "name", p->key.name, sizeof(p->key.name)) ||
	    !u64_of(j, "step", UINT64_MAX, &p->key.step) || !u64_of(j, "attempt", UINT32_MAX, &v)) {
		snprintf(why, whylen, "%s: not a record of this daemon's", SAVE_FILE);
		goto out;
	}
	p->key.attempt = (uint32_t)v;
	if (!u64_of(j, "world", CKPT_MAX_WORLD, &v) || !v) {
		snprintf(why, whylen, "%s: no world size", SAVE_FILE);
		goto out;
	}
	p->key.world = (uint32_t)v;
	store_key_id(&p->key, idc);
	if (strcmp(idc, id)) {
		snprintf(why, whylen, "%s: its key is not attempt %s's", SAVE_FILE, id);
		goto out;
	}
	if (!u64_of(j, "uid", UINT32_MAX - 1, &v))
		goto bad_owner;
	p->owner.uid = (uid_t)v;
	if (!u64_of(j, "gid", UINT32_MAX - 1, &v))
		goto bad_owner;
	p->owner.gid = (gid_t)v;
	if (!u64_of(j, "umask", 0777, &v))
		goto bad_owner;
	p->owner.umask = (mode_t)v;
	a = json_object_get(j, "groups");
	if (!json_is_array(a) || json_array_size(a) > CREDS_MAX_GROUPS)
		goto bad_owner;
	for (size_t i = 0; i < json_array_size(a); i++) {
		json_t *g = json_array_get(a, i);
		if (!json_is_integer(g) || json_integer_value(g) < 0 ||
		    json_integer_value(g) >= UINT32_MAX)
			goto bad_owner;
		p->owner.groups[p->owner.n_groups++] = (gid_t)json_integer_value(g);
	}
	a = json_object_get(j, "local");
	if (!json_is_array(a) || json_array_size(a) > p->key.world) {
		snprintf(why, whylen, "%s: bad list of local ranks", SAVE_FILE);
		goto out;
	}
	p->local = calloc(json_array_size(a) + 1, sizeof(*p->local));
	if (!p->local) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < json_array_size(a); i++) {
		json_t *x = json_array_get(a, i);
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) >= p->key.world) {
			snprintf(why, whylen, "%s: bad list of local ranks", SAVE_FILE);
			goto out;
		}
		p->local[p->n_local++] = (uint32_t)json_integer_value(x);
	}
	qsort(p->local, p->n_local, sizeof(*p->local), cmp_u32);
	for (size_t i = 1; i < p->n_local; i++)
		if (p->local[i] == p->local[i - 1]) {
			snprintf(why, whylen, "%s: a local rank listed twice", SAVE_FILE);
			goto out;
		}
	r = 0;
	goto out;
bad_owner:
	snprintf(why, whylen, "%s: bad owner credentials", SAVE_FILE);
out:
	json_decref(j);
	return r;
}

static int load_rec(int dfd, const char *name, const struct pending_save *p,
		    struct pending_rank *pr, char *why, size_t whylen)
{
	struct rec_head h;
	char *buf = NULL, derr[256];
	size_t len;
	uint32_t crc;
	int r;

	r = fs_read_file_at(dfd, name, REC_MAX, &buf, &len);
	if (r < 0) {
		snprintf(why, whylen, "%s: %s", name, strerror(-r));
		return r;
	}
	r = -EBADMSG;
	if (len < sizeof(h) + 4) {
		snprintf(why, whylen, "%s: too short", name);
		goto out;
	}
	memcpy(&h, buf, sizeof(h));
	memcpy(&crc, buf + len - 4, 4);
	if (memcmp(h.magic, REC_MAGIC, sizeof(h.magic)) || h.version != REC_VERSION ||
	    h.desc_len > DESC_MAX_BYTES || h.n_crcs > REC_CRCS_MAX ||
	    len != sizeof(h) + h.desc_len + h.n_crcs * 4 + 4 || crc != crc32c(buf, len - 4, 0)) {
		snprintf(why, whylen, "%s: damaged (magic, version, sizes or checksum)", name);
		goto out;
	}
	if (h.rank >= p->key.world || !h.extent || h.extent > (1ull << 40)) {
		snprintf(why, whylen, "%s: rank %u or part size %llu out of range", name, h.rank,
			 (unsigned long long)h.extent);
		goto out;
	}
	memset(&pr->layout, 0, sizeof(pr->layout));
	r = desc_parse(buf + sizeof(h), (size_t)h.desc_len, &pr->layout, derr, sizeof(derr));
	if (r < 0) {
		snprintf(why, whylen, "%s: its layout: %s", name, derr);
		goto out;
	}
	r = -EBADMSG;
	if (pr->layout.n_crcs != h.n_crcs || strcmp(pr->layout.name, p->key.name) ||
	    pr->layout.step != p->key.step) {
		snprintf(why, whylen, "%s: its layout is not this save's", name);
		layout_free(&pr->layout);
		goto out;
	}
	pr->crcs = calloc(h.n_crcs ? h.n_crcs : 1, sizeof(uint32_t));
	if (!pr->crcs) {
		r = -ENOMEM;
		layout_free(&pr->layout);
		goto out;
	}
	memcpy(pr->crcs, buf + sizeof(h) + h.desc_len, (size_t)h.n_crcs * 4);
	pr->rank = h.rank;
	pr->extent = h.extent;
	r = 0;
out:
	free(buf);
	return r;
}

static int cmp_rank(const void *a, const void *b)
{
	return cmp_u32(&((const struct pending_rank *)a)->rank,
		       &((const struct pending_rank *)b)->rank);
}

static int load_one(int pfd, const char *id, struct pending_save **ret, char *why, size_t whylen)
{
	struct pending_save *p = calloc(1, sizeof(*p));
	struct dirent *e;
	DIR *d;
	int dfd, r;

	if (!p)
		return -ENOMEM;
	dfd = openat(pfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		r = -errno;
		snprintf(why, whylen, "%s", strerror(errno));
		free(p);
		return r;
	}
	r = load_save(dfd, id, p, why, whylen);
	if (r < 0)
		goto fail;
	p->ranks = calloc(p->key.world, sizeof(*p->ranks));
	d = p->ranks ? fdopendir(dup(dfd)) : NULL;
	if (!d) {
		r = -ENOMEM;
		goto fail;
	}
	while ((e = readdir(d))) {
		unsigned rank;
		char tail;

		if (sscanf(e->d_name, "rank-%5u.re%c", &rank, &tail) != 2 || tail != 'c' ||
		    strlen(e->d_name) != strlen("rank-00000.rec"))
			continue;
		if (p->n_ranks == p->key.world) {
			snprintf(why, whylen, "more rank records than the world size");
			r = -EBADMSG;
			break;
		}
		r = load_rec(dfd, e->d_name, p, &p->ranks[p->n_ranks], why, whylen);
		if (r < 0)
			break;
		p->n_ranks++;
	}
	closedir(d);
	if (r < 0)
		goto fail;
	qsort(p->ranks, p->n_ranks, sizeof(*p->ranks), cmp_rank);
	for (size_t i = 0; i < p->n_ranks; i++) {
		if (i && p->ranks[i].rank == p->ranks[i - 1].rank) {
			snprintf(why, whylen, "rank %u recorded twice", p->ranks[i].rank);
			r = -EBADMSG;
			goto fail;
		}
	}
	if (!p->n_ranks) {
		snprintf(why, whylen, "no rank record");
		r = -EBADMSG;
		goto fail;
	}
	close(dfd);
	*ret = p;
	return 0;

fail:
	close(dfd);
	pending_free(p);
	return r;
}

unsigned pending_load_all(const char *state_dir, void (*fn)(void *ud, struct pending_save *p),
			  void (*bad)(void *ud, const char *id, const char *why, bool removed),
			  void *ud)
{
	char path[4096];
	struct dirent *e;
	unsigned n = 0;
	DIR *d;
	int pfd;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", state_dir, PENDING_DIR) >= sizeof(path))
		return 0;
	pfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0)
		return 0;
	d = fdopendir(dup(pfd));
	if (!d) {
		close(pfd);
		return 0;
	}
	while ((e = readdir(d))) {
		struct pending_save *p = NULL;
		char why[512] = "";
		int r;

		if (e->d_name[0] == '.')
			continue;
		if (!id_ok(e->d_name)) {
			bad(ud, e->d_name, "not an attempt id", false);
			continue;
		}
		r = load_one(pfd, e->d_name, &p, why, sizeof(why));
		if (r == -ENODATA) {
			/* A rank's record without its save's: the daemon stopped
			 * in between, before any SAVE_DURABLE said so. */
			bool gone = fs_rm_rf_at(pfd, e->d_name) == 0;
			bad(ud, e->d_name, "no save was recorded (ckptd stopped before it reported "
				"any rank durable)", gone);
			continue;
		}
		if (r < 0) {
			bad(ud, e->d_name, why, false);
			continue;
		}
		fn(ud, p);
		n++;
	}
	closedir(d);
	close(pfd);
	return n;
}
