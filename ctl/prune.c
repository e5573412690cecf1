/* SPDX-License-Identifier: MIT */
/*
 * prune.c - ckptctl prune and pin/unpin: a retention pass over one root
 * (store/prune.h, the engine ckptd runs too), shown as a table of each
 * committed checkpoint directly in ROOT with what became of it and why
 * (--dry-run: the plan only), or as JSON Lines.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "format/index.h"
#include "format/names.h"
#include "format/retention.h"
#include "store/fsutil.h"
#include "store/prune.h"
#include "store/remove.h"
#include "store/s3_addr.h"
#include "store/store_s3.h"

#define PINS_FILE PRUNE_PINS_FILE

/* One JSON line; o is consumed.  0, or -ENOMEM (said on stderr). */
static int emit(json_t *o)
{
	int r = o ? ctl_json_line(o) : -ENOMEM;

	json_decref(o);
	if (r < 0)
		ctl_err("prune: out of memory");
	return r;
}

static void warn_ctl(void *ud, const char *msg)
{
	(void)ud;
	ctl_err("prune: %s", msg);
}

/*
 * ckptctl pin|unpin ROOT NAME: adds NAME to (or removes it from) the pin
 * list.  The list is read, changed and written whole (a new file renamed
 * over the old, then the root fsynced) under an exclusive lock on the
 * root, so two pins at once both land and a crash leaves the old list or
 * the new, never half of one.  Only a committed checkpoint directly in
 * ROOT can be pinned; unpinning what is not pinned is an error.
 */
/* The pin list `pins` with `name` added (pin) or taken off, as text to
 * write (malloc'd, *len bytes), or NULL with the reason said (out of
 * memory, or a list longer than prune reads). */
static char *pins_text(char **pins, const char *name, bool pin, const char *root,
		       size_t *len)
{
	char *text = NULL;
	FILE *f = open_memstream(&text, len);

	if (!f) {
		ctl_err("%s: out of memory", pin ? "pin" : "unpin");
		return NULL;
	}
	fprintf(f, "# checkpoints kept whatever the retention policy (ckptctl pin/unpin)\n");
	for (size_t i = 0; pins[i]; i++)
		if (strcmp(pins[i], name))
			fprintf(f, "%s\n", pins[i]);
	if (pin)
		fprintf(f, "%s\n", name);
	if (fclose(f) != 0) {
		ctl_err("%s: out of memory", pin ? "pin" : "unpin");
		return NULL;
	}
	if (*len > PRUNE_PINS_MAX) {
		/* Prune would not read it: every prune of the root would fail. */
		ctl_err("pin: %s/%s would be over %u bytes, more than prune reads: unpin some first",
			root, PRUNE_PINS_FILE, PRUNE_PINS_MAX);
		free(text);
		return NULL;
	}
	return text;
}

/* Whether checkpoint `name` of S3 root `root` (url: the two joined) is
 * committed: 1, 0 not (why in err), or -errno (err). */
static int s3_committed(const char *url, const char *name, char *err, size_t errlen)
{
	char *text = NULL, e[512];
	struct manifest m;
	size_t len = 0;
	int r, k;

	r = store_s3_get(url, MANIFEST_FILE, CTL_MANIFEST_MAX, &text, &len, err, errlen);
	if (r == -ENOENT) {
		snprintf(err, errlen, "it has no %s", MANIFEST_FILE);
		return 0;
	}
	if (r < 0)
		return r;
	k = ctl_manifest_judge(0, text, len, &m, e, sizeof(e));
	if (k < 0) {
		snprintf(err, errlen, "out of memory");
		return k;
	}
	if (k != CTL_CKPT_COMMITTED) {
		snprintf(err, errlen, "%s", k == CTL_CKPT_REMOVING ? "it is being removed" : e);
		return 0;
	}
	r = strcmp(m.name, name) ? 0 : 1;
	if (!r)
		snprintf(err, errlen, "its manifest names another checkpoint");
	manifest_free(&m);
	return r;
}

#define PIN_S3_TRIES 8        /* writers racing on the list */
#define PIN_S3_WAIT_MS 3000u  /* for a manifest a removal puts back */

/*
 * pin|unpin on an S3 root: the list object is read with its ETag, changed,
 * and written back only over that ETag (or only if there is none yet), so
 * concurrent pins all land.  A pin is then checked against the
 * checkpoint's manifest: a prune tombstones first and looks at the pins
 * again before any data goes (store/remove.h), so a pin that finds the
 * manifest still there afterwards holds, and one that finds a tombstone
 * lost the race (said, exit 1).
 */
static int pin_s3(const char *root, const char *name, bool pin, bool json)
{
	const char *cmd = pin ? "pin" : "unpin";
	char url[2200], err[768], etag[STORE_ETAG_LEN], **pins = NULL, *text = NULL;
	size_t len = 0;
	bool have = false, changed = false;
	int r, tries;

	if (ctl_s3_start(root) < 0)
		return CTL_EXIT_ERROR;
	if ((size_t)snprintf(url, sizeof(url), "%s%s%s", root,
			     root[strlen(root) - 1] == '/' ? "" : "/", name) >= sizeof(url)) {
		ctl_err("%s: '%s/%s': too long", cmd, root, name);
		return CTL_EXIT_USAGE;
	}
	if (pin) {
		r = s3_committed(url, name, err, sizeof(err));
		if (r == -EACCES)
			ctl_s3_denied(url, err);
		else if (r <= 0)
			ctl_err("pin: '%s' in '%s' is not a committed checkpoint: %s", name, root,
				err);
		if (r <= 0)
			return CTL_EXIT_ERROR;
	}
	for (tries = 0; tries < PIN_S3_TRIES; tries++) {
		prune_pins_free(pins);
		pins = NULL;
		text = NULL;
		r = store_s3_get_etag(root, PRUNE_PINS_FILE, PRUNE_PINS_MAX, &text, &len, etag, err,
				      sizeof(err));
		if (r == -ENOENT) {
			text = NULL;
			etag[0] = '\0';
		} else if (r < 0) {
			if (r == -EACCES)
				ctl_s3_denied(root, err);
			else
				ctl_err("%s: reading %s/%s: %s", cmd, root, PRUNE_PINS_FILE, err);
			return CTL_EXIT_ERROR;
		}
		pins = prune_parse_pins(text, len, &r);
		text = NULL;
		if (!pins) {
			ctl_err("%s: reading %s/%s: %s", cmd, root, PRUNE_PINS_FILE,
				r == -EBADMSG ? "it holds a NUL byte" : strerror(-r));
			return CTL_EXIT_ERROR;
		}
		have = prune_pinned(pins, name);
		if (have == pin)
			break; /* nothing to write */
		text = pins_text(pins, name, pin, root, &len);
		if (!text)
			goto fail;
		r = store_s3_put_if(root, PRUNE_PINS_FILE, text, etag, err, sizeof(err));
		free(text);
		text = NULL;
		if (r == 0) {
			changed = true;
			break;
		}
		if (r != -ESTALE) {
			if (r == -EACCES)
				ctl_s3_denied(root, err);
			else
				ctl_err("%s: writing %s/%s: %s", cmd, root, PRUNE_PINS_FILE, err);
			goto fail;
		}
		/* Another writer came first: read the list again. */
	}
	if (tries == PIN_S3_TRIES) {
		ctl_err("%s: %s/%s kept changing under %d tries: try again", cmd, root,
			PRUNE_PINS_FILE, PIN_S3_TRIES);
		goto fail;
	}
	if (!pin && !changed) {
		ctl_err("unpin: '%s' is not in %s/%s", name, root, PRUNE_PINS_FILE);
		goto fail;
	}
	if (pin) {
		/* Still committed now that the pin is in the list?  A
		 * removal that saw the pin puts the manifest back at once. */
		for (unsigned waited = 0;; waited += 250) {
			r = s3_committed(url, name, err, sizeof(err));
			if (r != 0 || waited >= PIN_S3_WAIT_MS)
				break;
			usleep(250 * 1000);
		}
		if (r <= 0) {
			ctl_err("pin: '%s' in '%s' %s (%s): a prune removing it ran meanwhile; its "
				"name stays in %s, where prune reports it", name, root,
				r == 0 ? "is no longer a committed checkpoint" : "could not be checked",
				err, PRUNE_PINS_FILE);
			goto fail;
		}
	}
	if (json)
		(void)emit(json_pack("{s:s, s:b, s:b}", "name", name, "pinned", pin, "changed",
				     changed));
	else if (changed)
		printf("%s %s\n", pin ? "pinned" : "unpinned", name);
	else
		printf("%s is pinned already\n", name);
	prune_pins_free(pins);
	return 0;
fail:
	free(text);
	prune_pins_free(pins);
	return CTL_EXIT_ERROR;
}

int ctl_pin(const char *root, const char *name, bool pin, bool json)
{
	char err[512], **pins = NULL, *text = NULL;
	struct prune_item c;
	bool have = false;
	size_t len = 0;
	int rootfd, r, ret = CTL_EXIT_ERROR;

	if (!name_checkpoint_ok(name, err, sizeof(err))) {
		ctl_err("%s: %s", pin ? "pin" : "unpin", err);
		return CTL_EXIT_USAGE;
	}
	if (s3_is_url(root))
		return pin_s3(root, name, pin, json);
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		ctl_err("%s: cannot open root '%s': %s", pin ? "pin" : "unpin", root,
			strerror(errno));
		return CTL_EXIT_ERROR;
	}
	if (flock(rootfd, LOCK_EX) < 0) {
		ctl_err("%s: cannot lock root '%s': %s", pin ? "pin" : "unpin", root,
			strerror(errno));
		goto out;
	}
	pins = prune_read_pins(rootfd, NULL, &r, err, sizeof(err));
	if (!pins) {
		ctl_err("%s: reading %s/%s: %s", pin ? "pin" : "unpin", root, PINS_FILE,
			r == -EBADMSG ? "it holds a NUL byte" : err);
		goto out;
	}
	have = prune_pinned(pins, name);
	if (pin) {
		struct ret_policy none;

		memset(&none, 0, sizeof(none));
		r = prune_read_local(rootfd, name, &none, &c, err, sizeof(err));
		if (r <= 0) {
			ctl_err("pin: '%s' in '%s' is not a committed checkpoint%s%s", name, root,
				r < 0 ? ": " : "", r < 0 ? err : "");
			goto out;
		}
		free(c.name);
		if (have) {
			if (json)
				(void)emit(json_pack("{s:s, s:b, s:b}", "name", name, "pinned", true,
						     "changed", false));
			else
				printf("%s is pinned already\n", name);
			ret = 0;
			goto out;
		}
	} else if (!have) {
		ctl_err("unpin: '%s' is not in %s/%s", name, root, PINS_FILE);
		goto out;
	}
	/* The whole list, written through a temporary name and renamed over
	 * the old (fs_write_file_at), then the root synced for the rename. */
	text = pins_text(pins, name, pin, root, &len);
	if (!text)
		goto out;
	r = fs_write_file_at(rootfd, PINS_FILE, text, len, FS_ATOMIC);
	if (r == 0 && fsync(rootfd) < 0)
		r = -errno;
	if (r < 0) {
		ctl_err("%s: writing %s/%s: %s", pin ? "pin" : "unpin", root, PINS_FILE,
			strerror(-r));
		goto out;
	}
	if (json)
		(void)emit(json_pack("{s:s, s:b, s:b}", "name", name, "pinned", pin, "changed", true));
	else
		printf("%s %s\n", pin ? "pinned" : "unpinned", name);
	ret = 0;
out:
	free(text);
	prune_pins_free(pins);
	close(rootfd); /* (drops the lock) */
	return ret;
}

int ctl_prune(const char *root, const struct ret_policy *p, bool force, bool dry_run, bool json)
{
	struct prune_run pr = { .root = root, .policy = p, .force = force, .dry_run = dry_run,
				/* A user plans over their own checkpoints only;
				 * root over everyone's, each owner's apart. */
				.only_uid = geteuid() && !s3_is_url(root) ? geteuid() :
									   STORE_NO_OWNER,
				.remover = s3_is_url(root) ? STORE_NO_OWNER : geteuid(),
				.lock_root = !dry_run, .warn = warn_ctl };
	char pol[512], *shown_root = ctl_display(root), err[512];
	size_t width = 4;
	int r, ret = CTL_EXIT_ERROR;
	bool s3 = s3_is_url(root);

	if (!shown_root) {
		ctl_err("prune: out of memory");
		return CTL_EXIT_ERROR;
	}
	if (s3) {
		struct store_s3_settings set = { .retries = 3, .connect_timeout_ms = 5000 };

		r = store_s3_start_settings(&set, err, sizeof(err));
		if (r < 0) {
			ctl_err("prune: '%s': cannot set up S3: %s", root, err);
			free(shown_root);
			return CTL_EXIT_ERROR;
		}
	}
	if (!dry_run) {
		/* Removal is housekeeping: it yields the CPU and the disk to
		 * the saves running beside it (the lowest nice value, and
		 * the idle I/O class: IOPRIO_WHO_PROCESS 1, this process,
		 * IOPRIO_CLASS_IDLE 3 << 13). */
		(void)setpriority(PRIO_PROCESS, 0, 19);
#ifdef SYS_ioprio_set
		(void)syscall(SYS_ioprio_set, 1, 0, 3 << 13);
#endif
	}
	r = prune_run(&pr);
	if (r < 0) {
		ctl_err("prune: %s", pr.err);
		goto out;
	}
	if (pr.others && !pr.n && pr.plan_res == 0) {
		/* Nothing of the caller's: another user's checkpoints are
		 * never theirs to prune. */
		snprintf(pr.err, sizeof(pr.err), "none of the %zu checkpoint%s in '%s' belong to "
			 "uid %u: a user prunes only their own", pr.others, pr.others == 1 ? "" : "s",
			 shown_root, (unsigned)geteuid());
		pr.plan_res = -EPERM;
	} else if (pr.others) {
		ctl_err("prune: %zu checkpoint%s of other users left out (a user prunes only "
			"their own)", pr.others, pr.others == 1 ? "" : "s");
	}
	prune_policy_text(p, pol, sizeof(pol));
	for (size_t i = 0; i < pr.n; i++) {
		size_t l = strlen(pr.v[i].name);

		if (l > width)
			width = l > 64 ? 64 : l;
	}
	if (!json) {
		printf("root %s\npolicy: %s\n\n", shown_root, pol);
		printf("%-7s  %-*s  %10s  %-20s  %s\n", "ACTION", (int)width, "NAME", "STEP", "TIME",
		       "KEPT FOR");
	}
	for (size_t i = 0; i < pr.n; i++) {
		const struct prune_item *c = &pr.v[i];
		char why[128], *shown = ctl_display(c->name), *cwhy = c->why ? ctl_display(c->why) : NULL;
		const char *act;

		if (!shown || (c->why && !cwhy)) {
			free(shown);
			free(cwhy);
			ctl_err("prune: out of memory");
			goto out;
		}
		ret_reasons(c->keep, why, sizeof(why));
		if (c->keep)
			act = "keep";
		else if (dry_run || pr.plan_res < 0)
			act = "remove";
		else if (c->res == 0)
			act = "removed";
		else if (c->res == -EBUSY)
			act = "in_use";
		else if (c->res == -ESTALE || c->res == -ECANCELED)
			act = "changed"; /* since the plan: kept */
		else if (c->res == -EINPROGRESS)
			act = "taken"; /* by another removal */
		else
			act = "failed";
		if (json) {
			json_t *reasons = json_array(), *o;
			char *save = NULL;

			for (char *t = strtok_r(why, ",", &save); reasons && t;
			     t = strtok_r(NULL, ",", &save))
				json_array_append_new(reasons, json_string(t));
			o = reasons ? json_pack("{s:s, s:I, s:s, s:s, s:o}", "name", shown, "step",
						(json_int_t)c->rc.step, "time", c->time, "action",
						act, "reasons", reasons) : NULL;
			if (o && cwhy)
				json_object_set_new(o, "error", json_string(cwhy));
			free(shown);
			free(cwhy);
			if (emit(o) < 0)
				goto out;
		} else {
			char up[8] = "";

			/* ("in_use" -> "IN USE"; no action is longer than 7) */
			for (size_t k = 0; k < sizeof(up) - 1 && act[k]; k++)
				up[k] = (char)(act[k] == '_' ? ' ' : toupper((unsigned char)act[k]));
			printf("%-7s  %-*s  %10llu  %-20s  %s\n", up, (int)width, shown,
			       (unsigned long long)c->rc.step, c->time, c->keep ? why :
			       cwhy ? cwhy : "-");
			free(shown);
			free(cwhy);
		}
	}
	if (json) {
		json_t *o = json_pack("{s:{s:s, s:s, s:I, s:I, s:I, s:b, s:b, s:s?}}", "summary",
				      "root", shown_root, "policy", pol, "checkpoints",
				      (json_int_t)pr.n, "remove", (json_int_t)pr.planned,
				      "not_candidates", (json_int_t)pr.skipped, "dry_run", dry_run,
				      "refused", pr.plan_res == -EPERM, "error",
				      pr.plan_res == -EPERM ? pr.err : NULL);
		json_t *sum = json_object_get(o, "summary");

		if (sum && !dry_run) {
			json_object_set_new(sum, "removed", json_integer((json_int_t)pr.removed));
			json_object_set_new(sum, "in_use", json_integer((json_int_t)pr.busy));
			json_object_set_new(sum, "kept_since_plan",
					    json_integer((json_int_t)pr.kept_late));
			json_object_set_new(sum, "taken", json_integer((json_int_t)pr.taken));
			json_object_set_new(sum, "failed", json_integer((json_int_t)pr.failed));
			json_object_set_new(sum, "finished_earlier", json_integer(pr.finished));
		}
		if (emit(o) < 0)
			goto out;
	} else if (dry_run || pr.plan_res < 0) {
		printf("\n%zu of %zu checkpoint%s would be removed (%s: nothing was removed)\n",
		       pr.planned, pr.n, pr.n == 1 ? "" : "s", dry_run ? "dry run" : "refused");
	} else {
		printf("\n%zu of %zu checkpoint%s removed", pr.removed, pr.n, pr.n == 1 ? "" : "s");
		if (pr.busy)
			printf(", %zu kept because in use", pr.busy);
		if (pr.kept_late)
			printf(", %zu kept as pinned or changed since the plan", pr.kept_late);
		if (pr.taken)
			printf(", %zu left to another removal", pr.taken);
		if (pr.failed)
			printf(", %zu failed", pr.failed);
		if (pr.finished)
			printf("; %ld removal%s a crash had cut short finished", pr.finished,
			       pr.finished == 1 ? "" : "s");
		printf("\n");
	}
	if (pr.plan_res == -EPERM) {
		ctl_err("prune: refused: %s", pr.err);
		ret = CTL_EXIT_REFUSED;
		goto out;
	}
	if (pr.failed) {
		ctl_err("prune: %zu removal%s failed (above, each with what became of the "
			"checkpoint); one that no longer looks committed is finished or kept by the "
			"next prune", pr.failed, pr.failed == 1 ? "" : "s");
		goto out;
	}
	ret = pr.skipped ? CTL_EXIT_DEGRADED : 0;
	if (pr.skipped)
		ctl_err("prune: %zu entr%s of the root could not be read (above): the plan leaves "
			"them out", pr.skipped, pr.skipped == 1 ? "y" : "ies");
out:
	prune_run_free(&pr);
	free(shown_root);
	if (s3)
		store_s3_stop();
	return ret;
}
