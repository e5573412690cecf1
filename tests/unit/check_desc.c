/* SPDX-License-Identifier: MIT */
/* check_desc.c - the save descriptor: round trip and malformed input. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "format/desc.h"
#include "format/layout.h"
#include "format/safetensors.h"

static void place(struct layout *l)
{
	char *json;
	size_t len;

	ck_assert_int_eq(layout_pack(l), 0);
	ck_assert_int_eq(st_header_json(l, 0, &json, &len), 0);
	ck_assert_int_eq(layout_place(l, len), 0);
	free(json);
}

/* A layout with every kind of item: sharded, whole, zero-size, scalar,
 * blob, names needing escapes, metadata and metrics. */
static void build_sample(struct layout *l)
{
	uint64_t s1[2] = { 2, 3 }, g1[2] = { 4, 3 }, o1[2] = { 2, 0 };
	uint64_t s2[3] = { 300, 1024, 1 }, s3[2] = { 0, 7 }, blob[1] = { 1000 };

	ck_assert_int_eq(layout_init(l, "/data/ck pt", "step-100", 100), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "w", CKPT_F32, 2, s1, g1, o1, NULL, 0), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "big \"q\"\\", CKPT_BF16, 3, s2, NULL, NULL,
				    NULL, 0), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "empty", CKPT_I64, 2, s3, NULL, NULL, NULL, 0),
			 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "scalar", CKPT_F8_E5M2, 0, NULL, NULL, NULL,
				    NULL, 0), 0);
	ck_assert_int_eq(layout_add(l, ITEM_BLOB, "rng", CKPT_U8, 1, blob, NULL, NULL, NULL, 0), 0);
	json_object_set_new(l->meta, "model", json_string("llama \"7b\"\n\xc3\xa9"));
	json_object_set_new(l->meta, "git", json_string("abc123"));
	json_object_set_new(l->metrics, "loss", json_real(1.25));
	json_object_set_new(l->metrics, "acc", json_real(0.1));
	json_object_set_new(l->metrics, "tiny", json_real(-3.4e-300));
	place(l);
}

static void assert_same(const struct layout *a, const struct layout *b)
{
	ck_assert_str_eq(a->name, b->name);
	ck_assert_str_eq(a->root, b->root);
	ck_assert_uint_eq(a->step, b->step);
	ck_assert_uint_eq(a->file_size, b->file_size);
	ck_assert_uint_eq(a->data_start, b->data_start);
	ck_assert_uint_eq(a->n_crcs, b->n_crcs);
	ck_assert(json_equal(a->meta, b->meta));
	ck_assert(json_equal(a->metrics, b->metrics));
	ck_assert_uint_eq(a->n_items, b->n_items);
	ck_assert_uint_eq(a->n_dims, b->n_dims);
	for (size_t i = 0; i < a->n_items; i++) {
		const struct layout_item *x = &a->items[i], *y = &b->items[i];

		ck_assert_str_eq(x->name, y->name);
		ck_assert_uint_eq(x->kind, y->kind);
		ck_assert_uint_eq(x->dtype, y->dtype);
		ck_assert_uint_eq(x->ndim, y->ndim);
		ck_assert_int_eq(x->sharded, y->sharded);
		ck_assert_uint_eq(x->begin, y->begin);
		ck_assert_uint_eq(x->end, y->end);
		ck_assert_uint_eq(x->crc0, y->crc0);
		ck_assert_int_eq(memcmp(layout_shape(a, x), layout_shape(b, y),
					3u * x->ndim * sizeof(uint64_t)), 0);
	}
}

START_TEST(test_round_trip)
{
	struct layout l, p;
	char err[256] = "";
	char *text;
	size_t len;

	build_sample(&l);
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	assert_same(&l, &p);
	ck_assert(p.items[0].sharded);
	ck_assert_uint_eq(layout_gshape(&p, &p.items[0])[0], 4);
	ck_assert_uint_eq(layout_offs(&p, &p.items[0])[0], 2);
	/* Building the parsed layout again gives the same text. */
	{
		char *text2;
		size_t len2;

		ck_assert_int_eq(desc_build(&p, &text2, &len2), 0);
		ck_assert_uint_eq(len, len2);
		ck_assert_int_eq(memcmp(text, text2, len), 0);
		free(text2);
	}
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

START_TEST(test_round_trip_empty)
{
	struct layout l, p;
	char err[256] = "";
	char *text;
	size_t len;

	ck_assert_int_eq(layout_init(&l, "/", "e", 0), 0);
	place(&l);
	ck_assert_uint_eq(l.file_size, 4096);
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	assert_same(&l, &p);
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

/* Integer metrics from a peer become reals, so they compare with ours. */
START_TEST(test_integer_metric)
{
	static const char t[] = "{\"v\":1,\"name\":\"s\",\"root\":\"/r\",\"step\":1,"
				"\"file_size\":4096,\"data_start\":4096,\"meta\":{},"
				"\"metrics\":{\"epoch\":3},\"items\":[]}";
	struct layout p;
	char err[256] = "";

	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(t, sizeof(t) - 1, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert(json_is_real(json_object_get(p.metrics, "epoch")));
	ck_assert(json_real_value(json_object_get(p.metrics, "epoch")) == 3.0);
	layout_free(&p);
}
END_TEST

/*
 * Malformed descriptors.  The good base: w = F32 [2,3] (24 bytes) at
 * [4096, 4120) and blob b (8 bytes) at [4120, 4128).
 */
#define D(v, name, root, step, fs, ds, meta, metrics, items)                                   \
	"{\"v\":" v ",\"name\":" name ",\"root\":" root ",\"step\":" step ",\"file_size\":" fs    \
	",\"data_start\":" ds ",\"meta\":" meta ",\"metrics\":" metrics ",\"items\":" items "}"
#define W_OK "[\"w\",0,\"F32\",[2,3],null,null,4096,4120]"
#define B_OK "[\"b\",1,\"U8\",[8],null,null,4120,4128]"
#define GOOD_ITEMS "[" W_OK "," B_OK "]"
#define ITEMS(...) D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{}", __VA_ARGS__)

struct bad_desc {
	const char *what;
	const char *text;
	const char *reason; /* a substring of the message */
};

static const struct bad_desc bad_descs[] = {
	{ "not an object", "[1,2]", "not a JSON object" },
	{ "not JSON", "{\"v\":1,", "not valid JSON" },
	{ "empty", "", "not valid JSON" },
	{ "trailing garbage", ITEMS(GOOD_ITEMS) "x", "not valid JSON" },
	{ "wrong version", D("2", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "version" },
	{ "version as string",
	  D("\"1\"", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS), "version" },
	{ "duplicate key", "{\"v\":1,\"v\":1}", "duplicate" },
	{ "unknown field",
	  "{\"v\":1,\"name\":\"s\",\"root\":\"/r\",\"step\":1,\"file_size\":4128,"
	  "\"data_start\":4096,\"meta\":{},\"metrics\":{},\"items\":" GOOD_ITEMS ",\"x\":1}",
	  "unknown field 'x'" },
	{ "missing field",
	  "{\"v\":1,\"name\":\"s\",\"root\":\"/r\",\"step\":1,\"file_size\":4128,"
	  "\"data_start\":4096,\"meta\":{},\"items\":" GOOD_ITEMS "}",
	  "lacks the field 'metrics'" },
	{ "bad checkpoint name",
	  D("1", "\"../x\"", "\"/r\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS), "contains '/'" },
	{ "hidden checkpoint name",
	  D("1", "\".x\"", "\"/r\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS), "starts with '.'" },
	{ "relative root", D("1", "\"s\"", "\"r\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "absolute" },
	{ "root with ..", D("1", "\"s\"", "\"/r/../x\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "'..'" },
	{ "name not a string", D("1", "7", "\"/r\"", "1", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "must be strings" },
	{ "negative step", D("1", "\"s\"", "\"/r\"", "-1", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "non-negative" },
	{ "real step", D("1", "\"s\"", "\"/r\"", "1.0", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "non-negative" },
	{ "huge step",
	  D("1", "\"s\"", "\"/r\"", "18446744073709551615", "4128", "4096", "{}", "{}", GOOD_ITEMS),
	  "not valid JSON" },
	{ "unaligned data_start",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4000", "{}", "{}", GOOD_ITEMS), "data_start" },
	{ "zero data_start", D("1", "\"s\"", "\"/r\"", "1", "32", "0", "{}", "{}", GOOD_ITEMS),
	  "data_start" },
	{ "huge data_start",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "1073741824", "{}", "{}", GOOD_ITEMS),
	  "data_start" },
	{ "file_size short", D("1", "\"s\"", "\"/r\"", "1", "4127", "4096", "{}", "{}", GOOD_ITEMS),
	  "file_size" },
	{ "file_size long", D("1", "\"s\"", "\"/r\"", "1", "8192", "4096", "{}", "{}", GOOD_ITEMS),
	  "file_size" },
	{ "file_size without items",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{}", "[]"), "file_size" },
	{ "items not an array", ITEMS("{}"), "items" },
	{ "item not an array", ITEMS("[7]"), "item 0 is not an array" },
	{ "item of 7 fields", ITEMS("[[\"w\",0,\"F32\",[2,3],null,null,4096]]"), "item 0 is not" },
	{ "item name not a string", ITEMS("[[1,0,\"F32\",[2,3],null,null,4096,4120]," B_OK "]"),
	  "item 0" },
	{ "reserved item name",
	  ITEMS("[[\"__metadata__\",0,\"F32\",[2,3],null,null,4096,4120]," B_OK "]"), "'__'" },
	{ "control char in name",
	  ITEMS("[[\"a\\u0001\",0,\"F32\",[2,3],null,null,4096,4120]," B_OK "]"), "printable" },
	{ "NUL in name", ITEMS("[[\"a\\u0000b\",0,\"F32\",[2,3],null,null,4096,4120]," B_OK "]"),
	  "not valid JSON" },
	{ "bad kind", ITEMS("[[\"w\",2,\"F32\",[2,3],null,null,4096,4120]," B_OK "]"),
	  "item 0 ('w'): bad kind" },
	{ "bad dtype", ITEMS("[[\"w\",0,\"F33\",[2,3],null,null,4096,4120]," B_OK "]"),
	  "item 0 ('w'): unknown dtype" },
	{ "lowercase dtype", ITEMS("[[\"w\",0,\"f32\",[2,3],null,null,4096,4120]," B_OK "]"),
	  "unknown dtype" },
	{ "shape/bytes mismatch", ITEMS("[[\"w\",0,\"F32\",[2,3],null,null,4096,4116],"
					"[\"b\",1,\"U8\",[12],null,null,4116,4128]]"),
	  "item 0 ('w'): shape [2,3] F32 is 24 bytes but the range holds 20" },
	{ "end before begin", ITEMS("[[\"w\",0,\"F32\",[2,3],null,null,4096,4000]," B_OK "]"),
	  "before it begins" },
	{ "overlapping ranges", ITEMS("[" W_OK ",[\"b\",1,\"U8\",[8],null,null,4116,4124]]"),
	  "item 1 ('b'): begins at 4116 but the previous item ends at 4120 (overlap)" },
	{ "gap", D("1", "\"s\"", "\"/r\"", "1", "4132", "4096", "{}", "{}",
		  "[" W_OK ",[\"b\",1,\"U8\",[8],null,null,4124,4132]]"),
	  "(gap)" },
	{ "begins before data_start",
	  D("1", "\"s\"", "\"/r\"", "1", "32", "4096", "{}", "{}",
	    "[[\"w\",0,\"F32\",[2,3],null,null,0,24],[\"b\",1,\"U8\",[8],null,null,24,32]]"),
	  "before data_start" },
	{ "duplicate names", ITEMS("[" W_OK ",[\"w\",1,\"U8\",[8],null,null,4120,4128]]"),
	  "item 1 ('w'): name already used by item 0" },
	{ "huge ndim",
	  ITEMS("[[\"w\",0,\"F32\",[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2,3],null,null,4096,4120],"
		B_OK "]"),
	  "at most 16" },
	{ "negative dim", ITEMS("[[\"w\",0,\"F32\",[-2,-3],null,null,4096,4120]," B_OK "]"),
	  "non-negative" },
	{ "real dim", ITEMS("[[\"w\",0,\"F32\",[2.0,3],null,null,4096,4120]," B_OK "]"),
	  "non-negative" },
	{ "negative begin", ITEMS("[[\"w\",0,\"F32\",[2,3],null,null,-4096,4120]," B_OK "]"),
	  "non-negative" },
	{ "begin as string", ITEMS("[[\"w\",0,\"F32\",[2,3],null,null,\"4096\",4120]," B_OK "]"),
	  "non-negative" },
	{ "offs+shape > gshape",
	  ITEMS("[[\"w\",0,\"F32\",[2,3],[4,3],[3,0],4096,4120]," B_OK "]"), "exceeds" },
	{ "gshape rank differs",
	  ITEMS("[[\"w\",0,\"F32\",[2,3],[4,3,1],[0,0,0],4096,4120]," B_OK "]"), "global shape" },
	{ "gshape without offs",
	  ITEMS("[[\"w\",0,\"F32\",[2,3],[4,3],null,4096,4120]," B_OK "]"), "both be null" },
	{ "element overflow",
	  ITEMS("[[\"w\",0,\"F32\",[4294967296,4294967296,4],null,null,4096,4120]," B_OK "]"),
	  "overflow" },
	{ "blob not U8", ITEMS("[" W_OK ",[\"b\",1,\"F32\",[2],null,null,4120,4128]]"), "blob" },
	{ "blob 2-D", ITEMS("[" W_OK ",[\"b\",1,\"U8\",[2,4],null,null,4120,4128]]"), "blob" },
	{ "meta not an object", D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "[]", "{}", GOOD_ITEMS),
	  "meta is not an object" },
	{ "meta value not a string",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{\"k\":1}", "{}", GOOD_ITEMS),
	  "meta 'k'" },
	{ "meta reserved key",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{\"__k\":\"v\"}", "{}", GOOD_ITEMS),
	  "meta key" },
	{ "metric not a number",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{\"loss\":\"1\"}", GOOD_ITEMS),
	  "metric 'loss'" },
	{ "non-finite metric",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{\"loss\":1e999}", GOOD_ITEMS),
	  "not valid JSON" },
	{ "NaN metric",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{\"loss\":NaN}", GOOD_ITEMS),
	  "not valid JSON" },
	{ "empty metric key",
	  D("1", "\"s\"", "\"/r\"", "1", "4128", "4096", "{}", "{\"\":1.0}", GOOD_ITEMS),
	  "metrics key" },
};

START_TEST(test_malformed)
{
	const struct bad_desc *c = &bad_descs[_i];
	struct layout p;
	char err[256] = "";

	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(c->text, strlen(c->text), &p, err, sizeof(err)) == -EBADMSG,
		      "%s: accepted", c->what);
	ck_assert_msg(strstr(err, c->reason) != NULL, "%s: reason '%s' lacks '%s'", c->what, err,
		      c->reason);
	/* Left freed. */
	ck_assert_ptr_null(p.items);
	ck_assert_ptr_null(p.meta);
	ck_assert_ptr_null(p.root);
}
END_TEST

/* The base of the table is itself good, so each case fails for its reason. */
START_TEST(test_base_is_good)
{
	static const char t[] = ITEMS(GOOD_ITEMS);
	struct layout p;
	char err[256] = "";

	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(t, sizeof(t) - 1, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(p.n_items, 2);
	ck_assert_uint_eq(p.n_crcs, 2);
	ck_assert_uint_eq(p.items[1].crc0, 1);
	layout_free(&p);
}
END_TEST

/* Too many meta keys (more than CKPT_MAX_META_KEYS) and a too-long value. */
START_TEST(test_meta_caps)
{
	struct layout l, p;
	char key[32], err[256];
	char *text, *val;
	size_t len;

	ck_assert_int_eq(layout_init(&l, "/r", "s", 1), 0);
	place(&l);
	for (int i = 0; i <= CKPT_MAX_META_KEYS; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		json_object_set_new(l.meta, key, json_string("v"));
	}
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(desc_parse(text, len, &p, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "keys"));
	free(text);

	json_object_clear(l.meta);
	val = malloc(CKPT_MAX_META_LEN + 2);
	memset(val, 'v', CKPT_MAX_META_LEN + 1);
	val[CKPT_MAX_META_LEN + 1] = '\0';
	json_object_set_new(l.meta, "k", json_string(val));
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	ck_assert_int_eq(desc_parse(text, len, &p, err, sizeof(err)), -EBADMSG);
	free(text);
	val[CKPT_MAX_META_LEN] = '\0'; /* exactly the cap: fine */
	json_object_set_new(l.meta, "k", json_string(val));
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	ck_assert_int_eq(desc_parse(text, len, &p, err, sizeof(err)), 0);
	free(text);
	free(val);
	layout_free(&p);
	layout_free(&l);
}
END_TEST

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 10,000 items round trip; the time bounds are loose (targets: build a few
 * ms, parse < 30 ms) so sanitizer builds pass. */
START_TEST(test_10k)
{
	enum { N = 10000 };
	struct layout l, p;
	char name[80], err[256] = "";
	char *text;
	size_t len;
	double t0, build_ms, parse_ms;

	ck_assert_int_eq(layout_init(&l, "/data", "big", 7), 0);
	for (int i = 0; i < N; i++) {
		uint64_t shape[2] = { 128, (uint64_t)(i % 50 + 1) };
		uint64_t g[2] = { 1024, (uint64_t)(i % 50 + 1) }, o[2] = { 256, 0 };

		snprintf(name, sizeof(name), "model.layers.%d.self_attn.o_proj.weight", i);
		ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, name, CKPT_BF16, 2, shape,
					    i % 2 ? g : NULL, i % 2 ? o : NULL, NULL, 0), 0);
	}
	place(&l);
	t0 = now_ms();
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	build_ms = now_ms() - t0;
	memset(&p, 0, sizeof(p));
	t0 = now_ms();
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	parse_ms = now_ms() - t0;
	assert_same(&l, &p);
	ck_assert_msg(build_ms < 100 && parse_ms < 500, "build %.1f ms, parse %.1f ms", build_ms,
		      parse_ms);
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static Suite *desc_suite(void)
{
	Suite *s = suite_create("desc");
	TCase *tc;

	tc = tcase_create("round_trip");
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_round_trip_empty);
	tcase_add_test(tc, test_integer_metric);
	suite_add_tcase(s, tc);
	tc = tcase_create("malformed");
	tcase_add_test(tc, test_base_is_good);
	tcase_add_loop_test(tc, test_malformed, 0, N(bad_descs));
	tcase_add_test(tc, test_meta_caps);
	suite_add_tcase(s, tc);
	tc = tcase_create("scale");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_10k);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(desc_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
