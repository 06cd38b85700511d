/* checkpoint_lock.c: one run owns a checkpoint directory at a time.
 *
 * Two runs writing one checkpoint_dir interleave their step directories
 * and `latest`, and a restart then resumes from a mix.  The owner holds
 * checkpoint_dir/.lock, a small text file (token, host, pid, job, start
 * time) created with O_CREAT|O_EXCL, which is atomic on local file
 * systems, NFSv4, Lustre and GPFS (flock is not reliable on all of them).
 * Its mtime is the heartbeat: the owner touches it as it trains.  Another
 * run refuses the directory, naming the owner, unless the lock is stale:
 *  - its pid is gone on this very host;
 *  - it is this job's own, from a run of the same job and step that has
 *    ended (a Slurm requeue keeps the job id);
 *  - its heartbeat is older than stale_s (another host: compared with this
 *    host's clock, which cluster nodes keep in step with NTP).
 * A stale lock is taken over with a warning: the new lock is renamed over
 * the old one (atomic), then read back, so of two runs taking it over at
 * once only the one whose token stays proceeds.  Rank 0 does the file
 * work; every rank gets the outcome. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "mt_checkpoint.h"
#include "mt_comm.h"
#include "mt_clock.h"

#define LOCK_NAME ".lock"

typedef struct {
    char token[40], host[256], job[128];
    long long pid, started;
} owner_t;

static void this_job(char *out, size_t cap)
{
    static const char *const vars[][2] = {
        {"SLURM_JOB_ID", "SLURM_STEP_ID"}, {"PBS_JOBID", NULL}, {"LSB_JOBID", NULL},
        {"FLUX_JOB_ID", NULL}, {"JOB_ID", NULL}};
    out[0] = '\0';
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *j = getenv(vars[i][0]);
        if (j && *j) {
            const char *st = vars[i][1] ? getenv(vars[i][1]) : NULL;
            snprintf(out, cap, "%s%s%s", j, st && *st ? "." : "", st && *st ? st : "");
            return;
        }
    }
}

static void copy_field(char *dst, size_t cap, const char *v)
{
    size_t n = 0;
    for (; v[n] && v[n] != '\n' && n + 1 < cap; n++)
        dst[n] = (char)((unsigned char)v[n] < 0x20 ? '?' : v[n]);
    dst[n] = '\0';
}

/* The owner a lock file names; 0 when it cannot be read (it is being
 * replaced, or it is not a lock of ours): the caller judges by mtime. */
static int read_owner(const char *path, owner_t *o)
{
    memset(o, 0, sizeof *o);
    strcpy(o->host, "?");
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int fields = 0;
    while (fgets(line, sizeof line, f)) {
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        const char *v = eq + 1;
        if (strcmp(line, "token") == 0)
            copy_field(o->token, sizeof o->token, v), fields++;
        else if (strcmp(line, "host") == 0)
            copy_field(o->host, sizeof o->host, v), fields++;
        else if (strcmp(line, "job") == 0)
            copy_field(o->job, sizeof o->job, v);
        else if (strcmp(line, "pid") == 0)
            o->pid = strtoll(v, NULL, 10), fields++;
        else if (strcmp(line, "started") == 0)
            o->started = strtoll(v, NULL, 10);
    }
    fclose(f);
    return fields == 3 && o->token[0];
}

static mt_status_t write_owner(int fd, const char *path, const owner_t *o)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "# meshtrain: the run that writes this checkpoint directory\n"
                     "token=%s\nhost=%s\npid=%lld\njob=%s\nstarted=%lld\n",
                     o->token, o->host, o->pid, o->job, o->started);
    if (n < 0 || (size_t)n >= sizeof buf || write(fd, buf, (size_t)n) != (ssize_t)n ||
        fsync(fd) != 0) {
        int e = errno;
        close(fd);
        MT_FAIL(MT_ERR_IO, "%s: cannot write the lock: %s", path, strerror(e));
    }
    if (close(fd) != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot write the lock: %s", path, strerror(errno));
    return MT_OK;
}

/* Why the lock o (mtime age seconds ago) no longer protects a run, or
 * NULL when it does. */
static const char *stale_reason(const owner_t *o, int readable, double age, double stale_s,
                                const owner_t *me)
{
    if (readable && strcmp(o->host, me->host) == 0 && o->pid > 0 &&
        kill((pid_t)o->pid, 0) != 0 && errno == ESRCH)
        return "its process is gone";
    if (readable && o->job[0] && strcmp(o->job, me->job) == 0 &&
        (strcmp(o->host, me->host) != 0 || o->pid != me->pid))
        return "it is an earlier run of this job (requeued)";
    if (age > stale_s)
        return "its heartbeat stopped";
    return NULL;
}

static mt_status_t acquire_local(const char *dir, double stale_s, FILE *warn, mt_ckpt_lock_t *l)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        MT_FAIL(MT_ERR_IO, "%s: cannot create the checkpoint directory: %s", dir,
                strerror(errno));
    MT_TRY(mt_ckpt_join(l->path, dir, LOCK_NAME));
    owner_t me = {0};
    if (gethostname(me.host, sizeof me.host - 1) != 0)
        strcpy(me.host, "?");
    me.pid = (long long)getpid();
    me.started = (long long)time(NULL);
    this_job(me.job, sizeof me.job);
    /* the token tells this run's lock from any other's, pid reuse included */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(me.token, sizeof me.token, "%llx.%09ld.%llx", (long long)ts.tv_sec, ts.tv_nsec,
             me.pid);
    strcpy(l->token, me.token);

    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = open(l->path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            MT_TRY(write_owner(fd, l->path, &me));
            l->held = true;
            return MT_OK;
        }
        if (errno != EEXIST)
            MT_FAIL(MT_ERR_IO, "%s: cannot create the lock: %s", l->path, strerror(errno));
        owner_t o;
        struct stat st;
        int readable = read_owner(l->path, &o);
        if (stat(l->path, &st) != 0)
            continue; /* released meanwhile: try again */
        double age = difftime(time(NULL), st.st_mtime);
        const char *why = stale_reason(&o, readable, age, stale_s, &me);
        if (!why) {
            mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "checkpoint_dir %s is in use by another run: pid %lld on host %s%s%s, "
                         "started %.0f s ago, heartbeat %.0f s ago (%s)",
                         dir, o.pid, o.host, o.job[0] ? ", job " : "", o.job,
                         o.started > 0 ? difftime(time(NULL), (time_t)o.started) : -1.0, age,
                         l->path);
            mt_error_hint("two runs must not write one checkpoint directory: give this run "
                          "another checkpoint.checkpoint_dir; a dead run's lock is taken over "
                          "once its heartbeat is older than checkpoint.lock_stale_s");
            return MT_ERR_IO;
        }
        /* take it over: our lock renamed over the stale one, then read back */
        char tmp[MT_PATH_MAX + 32];
        snprintf(tmp, sizeof tmp, "%s.%lld.tmp", l->path, me.pid);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            MT_FAIL(MT_ERR_IO, "%s: cannot write the lock: %s", tmp, strerror(errno));
        MT_TRY(write_owner(fd, tmp, &me));
        if (rename(tmp, l->path) != 0) {
            int e = errno;
            unlink(tmp);
            MT_FAIL(MT_ERR_IO, "%s: cannot take over the lock: %s", l->path, strerror(e));
        }
        struct timespec nap = {0, 200000000}; /* another taker's rename lands first */
        nanosleep(&nap, NULL);
        owner_t now;
        if (read_owner(l->path, &now) && strcmp(now.token, me.token) == 0) {
            if (warn)
                fprintf(warn, "warning: took over the lock of checkpoint_dir %s from pid %lld "
                              "on host %s%s%s: %s (heartbeat %.0f s ago)\n",
                        dir, o.pid, o.host, o.job[0] ? ", job " : "", o.job, why, age);
            l->held = true;
            return MT_OK;
        }
    }
    MT_FAIL(MT_ERR_IO, "checkpoint_dir %s: another run took its lock (%s) at the same time",
            dir, l->path);
}

mt_status_t mt_ckpt_lock_acquire(MPI_Comm comm, const char *dir, double stale_s, FILE *warn,
                                 mt_ckpt_lock_t *l)
{
    memset(l, 0, sizeof *l);
    l->stale_s = stale_s;
    int rank;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    mt_status_t s = rank == 0 ? acquire_local(dir, stale_s, warn, l) : MT_OK;
    l->last_beat = mt_now_s();
    return mt_agree(comm, s);
}

void mt_ckpt_lock_beat(mt_ckpt_lock_t *l)
{
    if (!l->held)
        return;
    double now = mt_now_s();
    if (now - l->last_beat < l->stale_s / 10.0)
        return;
    l->last_beat = now;
    utimensat(AT_FDCWD, l->path, NULL, 0); /* a failed touch shows as age, not as an error */
}

void mt_ckpt_lock_release(mt_ckpt_lock_t *l)
{
    if (!l->held)
        return;
    owner_t o;
    if (read_owner(l->path, &o) && strcmp(o.token, l->token) == 0)
        unlink(l->path);
    l->held = false;
}
