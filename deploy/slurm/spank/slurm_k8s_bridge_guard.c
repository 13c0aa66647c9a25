/*
 * slurm-k8s-bridge step guard: a SPANK plugin that keeps user code off the slurmd hosts of
 * bridged partitions.
 *
 * A bridged job's only business on its slurmd is the batch step, which job_submit.lua turned
 * into the bridge's waiter. This plugin:
 *
 *   - refuses every other step of a job in a bridged partition (srun --jobid, srun inside the
 *     allocation, an interactive step) in slurmstepd, before anything is exec'd. The check
 *     runs in slurmstepd (remote context), so a user's own srun build cannot skip it; srun
 *     (local context) checks the same thing first only to print the reason early and clearly.
 *     Programs named by an `allow=` argument (absolute paths, written by the site in
 *     plugstack.conf) may run as steps: the bridge's own step launcher, if any.
 *   - strips the variables that would make the dynamic loader or Python run user code in the
 *     waiter (LD_*, PYTHON*, GLIBC_TUNABLES, ...) from the batch step of a bridged job. They are
 *     kept under SLURM_K8S_BRIDGE_HELD_<name>, so the waiter still hands the user's values to
 *     the pods, where they belong.
 *
 * Which partitions are bridged comes from the same settings file job_submit.lua reads
 * (`settings=` argument, lines `partition=<name> ...`). If that file cannot be read, every
 * step other than batch and extern steps is refused: the guard fails closed.
 *
 * plugstack.conf:
 *   required /path/slurm_k8s_bridge_guard.so settings=/etc/slurm/job_submit_bridge.conf
 */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(slurm_k8s_bridge_guard, 1);

#define MAX_PARTITIONS 64
#define MAX_ALLOWED 8
#define NAME_LEN 256
#define HELD_PREFIX "SLURM_K8S_BRIDGE_HELD_"
/* The second line of every batch script job_submit.lua wrote (see its WRAPPER_HEADER). */
#define WRAPPER_HEADER "# slurm-k8s-bridge: rewritten batch script"

static char settings_path[1024] = "/etc/slurm/job_submit_bridge.conf";
static char allowed[MAX_ALLOWED][NAME_LEN];
static int allowed_count;

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

/* Is `partition` (possibly a comma list) bridged? -1: the settings cannot be read. */
static int partition_is_bridged(const char *partition)
{
	char names[MAX_PARTITIONS][NAME_LEN];
	int count = 0;
	char line[4096];
	FILE *file = fopen(settings_path, "r");

	if (!file)
		return -1;
	while (fgets(line, sizeof(line), file) && count < MAX_PARTITIONS) {
		if (strncmp(line, "partition=", 10) != 0)
			continue;
		if (sscanf(line + 10, "%255[^ \t\r\n]", names[count]) == 1)
			count++;
	}
	fclose(file);
	if (!partition)
		return 0;

	char copy[4096];
	snprintf(copy, sizeof(copy), "%s", partition);
	char *save = NULL;
	for (char *part = strtok_r(copy, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
		for (int i = 0; i < count; i++)
			if (strcmp(part, names[i]) == 0)
				return 1;
	}
	return 0;
}

/* The job's partition from slurmctld (never from the job's environment, which the user sets).
 * Returns 1 bridged, 0 not, -1 unknown (slurmctld or the settings unreachable). */
static int job_is_bridged(uint32_t job_id, char *partition, size_t partition_len)
{
	job_info_msg_t *info = NULL;
	int bridged;

	slurm_step_id_t which = SLURM_STEP_ID_INITIALIZER;

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
	bridged = partition_is_bridged(info->job_array[0].partition);
	slurm_free_job_info_msg(info);
	return bridged;
}

static int program_is_allowed(spank_t sp)
{
	int argc = 0;
	char **argv = NULL;

	if (allowed_count == 0)
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv[0])
		return 0;
	for (int i = 0; i < allowed_count; i++)
		if (strcmp(argv[0], allowed[i]) == 0)
			return 1;
	return 0;
}

/* Refuse a step of a bridged job (both contexts); 0 lets it through. */
static int guard_step(spank_t sp, const char *where)
{
	uint32_t job_id = 0, step_id = 0;
	char partition[NAME_LEN];

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		return 0; /* srun before an allocation exists: checked again once it does */
	if (spank_get_item(sp, S_JOB_STEPID, &step_id) == ESPANK_SUCCESS &&
	    (step_id == SLURM_BATCH_SCRIPT || step_id == SLURM_EXTERN_CONT))
		return 0;
	int bridged = job_is_bridged(job_id, partition, sizeof(partition));
	if (bridged == 0)
		return 0;
	if (bridged == 1 && program_is_allowed(sp))
		return 0;
	if (bridged < 0) {
		slurm_error("slurm-k8s-bridge: refusing a step of job %u: cannot tell whether it runs in "
			    "Kubernetes (slurmctld or %s unreachable) [%s]", job_id, settings_path, where);
		return -1;
	}
	slurm_error("slurm-k8s-bridge: job %u runs in Kubernetes (partition %s): job steps cannot "
		    "start on its nodes' slurmd (srun --jobid, sattach, an interactive step); run the "
		    "command from the job's batch script [%s]", job_id, partition, where);
	return -1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	parse_args(ac, av);
	if (spank_context() == S_CTX_REMOTE)
		return guard_step(sp, "slurmstepd");
	return 0;
}

int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return guard_step(sp, "srun");
}

static int is_wrapped_batch_script(spank_t sp)
{
	int argc = 0;
	char **argv = NULL;
	char head[512];
	size_t got;
	FILE *file;

	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv[0])
		return 0;
	file = fopen(argv[0], "r");
	if (!file)
		return 0;
	got = fread(head, 1, sizeof(head) - 1, file);
	fclose(file);
	head[got] = '\0';
	char *second = strchr(head, '\n');
	return second && strncmp(second + 1, WRAPPER_HEADER, strlen(WRAPPER_HEADER)) == 0;
}

static int held_variable(const char *name)
{
	static const char *const exact[] = {
		"GLIBC_TUNABLES", "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF",
		"MALLOC_TRACE", "TMPDIR", "BASH_ENV", "ENV", NULL,
	};
	if (strncmp(name, "LD_", 3) == 0 || strncmp(name, "PYTHON", 6) == 0)
		return 1;
	for (int i = 0; exact[i]; i++)
		if (strcmp(name, exact[i]) == 0)
			return 1;
	return 0;
}

/* Batch step of a bridged job: move what could run user code in the waiter out of the way. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	uint32_t step_id = 0;
	char **env = NULL;
	char names[128][NAME_LEN];
	int count = 0;

	(void) ac;
	(void) av;
	if (spank_remote(sp) != 1)
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS || step_id != SLURM_BATCH_SCRIPT)
		return 0;
	if (!is_wrapped_batch_script(sp))
		return 0;
	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || !env)
		return 0;
	/* Collect first: unsetting while walking the array would skip entries. */
	for (int i = 0; env[i]; i++) {
		const char *eq = strchr(env[i], '=');
		size_t len = eq ? (size_t) (eq - env[i]) : strlen(env[i]);
		char name[NAME_LEN];
		if (len == 0 || len >= NAME_LEN) {
			slurm_error("slurm-k8s-bridge: an environment variable name of %zu bytes", len);
			return -1;
		}
		memcpy(name, env[i], len);
		name[len] = '\0';
		if (!held_variable(name))
			continue;
		if (count == 128) { /* never let one through unstripped */
			slurm_error("slurm-k8s-bridge: more than 128 LD_*/PYTHON* variables in the job's environment");
			return -1;
		}
		memcpy(names[count++], name, len + 1);
	}
	for (int i = 0; i < count; i++) {
		char value[8192];
		char held[NAME_LEN + sizeof(HELD_PREFIX)];
		if (spank_getenv(sp, names[i], value, sizeof(value)) == ESPANK_SUCCESS) {
			snprintf(held, sizeof(held), "%s%.255s", HELD_PREFIX, names[i]);
			spank_setenv(sp, held, value, 1);
		}
		if (spank_unsetenv(sp, names[i]) != ESPANK_SUCCESS) {
			slurm_error("slurm-k8s-bridge: cannot remove %s from the waiter's environment", names[i]);
			return -1;
		}
	}
	return 0;
}
