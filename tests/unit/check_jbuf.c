/* SPDX-License-Identifier: MIT */
/*
 * check_jbuf.c - the JSON text appender: exact text of every appender,
 * escaping read back by a real JSON parser, growth, the size cap and its
 * sticky error, and what jbuf_finish hands over.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/jbuf.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Finishes b with a NUL and returns the text (caller frees). */
static char *text_of(struct jbuf *b, size_t *ret_len)
{
	char *t = NULL;
	size_t len = 0;

	ck_assert_int_eq(jbuf_finish(b, true, &t, &len), 0);
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(strlen(t), len);
	if (ret_len)
		*ret_len = len;
	return t;
}

/* ---- numbers ---- */

static const struct {
	uint64_t v;
	const char *text;
} u64s[] = {
	{ 0, "0" },
	{ 7, "7" },
	{ 10, "10" },
	{ 4096, "4096" },
	{ 4294967296ull, "4294967296" },
	{ 10000000000000000000ull, "10000000000000000000" },
	{ UINT64_MAX, "18446744073709551615" },
};

START_TEST(test_u64)
{
	struct jbuf b;
	char *t;

	jbuf_init(&b, 0, 0);
	jbuf_u64(&b, u64s[_i].v);
	t = text_of(&b, NULL);
	ck_assert_str_eq(t, u64s[_i].text);
	free(t);
}
END_TEST

START_TEST(test_u64_array)
{
	static const uint64_t v[] = { 1, 0, UINT64_MAX };
	struct jbuf b;
	char *t;

	jbuf_init(&b, 0, 0);
	jbuf_u64_array(&b, v, 0);
	jbuf_ch(&b, ' ');
	jbuf_u64_array(&b, v, 1);
	jbuf_ch(&b, ' ');
	jbuf_u64_array(&b, v, 3);
	t = text_of(&b, NULL);
	ck_assert_str_eq(t, "[] [1] [1,0,18446744073709551615]");
	free(t);
}
END_TEST

/* ---- strings: exact escapes, and a JSON parser reads the original back ---- */

static const struct {
	const char *in, *out;
} strs[] = {
	{ "", "\"\"" },
	{ "plain", "\"plain\"" },
	{ "a\"b", "\"a\\\"b\"" },
	{ "back\\slash", "\"back\\\\slash\"" },
	{ "\"", "\"\\\"\"" },
	{ "\\", "\"\\\\\"" },
	{ "nl\n", "\"nl\\u000a\"" },
	{ "\t", "\"\\u0009\"" },
	{ "\x01\x1f", "\"\\u0001\\u001f\"" },
	{ "\x7f", "\"\x7f\"" },        /* DEL is not a control character in JSON */
	{ "/", "\"/\"" },              /* no need to escape a slash */
	{ "caf\xc3\xa9", "\"caf\xc3\xa9\"" }, /* UTF-8 passes as it is */
	{ "\xe2\x82\xac\"\n", "\"\xe2\x82\xac\\\"\\u000a\"" },
	{ "end\\", "\"end\\\\\"" },
};

START_TEST(test_str)
{
	json_error_t je;
	struct jbuf b;
	json_t *j;
	char *t, *doc;
	size_t len;

	jbuf_init(&b, 0, 0);
	jbuf_str(&b, strs[_i].in);
	t = text_of(&b, &len);
	ck_assert_str_eq(t, strs[_i].out);

	/* As a JSON document: an array holding the string. */
	doc = malloc(len + 3);
	ck_assert_ptr_nonnull(doc);
	snprintf(doc, len + 3, "[%s]", t);
	j = json_loads(doc, 0, &je);
	ck_assert_msg(j != NULL, "'%s' is not JSON: %s", doc, je.text);
	ck_assert_str_eq(json_string_value(json_array_get(j, 0)), strs[_i].in);
	json_decref(j);
	free(doc);
	free(t);
}
END_TEST

/* Every byte 1..255 once: whatever the input, the output parses back. */
START_TEST(test_str_all_bytes)
{
	char in[256], *t;
	struct jbuf b;
	json_t *j;

	for (int i = 1; i < 128; i++)
		in[i - 1] = (char)i;
	in[127] = '\0';
	jbuf_init(&b, 0, 0);
	jbuf_str(&b, in);
	t = text_of(&b, NULL);
	j = json_loads(t, JSON_DECODE_ANY, NULL);
	ck_assert_msg(j != NULL, "not JSON: %s", t);
	ck_assert_str_eq(json_string_value(j), in);
	json_decref(j);
	free(t);
}
END_TEST

/* ---- literals, characters, raw bytes ---- */

START_TEST(test_lit_ch_mem)
{
	struct jbuf b;
	char *t;
	size_t len;

	jbuf_init(&b, 4, 0);
	jbuf_lit(&b, "{\"k\":");
	jbuf_mem(&b, "xyz", 0); /* nothing */
	jbuf_mem(&b, "12", 2);
	jbuf_ch(&b, '}');
	t = text_of(&b, &len);
	ck_assert_str_eq(t, "{\"k\":12}");
	ck_assert_uint_eq(len, 8);
	free(t);
}
END_TEST

/* ---- jansson values ---- */

START_TEST(test_json_value)
{
	json_t *o = json_pack("{s:i, s:s, s:[i, b], s:f, s:n}", "b", 2, "a", "x\"y", "arr", 1, 1,
			      "r", 0.1, "z");
	struct jbuf b;
	json_t *back;
	char *t;

	ck_assert_ptr_nonnull(o);
	jbuf_init(&b, 0, 0);
	jbuf_json(&b, NULL);
	jbuf_ch(&b, ' ');
	jbuf_json(&b, o);
	t = text_of(&b, NULL);
	/* compact, keys in insertion order */
	ck_assert_msg(strncmp(t, "{} {\"b\":2,\"a\":\"x\\\"y\",\"arr\":[1,true],\"r\":", 39) == 0,
		      "%s", t);
	back = json_loads(t + 3, 0, NULL);
	ck_assert_ptr_nonnull(back);
	ck_assert(json_equal(back, o));
	/* the real reads back to the same double */
	ck_assert(json_real_value(json_object_get(back, "r")) == 0.1);
	json_decref(back);
	json_decref(o);
	free(t);
}
END_TEST

/* ---- growth: many appends from every starting hint ---- */

static const size_t hints[] = { 0, 1, 2, 255, 256, 257, 4096, 1 << 20 };

START_TEST(test_growth)
{
	struct jbuf b;
	char *t;
	size_t len;

	jbuf_init(&b, hints[_i], 0);
	for (uint64_t i = 0; i < 20000; i++) {
		jbuf_u64(&b, i % 10);
		jbuf_ch(&b, ',');
	}
	ck_assert_int_eq(b.err, 0);
	t = text_of(&b, &len);
	ck_assert_uint_eq(len, 40000);
	for (size_t i = 0; i < len; i += 2) {
		ck_assert_int_eq(t[i], (char)('0' + (i / 2) % 10));
		ck_assert_int_eq(t[i + 1], ',');
	}
	free(t);
}
END_TEST

/* ---- the cap ---- */

START_TEST(test_cap)
{
	const size_t max = 10;
	struct jbuf b;
	char *t = NULL, *dummy = (char *)0x1;
	size_t len = 0;

	/* Exactly max bytes fit (without a NUL, as the shard header and the
	 * descriptor finish), from any hint. */
	for (int h = 0; h < N(hints); h++) {
		jbuf_init(&b, hints[h], max);
		jbuf_mem(&b, "0123456789", max);
		ck_assert_int_eq(b.err, 0);
		ck_assert_int_eq(jbuf_finish(&b, false, &t, &len), 0);
		ck_assert_uint_eq(len, max);
		ck_assert_int_eq(memcmp(t, "0123456789", max), 0);
		free(t);

		/* max - 1 bytes and the NUL fit too. */
		jbuf_init(&b, hints[h], max);
		jbuf_mem(&b, "012345678", max - 1);
		ck_assert_int_eq(jbuf_finish(&b, true, &t, &len), 0);
		ck_assert_str_eq(t, "012345678");
		free(t);
	}

	/* One byte more: -E2BIG, sticky; later appends that would fit change
	 * nothing; finish reports it, frees, and leaves the outputs alone. */
	jbuf_init(&b, 0, max);
	jbuf_lit(&b, "01234");
	jbuf_lit(&b, "567890");
	ck_assert_int_eq(b.err, -E2BIG);
	jbuf_ch(&b, 'x');
	jbuf_u64(&b, 1);
	jbuf_str(&b, "");
	jbuf_u64_array(&b, NULL, 0);
	jbuf_json(&b, NULL);
	ck_assert_int_eq(b.err, -E2BIG);
	ck_assert_uint_eq(b.len, 5);
	len = 77;
	ck_assert_int_eq(jbuf_finish(&b, false, &dummy, &len), -E2BIG);
	ck_assert_ptr_eq(dummy, (char *)0x1);
	ck_assert_uint_eq(len, 77);
	ck_assert_ptr_null(b.buf);
	jbuf_free(&b); /* after finish: harmless */

	/* A hint above the cap is cut to it. */
	jbuf_init(&b, 1 << 20, max);
	ck_assert_uint_eq(b.cap, max);
	jbuf_free(&b);
}
END_TEST

/* ---- finish and free ---- */

START_TEST(test_finish_empty)
{
	struct jbuf b;
	char *t = NULL;
	size_t len = 77;

	/* Nothing appended, no NUL asked: still a buffer (callers free it). */
	jbuf_init(&b, 0, 0);
	ck_assert_int_eq(jbuf_finish(&b, false, &t, &len), 0);
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(len, 0);
	free(t);
	ck_assert_ptr_null(b.buf);

	jbuf_init(&b, 0, 0);
	t = text_of(&b, &len);
	ck_assert_str_eq(t, "");
	ck_assert_uint_eq(len, 0);
	free(t);

	/* ret_len may be NULL. */
	jbuf_init(&b, 16, 0);
	jbuf_lit(&b, "ab");
	ck_assert_int_eq(jbuf_finish(&b, true, &t, NULL), 0);
	ck_assert_str_eq(t, "ab");
	free(t);
}
END_TEST

START_TEST(test_free)
{
	struct jbuf b;

	memset(&b, 0, sizeof(b));
	jbuf_free(&b);
	jbuf_free(NULL);
	jbuf_init(&b, 64, 0);
	jbuf_lit(&b, "abc");
	jbuf_free(&b);
	ck_assert_ptr_null(b.buf);
	ck_assert_uint_eq(b.len, 0);
	jbuf_free(&b);
}
END_TEST

static Suite *jbuf_suite(void)
{
	Suite *s = suite_create("jbuf");
	TCase *tc;

	tc = tcase_create("numbers");
	tcase_add_loop_test(tc, test_u64, 0, N(u64s));
	tcase_add_test(tc, test_u64_array);
	suite_add_tcase(s, tc);

	tc = tcase_create("strings");
	tcase_add_loop_test(tc, test_str, 0, N(strs));
	tcase_add_test(tc, test_str_all_bytes);
	tcase_add_test(tc, test_lit_ch_mem);
	tcase_add_test(tc, test_json_value);
	suite_add_tcase(s, tc);

	tc = tcase_create("buffer");
	tcase_add_loop_test(tc, test_growth, 0, N(hints));
	tcase_add_test(tc, test_cap);
	tcase_add_test(tc, test_finish_empty);
	tcase_add_test(tc, test_free);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(jbuf_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
