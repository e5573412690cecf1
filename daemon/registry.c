/* SPDX-License-Identifier: MIT */
/* registry.c - see registry.h. */
#include "daemon/registry.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/pending.h"
#include "store/fsutil.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"
#include "store/store_spill.h"

#define ENTRY_MAX (16u << 10)

int registry_open(struct registry *reg, const char *state_dir, char *err, size_t errlen)
{
	int sfd, r;

	reg->dirfd = reg->lockfd = -1;
	reg->path = strdup(state_dir);
	if (!reg->path)
		return -ENOMEM;
	r = fs_mkdir_p(state_dir, 0700);
	if (r < 0) {
		snprintf(err, errlen, "cannot create state_dir '%s': %s", state_dir, strerror(-r));
		goto fail;
	}
	sfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open state_dir '%s': %s", state_dir, strerror(errno));
		goto fail;
	}
	reg->lockfd = openat(sfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (reg->lockfd < 0 || flock(reg->lockfd, LOCK_EX | LOCK_NB) < 0) {
		r = errno == EWOULDBLOCK ? -EBUSY : -errno;
		snprintf(err, errlen, r == -EBUSY ? "state_dir '%s' is in use by another ckptd" :
						    "cannot lock state_dir '%s': %s",
			 state_dir, strerror(-r));
		close(sfd);
		goto fail;
	}
	if (mkdirat(sfd, "areas", 0700) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "cannot create '%s/areas': %s", state_dir, strerror(errno));
		close(sfd);
		goto fail;
	}
	reg->dirfd = openat(sfd, "areas", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(sfd);
	if (reg->dirfd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open '%s/areas': %s", state_dir, strerror(errno));
		goto fail;
	}
	return 0;

fail:
	registry_close(reg);
	return r;
}

void registry_close(struct registry *reg)
{
	if (reg->dirfd >= 0)
		close(reg->dirfd);
	if (reg->lockfd >= 0)
		close(reg->lockfd);
	free(reg->path);
	reg->dirfd = reg->lockfd = -1;
	reg->path = NULL;
}

static void entry_name(const char *id, char *buf, size_t len)
{
	snprintf(buf, len, "%s.json", id);
}

int registry_add(struct registry *reg, const char *id, const char *root, const struct creds *owner,
		 const char *instance)
{
	json_t *groups = json_array(), *j;
	char name[STORE_ID_LEN + 8];
	char *text;
	int r;

	for (uint32_t i = 0; i < owner->n_groups; i++)
		json_array_append_new(groups, json_integer(owner->groups[i]));
	j = json_pack("{s:s, s:s, s:I, s:I, s:o, s:s, s:I}", "id", id, "root", root, "uid",
		      (json_int_t)owner->uid, "gid", (json_int_t)owner->gid, "groups", groups,
		      "instance", instance, "created", (json_int_t)time(NULL));
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text)
		return -ENOMEM;
	entry_name(id, name, sizeof(name));
	/* Not fsynced: the entry must outlive a crash of the daemon (the page
	 * cache does), and an fsync here would make every save start wait for
	 * the journal commit of other jobs' writes.  After a power loss an
	 * entry may be lost and its work area left (ckptctl list shows it). */
	r = fs_write_file_at(reg->dirfd, name, text, strlen(text), FS_ATOMIC | FS_NOSYNC);
	free(text);
	return r;
}

void registry_del(struct registry *reg, const char *id)
{
	char name[STORE_ID_LEN + 8];

	entry_name(id, name, sizeof(name));
	if (unlinkat(reg->dirfd, name, 0) < 0 && errno != ENOENT)
		log_warn("registry: cannot remove '%s/areas/%s': %s", reg->path, name,
			 strerror(errno));
}

/* Removes the work area noted in entry j, acting as its owner (an S3 one
 * only once idle for idle_ms).  Returns 0 if it is gone (or was never
 * made), -EBUSY if it is still active, -errno if it could not be removed:
 * the entry stays for the next sweep. */
static int remove_area(json_t *j, const char *id, int64_t idle_ms)
{
	const char *root = json_string_value(json_object_get(j, "root"));
	json_t *groups = json_object_get(j, "groups");
	char work[sizeof(STORE_WORK_PREFIX) + STORE_ID_LEN], err[256], spill[PATH_MAX];
	struct creds owner = { .umask = 077 };
	struct creds self;
	char *text = NULL;
	size_t len;
	int rfd, wfd, r;

	if (!root || !json_is_integer(json_object_get(j, "uid")) ||
	    !json_is_integer(json_object_get(j, "gid")))
		return -EBADMSG;
	owner.uid = (uid_t)json_integer_value(json_object_get(j, "uid"));
	if (s3_is_url(root)) {
		/* The daemon's S3 credentials, not the owner's: S3 knows no
		 * uids.  The area's attempt.json must name this entry's life. */
		const char *inst = json_string_value(json_object_get(j, "instance"));
		r = inst ? store_s3_sweep(root, id, inst, idle_ms / 1000, err, sizeof(err)) :
			   -EBADMSG;
		if (r == -EBUSY)
			log_debug("sweep: %s: kept", err);
		else if (r < 0 && r != -EBADMSG)
			log_warn("sweep: %s (tried again at the next sweep)", err);
		else if (r > 0)
			log_info("removed stale work area '%s/%s%s'", root, STORE_WORK_PREFIX, id);
		if (r < 0)
			return r;
		/* With the spill tier the attempt had a local work area too,
		 * under the owner's spill directory: removed as a local one. */
		if (store_spill_work_root(owner.uid, spill, sizeof(spill)) < 0)
			return 0;
		root = spill;
	}
	if (root[0] != '/')
		return -EBADMSG;
	owner.gid = (gid_t)json_integer_value(json_object_get(j, "gid"));
	for (size_t i = 0; i < json_array_size(groups) && i < CREDS_MAX_GROUPS; i++)
		owner.groups[owner.n_groups++] = (gid_t)json_integer_value(json_array_get(groups, i));
	snprintf(work, sizeof(work), "%s%s", STORE_WORK_PREFIX, id);

	creds_self(&self);
	r = creds_apply(&owner, err, sizeof(err));
	if (r < 0) {
		log_warn("sweep: %s", err);
		return r;
	}
	rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd < 0) {
		r = errno == ENOENT ? 0 : -errno;
		goto out;
	}
	wfd = openat(rfd, work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (wfd < 0) {
		r = errno == ENOENT ? 0 : -errno;
		goto out_root;
	}
	/* Only the area this entry is about: its attempt.json names the id and
	 * the life of the daemon that noted it (a new life may have replaced
	 * the area under the same name for a new attempt with the same key). */
	r = fs_read_file_at(wfd, STORE_ATTEMPT_FILE, 64u << 10, &text, &len);
	if (r == 0) {
		json_t *a = json_loadb(text, len, 0, NULL);
		const char *aid = json_string_value(json_object_get(a, "id"));
		const char *ainst = json_string_value(
			json_object_get(json_object_get(a, "daemon"), "instance"));
		const char *inst = json_string_value(json_object_get(j, "instance"));
		bool match = aid && strcmp(aid, id) == 0 && ainst && inst && !strcmp(ainst, inst);
		json_decref(a);
		free(text);
		if (!match) {
			log_info("sweep: '%s/%s' is not the work area noted (another save or "
				 "a later life made it): left alone", root, work);
			r = 0;
			goto out_work;
		}
		/* Claimed by another daemon (or another life): the area is its
		 * coordinator's now, which may be committing it with every rank
		 * durable; it removes the area if the save fails, and `ckptctl
		 * gc` if that daemon dies too.  Not ours to remove. */
		if (fs_read_file_at(wfd, STORE_CLAIM_FILE, 64u << 10, &text, &len) == 0) {
			json_t *c = json_loadb(text, len, 0, NULL);
			const char *cinst = json_string_value(json_object_get(c, "instance"));
			bool others = !cinst || strcmp(cinst, inst);

			json_decref(c);
			free(text);
			if (others) {
				log_info("sweep: '%s/%s' is claimed by another daemon's save: left "
					 "to its coordinator", root, work);
				r = 0;
				goto out_work;
			}
		}
	} else if (r != -ENOENT) {
		goto out_work;
	}
	/* (No attempt.json: the daemon died between mkdir and writing it.)
	 * Renamed away before anything goes, and only if the name still
	 * holds the directory just judged: another daemon coordinating the
	 * attempt may commit it at any moment, and a commit that came first
	 * leaves nothing here to remove (-ENOENT). */
	r = store_local_discard(rfd, work, wfd, owner.uid, true, err, sizeof(err));
	if (r == 0)
		log_info("removed stale work area '%s/%s'", root, work);
	else if (r == -ENOENT)
		r = 0;
	else
		log_warn("cannot remove stale work area '%s/%s': %s", root, work, err);
out_work:
	close(wfd);
out_root:
	close(rfd);
out:
	creds_apply(&self, err, sizeof(err));
	return r;
}

/* True if entry `name` still names life `instance`: a new save of this life
 * with the same attempt id may have replaced it (and its area) meanwhile,
 * and its entry must stay. */
static bool entry_still(struct registry *reg, const char *name, const char *instance)
{
	char *text = NULL;
	size_t len;
	bool same = false;

	if (!instance || fs_read_file_at(reg->dirfd, name, ENTRY_MAX, &text, &len) < 0)
		return false;
	json_t *j = json_loadb(text, len, 0, NULL);
	const char *now = json_string_value(json_object_get(j, "instance"));
	same = now && strcmp(now, instance) == 0;
	json_decref(j);
	free(text);
	return same;
}

unsigned registry_sweep(struct registry *reg, const char *instance, int64_t min_age_ms,
			int64_t idle_ms, char (*live)[STORE_ID_LEN + 1], size_t n_live)
{
	int fd = dup(reg->dirfd);
	unsigned removed = 0;
	struct dirent *de;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		log_warn("sweep: cannot read '%s/areas': %s", reg->path, strerror(errno));
		return 0;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		char id[STORE_ID_LEN + 1];
		size_t nl = strlen(de->d_name);
		char *text = NULL;
		size_t len;
		bool is_live = false;

		if (nl != STORE_ID_LEN + 5 || strcmp(de->d_name + STORE_ID_LEN, ".json"))
			continue;
		memcpy(id, de->d_name, STORE_ID_LEN);
		id[STORE_ID_LEN] = '\0';
		for (size_t i = 0; i < n_live && !is_live; i++)
			is_live = strcmp(live[i], id) == 0;
		/* A save owed a commit (pending.h) keeps its areas, also when
		 * its records could not be loaded: never removed silently. */
		if (is_live || pending_exists(reg->path, id) ||
		    fs_read_file_at(reg->dirfd, de->d_name, ENTRY_MAX, &text, &len) < 0)
			continue;
		json_t *j = json_loadb(text, len, 0, NULL);
		free(text);
		const char *inst = json_string_value(json_object_get(j, "instance"));
		json_int_t created = json_integer_value(json_object_get(j, "created"));
		bool same = inst && strcmp(inst, instance) == 0;
		if (same && ((int64_t)time(NULL) - (int64_t)created) * 1000 <= min_age_ms) {
			json_decref(j);
			continue;
		}
		if (remove_area(j, id, idle_ms) == 0 && entry_still(reg, de->d_name, inst)) {
			unlinkat(reg->dirfd, de->d_name, 0);
			removed++;
		}
		json_decref(j);
	}
	closedir(d);
	return removed;
}
