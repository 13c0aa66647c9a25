/*
 * slurm-k8s-bridge step guard: a SPANK plugin that keeps user code off the slurmd hosts of
 * bridged partitions.
 *
 * A bridged job's only business on its slurmd is the batch step, which this guard turns into the
 * bridge's waiter. In slurmstepd (remote context, which a user's own srun build cannot skip) this
 * plugin, for a job whose partition slurmctld names as bridged:
 *
 *   - starts the bridge's waiter as the batch step, in place of the script: at the step's start
 *     (slurm_spank_init, as root), slurmd's copy of the script (the file slurmstepd then execs)
 *     becomes a root-owned wrapper that execs the waiter with the user's copy, moved aside, as its
 *     batch script (wrap_batch_script). So slurmstepd still does all it does before a batch
 *     script's exec (the job's limits, TMPDIR, the task prolog), and the script Slurm keeps stays
 *     the user's (`scontrol write batch_script`, sacct's job_script). However the job reached the
 *     partition (a reservation, an Alternate partition), the script never runs here; if the copy
 *     cannot be made a call of the waiter, the step fails; a job with an OCI container
 *     (--container), which slurmstepd would run here with the user's bundle, is refused;
 *   - lets a step through that is the bridge's own task proxy: exactly the waiter's command,
 *     then `task` and a step key (the waiter starts such steps for the script's `srun`; their
 *     tasks only stream what the daemon runs in the pods), with the environment held as below;
 *   - turns every other step of the job's user (srun --jobid N --overlap, the srun of an salloc
 *     or of a bare srun's allocation) into the bridge's user-step proxy: in the task, just before
 *     slurmstepd would exec the user's program (and before any task prolog), it execs the
 *     waiter's command with `step -- ARGV...` instead; the proxy has the daemon run ARGV in the
 *     job's pod on this node. The user's program never starts here. slurmstepd would still run a
 *     step's --task-epilog (a program of the user's, as the user, on this host) after each task,
 *     and SPANK cannot see that option: once the step's tasks are forked, the guard forbids
 *     slurmstepd to exec anything more (a seccomp filter on execve/execveat, in
 *     slurm_spank_task_post_fork), so no epilog, the user's or the site's, starts for such a
 *     step. The tasks, forked before, exec the proxy as above.
 *     Programs named by an `allow=` argument (absolute paths, written by the site in
 *     plugstack.conf) may run as steps: the bridge's own step launcher, if any. srun (local
 *     context) checks the same first, only to print the reason early and clearly;
 *   - starts the waiter (batch step or task proxy) with the signals Slurm sends a batch script
 *     or a task blocked: one that comes while the waiter starts (scancel -s USR1 --batch the
 *     moment the job runs) stays pending until the waiter has its handlers and unblocks them, where it
 *     would otherwise end the waiter by its default action;
 *   - for the waiter's batch step, moves every variable but SLURM_* out of the way, under
 *     SLURM_K8S_BRIDGE_HELD_<name>: nothing the user exported (LD_PRELOAD, OPENSSL_CONF, LOCPATH,
 *     ...) can steer what starts the waiter, or the waiter. The waiter hands the user's values
 *     to the pods, where they belong.
 *
 * Which partitions are bridged, and the waiter's command, come from the settings file that
 * job_submit.lua reads (`settings=` argument), parsed the same way. If it cannot be read, or
 * slurmctld cannot be asked, every step but extern steps is refused: the guard fails closed.
 *
 * plugstack.conf:
 *   required /path/slurm_k8s_bridge_guard.so settings=/etc/slurm/job_submit_bridge.conf
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(slurm_k8s_bridge_guard, 1);

#define MAX_PARTITIONS 256
#define MAX_ALLOWED 8
#define NAME_LEN 256
#define HELD_PREFIX "SLURM_K8S_BRIDGE_HELD_"
/* Set when the guard held the environment: the waiter then knows that any other variable is not
 * the user's. */
#define HELD_MARKER "SLURM_K8S_BRIDGE_ENV_HELD"

static char settings_path[1024] = "/etc/slurm/job_submit_bridge.conf";
static char allowed[MAX_ALLOWED][NAME_LEN];
static int allowed_count;
/* Decided in slurm_spank_init, used by slurm_spank_user_init of the same slurmstepd. */
static int batch_of_bridged_job;
static void remove_step_usage(pid_t stepd);
static int wrap_batch_script(const char *path, const char *waiter);
/* A user's step of a bridged job: its tasks exec the waiter's `step` proxy (slurm_spank_task_init). */
static int user_step_of_bridged_job;
static char user_step_command[4096];
#define MAX_COMMAND_WORDS 32

struct settings {
	char partitions[MAX_PARTITIONS][NAME_LEN];
	int count;
	char attach_command[4096];
	char step_key_file[1024];
};

static void parse_args(int ac, char **av)
{
	allowed_count = 0;
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "settings=", 9) == 0) {
			snprintf(settings_path, sizeof(settings_path), "%s", av[i] + 9);
		} else if (strncmp(av[i], "allow=", 6) == 0 && av[i][6] == '/' &&
			   allowed_count < MAX_ALLOWED) {
			snprintf(allowed[allowed_count++], NAME_LEN, "%s", av[i] + 6);
		} else {
			slurm_error("slurm-k8s-bridge guard: unknown argument '%s' in plugstack.conf", av[i]);
		}
	}
}

/* A settings line as job_submit.lua sees it: from the first '#' on a comment, then trimmed. */
static char *clean_line(char *line)
{
	char *hash = strchr(line, '#');
	if (hash)
		*hash = '\0';
	while (*line == ' ' || *line == '\t')
		line++;
	char *end = line + strlen(line);
	while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	return line;
}

/* 0, or -1 when the settings cannot be read or hold more than this guard can keep. */
static int load_settings(struct settings *settings)
{
	char raw[8192];
	FILE *file = fopen(settings_path, "r");

	memset(settings, 0, sizeof(*settings));
	if (!file)
		return -1;
	while (fgets(raw, sizeof(raw), file)) {
		char *line = clean_line(raw);
		if (strncmp(line, "partition=", 10) == 0) {
			if (settings->count == MAX_PARTITIONS) {
				fclose(file);
				return -1; /* never treat a partition it could not keep as unbridged */
			}
			if (sscanf(line + 10, "%255[^ \t]", settings->partitions[settings->count]) == 1)
				settings->count++;
		} else if (strncmp(line, "attach_command=", 15) == 0) {
			snprintf(settings->attach_command, sizeof(settings->attach_command), "%s", line + 15);
		} else if (strncmp(line, "step_key_file=", 14) == 0) {
			snprintf(settings->step_key_file, sizeof(settings->step_key_file), "%s", line + 14);
		}
	}
	fclose(file);
	return settings->attach_command[0] ? 0 : -1;
}

static int partition_is_bridged(const struct settings *settings, const char *partition)
{
	char copy[4096];
	char *save = NULL;

	if (!partition)
		return 0;
	snprintf(copy, sizeof(copy), "%s", partition);
	for (char *part = strtok_r(copy, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
		for (int i = 0; i < settings->count; i++)
			if (strcmp(part, settings->partitions[i]) == 0)
				return 1;
	}
	return 0;
}

/* The job's partition from slurmctld (never from the job's environment, which the user sets).
 * Returns 1 bridged, 0 not, -1 unknown (slurmctld or the settings unreachable). */
static int job_is_bridged(uint32_t job_id, const struct settings *settings, char *partition,
			  size_t partition_len, uint32_t *restarts, int *in_container)
{
	job_info_msg_t *info = NULL;
	slurm_step_id_t which = SLURM_STEP_ID_INITIALIZER;
	int bridged;

	which.job_id = job_id;
	snprintf(partition, partition_len, "?");
	if (slurm_load_job(&info, which, SHOW_ALL) != SLURM_SUCCESS || !info ||
	    info->record_count < 1) {
		if (info)
			slurm_free_job_info_msg(info);
		return -1;
	}
	snprintf(partition, partition_len, "%s",
		 info->job_array[0].partition ? info->job_array[0].partition : "");
	bridged = partition_is_bridged(settings, info->job_array[0].partition);
	*restarts = info->job_array[0].restart_cnt;
	*in_container = info->job_array[0].container && info->job_array[0].container[0];
	slurm_free_job_info_msg(info);
	return bridged;
}

static const char *program_of(spank_t sp)
{
	int argc = 0;
	char **argv = NULL;

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv[0])
		return NULL;
	return argv[0];
}

static int program_is_allowed(spank_t sp)
{
	const char *program = program_of(sp);

	for (int i = 0; program && i < allowed_count; i++)
		if (strcmp(program, allowed[i]) == 0)
			return 1;
	return 0;
}

/* --- HMAC-SHA256, to check the step token (no crypto library is needed on the slurmd host) --- */
static const uint32_t sha_k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

struct sha256 {
	uint32_t h[8];
	uint8_t block[64];
	size_t used;
	uint64_t bits;
};

static void sha256_init(struct sha256 *c)
{
	static const uint32_t iv[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	memcpy(c->h, iv, sizeof(iv));
	c->used = 0;
	c->bits = 0;
}

static void sha256_block(struct sha256 *c)
{
	uint32_t w[64], a, b, d, e, f, g, h, cc, t1, t2;

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t) c->block[4 * i] << 24 | (uint32_t) c->block[4 * i + 1] << 16 |
		       (uint32_t) c->block[4 * i + 2] << 8 | c->block[4 * i + 3];
	for (int i = 16; i < 64; i++)
		w[i] = w[i - 16] + (ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
		       (ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10));
	a = c->h[0]; b = c->h[1]; cc = c->h[2]; d = c->h[3];
	e = c->h[4]; f = c->h[5]; g = c->h[6]; h = c->h[7];
	for (int i = 0; i < 64; i++) {
		t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
		t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
		h = g; g = f; f = e; e = d + t1; d = cc; cc = b; b = a; a = t1 + t2;
	}
	c->h[0] += a; c->h[1] += b; c->h[2] += cc; c->h[3] += d;
	c->h[4] += e; c->h[5] += f; c->h[6] += g; c->h[7] += h;
}

static void sha256_update(struct sha256 *c, const uint8_t *data, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		c->block[c->used++] = data[i];
		c->bits += 8;
		if (c->used == 64) {
			sha256_block(c);
			c->used = 0;
		}
	}
}

static void sha256_final(struct sha256 *c, uint8_t out[32])
{
	uint64_t bits = c->bits;
	uint8_t pad = 0x80, zero = 0, len[8];

	sha256_update(c, &pad, 1);
	while (c->used != 56)
		sha256_update(c, &zero, 1);
	for (int i = 0; i < 8; i++)
		len[i] = (uint8_t) (bits >> (56 - 8 * i));
	sha256_update(c, len, 8);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t) (c->h[i] >> 24);
		out[4 * i + 1] = (uint8_t) (c->h[i] >> 16);
		out[4 * i + 2] = (uint8_t) (c->h[i] >> 8);
		out[4 * i + 3] = (uint8_t) c->h[i];
	}
}

static void hmac_sha256_hex(const uint8_t *key, size_t key_len, const char *msg, char hex[65])
{
	uint8_t k[64] = { 0 }, pad[64], inner[32], outer[32];
	struct sha256 c;

	if (key_len > 64) {
		sha256_init(&c);
		sha256_update(&c, key, key_len);
		sha256_final(&c, k);
	} else {
		memcpy(k, key, key_len);
	}
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	sha256_init(&c);
	sha256_update(&c, pad, 64);
	sha256_update(&c, (const uint8_t *) msg, strlen(msg));
	sha256_final(&c, inner);
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	sha256_init(&c);
	sha256_update(&c, pad, 64);
	sha256_update(&c, inner, 32);
	sha256_final(&c, outer);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", outer[i]);
}

/* The step token the daemon gave the waiter for this step (env SLURM_K8S_BRIDGE_STEP_TOKEN) must
 * be HMAC-SHA256(step key file, "<job id>:<restart count>:<step key>"): a user who launches a task proxy step
 * by hand (srun --jobid, with --task-prolog or --container, which would run their code on this
 * host) has no token, and cannot read the key file (root only, read here in slurmstepd).
 *
 * The restart count is the job's, as slurmctld has it (the run the daemon signed for): Slurm's
 * S_SLURM_RESTART_COUNT is 0 in every step's slurmstepd (its field is never filled in), which
 * made each srun of a requeued job's script a refused user step. */
static int step_token_is_valid(spank_t sp, const struct settings *settings, uint32_t job_id,
			       uint32_t run, const char *step_key)
{
	char token[128] = "", want[65], msg[128];
	uint8_t key[256];
	size_t key_len;
	struct stat info;
	FILE *file;

	if (!settings->step_key_file[0])
		return 0;
	if (spank_getenv(sp, "SLURM_K8S_BRIDGE_STEP_TOKEN", token, sizeof(token)) != ESPANK_SUCCESS)
		return 0;
	file = fopen(settings->step_key_file, "r");
	if (!file)
		return 0;
	/* Root's secret: a key file anybody else could read or write proves nothing. */
	if (fstat(fileno(file), &info) != 0 || info.st_uid != 0 || (info.st_mode & 077)) {
		fclose(file);
		slurm_error("slurm-k8s-bridge: %s must be owned by root, mode 600", settings->step_key_file);
		return 0;
	}
	key_len = fread(key, 1, sizeof(key), file);
	fclose(file);
	while (key_len > 0 && (key[key_len - 1] == '\n' || key[key_len - 1] == '\r'))
		key_len--;
	if (key_len < 16)
		return 0;
	if (strlen(step_key) > 19 ||
	    (size_t) snprintf(msg, sizeof(msg), "%u:%u:%s", job_id, run, step_key) >= sizeof(msg))
		return 0;
	hmac_sha256_hex(key, key_len, msg, want);
	return strlen(token) == 64 && memcmp(token, want, 64) == 0;
}

/* Is this step the bridge's own task proxy: exactly the waiter's command (attach_command, which
 * is validated to be plain words), then "task" and a step key of digits? Such a step is what the
 * waiter launches for a `srun` of the script; its tasks only stream what the daemon runs in the
 * job's pods. Its environment is held like the batch step's. */
static int is_task_proxy(spank_t sp, const struct settings *settings, uint32_t job_id, uint32_t restarts,
			 int remote)
{
	int argc = 0, word = 0;
	char **argv = NULL;
	char command[4096];
	char *save = NULL;

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || !argv)
		return 0;
	snprintf(command, sizeof(command), "%s", settings->attach_command);
	for (char *part = strtok_r(command, " ", &save); part; part = strtok_r(NULL, " ", &save)) {
		if (word >= argc || !argv[word] || strcmp(argv[word], part) != 0)
			return 0;
		word++;
	}
	if (word == 0 || argc != word + 2 || strcmp(argv[word], "task") != 0 || !argv[word + 1][0])
		return 0;
	for (const char *c = argv[word + 1]; *c; c++)
		if (*c < '0' || *c > '9')
			return 0;
	/* srun (local context) runs as the user and cannot read the key: it only checks there is a
	 * token, to say early why a hand-made one is refused; slurmstepd decides. */
	if (!remote) {
		char token[8];
		return spank_getenv(sp, "SLURM_K8S_BRIDGE_STEP_TOKEN", token, sizeof(token)) != ESPANK_ENV_NOEXIST;
	}
	return step_token_is_valid(sp, settings, job_id, restarts, argv[word + 1]);
}

/* slurmstepd of a user's step, once its tasks are forked: every execve/execveat fails (EPERM).
 * What it would still exec is the step's --task-epilog (the user's program, as the user, here)
 * and the site's TaskEpilog; the tasks themselves were forked before and exec the proxy. 0 when
 * the filter is on. */
static int forbid_further_execs(void)
{
	struct sock_filter filter[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS), /* another ABI: nothing runs */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execve, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execveat, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	};
	struct sock_fprog program = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};

	/* Without CAP_SYS_ADMIN in effect the kernel asks for no_new_privs first; slurmstepd never
	 * gains privileges by exec (and now execs nothing). */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
		slurm_error("slurm-k8s-bridge: cannot forbid slurmstepd further execs for a user's step "
			    "(seccomp: %m): the step is refused");
		return -1;
	}
	return 0;
}

/* In a user step's task, instead of the user's program: the waiter's command, `step`, `--`, then
 * the program's argv, with the step's (held) environment. Only returns on failure. */
static int exec_user_step_proxy(spank_t sp)
{
	char *words[MAX_COMMAND_WORDS + 2] = {NULL};
	char command[4096];
	char *save = NULL, **argv = NULL, **env = NULL, **proxy;
	int argc = 0, count = 0;

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || !argv ||
	    spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || !env)
		return -1;
	snprintf(command, sizeof(command), "%s", user_step_command);
	for (char *part = strtok_r(command, " ", &save); part && count < MAX_COMMAND_WORDS;
	     part = strtok_r(NULL, " ", &save))
		words[count++] = part;
	if (count == 0 || words[0][0] != '/')
		return -1;
	proxy = calloc((size_t) count + 2 + (size_t) argc + 1, sizeof(char *));
	if (!proxy)
		return -1;
	for (int i = 0; i < count; i++)
		proxy[i] = words[i];
	proxy[count] = "step";
	proxy[count + 1] = "--";
	for (int i = 0; i < argc; i++)
		proxy[count + 2 + i] = argv[i];
	execve(proxy[0], proxy, env);
	slurm_error("slurm-k8s-bridge: cannot start the user-step proxy %s: %m", proxy[0]);
	free(proxy);
	return -1;
}

/* Refuse a step of a bridged job (both contexts); 0 lets it through. */
static int guard_step(spank_t sp, const char *where)
{
	uint32_t job_id = 0, step_id = 0, restarts = 0;
	char partition[NAME_LEN];
	struct settings *settings;
	int bridged, in_container = 0, rc = -1;

	batch_of_bridged_job = 0;
	user_step_of_bridged_job = 0;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		return 0; /* srun before an allocation exists: checked again once it does */
	if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS)
		step_id = NO_VAL;
	if (step_id == SLURM_EXTERN_CONT)
		return 0; /* runs no user program (PrologFlags=contain) */
	settings = malloc(sizeof(*settings));
	if (!settings)
		return -1;
	bridged = load_settings(settings) == 0 ? job_is_bridged(job_id, settings, partition,
								  sizeof(partition), &restarts, &in_container) : -1;
	if (bridged == 0) {
		rc = 0;
	} else if (bridged < 0) {
		slurm_error("slurm-k8s-bridge: refusing a step of job %u: cannot tell whether it runs in "
			    "Kubernetes (slurmctld or %s unreachable) [%s]", job_id, settings_path, where);
	} else if (in_container) {
		/* slurmstepd would run the step here, in the user's OCI bundle (job_submit.lua refuses
		 * --container in a bridged partition; this is for a job that got past it). */
		slurm_error("slurm-k8s-bridge: job %u runs in Kubernetes (partition %s): an OCI container "
			    "(--container) cannot run on its nodes' slurmd [%s]", job_id, partition, where);
	} else if (step_id == SLURM_BATCH_SCRIPT) {
		/* Hold the environment and the early signals; the script becomes the waiter's wrapper. */
		batch_of_bridged_job = 1;
		rc = spank_context() == S_CTX_REMOTE ? wrap_batch_script(program_of(sp), settings->attach_command) : 0;
	} else if (is_task_proxy(sp, settings, job_id, restarts, spank_context() == S_CTX_REMOTE)) {
		batch_of_bridged_job = 1; /* hold the environment, as for the waiter */
		rc = 0;
	} else if (program_is_allowed(sp)) {
		rc = 0;
	} else if (step_id > SLURM_MAX_NORMAL_STEP_ID && step_id != SLURM_INTERACTIVE_STEP) {
		slurm_error("slurm-k8s-bridge: job %u runs in Kubernetes (partition %s): this kind of step "
			    "cannot start on its nodes' slurmd [%s]", job_id, partition, where);
	} else {
		/* Hold the environment and the early signals, as for the waiter: it is what starts. */
		batch_of_bridged_job = 1;
		user_step_of_bridged_job = 1;
		snprintf(user_step_command, sizeof(user_step_command), "%s", settings->attach_command);
		rc = 0;
	}
	free(settings);
	return rc;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	parse_args(ac, av);
	if (spank_context() == S_CTX_REMOTE) {
		/* A slurmstepd that died with this pid may have left its usage files. */
		remove_step_usage(getpid());
		return guard_step(sp, "slurmstepd");
	}
	return 0;
}

int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return guard_step(sp, "srun");
}

/* The first lines of the batch script slurmstepd execs for a bridged job (the user's script is
 * in USER_COPY_SUFFIX beside it). */
#define WRAPPER_HEAD "#!/bin/sh\n# slurm-k8s-bridge: this job runs in Kubernetes pods. The waiter streams their " \
		     "output here and\n# exits with their exit code; the user's script is its first argument.\n"
#define USER_COPY_SUFFIX ".user"

/* slurmd's copy of the user's script, once moved aside (removed in slurm_spank_exit, before
 * slurmstepd removes the job's directory). */
static char user_copy[4200];

/* Makes slurmd's copy of the batch script (`path`, which slurmstepd execs) a call of the waiter:
 * the copy, the user's (owner and mode kept), is renamed to `path`.user, and `path` becomes a
 * root-owned wrapper holding nothing of the user's, which execs the waiter with that copy as the
 * batch script and the script's arguments. So nothing the job's user can write is ever run here,
 * while slurmstepd still does all it does before a batch script's exec (the job's limits, TMPDIR,
 * the task prolog). Runs in slurmstepd as root (slurm_spank_init), in slurmd's job directory
 * (root's, the job's group may read it). 0, or -1 (the step fails: nothing starts). */
static int wrap_batch_script(const char *path, const char *waiter)
{
	char temporary[4200];
	struct stat st;
	int fd = -1, rc = -1;
	FILE *out = NULL;

	temporary[0] = user_copy[0] = '\0';
	if (!path || path[0] != '/' || strchr(path, '\'') || strchr(path, '\n') ||
	    (size_t) snprintf(user_copy, sizeof(user_copy), "%s%s", path, USER_COPY_SUFFIX) >= sizeof(user_copy) ||
	    (size_t) snprintf(temporary, sizeof(temporary), "%s.slurm-k8s-bridge", path) >= sizeof(temporary))
		goto done;
	if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
		goto done;
	/* Leftovers of a slurmstepd that died here. */
	unlink(user_copy);
	unlink(temporary);
	fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0755);
	if (fd < 0 || fchown(fd, 0, 0) != 0 || fchmod(fd, 0755) != 0)
		goto done;
	out = fdopen(fd, "w");
	if (!out)
		goto done;
	fd = -1;
	if (fprintf(out, "%sexec %s '%s' \"$@\"\n", WRAPPER_HEAD, waiter, user_copy) < 0)
		goto done;
	if (fclose(out) != 0) {
		out = NULL;
		goto done;
	}
	out = NULL;
	if (rename(path, user_copy) != 0)
		goto done;
	if (rename(temporary, path) != 0) {
		rename(user_copy, path);
		goto done;
	}
	rc = 0;
done:
	if (rc != 0) {
		slurm_error("slurm-k8s-bridge: cannot make the batch script %s a call of the waiter: %m",
			    path ? path : "?");
		user_copy[0] = '\0';
	}
	if (out)
		fclose(out);
	if (fd >= 0)
		close(fd);
	if (rc != 0 && temporary[0])
		unlink(temporary);
	return rc;
}

/* Batch step of a bridged job: hold every variable but SLURM_* out of the waiter's way. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char **env = NULL;
	char **names = NULL, **values = NULL;
	int count = 0, rc = 0;

	(void) ac;
	(void) av;
	if (spank_remote(sp) != 1 || !batch_of_bridged_job)
		return 0;
	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || !env) {
		slurm_error("slurm-k8s-bridge: cannot read the waiter's environment");
		return -1;
	}
	for (int i = 0; env[i]; i++)
		count++;
	names = calloc(count + 1, sizeof(char *));
	values = calloc(count + 1, sizeof(char *));
	if (!names || !values) {
		free(names);
		free(values);
		return -1;
	}
	/* Copy first: setting and unsetting while walking the array would skip or reuse entries. */
	int held = 0;
	for (int i = 0; env[i]; i++) {
		const char *eq = strchr(env[i], '=');
		size_t len = eq ? (size_t) (eq - env[i]) : strlen(env[i]);
		if (strncmp(env[i], "SLURM_", 6) == 0 && len > 6)
			continue;
		names[held] = strndup(env[i], len);
		values[held] = strdup(eq ? eq + 1 : "");
		if (!names[held] || !values[held]) {
			rc = -1;
			held++;
			break;
		}
		held++;
	}
	for (int i = 0; rc == 0 && i < held; i++) {
		size_t size = strlen(HELD_PREFIX) + strlen(names[i]) + 1;
		char *name = malloc(size);
		if (!name) {
			rc = -1;
			break;
		}
		snprintf(name, size, "%s%s", HELD_PREFIX, names[i]);
		if ((names[i][0] && spank_setenv(sp, name, values[i], 1) != ESPANK_SUCCESS) ||
		    spank_unsetenv(sp, names[i]) != ESPANK_SUCCESS) {
			slurm_error("slurm-k8s-bridge: cannot move %s out of the waiter's environment", names[i]);
			rc = -1;
		}
		free(name);
	}
	if (rc == 0 && spank_setenv(sp, HELD_MARKER, "1", 1) != ESPANK_SUCCESS)
		rc = -1;
	for (int i = 0; i < held; i++) {
		free(names[i]);
		free(values[i]);
	}
	free(names);
	free(values);
	return rc;
}

/* The signals Slurm sends a batch script or a task, held (blocked) for the waiter's start: its first
 * act is to take the pending ones and set its handlers (agent/internal/earlysignals, whose
 * constructor runs before the Go runtime). A mask survives exec. Not TERM or INT: the site's
 * TaskProlog, which runs after slurm_spank_task_init, inherits the mask. */
static void hold_early_signals(void)
{
	static const int held_signals[] = {SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};
	sigset_t held;

	sigemptyset(&held);
	for (size_t i = 0; i < sizeof(held_signals) / sizeof(held_signals[0]); i++)
		sigaddset(&held, held_signals[i]);
	if (sigprocmask(SIG_BLOCK, &held, NULL) != 0)
		slurm_error("slurm-k8s-bridge: cannot hold signals for the waiter's start: %m");
}

/* Runs in the task's process as soon as slurmstepd has forked it, before the task waits for
 * slurmstepd's go-ahead. slurmstepd marks the step running (and takes `scancel -s USR1 --batch`,
 * `--signal=B:...`) once it has released its tasks; a task released but not yet at
 * slurm_spank_task_init died of such a signal by its default action (CI: an array task FAILED
 * 0:10 with the signal sent the moment it ran). Held here, the window left is a task that has not
 * reached this hook (namespace join, plugins listed before this one) by the time slurmstepd has
 * set up every task, released them and marked the step running. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (spank_remote(sp) == 1 && batch_of_bridged_job)
		hold_early_signals();
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (spank_remote(sp) != 1 || !batch_of_bridged_job)
		return 0;
	hold_early_signals(); /* again: a slurmstepd that skipped the privileged hook */
	/* Before the task prologs, which slurmstepd runs after this hook: they never run either. */
	if (user_step_of_bridged_job)
		return exec_user_step_proxy(sp);
	return 0;
}

/* Where a bridged job's waiter task (the batch step's, a task proxy, a user-step proxy) passes what
 * its pod's processes used to jobacct_gather/linux_k8s_bridge
 * (deploy/slurm/jobacct): /run/slurm-k8s-bridge/usage/<slurmstepd pid>/<task pid>, made here by
 * root at the task's fork and given to the job's user, in directories only root writes. So a
 * user's waiter writes its own task's figures and no other's; a directory lives as long as its
 * slurmstepd (emptied at its start, should a dead one have left it, and removed at its end), so
 * no file outlives its task for another to read. */
#define USAGE_PARENTS "/run"

/* Directory `name` under `parent` (a handle), root's, never through a link: its handle or -1.
 * `make`: created if missing, and 0755 whatever umask the job gave slurmstepd (SLURM_UMASK). */
static int root_dir_at(int parent, const char *name, int make)
{
	struct stat st;
	int fd;

	if (parent < 0)
		return -1;
	if (make)
		(void) mkdirat(parent, name, 0755);
	fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0 || st.st_uid != 0 || (make && fchmod(fd, 0755) != 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The usage directory: its handle, or -1. */
static int usage_dir(int make)
{
	int run = open(USAGE_PARENTS, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int top = root_dir_at(run, "slurm-k8s-bridge", make);
	int usage = root_dir_at(top, "usage", make);

	if (run >= 0)
		close(run);
	if (top >= 0)
		close(top);
	return usage;
}

/* Removes slurmstepd `stepd`'s usage directory and what is in it. */
static void remove_step_usage(pid_t stepd)
{
	char name[32];
	struct dirent *entry;
	int usage = usage_dir(0), step;
	DIR *listing;

	if (usage < 0)
		return;
	snprintf(name, sizeof(name), "%d", (int) stepd);
	step = root_dir_at(usage, name, 0);
	if (step >= 0 && (listing = fdopendir(step))) {
		while ((entry = readdir(listing)))
			if (entry->d_name[0] != '.')
				(void) unlinkat(dirfd(listing), entry->d_name, 0);
		closedir(listing);
	} else if (step >= 0) {
		close(step);
	}
	(void) unlinkat(usage, name, AT_REMOVEDIR);
	close(usage);
}

/* The parent of `pid` (a task's: its slurmstepd, whether this hook runs in slurmstepd or in the
 * child it clones for contain_spank), or -1. */
static pid_t parent_of(pid_t pid)
{
	char path[64], stat_line[512], *end;
	int ppid = -1;
	FILE *file;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
	if (!(file = fopen(path, "re")))
		return -1;
	if (fgets(stat_line, sizeof(stat_line), file) && (end = strrchr(stat_line, ')')))
		if (sscanf(end + 1, " %*c %d", &ppid) != 1)
			ppid = -1;
	fclose(file);
	return ppid;
}

static void make_usage_file(spank_t sp)
{
	pid_t pid = 0, stepd;
	uid_t uid;
	gid_t gid;
	char name[32];
	int usage, step, fd;

	if (spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0 ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS || (stepd = parent_of(pid)) <= 0)
		return;
	usage = usage_dir(1);
	snprintf(name, sizeof(name), "%d", (int) stepd);
	step = root_dir_at(usage, name, 1);
	if (usage >= 0)
		close(usage);
	if (step < 0) {
		slurm_info("slurm-k8s-bridge: no usage directory for task %d: sacct will show the "
			   "waiter's own usage for it", (int) pid);
		return;
	}
	snprintf(name, sizeof(name), "%d", (int) pid);
	(void) unlinkat(step, name, 0);
	fd = openat(step, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || fchown(fd, uid, gid) != 0 || fchmod(fd, 0600) != 0)
		slurm_info("slurm-k8s-bridge: no usage file for task %d (%m): sacct will show the "
			   "waiter's own usage for it", (int) pid);
	if (fd >= 0)
		close(fd);
	close(step);
}

/* In slurmstepd, after the step's tasks are forked (all of them, before the first call): a usage
 * file for each waiter task; for a user's step, slurmstepd execs nothing more
 * (forbid_further_execs). */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (spank_remote(sp) != 1 || !batch_of_bridged_job)
		return 0;
	make_usage_file(sp); /* the waiter's: batch step, task proxy or user-step proxy */
	if (!user_step_of_bridged_job)
		return 0;
	return forbid_further_execs();
}

/* The step is over and its accounting sent: its usage files go. */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (spank_remote(sp) == 1)
		remove_step_usage(getpid());
	if (spank_remote(sp) == 1 && user_copy[0])
		unlink(user_copy); /* slurmstepd removes the job's directory next, and only if empty */
	return 0;
}
