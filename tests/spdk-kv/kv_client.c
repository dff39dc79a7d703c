/*
 * A KV client on SPDK v26.05's stock NVMe host (include/spdk/nvme_kv.h): attaches
 * to an NVMe/TCP subsystem with the driver's default options, finds its Key Value
 * namespace, and runs the KV command set against it with every value checked.
 * Written for kvtarget's tests (tests/spdk-kv/run.sh); it knows nothing of kvtarget.
 *
 *   kv_client -r TRID -m MODE [-n KEYS] [-s VALUE_BYTES]
 *
 *   TRID   SPDK transport ID, e.g. "trtype:TCP adrfam:IPv4 traddr:127.0.0.1
 *          trsvcid:4420 subnqn:nqn..."
 *   MODE   attach   attach, list the namespaces and their command sets, detach
 *          run      store / retrieve / exist / store options / list / delete,
 *                   every answer and value checked (the namespace is left empty)
 *          store    store KEYS keys with values derived from the key, then flush
 *          verify   retrieve those KEYS keys and check every byte
 *
 * Output: one "ok - ..." or "FAIL - ..." line per check and a summary; exit 0 only
 * when every check passed. Statuses are printed as SCT/SC so a failure says what
 * the controller answered.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spdk/env.h"
#include "spdk/nvme.h"
#include "spdk/nvme_kv.h"

static struct spdk_nvme_ctrlr *g_ctrlr;
static struct spdk_nvme_ns *g_kv_ns;
static struct spdk_nvme_qpair *g_qpair;
static int g_pass, g_fail;

struct wait {
	bool done;
	struct spdk_nvme_cpl cpl;
};

static void
check(bool ok, const char *what, const char *detail)
{
	if (ok) {
		printf("ok - %s\n", what);
		g_pass++;
	} else {
		printf("FAIL - %s: %s\n", what, detail ? detail : "");
		g_fail++;
	}
}

static void
on_done(void *arg, const struct spdk_nvme_cpl *cpl)
{
	struct wait *w = arg;

	w->cpl = *cpl;
	w->done = true;
}

/* Polls until the command completes; false when it could not be sent or the
 * qpair failed. */
static bool
wait_for(struct wait *w, int rc)
{
	if (rc != 0) {
		fprintf(stderr, "submit failed: %s\n", strerror(-rc));
		return false;
	}
	while (!w->done) {
		if (spdk_nvme_qpair_process_completions(g_qpair, 0) < 0) {
			fprintf(stderr, "qpair failed\n");
			return false;
		}
	}
	return true;
}

static const char *
status_str(const struct spdk_nvme_cpl *cpl)
{
	static char buf[64];

	snprintf(buf, sizeof(buf), "SCT %u SC 0x%02x", cpl->status.sct, cpl->status.sc);
	return buf;
}

static bool
is_success(const struct spdk_nvme_cpl *cpl)
{
	return !spdk_nvme_cpl_is_error(cpl);
}

/* The KV command set's statuses are command specific (SCT 1); some hosts list
 * them among the generic ones (SCT 0): accept the code with either. */
static bool
is_status(const struct spdk_nvme_cpl *cpl, uint8_t sc)
{
	return (cpl->status.sct == SPDK_NVME_SCT_COMMAND_SPECIFIC ||
		cpl->status.sct == SPDK_NVME_SCT_GENERIC) && cpl->status.sc == sc;
}

static void
key_of(uint32_t i, uint8_t *key, uint8_t *len)
{
	*len = (uint8_t)snprintf((char *)key, 17, "spdk-kv-%08" PRIu32, i);
}

static void
fill_value(uint8_t *v, uint32_t len, uint32_t i)
{
	uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);

	for (uint32_t b = 0; b < len; b++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v[b] = (uint8_t)x;
	}
}

static bool
store(uint32_t i, const uint8_t *v, uint32_t len, uint8_t opts, struct spdk_nvme_cpl *out)
{
	uint8_t key[17];
	uint8_t klen;
	struct wait w = {0};

	key_of(i, key, &klen);
	if (!wait_for(&w, spdk_nvme_kv_store(g_kv_ns, g_qpair, key, klen, v, len, on_done, &w, opts))) {
		return false;
	}
	*out = w.cpl;
	return true;
}

static bool
retrieve(uint32_t i, uint8_t *v, uint32_t len, struct spdk_nvme_cpl *out)
{
	uint8_t key[17];
	uint8_t klen;
	struct wait w = {0};

	key_of(i, key, &klen);
	if (!wait_for(&w, spdk_nvme_kv_retrieve(g_kv_ns, g_qpair, key, klen, v, len, on_done, &w, 0))) {
		return false;
	}
	*out = w.cpl;
	return true;
}

static bool
exist(uint32_t i, struct spdk_nvme_cpl *out)
{
	uint8_t key[17];
	uint8_t klen;
	struct wait w = {0};

	key_of(i, key, &klen);
	if (!wait_for(&w, spdk_nvme_kv_exist(g_kv_ns, g_qpair, key, klen, on_done, &w))) {
		return false;
	}
	*out = w.cpl;
	return true;
}

static bool
delete(uint32_t i, struct spdk_nvme_cpl *out)
{
	uint8_t key[17];
	uint8_t klen;
	struct wait w = {0};

	key_of(i, key, &klen);
	if (!wait_for(&w, spdk_nvme_kv_delete(g_kv_ns, g_qpair, key, klen, on_done, &w))) {
		return false;
	}
	*out = w.cpl;
	return true;
}

static bool
flush(void)
{
	struct wait w = {0};

	return wait_for(&w, spdk_nvme_ns_cmd_flush(g_kv_ns, g_qpair, on_done, &w)) &&
	       is_success(&w.cpl);
}

static bool
probe_cb(void *ctx, const struct spdk_nvme_transport_id *trid, struct spdk_nvme_ctrlr_opts *opts)
{
	return true;
}

static void
attach_cb(void *ctx, const struct spdk_nvme_transport_id *trid, struct spdk_nvme_ctrlr *ctrlr,
	  const struct spdk_nvme_ctrlr_opts *opts)
{
	g_ctrlr = ctrlr;
}

/* Every active namespace and its command set; the first KV one is used. */
static void
find_namespaces(int *nvm, int *kv)
{
	*nvm = 0;
	*kv = 0;
	for (uint32_t nsid = spdk_nvme_ctrlr_get_first_active_ns(g_ctrlr); nsid != 0;
	     nsid = spdk_nvme_ctrlr_get_next_active_ns(g_ctrlr, nsid)) {
		struct spdk_nvme_ns *ns = spdk_nvme_ctrlr_get_ns(g_ctrlr, nsid);
		enum spdk_nvme_csi csi = spdk_nvme_ns_get_csi(ns);

		printf("# namespace %u: CSI %u\n", nsid, csi);
		if (csi == SPDK_NVME_CSI_KV) {
			(*kv)++;
			if (g_kv_ns == NULL) {
				g_kv_ns = ns;
			}
		} else if (csi == SPDK_NVME_CSI_NVM) {
			(*nvm)++;
		}
	}
}

static void
run_checks(uint32_t keys, uint32_t size)
{
	uint8_t *v = spdk_zmalloc(size, 4096, NULL, SPDK_ENV_NUMA_ID_ANY, SPDK_MALLOC_DMA);
	uint8_t *r = spdk_zmalloc(size, 4096, NULL, SPDK_ENV_NUMA_ID_ANY, SPDK_MALLOC_DMA);
	uint8_t *list = spdk_zmalloc(64 * 1024, 4096, NULL, SPDK_ENV_NUMA_ID_ANY, SPDK_MALLOC_DMA);
	struct spdk_nvme_cpl c;
	char d[160];
	bool all = true;

	if (!v || !r || !list) {
		check(false, "buffers", "spdk_zmalloc failed");
		return;
	}
	const struct spdk_nvme_kv_ns_data *nd = spdk_nvme_kv_ns_get_data(g_kv_ns);
	check(nd != NULL, "KV Identify Namespace read by the driver", "no KV namespace data");

	for (uint32_t i = 0; i < keys && all; i++) {
		fill_value(v, size, i);
		all = store(i, v, size, 0, &c) && is_success(&c);
		if (!all) {
			snprintf(d, sizeof(d), "key %u: %s", i, status_str(&c));
		}
	}
	check(all, "store every key", d);

	all = true;
	for (uint32_t i = 0; i < keys && all; i++) {
		memset(r, 0, size);
		fill_value(v, size, i);
		all = retrieve(i, r, size, &c) && is_success(&c) && c.cdw0 == size &&
		      memcmp(r, v, size) == 0;
		if (!all) {
			snprintf(d, sizeof(d), "key %u: %s, size %u", i, status_str(&c), c.cdw0);
		}
	}
	check(all, "retrieve every key: its size in CDW0 and every byte", d);

	/* A short buffer gets the value's head and its whole size. */
	memset(r, 0, size);
	fill_value(v, size, 0);
	all = retrieve(0, r, size / 2, &c) && is_success(&c) && c.cdw0 == size &&
	      memcmp(r, v, size / 2) == 0;
	snprintf(d, sizeof(d), "%s, size %u", status_str(&c), c.cdw0);
	check(all, "retrieve into a shorter buffer", d);

	all = exist(0, &c) && is_success(&c);
	check(all, "exist on a stored key", status_str(&c));
	all = exist(keys + 7, &c) && is_status(&c, SPDK_NVME_SC_KV_KEY_DOES_NOT_EXIST);
	check(all, "exist on a missing key: Key Does Not Exist", status_str(&c));
	all = retrieve(keys + 7, r, size, &c) && is_status(&c, SPDK_NVME_SC_KV_KEY_DOES_NOT_EXIST);
	check(all, "retrieve of a missing key: Key Does Not Exist", status_str(&c));

	all = store(0, v, size, SPDK_NVME_KV_STORE_OPT_DONT_STORE_IF_KEY_EXISTS, &c) &&
	      is_status(&c, SPDK_NVME_SC_KEY_EXISTS);
	check(all, "store 'only if new' over a stored key: Key Exists", status_str(&c));
	all = store(keys + 7, v, size, SPDK_NVME_KV_STORE_OPT_DONT_STORE_IF_KEY_NOT_EXISTS, &c) &&
	      is_status(&c, SPDK_NVME_SC_KV_KEY_DOES_NOT_EXIST);
	check(all, "store 'only if present' of a missing key: Key Does Not Exist", status_str(&c));

	/* An overwrite replaces the value. */
	fill_value(v, size, 1000000);
	all = store(1, v, size, SPDK_NVME_KV_STORE_OPT_DONT_STORE_IF_KEY_NOT_EXISTS, &c) &&
	      is_success(&c) && retrieve(1, r, size, &c) && is_success(&c) && memcmp(r, v, size) == 0;
	check(all, "overwrite of a present key reads back the new value", status_str(&c));

	struct wait w = {0};
	all = wait_for(&w, spdk_nvme_kv_list(g_kv_ns, g_qpair, NULL, 0, list, 64 * 1024, on_done, &w)) &&
	      is_success(&w.cpl);
	uint32_t nrk = 0, seen = 0;
	if (all) {
		memcpy(&nrk, list, 4);
		size_t off = 4;
		for (uint32_t k = 0; k < nrk && off + 2 <= 64 * 1024; k++) {
			uint16_t kl;
			memcpy(&kl, list + off, 2);
			if (kl >= 8 && kl <= 16 && memcmp(list + off + 2, "spdk-kv-", 8) == 0) {
				seen++;
			}
			off += (2 + kl + 3) / 4 * 4;
		}
	}
	snprintf(d, sizeof(d), "%s, %u keys returned, %u ours, %u stored", status_str(&w.cpl), nrk,
		 seen, keys);
	check(all && nrk == keys && seen == keys, "list from the first key returns every key", d);

	all = true;
	for (uint32_t i = 0; i < keys && all; i++) {
		all = delete(i, &c) && is_success(&c);
		if (!all) {
			snprintf(d, sizeof(d), "key %u: %s", i, status_str(&c));
		}
	}
	check(all, "delete every key", d);
	all = exist(0, &c) && is_status(&c, SPDK_NVME_SC_KV_KEY_DOES_NOT_EXIST) &&
	      retrieve(keys - 1, r, size, &c) && is_status(&c, SPDK_NVME_SC_KV_KEY_DOES_NOT_EXIST);
	check(all, "deleted keys read as Key Does Not Exist", status_str(&c));
	all = delete(0, &c) && is_status(&c, SPDK_NVME_SC_KV_KEY_DOES_NOT_EXIST);
	check(all, "delete of a missing key: Key Does Not Exist", status_str(&c));

	spdk_free(v);
	spdk_free(r);
	spdk_free(list);
}

static void
store_all(uint32_t keys, uint32_t size, bool verify)
{
	uint8_t *v = spdk_zmalloc(size, 4096, NULL, SPDK_ENV_NUMA_ID_ANY, SPDK_MALLOC_DMA);
	uint8_t *r = spdk_zmalloc(size, 4096, NULL, SPDK_ENV_NUMA_ID_ANY, SPDK_MALLOC_DMA);
	struct spdk_nvme_cpl c = {0};
	char d[160] = "";
	uint32_t good = 0;

	if (!v || !r) {
		check(false, "buffers", "spdk_zmalloc failed");
		return;
	}
	for (uint32_t i = 0; i < keys; i++) {
		fill_value(v, size, i);
		bool ok;
		if (verify) {
			memset(r, 0, size);
			ok = retrieve(i, r, size, &c) && is_success(&c) && c.cdw0 == size &&
			     memcmp(r, v, size) == 0;
		} else {
			ok = store(i, v, size, 0, &c) && is_success(&c);
		}
		if (ok) {
			good++;
		} else if (d[0] == 0) {
			snprintf(d, sizeof(d), "first bad key %u: %s", i, status_str(&c));
		}
	}
	if (verify) {
		snprintf(d + strlen(d), sizeof(d) - strlen(d), " (%u of %u intact)", good, keys);
		check(good == keys, "every flushed key survived with every byte", d);
	} else {
		check(good == keys, "store every key", d);
		check(flush(), "flush the KV namespace", "Flush failed");
	}
	spdk_free(v);
	spdk_free(r);
}

int
main(int argc, char **argv)
{
	struct spdk_env_opts env_opts;
	struct spdk_nvme_transport_id trid = {0};
	const char *trid_str = NULL, *mode = "run";
	uint32_t keys = 64, size = 8192;
	int op, nvm, kv;

	while ((op = getopt(argc, argv, "r:m:n:s:")) != -1) {
		switch (op) {
		case 'r': trid_str = optarg; break;
		case 'm': mode = optarg; break;
		case 'n': keys = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 's': size = (uint32_t)strtoul(optarg, NULL, 10); break;
		default:
			fprintf(stderr, "usage: %s -r TRID -m attach|run|store|verify [-n KEYS] [-s BYTES]\n",
				argv[0]);
			return 2;
		}
	}
	if (trid_str == NULL || keys < 2 || size < 2) {
		fprintf(stderr, "kv_client: -r TRID is required; -n and -s at least 2\n");
		return 2;
	}
	env_opts.opts_size = sizeof(env_opts);
	spdk_env_opts_init(&env_opts);
	env_opts.name = "kv_client";
	env_opts.shm_id = -1;
	if (spdk_env_init(&env_opts) < 0) {
		fprintf(stderr, "kv_client: spdk_env_init failed\n");
		return 1;
	}
	if (spdk_nvme_transport_id_parse(&trid, trid_str) != 0) {
		fprintf(stderr, "kv_client: bad transport ID '%s'\n", trid_str);
		return 2;
	}
	/* The driver's default controller options: a stock host. */
	if (spdk_nvme_probe(&trid, NULL, probe_cb, attach_cb, NULL) != 0 || g_ctrlr == NULL) {
		check(false, "attach with the driver's default options", "spdk_nvme_probe attached nothing");
		printf("%d passed, %d failed\n", g_pass, g_fail);
		return 1;
	}
	check(true, "attach with the driver's default options", NULL);
	find_namespaces(&nvm, &kv);
	check(kv == 1, "one active KV namespace", "the driver found none");
	check(spdk_nvme_kv_ctrlr_get_data(g_ctrlr) != NULL, "KV Identify Controller read by the driver",
	      "none");
	if (strcmp(mode, "attach") == 0) {
		check(nvm >= 1, "the NVM namespace beside it is active too", "none");
	}
	if (g_kv_ns != NULL && strcmp(mode, "attach") != 0) {
		g_qpair = spdk_nvme_ctrlr_alloc_io_qpair(g_ctrlr, NULL, 0);
		check(g_qpair != NULL, "I/O queue pair", "alloc failed");
		if (g_qpair != NULL) {
			if (strcmp(mode, "run") == 0) {
				run_checks(keys, size);
			} else if (strcmp(mode, "store") == 0) {
				store_all(keys, size, false);
			} else if (strcmp(mode, "verify") == 0) {
				store_all(keys, size, true);
			} else {
				check(false, "mode", mode);
			}
			spdk_nvme_ctrlr_free_io_qpair(g_qpair);
		}
	}
	struct spdk_nvme_detach_ctx *dctx = NULL;
	spdk_nvme_detach_async(g_ctrlr, &dctx);
	if (dctx) {
		spdk_nvme_detach_poll(dctx);
	}
	printf("%d passed, %d failed\n", g_pass, g_fail);
	spdk_env_fini();
	return g_fail == 0 ? 0 : 1;
}
