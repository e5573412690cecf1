/* SPDX-License-Identifier: MIT */
/*
 * check_s3.c - what the S3 test server does not enforce: locations and key
 * checks, path and query encoding for libcurl 7.88's SigV4, object URLs,
 * the XML scanner on S3 answers (and on hostile bodies), the
 * CompleteMultipartUpload body, part plans up to 10,000 parts and 5 TiB,
 * retry classification and backoff, and the check of a GET's body against
 * the checksums its answer carries (moto keeps ours but returns S3's own
 * only in some cases: every combination is checked here).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/crc32c.h"
#include "format/jbuf.h"
#include "store/s3_addr.h"
#include "store/s3_creds.h"
#include "store/s3_digest.h"
#include "store/s3_parts.h"
#include "store/s3_retry.h"
#include "store/s3_xml.h"

/* ---- s3:// locations ---- */

struct url_case {
	const char *url;
	int ret;
	const char *bucket, *prefix;
};

static const struct url_case url_cases[] = {
	{ "s3://bucket", 0, "bucket", "" },
	{ "s3://bucket/", 0, "bucket", "" },
	{ "s3://my-bucket.v2/ckpt/run1", 0, "my-bucket.v2", "ckpt/run1" },
	{ "s3://my-bucket/ckpt/run1/", 0, "my-bucket", "ckpt/run1" },
	{ "s3://abc/a b+c=d", 0, "abc", "a b+c=d" },
	{ "s3://ab", -EINVAL, NULL, NULL },                 /* too short */
	{ "s3://Bucket", -EINVAL, NULL, NULL },             /* uppercase */
	{ "s3://-bucket", -EINVAL, NULL, NULL },
	{ "s3://bucket-", -EINVAL, NULL, NULL },
	{ "s3://a..b", -EINVAL, NULL, NULL },
	{ "s3://192.168.1.1", -EINVAL, NULL, NULL },
	{ "s3://under_score", -EINVAL, NULL, NULL },
	{ "s3://bucket//x", -EINVAL, NULL, NULL },          /* leading '/' in prefix */
	{ "s3://bucket/a//b", -EINVAL, NULL, NULL },
	{ "s3://bucket/a/./b", -EINVAL, NULL, NULL },
	{ "s3://bucket/a/../b", -EINVAL, NULL, NULL },
	{ "s3://bucket/..", -EINVAL, NULL, NULL },
	{ "s3://bucket/a\tb", -EINVAL, NULL, NULL },
	{ "s3://bucket/caf\xc3\xa9", -EINVAL, NULL, NULL },
	{ "s3:/bucket", -EINVAL, NULL, NULL },
	{ "/local/dir", -EINVAL, NULL, NULL },
	{ "", -EINVAL, NULL, NULL },
};

START_TEST(url_parse)
{
	const struct url_case *c = &url_cases[_i];
	struct s3_loc loc;
	char err[256] = "", back[600];
	int r = s3_url_parse(c->url, &loc, err, sizeof(err));

	ck_assert_msg(r == c->ret, "'%s': %d (%s), want %d", c->url, r, err, c->ret);
	if (r == 0) {
		ck_assert_str_eq(loc.bucket, c->bucket);
		ck_assert_str_eq(loc.prefix, c->prefix);
		/* The canonical form parses to the same. */
		ck_assert_int_eq(s3_url_format(&loc, back, sizeof(back)), 0);
		struct s3_loc again;
		ck_assert_int_eq(s3_url_parse(back, &again, err, sizeof(err)), 0);
		ck_assert_str_eq(again.bucket, loc.bucket);
		ck_assert_str_eq(again.prefix, loc.prefix);
	} else {
		ck_assert_msg(err[0], "'%s': no reason given", c->url);
	}
}
END_TEST

START_TEST(url_limits)
{
	char url[S3_PREFIX_MAX + 64], err[256];
	struct s3_loc loc;

	/* 63 characters is the longest bucket name; 64 is refused. */
	strcpy(url, "s3://");
	memset(url + 5, 'b', 63);
	url[68] = '\0';
	ck_assert_int_eq(s3_url_parse(url, &loc, err, sizeof(err)), 0);
	url[68] = 'b';
	url[69] = '\0';
	ck_assert_int_eq(s3_url_parse(url, &loc, err, sizeof(err)), -EINVAL);
	/* The longest prefix, and one byte more. */
	strcpy(url, "s3://bkt/");
	memset(url + 9, 'p', S3_PREFIX_MAX);
	url[9 + S3_PREFIX_MAX] = '\0';
	ck_assert_int_eq(s3_url_parse(url, &loc, err, sizeof(err)), 0);
	ck_assert_uint_eq(strlen(loc.prefix), S3_PREFIX_MAX);
	strcat(url, "p");
	ck_assert_int_eq(s3_url_parse(url, &loc, err, sizeof(err)), -EINVAL);
	ck_assert(s3_is_url("s3://x"));
	ck_assert(!s3_is_url("S3://x"));
	ck_assert(!s3_is_url(NULL));
}
END_TEST

/* ---- encoding ---- */

START_TEST(encode_path)
{
	char buf[256];

	ck_assert_int_eq(s3_encode_path("a/b-c_d.e~f", buf, sizeof(buf)), 11);
	ck_assert_str_eq(buf, "a/b-c_d.e~f");
	ck_assert_int_gt(s3_encode_path("sp ace+plus=eq&amp/%pct", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "sp%20ace%2Bplus%3Deq%26amp/%25pct");
	ck_assert_int_gt(s3_encode_path("caf\xc3\xa9!*'()", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "caf%C3%A9%21%2A%27%28%29");
	/* Exactly fits, and one byte short. */
	ck_assert_int_eq(s3_encode_path("a b", buf, 6), 5);
	ck_assert_int_eq(s3_encode_path("a b", buf, 5), -ENAMETOOLONG);
	ck_assert_int_eq(s3_encode_path("", buf, 1), 0);
}
END_TEST

START_TEST(encode_query)
{
	char buf[256];

	ck_assert_int_gt(s3_encode_query("a/b+c=d e", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "a%2Fb%2Bc%3Dd%20e");
	/* An upload id as real S3 makes them (with '+', '/', '='). */
	ck_assert_int_gt(s3_encode_query("VXBsb2Fk+SUQ/x=", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "VXBsb2Fk%2BSUQ%2Fx%3D");
}
END_TEST

START_TEST(every_name_char)
{
	/* Every character a checkpoint name, job or file may hold, and every
	 * printable ASCII a prefix may: the key checks pass, and the encoded
	 * path keeps only unreserved characters and '/'. */
	char key[200], enc[700], err[256];
	struct s3_loc loc = { .bucket = "bkt" };
	size_t n = 0;

	for (int c = 0x20; c <= 0x7e; c++)
		if (c != '/')
			key[n++] = (char)c;
	key[n] = '\0';
	snprintf(loc.prefix, sizeof(loc.prefix), "pre/%s", key);
	char joined[700];

	ck_assert_int_eq(s3_key_join(&loc, "A.b_c-9/manifest.json", joined, sizeof(joined), err,
				     sizeof(err)), 0);
	ck_assert_int_gt(s3_encode_path(joined, enc, sizeof(enc)), 0);
	for (const char *p = enc; *p; p++) {
		if (*p == '%') {
			ck_assert(strchr("0123456789ABCDEF", p[1]) && strchr("0123456789ABCDEF", p[2]));
			p += 2;
			continue;
		}
		ck_assert_msg(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/",
				     *p), "'%c' left unencoded", *p);
	}
}
END_TEST

struct key_case {
	const char *key;
	int ret;
};

static const struct key_case key_cases[] = {
	{ "a", 0 },         { "a/b.c/d", 0 },   { "a/..b/c", 0 },  { "", -EINVAL },
	{ "/a", -EINVAL },  { "a/", -EINVAL },  { "a//b", -EINVAL }, { "./a", -EINVAL },
	{ "a/..", -EINVAL }, { "a/./b", -EINVAL }, { "a\nb", -EINVAL }, { "a\x7f", -EINVAL },
};

START_TEST(key_check)
{
	char err[256] = "";

	ck_assert_int_eq(s3_key_check(key_cases[_i].key, err, sizeof(err)), key_cases[_i].ret);
}
END_TEST

START_TEST(object_url)
{
	char url[4096], err[256];

	ck_assert_int_eq(s3_object_url("http://127.0.0.1:9000", false, "bkt", "a b/c", "uploads=",
				       url, sizeof(url), err, sizeof(err)), 0);
	ck_assert_str_eq(url, "http://127.0.0.1:9000/bkt/a%20b/c?uploads=");
	ck_assert_int_eq(s3_object_url("https://s3.eu-west-1.amazonaws.com/", true, "bkt", "k",
				       NULL, url, sizeof(url), err, sizeof(err)), 0);
	ck_assert_str_eq(url, "https://bkt.s3.eu-west-1.amazonaws.com/k");
	ck_assert_int_eq(s3_object_url("http://[::1]:9000", false, "bkt", "", "list-type=2",
				       url, sizeof(url), err, sizeof(err)), 0);
	ck_assert_str_eq(url, "http://[::1]:9000/bkt?list-type=2");
	/* A dotted bucket cannot be a TLS virtual host. */
	ck_assert_int_eq(s3_object_url("https://s3.amazonaws.com", true, "a.b", "k", NULL, url,
				       sizeof(url), err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(s3_object_url("ftp://x", false, "bkt", "k", NULL, url, sizeof(url), err,
				       sizeof(err)), -EINVAL);
	ck_assert_int_eq(s3_object_url("http://h/path", false, "bkt", "k", NULL, url, sizeof(url),
				       err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(s3_object_url("http://user@h", false, "bkt", "k", NULL, url, sizeof(url),
				       err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(s3_object_url("http://", false, "bkt", "k", NULL, url, sizeof(url), err,
				       sizeof(err)), -EINVAL);
	ck_assert_int_eq(s3_object_url("http://h", false, "bkt", "k", NULL, url, 12, err,
				       sizeof(err)), -ENAMETOOLONG);
}
END_TEST

/* ---- XML ---- */

static const char error_body[] =
	"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	"<Error><Code>SlowDown</Code><Message>Please reduce your request rate &amp; "
	"try &lt;again&gt; &#38; &#x41;&quot;&apos;</Message>"
	"<RequestId>4442587FB7D0A2F9</RequestId></Error>";

START_TEST(xml_error)
{
	char buf[256];

	ck_assert_int_eq(s3_xml_text(error_body, strlen(error_body), "Error/Code", buf, sizeof(buf)),
			 8);
	ck_assert_str_eq(buf, "SlowDown");
	ck_assert_int_gt(s3_xml_text(error_body, strlen(error_body), "Error/Message", buf,
				     sizeof(buf)), 0);
	ck_assert_str_eq(buf, "Please reduce your request rate & try <again> & A\"'");
	ck_assert_int_eq(s3_xml_text(error_body, strlen(error_body), "Error/Resource", buf,
				     sizeof(buf)), -ENOENT);
	ck_assert_int_eq(s3_xml_text(error_body, strlen(error_body), "Code", buf, sizeof(buf)),
			 -ENOENT);
	ck_assert_int_eq(s3_xml_text(error_body, strlen(error_body), "Error/Code", buf, 8),
			 -ENAMETOOLONG);
	/* An element's own text leaves out its children, whatever their
	 * attributes hold. */
	{
		static const char mixed[] = "<Error>head<M a=\"1>2\" b='<'>m</M><E/>tail</Error>";

		ck_assert_int_eq(s3_xml_text(mixed, strlen(mixed), "Error", buf, sizeof(buf)), 8);
		ck_assert_str_eq(buf, "headtail");
		ck_assert_int_eq(s3_xml_text(mixed, strlen(mixed), "Error/M", buf, sizeof(buf)), 1);
		ck_assert_int_eq(s3_xml_text(mixed, strlen(mixed), "Error/E", buf, sizeof(buf)), 0);
	}
}
END_TEST

/* A Complete that answers 200 with an error inside. */
START_TEST(xml_complete_result)
{
	static const char ok[] =
		"<?xml version=\"1.0\"?><CompleteMultipartUploadResult "
		"xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Location>http://x/b/k</Location>"
		"<Bucket>b</Bucket><Key>k</Key><ETag>\"3858f62230ac3c915f300c664312c11f-9\"</ETag>"
		"</CompleteMultipartUploadResult>";
	static const char bad[] = "<?xml version=\"1.0\"?>\n\n<Error><Code>InternalError</Code>"
				  "<Message>We encountered an internal error.</Message></Error>";
	char buf[128];

	ck_assert_int_gt(s3_xml_text(ok, strlen(ok), "CompleteMultipartUploadResult/ETag", buf,
				     sizeof(buf)), 0);
	ck_assert_str_eq(buf, "\"3858f62230ac3c915f300c664312c11f-9\"");
	ck_assert_int_eq(s3_xml_text(ok, strlen(ok), "Error/Code", buf, sizeof(buf)), -ENOENT);
	ck_assert_int_gt(s3_xml_text(bad, strlen(bad), "Error/Code", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "InternalError");
	ck_assert_int_eq(s3_classify(S3_NET_OK, 200, buf), S3_RETRY);
}
END_TEST

struct list_ctx {
	char keys[8][64];
	unsigned long long sizes[8];
	int n;
};

static int list_one(void *ud, const char *inner, size_t len)
{
	struct list_ctx *l = ud;
	char size[32];

	ck_assert_int_lt(l->n, 8);
	ck_assert_int_gt(s3_xml_text(inner, len, "Key", l->keys[l->n], sizeof(l->keys[0])), 0);
	ck_assert_int_gt(s3_xml_text(inner, len, "Size", size, sizeof(size)), 0);
	l->sizes[l->n] = strtoull(size, NULL, 10);
	l->n++;
	return 0;
}

static int stop_at_two(void *ud, const char *inner, size_t len)
{
	(void)inner, (void)len;
	return ++*(int *)ud == 2 ? 42 : 0;
}

START_TEST(xml_list)
{
	static const char body[] =
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
		"<Name>bkt</Name><Prefix>p/</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>"
		"<IsTruncated>true</IsTruncated>"
		"<Contents><Key>p/a&amp;b</Key><LastModified>2026-11-23T00:00:00.000Z</LastModified>"
		"<ETag>&quot;x&quot;</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass></Contents>"
		"<Contents><Key>p/c</Key><Size>0</Size><Owner><ID>o</ID></Owner></Contents>\n"
		"<Contents><Key><![CDATA[p/<raw>]]></Key><Size>5368709120</Size></Contents>"
		"<CommonPrefixes><Prefix>p/dir/</Prefix></CommonPrefixes>"
		"<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
		"</ListBucketResult>";
	struct list_ctx l = { .n = 0 };
	char buf[128];
	int calls = 0;

	ck_assert_int_eq(s3_xml_each(body, strlen(body), "ListBucketResult/Contents", list_one, &l), 3);
	ck_assert_int_eq(l.n, 3);
	ck_assert_str_eq(l.keys[0], "p/a&b");
	ck_assert_str_eq(l.keys[1], "p/c");
	ck_assert_str_eq(l.keys[2], "p/<raw>");
	ck_assert_uint_eq(l.sizes[0], 12);
	ck_assert_uint_eq(l.sizes[2], 5368709120ull);
	ck_assert_int_gt(s3_xml_text(body, strlen(body), "ListBucketResult/NextContinuationToken", buf,
				     sizeof(buf)), 0);
	ck_assert_str_eq(buf, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
	ck_assert_int_gt(s3_xml_text(body, strlen(body), "ListBucketResult/IsTruncated", buf,
				     sizeof(buf)), 0);
	ck_assert_str_eq(buf, "true");
	ck_assert_int_gt(s3_xml_text(body, strlen(body), "ListBucketResult/CommonPrefixes/Prefix", buf,
				     sizeof(buf)), 0);
	ck_assert_str_eq(buf, "p/dir/");
	ck_assert_int_eq(s3_xml_each(body, strlen(body), "ListBucketResult/Contents", stop_at_two,
				     &calls), 42);
	ck_assert_int_eq(calls, 2);
	/* Nothing at a path: zero visits. */
	ck_assert_int_eq(s3_xml_each(body, strlen(body), "ListBucketResult/Nope", stop_at_two, &calls),
			 0);
}
END_TEST

/* Hostile or broken bodies: an answer, never a read past the end. */
static const char *const bad_bodies[] = {
	"<Error><Code>x</Code>",                 /* unclosed */
	"<Error><Code>x</Error></Code>",         /* crossed */
	"<Error><Code>x&bogus;</Code></Error>",  /* unknown entity */
	"<Error><Code>x&#;</Code></Error>",
	"<Error><Code>x&#x110000;</Code></Error>",
	"<Error><Code>x&#0;</Code></Error>",
	"<Error><Code>x&amp</Code></Error>",     /* no ';' */
	"<!DOCTYPE x [<!ENTITY a \"b\">]><Error><Code>&a;</Code></Error>",
	"<Error><Code><!-- unterminated </Code></Error>",
	"<Error><Code><![CDATA[x</Code></Error>",
	"<Error><Code>x</Code",
	"<Error><Code a=\"1>x</Code></Error>",
	"<a><b><c><d><e><f><g><h><i><j><k><l><m><n><o><p><q>deep</q></p></o></n></m></l></k>"
	"</j></i></h></g></f></e></d></c></b></a>",
	"<>x</>",
	"<Error><?pi x?><Code>x</Code></Error>",
};

START_TEST(xml_hostile)
{
	const char *b = bad_bodies[_i];
	size_t n = strlen(b);
	char *copy = malloc(n); /* exactly n bytes: ASan catches an overread */
	char buf[64];
	int r;

	ck_assert_ptr_nonnull(copy);
	memcpy(copy, b, n);
	r = s3_xml_text(copy, n, "Error/Code", buf, sizeof(buf));
	ck_assert_msg(r == -EBADMSG, "body %d: %d, want -EBADMSG", _i, r);
	/* Every prefix of it too. */
	for (size_t k = 0; k < n; k++) {
		char *p = malloc(k ? k : 1);

		memcpy(p, b, k);
		r = s3_xml_text(p, k, "Error/Code", buf, sizeof(buf));
		ck_assert_msg(r == -EBADMSG || r == -ENOENT || r >= 0, "prefix %zu: %d", k, r);
		free(p);
	}
	free(copy);
}
END_TEST

START_TEST(complete_xml)
{
	struct s3_part_done parts[2] = {
		{ .number = 1, .etag = "\"abc\"", .crc32c = 0 },
		{ .number = 2, .etag = "\"d&e<\"", .crc32c = 0xE3069283u },
	};
	struct jbuf b;
	char *text;
	size_t len;
	char buf[64];
	int seen = 0;

	jbuf_init(&b, 256, 0);
	s3_complete_xml(&b, parts, 2);
	ck_assert_int_eq(jbuf_finish(&b, true, &text, &len), 0);
	ck_assert_str_eq(text,
			 "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
			 "<Part><ETag>&quot;abc&quot;</ETag><PartNumber>1</PartNumber>"
			 "<ChecksumCRC32C>AAAAAA==</ChecksumCRC32C></Part>"
			 "<Part><ETag>&quot;d&amp;e&lt;&quot;</ETag><PartNumber>2</PartNumber>"
			 "<ChecksumCRC32C>4waSgw==</ChecksumCRC32C></Part>"
			 "</CompleteMultipartUpload>");
	/* Our own reader reads it back. */
	ck_assert_int_eq(s3_xml_each(text, len, "CompleteMultipartUpload/Part", stop_at_two, &seen), 42);
	ck_assert_int_gt(s3_xml_text(text, len, "CompleteMultipartUpload/Part/ETag", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "\"abc\"");
	free(text);
}
END_TEST

START_TEST(crc_b64)
{
	char out[9];

	/* CRC32C("123456789") = 0xE3069283, S3's example encoding "4waSgw==". */
	ck_assert_uint_eq(crc32c("123456789", 9, 0), 0xE3069283u);
	s3_crc32c_b64(crc32c("123456789", 9, 0), out);
	ck_assert_str_eq(out, "4waSgw==");
	s3_crc32c_b64(0xffffffffu, out);
	ck_assert_str_eq(out, "/////w==");
}
END_TEST

/* A GET's body against the checksums its answer carried: ours
 * (x-amz-meta-ckpt-crc32c), S3's (x-amz-checksum-crc32c), both or none.
 * CRC32C("123456789") is "4waSgw==" (above), of nothing "AAAAAA==". */
static const struct {
	const char *body, *sum, *s3sum;
	int ret;
	const char *names;  /* the header the message blames */
} sum_cases[] = {
	{ "123456789", "4waSgw==", NULL, 1, NULL },
	{ "123456789", NULL, "4waSgw==", 1, NULL },
	{ "123456789", "4waSgw==", "4waSgw==", 1, NULL },
	{ "123456789", NULL, NULL, 0, NULL },                       /* an older object */
	{ "", "AAAAAA==", NULL, 1, NULL },
	{ "123456780", "4waSgw==", NULL, -EBADMSG, S3_SUM_HEADER }, /* a byte changed */
	{ "12345678", "4waSgw==", NULL, -EBADMSG, S3_SUM_HEADER },  /* cut short */
	{ "123456789", "4waSgx==", NULL, -EBADMSG, S3_SUM_HEADER }, /* the header changed */
	{ "123456789", "4WASGW==", NULL, -EBADMSG, S3_SUM_HEADER }, /* base64 has case */
	{ "123456789", "", NULL, -EBADMSG, S3_SUM_HEADER },         /* too long, or twice */
	{ "123456789", "4waSgw==", "AAAAAA==", -EBADMSG, S3_CRC32C_HEADER },
	{ "123456789", NULL, "", -EBADMSG, S3_CRC32C_HEADER },
	/* An object uploaded in parts: S3's value is of the parts' checksums. */
	{ "123456789", NULL, "4waSgw==-3", 0, NULL },
	{ "123456789", "4waSgw==", "AAAAAA==-2", 1, NULL },
	{ "123456789", "AAAAAA==", "4waSgw==-2", -EBADMSG, S3_SUM_HEADER },
};

START_TEST(sum_check)
{
	char why[256] = "";
	const char *b = sum_cases[_i].body;
	int r = s3_sum_check(b, strlen(b), sum_cases[_i].sum, sum_cases[_i].s3sum, why,
			     sizeof(why));

	ck_assert_msg(r == sum_cases[_i].ret, "case %d: %d, want %d (%s)", _i, r,
		      sum_cases[_i].ret, why);
	if (r < 0) {
		ck_assert_msg(strstr(why, "checksum mismatch") && strstr(why, sum_cases[_i].names),
			      "case %d: '%s'", _i, why);
		/* It says what arrived: the length and its CRC32C. */
		char want[64];
		snprintf(want, sizeof(want), "the %zu bytes received", strlen(b));
		ck_assert_msg(strstr(why, want), "case %d: '%s'", _i, why);
	} else {
		ck_assert_str_eq(why, "");
	}
}
END_TEST

/* An answer as s3_call sees it, judged end to end: the code read from the
 * body, then the verdict and errno on it. */
static const struct {
	const char *method;
	long status;
	const char *body;
	const char *code;
	enum s3_verdict v;
	int err;
} answers[] = {
	{ "GET", 503, "<Error><Code>SlowDown</Code><Message>Reduce</Message></Error>", "SlowDown",
	  S3_RETRY, -EAGAIN },
	{ "PUT", 500, "<?xml version=\"1.0\"?><Error><Code>InternalError</Code></Error>",
	  "InternalError", S3_RETRY, -EIO },
	{ "POST", 200, "<Error><Code>InternalError</Code><Message>x</Message></Error>",
	  "InternalError", S3_RETRY, -EIO },              /* Complete: 200 + Error */
	{ "POST", 200, "<Error><Code>AccessDenied</Code></Error>", "AccessDenied", S3_FAIL,
	  -EACCES },
	{ "POST", 200, "<CompleteMultipartUploadResult><ETag>\"e\"</ETag>"
		       "</CompleteMultipartUploadResult>", "", S3_DONE, 0 },
	{ "GET", 200, "<Error><Code>NoSuchKey</Code></Error>", "", S3_DONE, 0 }, /* an object */
	{ "GET", 404, "<Error><Code>NoSuchKey</Code></Error>", "NoSuchKey", S3_FAIL, -ENOENT },
	{ "GET", 404, NULL, "", S3_FAIL, -ENOENT },
	{ "PUT", 503, "Service Unavailable", "", S3_RETRY, -EAGAIN },  /* not S3's XML */
	{ "PUT", 502, "", "", S3_RETRY, -EIO },
	{ "PUT", 400, "<Error><Code>BadDigest</Code></Error>", "BadDigest", S3_RETRY, -EBADMSG },
	{ "PUT", 412, "<Error><Code>PreconditionFailed</Code></Error>", "PreconditionFailed",
	  S3_FAIL, -EEXIST },
	{ "PUT", 400, "<Error><Code>RequestTimeTooSkewed</Code></Error>", "RequestTimeTooSkewed",
	  S3_FAIL, -EINVAL },
	{ "PUT", 403, "<Error><Code>SignatureDoesNotMatch</Code><Message>m</Message>",
	  "", S3_FAIL, -EACCES },                         /* cut short: no code read */
};

START_TEST(answer)
{
	char code[64], msg[256];

	s3_answer_error(answers[_i].method, answers[_i].status, answers[_i].body,
			answers[_i].body ? strlen(answers[_i].body) : 0, code, sizeof(code), msg,
			sizeof(msg));
	ck_assert_str_eq(code, answers[_i].code);
	ck_assert_int_eq(s3_classify(S3_NET_OK, answers[_i].status, code), answers[_i].v);
	if (answers[_i].v != S3_DONE)
		ck_assert_int_eq(s3_errno(S3_NET_OK, answers[_i].status, code), answers[_i].err);
}
END_TEST

/* RFC 1321's test suite, and RFC 4648's base64 vectors. */
static const struct {
	const char *in, *md5;
} md5_cases[] = {
	{ "", "d41d8cd98f00b204e9800998ecf8427e" },
	{ "a", "0cc175b9c0f1b6a831c399e269772661" },
	{ "abc", "900150983cd24fb0d6963f7d28e17f72" },
	{ "message digest", "f96b697d7cb7938d525a2f31aaf161d0" },
	{ "abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b" },
	{ "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
	  "d174ab98d277d9f5a5611c2c9f419d9f" },
	{ "1234567890123456789012345678901234567890123456789012345678901234567890123456"
	  "7890", "57edf4a22be3c955ac49da2e2107b67a" },
};

START_TEST(md5)
{
	uint8_t d[16];
	char hex[33];

	s3_md5(md5_cases[_i].in, strlen(md5_cases[_i].in), d);
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", d[i]);
	ck_assert_str_eq(hex, md5_cases[_i].md5);
}
END_TEST

START_TEST(md5_lengths)
{
	/* Padding edges: 55, 56, 63, 64, 65 bytes; "Content-MD5" form. */
	static const char *const want[] = {
		"ef1772b6dff9a122358552954ad0df65", "3b0c8ac703f828b04c6c197006d17218",
		"b06521f39153d618550606be297466d5", "014842d480b571495a4a0363793f7367",
		"c743a45e0d2e6a95cb859adae0248435",
	};
	static const size_t lens[] = { 55, 56, 63, 64, 65 };
	char buf[65], hex[33], hdr[64];
	uint8_t d[16];

	memset(buf, 'a', sizeof(buf));
	for (size_t k = 0; k < 5; k++) {
		s3_md5(buf, lens[k], d);
		for (int i = 0; i < 16; i++)
			snprintf(hex + 2 * i, 3, "%02x", d[i]);
		ck_assert_str_eq(hex, want[k]);
	}
	s3_content_md5_hdr("", 0, hdr, sizeof(hdr));
	ck_assert_str_eq(hdr, "Content-MD5: 1B2M2Y8AsgTpgAmY7PhCfg==");
}
END_TEST

START_TEST(b64)
{
	static const char *const in[] = { "", "f", "fo", "foo", "foob", "fooba", "foobar" };
	static const char *const out[] = { "", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=",
					   "Zm9vYmFy" };
	char b[16];

	for (size_t i = 0; i < 7; i++) {
		s3_b64((const uint8_t *)in[i], strlen(in[i]), b);
		ck_assert_str_eq(b, out[i]);
	}
}
END_TEST

/* ---- part plans ---- */

START_TEST(plan_small)
{
	struct s3_plan p;
	char err[256];
	uint64_t off, len;

	/* Up to one part: one PUT. */
	ck_assert_int_eq(s3_part_plan(0, 8 << 20, 8 << 20, &p, err, sizeof(err)), 0);
	ck_assert(p.single);
	ck_assert_uint_eq(p.n_parts, 1);
	ck_assert_int_eq(s3_part_plan(8 << 20, 8 << 20, 8 << 20, &p, err, sizeof(err)), 0);
	ck_assert(p.single);
	ck_assert_int_eq(s3_part_plan((8 << 20) + 1, 8 << 20, 8 << 20, &p, err, sizeof(err)), 0);
	ck_assert(!p.single);
	ck_assert_uint_eq(p.n_parts, 2);
	s3_part_range(&p, 1, &off, &len);
	ck_assert_uint_eq(off, 8 << 20);
	ck_assert_uint_eq(len, 1);
	/* 1 MiB extents: parts of at least 5 MiB, a whole number of extents. */
	ck_assert_int_eq(s3_part_plan(100 << 20, 1 << 20, 0, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p.part_bytes, 5 << 20);
	ck_assert_uint_eq(p.n_parts, 20);
	ck_assert_int_eq(s3_part_plan(100 << 20, 4 << 20, 0, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p.part_bytes, 8 << 20);
	ck_assert_uint_eq(p.n_parts, 13);
	ck_assert_uint_eq(s3_part_of(&p, (8 << 20) - 1), 0);
	ck_assert_uint_eq(s3_part_of(&p, 8 << 20), 1);
	ck_assert_uint_eq(s3_part_of(&p, (100 << 20) - 1), 12);
	ck_assert_int_eq(s3_part_plan(1, 3, 0, &p, err, sizeof(err)), -EINVAL);
}
END_TEST

START_TEST(plan_limits)
{
	struct s3_plan p;
	char err[256];
	uint64_t off, len, sum = 0;

	/* 10,000 parts of 8 MiB exactly; one byte more needs bigger parts. */
	ck_assert_int_eq(s3_part_plan(10000ull * (8 << 20), 8 << 20, 8 << 20, &p, err, sizeof(err)), 0);
	ck_assert_uint_eq(p.n_parts, 10000);
	ck_assert_uint_eq(p.part_bytes, 8 << 20);
	ck_assert_int_eq(s3_part_plan(10000ull * (8 << 20) + 1, 8 << 20, 8 << 20, &p, err, sizeof(err)), 0);
	ck_assert_uint_le(p.n_parts, S3_MAX_PARTS);
	ck_assert_uint_eq(p.part_bytes, 16 << 20);
	/* 5 TiB: the largest object, in at most 10,000 parts of at most 5 GiB,
	 * every part a whole number of extents, covering every byte once. */
	ck_assert_int_eq(s3_part_plan(S3_MAX_OBJECT, 8 << 20, 64 << 20, &p, err, sizeof(err)), 0);
	ck_assert_uint_le(p.n_parts, S3_MAX_PARTS);
	ck_assert_uint_le(p.part_bytes, S3_MAX_PART);
	ck_assert_uint_eq(p.part_bytes % (8 << 20), 0);
	for (uint32_t i = 0; i < p.n_parts; i++) {
		s3_part_range(&p, i, &off, &len);
		ck_assert_uint_eq(off, sum);
		ck_assert(len > 0);
		if (i + 1 < p.n_parts)
			ck_assert_uint_ge(len, S3_MIN_PART);
		sum += len;
	}
	ck_assert_uint_eq(sum, S3_MAX_OBJECT);
	ck_assert_int_eq(s3_part_plan(S3_MAX_OBJECT + 1, 8 << 20, 0, &p, err, sizeof(err)), -EFBIG);
	ck_assert_ptr_nonnull(strstr(err, "5 TiB"));
	ck_assert_int_eq(s3_part_plan(1ull << 40, 8 << 20, 6ull << 30, &p, err, sizeof(err)), -EFBIG);
}
END_TEST

/* ---- retries ---- */

struct retry_case {
	enum s3_transport net;
	long status;
	const char *code;
	enum s3_verdict v;
	int err;
};

static const struct retry_case retry_cases[] = {
	{ S3_NET_OK, 200, "", S3_DONE, 0 },
	{ S3_NET_OK, 204, NULL, S3_DONE, 0 },
	{ S3_NET_OK, 500, "InternalError", S3_RETRY, -EIO },
	{ S3_NET_OK, 500, "", S3_RETRY, -EIO },
	{ S3_NET_OK, 502, "", S3_RETRY, -EIO },
	{ S3_NET_OK, 503, "SlowDown", S3_RETRY, -EAGAIN },
	{ S3_NET_OK, 504, "", S3_RETRY, -EIO },
	{ S3_NET_OK, 400, "RequestTimeout", S3_RETRY, -EINVAL },
	{ S3_NET_OK, 400, "BadDigest", S3_RETRY, -EBADMSG },
	{ S3_NET_OK, 200, "InternalError", S3_RETRY, -EIO },   /* a 200 Complete with an error */
	{ S3_NET_OK, 200, "AccessDenied", S3_FAIL, -EACCES },
	{ S3_NET_OK, 403, "SignatureDoesNotMatch", S3_FAIL, -EACCES },
	{ S3_NET_OK, 403, "RequestTimeTooSkewed", S3_FAIL, -EACCES },
	{ S3_NET_OK, 404, "NoSuchUpload", S3_FAIL, -ENOENT },
	{ S3_NET_OK, 404, "NoSuchBucket", S3_FAIL, -ENOENT },
	{ S3_NET_OK, 400, "EntityTooSmall", S3_FAIL, -EFBIG },
	{ S3_NET_OK, 400, "InvalidPart", S3_FAIL, -EINVAL },
	{ S3_NET_OK, 412, "PreconditionFailed", S3_FAIL, -EEXIST },
	{ S3_NET_TIMEOUT, 0, "", S3_RETRY, -ETIMEDOUT },
	{ S3_NET_RESET, 0, "", S3_RETRY, -ECONNRESET },
	{ S3_NET_TRUNCATED, 200, "", S3_RETRY, -EPROTO },
	{ S3_NET_OTHER, 0, "", S3_FAIL, -EIO },
};

START_TEST(classify)
{
	const struct retry_case *c = &retry_cases[_i];

	ck_assert_int_eq(s3_classify(c->net, c->status, c->code), c->v);
	if (c->v != S3_DONE)
		ck_assert_int_eq(s3_errno(c->net, c->status, c->code), c->err);
}
END_TEST

START_TEST(backoff)
{
	uint64_t seed = 1, max_seen = 0;

	/* Full jitter within min(cap, base * 2^(n-1)), never more. */
	for (unsigned attempt = 1; attempt <= 12; attempt++) {
		uint64_t top = 100ull << (attempt - 1);

		if (top > 5000)
			top = 5000;
		for (int i = 0; i < 1000; i++) {
			uint64_t w = s3_backoff_ms(attempt, 100, 5000, &seed);

			ck_assert_uint_le(w, top);
			if (attempt == 12 && w > max_seen)
				max_seen = w;
		}
	}
	/* It does spread: the capped waits reach past half the cap. */
	ck_assert_uint_gt(max_seen, 2500);
	ck_assert_uint_eq(s3_backoff_ms(1, 0, 5000, &seed), 0);
	/* Huge attempt numbers do not overflow past the cap. */
	ck_assert_uint_le(s3_backoff_ms(200, 100, 5000, &seed), 5000);
}
END_TEST

/* ---- credentials ---- */

static const char *const *fake_env;

static const char *fake_get(const char *name)
{
	for (const char *const *e = fake_env; e && *e; e += 2)
		if (!strcmp(e[0], name))
			return e[1];
	return NULL;
}

static char creds_path[64];

static void write_creds(const char *text, mode_t mode)
{
	FILE *f;

	snprintf(creds_path, sizeof(creds_path), "/tmp/check-s3-creds-%ld", (long)getpid());
	unlink(creds_path);
	f = fopen(creds_path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	ck_assert_int_eq(chmod(creds_path, mode), 0);
}

static void creds_teardown(void)
{
	if (creds_path[0])
		unlink(creds_path);
}

START_TEST(creds_env)
{
	static const char *const env[] = {
		"AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY", "s3cr3t/+=",
		"AWS_DEFAULT_REGION", "eu-west-1", "AWS_REGION", "us-west-2",
		"AWS_ENDPOINT_URL", "http://general:1", "AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000",
		NULL,
	};
	struct s3_creds c;
	char err[256] = "";

	fake_env = env;
	ck_assert_int_eq(s3_creds_load(fake_get, NULL, NULL, &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.key_id, "AKIDEXAMPLE");
	ck_assert_str_eq(c.secret, "s3cr3t/+=");
	ck_assert_str_eq(c.token, "");
	ck_assert_str_eq(c.region, "us-west-2");
	ck_assert_str_eq(c.endpoint, "http://127.0.0.1:9000");
	s3_creds_wipe(&c);
	ck_assert_str_eq(c.secret, "");

	/* Nothing set: -ENOENT, saying what to set. */
	fake_env = NULL;
	ck_assert_int_eq(s3_creds_load(fake_get, NULL, NULL, &c, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "AWS_ACCESS_KEY_ID"));
}
END_TEST

START_TEST(creds_file)
{
	/* No pair in the environment: the file gives it. */
	static const char *const env[] = { "AWS_REGION", "eu-north-1", NULL };
	struct s3_creds c;
	char err[256] = "";

	fake_env = env;
	write_creds("# comment\n[default]\naws_access_key_id = DEFKEY\n"
		    "aws_secret_access_key=defsecret\n\n[profile train]\n"
		    "  aws_access_key_id =  TRAINKEY  \r\naws_secret_access_key = tr=ain\n"
		    "aws_session_token = tok\nregion = ap-south-1\noutput = json\n", 0600);
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.key_id, "DEFKEY");
	ck_assert_str_eq(c.secret, "defsecret");
	ck_assert_str_eq(c.region, "eu-north-1"); /* the file's [default] has none */
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, "train", &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.key_id, "TRAINKEY");
	ck_assert_str_eq(c.secret, "tr=ain");
	ck_assert_str_eq(c.token, "tok");
	ck_assert_str_eq(c.region, "eu-north-1"); /* the environment's, over the file's */
	fake_env = NULL;
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, "train", &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.region, "ap-south-1"); /* the file's, when the environment has none */
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, "nope", &c, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "[nope]"));

	/* Readable by others: refused, and the message says why. */
	chmod(creds_path, 0644);
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), -EACCES);
	ck_assert_ptr_nonnull(strstr(err, "chmod 600"));

	/* Malformed, and a value too long: -EINVAL, without the value. */
	write_creds("[default]\nthis line has no equals sign\n", 0600);
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, ":2:"));
	{
		char text[512] = "[default]\naws_secret_access_key = ";
		size_t n = strlen(text);

		memset(text + n, 'S', 200);
		strcpy(text + n + 200, "\n");
		write_creds(text, 0600);
		ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)),
				 -EINVAL);
		ck_assert_ptr_null(strstr(err, "SSSS"));
	}
	write_creds("[default\n", 0600);
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(s3_creds_load(fake_get, "/nonexistent/creds", NULL, &c, err, sizeof(err)),
			 -ENOENT);
	ck_assert_int_eq(s3_creds_load(fake_get, "/tmp", NULL, &c, err, sizeof(err)), -EINVAL);
}
END_TEST

/* One source gives the whole pair and its token, in the documented order:
 * never a key id of one with the secret (or token) of the other. */
START_TEST(creds_one_source)
{
	static const char *const pair[] = { "AWS_ACCESS_KEY_ID", "ENVKEY", "AWS_SECRET_ACCESS_KEY",
					    "envsecret", NULL };
	static const char *const id_only[] = { "AWS_ACCESS_KEY_ID", "ENVKEY", NULL };
	static const char *const secret_only[] = { "AWS_SECRET_ACCESS_KEY", "envsecret", NULL };
	static const char *const token_only[] = { "AWS_SESSION_TOKEN", "envtok", NULL };
	struct s3_creds c;
	char err[256] = "";

	write_creds("[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n"
		    "aws_session_token = filetok\nregion = ap-south-1\n"
		    "[half]\naws_access_key_id = HALFKEY\n", 0600);

	/* The environment's pair wins whole: the file's token is not added. */
	fake_env = pair;
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.key_id, "ENVKEY");
	ck_assert_str_eq(c.secret, "envsecret");
	ck_assert_str_eq(c.token, "");
	ck_assert_str_eq(c.region, "ap-south-1"); /* what the environment does not give */
	/* ... also when the file has no such profile. */
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, "nope", &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.key_id, "ENVKEY");

	/* Half a pair in the environment: an error, never completed by the file. */
	fake_env = id_only;
	err[0] = '\0';
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "AWS_SECRET_ACCESS_KEY is not"));
	fake_env = secret_only;
	err[0] = '\0';
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "AWS_ACCESS_KEY_ID is not"));
	ck_assert_ptr_null(strstr(err, "envsecret"));
	ck_assert_int_eq(s3_creds_load(fake_get, NULL, NULL, &c, err, sizeof(err)), -EINVAL);
	/* A token without its pair is not lent to the file's pair. */
	fake_env = token_only;
	err[0] = '\0';
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "AWS_SESSION_TOKEN"));

	/* Nothing in the environment: the file's pair and its token. */
	fake_env = NULL;
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, NULL, &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.key_id, "FILEKEY");
	ck_assert_str_eq(c.secret, "filesecret");
	ck_assert_str_eq(c.token, "filetok");
	/* Half a pair in the file: an error too. */
	err[0] = '\0';
	ck_assert_int_eq(s3_creds_load(fake_get, creds_path, "half", &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "aws_access_key_id without aws_secret_access_key"));
	s3_creds_wipe(&c);
}
END_TEST

static Suite *s3_suite(void)
{
	Suite *s = suite_create("s3");
	TCase *tc;

	tc = tcase_create("url");
	tcase_add_loop_test(tc, url_parse, 0, sizeof(url_cases) / sizeof(url_cases[0]));
	tcase_add_test(tc, url_limits);
	suite_add_tcase(s, tc);

	tc = tcase_create("encoding");
	tcase_add_test(tc, encode_path);
	tcase_add_test(tc, encode_query);
	tcase_add_test(tc, every_name_char);
	tcase_add_loop_test(tc, key_check, 0, sizeof(key_cases) / sizeof(key_cases[0]));
	tcase_add_test(tc, object_url);
	suite_add_tcase(s, tc);

	tc = tcase_create("xml");
	tcase_add_test(tc, xml_error);
	tcase_add_test(tc, xml_complete_result);
	tcase_add_test(tc, xml_list);
	tcase_add_loop_test(tc, xml_hostile, 0, sizeof(bad_bodies) / sizeof(bad_bodies[0]));
	tcase_add_test(tc, complete_xml);
	tcase_add_test(tc, crc_b64);
	tcase_add_loop_test(tc, sum_check, 0, sizeof(sum_cases) / sizeof(sum_cases[0]));
	tcase_add_loop_test(tc, answer, 0, sizeof(answers) / sizeof(answers[0]));
	tcase_add_loop_test(tc, md5, 0, sizeof(md5_cases) / sizeof(md5_cases[0]));
	tcase_add_test(tc, md5_lengths);
	tcase_add_test(tc, b64);
	suite_add_tcase(s, tc);

	tc = tcase_create("parts");
	tcase_add_test(tc, plan_small);
	tcase_add_test(tc, plan_limits);
	suite_add_tcase(s, tc);

	tc = tcase_create("creds");
	tcase_add_checked_fixture(tc, NULL, creds_teardown);
	tcase_add_test(tc, creds_env);
	tcase_add_test(tc, creds_file);
	tcase_add_test(tc, creds_one_source);
	suite_add_tcase(s, tc);

	tc = tcase_create("retry");
	tcase_add_loop_test(tc, classify, 0, sizeof(retry_cases) / sizeof(retry_cases[0]));
	tcase_add_test(tc, backoff);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(s3_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
