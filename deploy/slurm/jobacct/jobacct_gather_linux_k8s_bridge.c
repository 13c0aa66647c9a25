/*
 * jobacct_gather/linux_k8s_bridge: Slurm's jobacct_gather/linux, plus what a bridged job's pods
 * used. ("linux" in its name: Slurm honours JobAcctGatherParams UsePss and NoShared only for a
 * type that says so, and this one is jobacct_gather/linux for every native job.)
 *
 * A bridged job's task on its slurmd is the bridge's waiter; the job's processes run in a pod on
 * another host. jobacct_gather/linux alone would account the waiter (a few MB, a few ms of CPU).
 * This plugin runs jobacct_gather/linux for every task, so native jobs are accounted exactly as
 * before, and then, for a task that has a usage file, puts the pod's figures in its place:
 *
 *   /run/slurm-k8s-bridge/usage/<slurmstepd pid>/<task pid>
 *     one line, written by the waiter (agent/internal/waiter/usage.go): a batch step's latest sample, or
 *     the rusage of a step's task (agent/task_wait.go)
 *     "k8s-bridge-usage-v1 USER_US SYS_US RSS MAX_RSS VSIZE MAX_VSIZE READ WRITE MAJFLT
 *      WAITER_USER_US WAITER_SYS_US SUM"
 *     (bytes, microseconds, a count; "-" for a figure the pod could not give; the waiter's own
 *     CPU so far; SUM: the sum of the figures modulo 2^64, so that a half-written line is never
 *     read; padded with spaces to a fixed length, so that one write replaces the last)
 *
 * The in-pod agent measures them as jobacct_gather/linux does on a host: the process tree's
 * utime/stime and RSS from /proc while it runs, and the script's wait4 rusage when it ends.
 *
 * Who may write what: the step guard (deploy/slurm/spank) makes the batch waiter's file as root at
 * the fork, owned by the job's user, in directories only root writes, one per slurmstepd (so a
 * file never outlives its slurmstepd, and a pid reused elsewhere never finds it); the waiter
 * writes into it, never creates. A figure that is missing stays jobacct_gather/linux's.
 *
 * Slurm's jobacctinfo is not public: the part this plugin reads and writes is declared below from
 * Slurm 26.05's src/interfaces/jobacct_gather.h, so it builds only against 26.05 headers (and
 * Slurm loads a plugin only of its own exact release: rebuild it with every upgrade). A layout
 * check at run time (the TRES ids of cpu and mem at their places) leaves the figures to
 * jobacct_gather/linux, with one error in the log, should a 26.05 release disagree.
 *
 * slurm.conf: JobAcctGatherType=jobacct_gather/linux_k8s_bridge, PluginDir listing the directory
 * that holds this plugin after Slurm's own. Slurm's jobacct_gather_linux.so is looked for at
 * -DLINUX_PLUGIN="/path/jobacct_gather_linux.so", then at the usual packages' places.
 */

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h> /* slurm_error */

#if SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER) != 26 || SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER) != 5
#error "struct jobacctinfo is declared here as Slurm 26.05 has it: check it against this release's src/interfaces/jobacct_gather.h"
#endif

#ifndef LINUX_PLUGIN
#define LINUX_PLUGIN "/usr/lib/x86_64-linux-gnu/slurm-wlm/jobacct_gather_linux.so"
#endif
static const char *const linux_plugin_places[] = {
	LINUX_PLUGIN,
	"/usr/lib/x86_64-linux-gnu/slurm-wlm/jobacct_gather_linux.so", /* Debian, Ubuntu */
	"/usr/lib64/slurm/jobacct_gather_linux.so",                     /* RPMs */
	"/usr/lib/slurm/jobacct_gather_linux.so",
	"/usr/local/lib/slurm/jobacct_gather_linux.so",                 /* make install */
};
#ifndef USAGE_DIR /* a test harness names its own */
#define USAGE_DIR "/run/slurm-k8s-bridge/usage"
#endif
#define SLURM_NO_VAL64 0xfffffffffffffffeULL /* and above: Slurm's "no value" markers */
#define USAGE_MAGIC "k8s-bridge-usage-v1"
#define CPU_TIME_ADJ 1000 /* Slurm keeps the cpu TRES in milliseconds */

const char plugin_name[] = "Job accounting gather: Linux, with bridged jobs' pod usage";
const char plugin_type[] = "jobacct_gather/linux_k8s_bridge";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* Slurm's TRES positions (src/slurmctld/slurmctld.h, TRES_ARRAY_*). */
enum { TRES_CPU = 0, TRES_MEM = 1, TRES_FS_DISK = 5, TRES_VMEM = 6, TRES_PAGES = 7, TRES_KNOWN = 8 };

/* The leading fields of Slurm 26.05's struct jobacctinfo, in its order. */
struct jobacctinfo_head {
	pid_t pid;
	uint64_t sys_cpu_sec;
	uint32_t sys_cpu_usec;
	uint64_t user_cpu_sec;
	uint32_t user_cpu_usec;
	uint32_t act_cpufreq;
	acct_gather_energy_t energy;
	double last_total_cputime;
	double this_sampled_cputime;
	uint32_t current_weighted_freq;
	uint32_t current_weighted_power;
	uint32_t tres_count;
	uint32_t *tres_ids;
	list_t *tres_list;
	uint64_t *tres_usage_in_max;
	uint64_t *tres_usage_in_max_nodeid;
	uint64_t *tres_usage_in_max_taskid;
	uint64_t *tres_usage_in_min;
	uint64_t *tres_usage_in_min_nodeid;
	uint64_t *tres_usage_in_min_taskid;
	uint64_t *tres_usage_in_tot;
	uint64_t *tres_usage_out_max;
	uint64_t *tres_usage_out_max_nodeid;
	uint64_t *tres_usage_out_max_taskid;
	uint64_t *tres_usage_out_min;
	uint64_t *tres_usage_out_min_nodeid;
	uint64_t *tres_usage_out_min_taskid;
	uint64_t *tres_usage_out_tot;
};

enum { F_USER_US, F_SYS_US, F_RSS, F_MAX_RSS, F_VSIZE, F_MAX_VSIZE, F_READ, F_WRITE, F_MAJFLT,
       F_WAITER_USER_US, F_WAITER_SYS_US, F_COUNT };

struct pod_usage {
	uint64_t value[F_COUNT];
	bool known[F_COUNT];
};

static void *linux_plugin;
static void (*linux_poll_data)(list_t *, uint64_t, bool);
static int (*linux_endpoll)(void);
static int (*linux_add_task)(pid_t, void *);
static void (*linux_stat_job)(void *);
static void (*linux_fini)(void);
static bool layout_refused;
/* The CPU time jobacct_gather/linux last measured of each bridged task, by pid (see below). */
struct measured_cpu {
	pid_t pid;
	uint64_t cpu_ms;
};
static struct measured_cpu *measured;
static size_t measured_count, measured_room;

extern int init(void)
{
	int (*linux_init)(void);

	/* Lazily, as Slurm loads its plugins: some symbols exist only in the daemon that calls them. */
	for (size_t i = 0; !linux_plugin && i < sizeof(linux_plugin_places) / sizeof(*linux_plugin_places); i++)
		linux_plugin = dlopen(linux_plugin_places[i], RTLD_LAZY | RTLD_LOCAL);
	if (!linux_plugin) {
		slurm_error("%s: cannot load Slurm's jobacct_gather_linux.so (%s, or where packages put "
			    "it): %s", plugin_type, LINUX_PLUGIN, dlerror());
		return SLURM_ERROR;
	}
	linux_poll_data = dlsym(linux_plugin, "jobacct_gather_p_poll_data");
	linux_endpoll = dlsym(linux_plugin, "jobacct_gather_p_endpoll");
	linux_add_task = dlsym(linux_plugin, "jobacct_gather_p_add_task");
	linux_stat_job = dlsym(linux_plugin, "jobacct_gather_p_stat_job");
	linux_fini = dlsym(linux_plugin, "fini");
	linux_init = dlsym(linux_plugin, "init");
	if (!linux_poll_data || !linux_endpoll || !linux_add_task || !linux_stat_job) {
		slurm_error("%s: %s lacks the jobacct_gather interface", plugin_type, LINUX_PLUGIN);
		return SLURM_ERROR;
	}
	return linux_init ? linux_init() : SLURM_SUCCESS;
}

extern void fini(void)
{
	if (linux_fini)
		linux_fini();
	free(measured);
	measured = NULL;
	measured_count = measured_room = 0;
}

/* Directory `name` under `parent`, if it is root's and only root writes it (the step guard makes
 * them): its handle, or -1. */
static int root_only_dir(int parent, const char *name)
{
	struct stat st;
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_uid != 0 || (st.st_mode & 022))) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* The usage file of this slurmstepd's task `pid`, if there is one and it holds a whole line: true. */
static bool read_pod_usage(pid_t pid, struct pod_usage *usage)
{
	char name[32], line[512], *field, *save = NULL;
	struct stat st;
	uint64_t sum = 0, claimed;
	ssize_t got;
	int usage_dir, dir, fd, i;

	usage_dir = root_only_dir(AT_FDCWD, USAGE_DIR);
	if (usage_dir < 0)
		return false;
	snprintf(name, sizeof(name), "%d", (int) getpid()); /* this slurmstepd's */
	dir = root_only_dir(usage_dir, name);
	close(usage_dir);
	if (dir < 0)
		return false;
	snprintf(name, sizeof(name), "%d", (int) pid);
	fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	close(dir);
	if (fd < 0)
		return false;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return false;
	}
	got = pread(fd, line, sizeof(line) - 1, 0);
	close(fd);
	if (got <= 0 || line[got - 1] != '\n')
		return false;
	line[got - 1] = '\0';
	field = strtok_r(line, " ", &save);
	if (!field || strcmp(field, USAGE_MAGIC))
		return false;
	for (i = 0; i < F_COUNT; i++) {
		char *end;
		if (!(field = strtok_r(NULL, " ", &save)))
			return false;
		usage->known[i] = strcmp(field, "-") != 0;
		usage->value[i] = 0;
		if (usage->known[i]) {
			if (!isdigit((unsigned char) field[0]))
				return false; /* strtoull would take a sign */
			errno = 0;
			usage->value[i] = strtoull(field, &end, 10);
			if (errno || *end || end == field || usage->value[i] >= SLURM_NO_VAL64)
				return false;
			sum += usage->value[i];
		}
	}
	if (!(field = strtok_r(NULL, " ", &save)))
		return false;
	claimed = strtoull(field, NULL, 10);
	return claimed == sum && !strtok_r(NULL, " ", &save);
}

static bool layout_agrees(struct jobacctinfo_head *jobacct)
{
	if (jobacct->tres_count >= TRES_KNOWN && jobacct->tres_count < 4096 && jobacct->tres_ids &&
	    jobacct->tres_usage_in_max && jobacct->tres_usage_in_tot && jobacct->tres_usage_out_tot &&
	    /* ids from the TRES table (cpu 1, mem 2) or, without one, the positions */
	    ((jobacct->tres_ids[TRES_CPU] == 1 && jobacct->tres_ids[TRES_MEM] == 2) ||
	     (jobacct->tres_ids[TRES_CPU] == 0 && jobacct->tres_ids[TRES_MEM] == 1)))
		return true;
	slurm_error("%s: Slurm's jobacctinfo is not laid out as this plugin was built for: pods' usage "
		    "is not accounted (jobacct_gather/linux's only)", plugin_type);
	layout_refused = true;
	return false;
}

/* In: the figure, its maximum, its minimum (as jobacct_gather/linux keeps a task's: the max). */
static void set_in(struct jobacctinfo_head *jobacct, int tres, uint64_t now, uint64_t max)
{
	jobacct->tres_usage_in_tot[tres] = now;
	jobacct->tres_usage_in_max[tres] = max;
	jobacct->tres_usage_in_min[tres] = max;
}

static void set_out(struct jobacctinfo_head *jobacct, int tres, uint64_t now)
{
	jobacct->tres_usage_out_tot[tres] = now;
	jobacct->tres_usage_out_max[tres] = now;
	jobacct->tres_usage_out_min[tres] = now;
}

/*
 * The pod's CPU time as seconds and microseconds. When the task ends, slurmstepd sets the
 * waiter's wait4 rusage over them: the larger of the two seconds, and always the waiter's
 * microseconds. So the seconds are the pod's less the waiter's microseconds, rounded: the sum
 * slurmstepd leaves is the pod's within half a second (the waiter's own last milliseconds aside).
 */
static void split_cpu(uint64_t pod_us, bool waiter_known, uint64_t waiter_us, uint64_t *sec,
		      uint32_t *usec)
{
	if (!waiter_known) {
		*sec = pod_us / 1000000;
		*usec = pod_us % 1000000;
		return;
	}
	*usec = waiter_us % 1000000;
	*sec = pod_us > *usec ? (pod_us - *usec + 500000) / 1000000 : 0;
}

static void put_pod_usage(struct jobacctinfo_head *jobacct, const struct pod_usage *usage)
{
	const uint64_t *v = usage->value;
	const bool *k = usage->known;

	if (k[F_USER_US] && k[F_SYS_US]) {
		uint64_t cpu_ms = (v[F_USER_US] + v[F_SYS_US]) / (1000000 / CPU_TIME_ADJ);
		split_cpu(v[F_USER_US], k[F_WAITER_USER_US], v[F_WAITER_USER_US], &jobacct->user_cpu_sec,
			  &jobacct->user_cpu_usec);
		split_cpu(v[F_SYS_US], k[F_WAITER_SYS_US], v[F_WAITER_SYS_US], &jobacct->sys_cpu_sec,
			  &jobacct->sys_cpu_usec);
		set_in(jobacct, TRES_CPU, cpu_ms, cpu_ms);
	}
	if (k[F_RSS] && k[F_MAX_RSS])
		set_in(jobacct, TRES_MEM, v[F_RSS], v[F_MAX_RSS]);
	if (k[F_VSIZE] && k[F_MAX_VSIZE])
		set_in(jobacct, TRES_VMEM, v[F_VSIZE], v[F_MAX_VSIZE]);
	if (k[F_MAJFLT])
		set_in(jobacct, TRES_PAGES, v[F_MAJFLT], v[F_MAJFLT]);
	if (k[F_READ])
		set_in(jobacct, TRES_FS_DISK, v[F_READ], v[F_READ]);
	if (k[F_WRITE])
		set_out(jobacct, TRES_FS_DISK, v[F_WRITE]);
}

/*
 * jobacct_gather/linux weighs the CPU frequency by the CPU time its task used since the last poll:
 * what it reads of the process now, less the task's CPU figure it left last time. For a bridged
 * task that figure is the pod's, which this plugin put there, so the difference went negative and
 * sacct showed AveCPUFreq in the hundreds of GHz. So each bridged task's figure is, during
 * jobacct_gather/linux's poll, the one that plugin measured itself last time (kept by pid in
 * `measured` as the pod's figures go in, for this slurmstepd's few tasks), and the pod's after it.
 */

static struct measured_cpu *measured_of(pid_t pid, bool add)
{
	for (size_t i = 0; i < measured_count; i++)
		if (measured[i].pid == pid)
			return &measured[i];
	if (!add)
		return NULL;
	if (measured_count == measured_room) {
		size_t room = measured_room ? 2 * measured_room : 16;
		struct measured_cpu *grown = realloc(measured, room * sizeof(*measured));
		if (!grown)
			return NULL;
		measured = grown;
		measured_room = room;
	}
	measured[measured_count] = (struct measured_cpu) { .pid = pid, .cpu_ms = 0 };
	return &measured[measured_count++];
}

/* Each bridged task's CPU figure, for jobacct_gather/linux's poll, is the one it measured last. */
static void put_measured_cpu(list_t *task_list)
{
	struct jobacctinfo_head *jobacct;
	struct pod_usage usage;
	struct measured_cpu *kept;
	list_itr_t *it = slurm_list_iterator_create(task_list);

	while ((jobacct = slurm_list_next(it))) {
		if (jobacct->pid <= 0 || !read_pod_usage(jobacct->pid, &usage))
			continue;
		if (!layout_agrees(jobacct))
			break;
		kept = measured_of(jobacct->pid, false);
		jobacct->tres_usage_in_tot[TRES_CPU] = kept ? kept->cpu_ms : 0;
	}
	slurm_list_iterator_destroy(it);
}

extern void jobacct_gather_p_poll_data(list_t *task_list, uint64_t cont_id, bool profile)
{
	struct jobacctinfo_head *jobacct;
	struct pod_usage usage;
	struct measured_cpu *kept;
	list_itr_t *it;

	if (task_list && !layout_refused)
		put_measured_cpu(task_list);
	linux_poll_data(task_list, cont_id, profile);
	if (!task_list || layout_refused)
		return;
	it = slurm_list_iterator_create(task_list);
	while ((jobacct = slurm_list_next(it))) {
		if (jobacct->pid <= 0 || !read_pod_usage(jobacct->pid, &usage))
			continue;
		if (!layout_agrees(jobacct))
			break;
		/* What linux measured, kept for its next poll, before the pod's figures replace it. */
		if ((kept = measured_of(jobacct->pid, true)))
			kept->cpu_ms = jobacct->tres_usage_in_tot[TRES_CPU];
		put_pod_usage(jobacct, &usage);
	}
	slurm_list_iterator_destroy(it);
}

extern int jobacct_gather_p_endpoll(void)
{
	return linux_endpoll();
}

extern int jobacct_gather_p_add_task(pid_t pid, void *jobacct_id)
{
	return linux_add_task(pid, jobacct_id);
}

extern void jobacct_gather_p_stat_job(void *jobacct)
{
	linux_stat_job(jobacct);
}
