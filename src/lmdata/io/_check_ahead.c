/* check_ahead: check_mapped_nogil's and read_mapped_nogil's work on a POSIX thread of its own, which never
 * takes the GIL (#included by _preads.c after _mapped.c).
 *
 * check_ahead(starts, length, itemsize, bounds, bases, modes, file_bytes, block_base, done, crcs[, out,
 * status, check]) hands the job "check the unchecked blocks under these windows" (check_mapped_nogil) to
 * the process's check-ahead thread, started at the first call, and returns at once: the 0-worker
 * loader gives it the next reads' windows while the training thread widens and trains on the current
 * one (lmdata.data.ahead). With out and status (int64[2]) the job then also reads the windows into out
 * as read_mapped would (blocks checked with check): status[0] gets read_mapped's result (-3 until the
 * job has run: a job dropped, or left unrun by a fork), status[1] the job's ticket for check_ahead_wait.
 * Jobs run in the order handed over (a mixture hands one per source a read); past AHEAD_WAITING_MAX
 * waiting (a thread far behind), the oldest is dropped. Returns how many unchecked blocks the jobs
 * finished since the last call met, plus the windows they read, or -1 when none finished: a caller
 * whose jobs find nothing to do hands fewer.
 * check_ahead_wait([ticket[, cancel]]) returns once every job handed over before it was called (up to the
 * one of that ticket) has finished or was dropped, with the same count: jobs handed over meanwhile, by
 * other threads, do not keep it waiting; a ticket past the jobs handed over (a fork's parent's) waits for
 * those. With cancel, a job of that ticket not started yet is not run (its status stays -3) and nothing
 * is waited for: a read that finds its windows not read yet reads them itself, on its own core, while the
 * thread goes on to the next job, instead of waiting for the thread to reach them. And when that job is
 * running, the one after it is not run either (the thread is behind: the next read reads it itself, so
 * the two share the work). A first epoch of 1 G tokens, where each read's blocks are checked too: the
 * training thread waited 0.15-0.26 s for the thread; with the next job taken back, 0.04-0.05 s, and read
 * ~1.5% of the reads itself.
 * fork: the thread does not exist in a child. Handlers registered at import (ahead_init) hold the
 * lock across fork(), so the child finds the queue whole; its jobs (the running one too) go to the
 * finished list, released by the child's next call, and that call starts a thread of its own.
 *
 * The job's buffers are held from the hand-over (PyArg "y*") until a later call, under the GIL,
 * releases them. Why a C thread and not a Python one: a Python helper's share of the GIL, taken
 * each time the training thread let it go inside a read, slowed a 12 M-token store's steady
 * 0-worker reads by 30-40% (581-590 -> 337-414 M tok/s here).
 */
#include <pthread.h>

#define AHEAD_BUFFERS 10  /* starts, bounds, bases, modes, file_bytes, block_base, done, crcs[, out, status] */

typedef struct ahead_job {
    Py_buffer buf[AHEAD_BUFFERS];
    int n_buf;
    int64_t length;
    int itemsize;
    int check;  /* a read-ahead job (with out and status): its blocks checked as it reads them */
    int skip;   /* taken back before it ran (check_ahead_wait's cancel): settled without running */
    uint64_t ticket;
    int64_t found;
    struct ahead_job *next;
} ahead_job;

static pthread_mutex_t ahead_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ahead_cv = PTHREAD_COND_INITIALIZER;
#define AHEAD_WAITING_MAX 64  /* jobs waiting at most: past it the oldest is dropped (the read does its work) */

static ahead_job *ahead_waiting, *ahead_last, *ahead_finished;  /* jobs to run, oldest first; jobs done, to release */
static ahead_job *ahead_current;  /* the job the thread runs (in a forked child: finished with the rest) */
static int ahead_n_waiting, ahead_started, ahead_failed, ahead_forkable;
static uint64_t ahead_handed, ahead_settled;  /* jobs handed over; jobs finished or dropped (the waits' tickets) */

static void ahead_run(ahead_job *job) {
    const Py_buffer *b = job->buf;
    Py_ssize_t n = b[0].len / 8;
    if (job->check || job->n_buf < AHEAD_BUFFERS)
        check_mapped_nogil(n, b[0].buf, job->length, job->itemsize, b[1].buf, b[1].len / 8 - 1, b[2].buf, b[3].buf,
                           b[4].buf, b[5].buf, b[6].buf, b[6].len, b[7].buf, &job->found);
    if (job->n_buf == AHEAD_BUFFERS) {  /* read ahead: the windows copied into out, status[0] what read_mapped returns */
        Py_ssize_t got = read_mapped_nogil(n, b[0].buf, job->length, job->itemsize, b[1].buf, b[1].len / 8 - 1,
                                           b[2].buf, b[3].buf, b[4].buf, b[5].buf, b[6].buf, b[6].len, b[7].buf,
                                           b[8].buf, job->check);
        ((int64_t *)b[9].buf)[0] = got;
        if (got == -1) job->found += n;
    }
}

static void *ahead_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&ahead_mu);
    for (;;) {
        while (!ahead_waiting) pthread_cond_wait(&ahead_cv, &ahead_mu);
        ahead_job *job = ahead_current = ahead_waiting;
        ahead_waiting = job->next;
        if (!ahead_waiting) ahead_last = NULL;
        ahead_n_waiting--;
        pthread_mutex_unlock(&ahead_mu);
        if (!job->skip) ahead_run(job);
        pthread_mutex_lock(&ahead_mu);
        ahead_current = NULL;
        job->next = ahead_finished;
        ahead_finished = job;
        ahead_settled++;
        pthread_cond_broadcast(&ahead_cv);
    }
    return NULL;
}

static void ahead_before_fork(void) { pthread_mutex_lock(&ahead_mu); }
static void ahead_after_fork_in_parent(void) { pthread_mutex_unlock(&ahead_mu); }

/* The child's only thread holds ahead_mu (ahead_before_fork) and no thread runs its jobs: every job,
 * the one that was running too, is finished (unchecked; the reads check their blocks themselves), to be
 * released by the next call under the GIL, which starts a thread. The condition variable may have had
 * waiters in the parent (threads the child does not have): it is made anew. */
static void ahead_after_fork_in_child(void) {
    ahead_job *jobs = ahead_finished;
    if (ahead_current) ahead_current->next = jobs, jobs = ahead_current;
    if (ahead_last) ahead_last->next = jobs, jobs = ahead_waiting;
    ahead_finished = jobs;
    ahead_waiting = ahead_last = ahead_current = NULL;
    ahead_n_waiting = ahead_started = 0;
    ahead_handed = ahead_settled = 0;
    pthread_cond_init(&ahead_cv, NULL);
    pthread_mutex_unlock(&ahead_mu);
}

/* At import, not under ahead_mu: a fork handler registered while holding it would order glibc's fork
 * lock after ahead_mu, and ahead_before_fork orders it before. Without the handlers, no thread. */
static void ahead_init(void) {
    ahead_forkable = pthread_atfork(ahead_before_fork, ahead_after_fork_in_parent, ahead_after_fork_in_child) == 0;
}

/* With ahead_mu held. The thread blocks every signal a program handles itself (SIGINT, SIGCHLD, ...):
 * they go to the other threads; faults (SIGBUS from a file cut short) stay its own. A thread that could
 * not be started is not tried again: the reads check their blocks themselves. */
static int ahead_start(void) {
    if (ahead_failed || !ahead_forkable) return 0;
    sigset_t all, before;
    sigfillset(&all);
    sigdelset(&all, SIGBUS); sigdelset(&all, SIGSEGV); sigdelset(&all, SIGFPE); sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_BLOCK, &all, &before);
    pthread_t thread;
    int ok = pthread_create(&thread, NULL, ahead_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (ok) pthread_detach(thread);
    ahead_failed = !ok;
    return ahead_started = ok;
}

static void ahead_release(ahead_job *job) {
    while (job) {
        ahead_job *next = job->next;
        for (int k = 0; k < job->n_buf; k++) PyBuffer_Release(&job->buf[k]);
        free(job);
        job = next;
    }
}

/* With ahead_mu held: the finished jobs, taken; *found their count of unchecked blocks met (-1: none). */
static ahead_job *ahead_take_finished(int64_t *found) {
    ahead_job *finished = ahead_finished;
    ahead_finished = NULL;
    *found = finished ? 0 : -1;
    for (ahead_job *f = finished; f; f = f->next) *found += f->found;
    return finished;
}

static PyObject *check_ahead(PyObject *self, PyObject *args) {
    (void)self;
    ahead_job *job = calloc(1, sizeof *job);
    if (!job) return PyErr_NoMemory();
    long long length;
    Py_buffer *b = job->buf;
    b[8].obj = b[9].obj = NULL;
    if (!PyArg_ParseTuple(args, "y*Liy*y*y*y*y*w*y*|w*w*p", &b[0], &length, &job->itemsize, &b[1], &b[2], &b[3],
                          &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &job->check)) {
        free(job);
        return NULL;
    }
    job->n_buf = b[9].obj ? AHEAD_BUFFERS : b[8].obj ? AHEAD_BUFFERS - 1 : AHEAD_BUFFERS - 2;
    job->length = (int64_t)length;
    Py_buffer no_out = {0};
    no_out.len = (b[0].len / 8) * job->length * job->itemsize;
    int reads = job->n_buf == AHEAD_BUFFERS;
    if (job->n_buf == AHEAD_BUFFERS - 1 || (reads && b[9].len < 16)
        || !batch_args_ok(&b[0], length, job->itemsize, &b[1], &b[2], 8, &b[3], &b[4], &b[5], &b[6], &b[7],
                          reads ? &b[8] : &no_out)) {
        ahead_release(job);
        PyErr_SetString(PyExc_ValueError, "check_ahead: arrays of different lengths, a window outside the split, "
                                          "done/crcs/out too small, or out without a status of 2 int64");
        return NULL;
    }
    if (reads) ((int64_t *)b[9].buf)[0] = -3;  /* not read (yet): a dropped job, or one a fork left unrun */
    install_bus_handler();
    ahead_job *replaced = NULL, *finished;
    int64_t found;
    pthread_mutex_lock(&ahead_mu);
    int running = ahead_started || ahead_start();
    if (running) {
        job->next = NULL;
        if (ahead_last) ahead_last->next = job;
        else ahead_waiting = job;
        ahead_last = job;
        job->ticket = ++ahead_handed;
        if (reads) ((int64_t *)b[9].buf)[1] = (int64_t)job->ticket;  /* for check_ahead_wait */
        job = NULL;
        if (++ahead_n_waiting > AHEAD_WAITING_MAX) {  /* the oldest waiting job: its read is here by now */
            replaced = ahead_waiting;
            ahead_waiting = replaced->next;
            replaced->next = NULL;
            ahead_n_waiting--;
            ahead_settled++;
        }
        pthread_cond_broadcast(&ahead_cv);
    }
    finished = ahead_take_finished(&found);
    pthread_mutex_unlock(&ahead_mu);
    if (!running && found < 0) found = 0;  /* no thread: nothing to wait for (the caller hands fewer) */
    if (replaced) replaced->next = finished, finished = replaced;
    ahead_release(finished);
    ahead_release(job);  /* no thread: nothing handed over */
    return PyLong_FromLongLong(found);
}

static PyObject *check_ahead_wait(PyObject *self, PyObject *args) {
    (void)self;
    long long upto = 0;
    int cancel = 0;
    if (!PyArg_ParseTuple(args, "|Lp", &upto, &cancel)) return NULL;
    ahead_job *finished;
    int64_t found;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&ahead_mu);
    uint64_t ticket = upto > 0 && (uint64_t)upto < ahead_handed ? (uint64_t)upto : ahead_handed;
    int waiting = 0;
    for (ahead_job *w = ahead_waiting; cancel && upto > 0 && w && !waiting; w = w->next)
        if (w->ticket == (uint64_t)upto) w->skip = waiting = 1;  /* not started: the caller does it itself */
    if (cancel && !waiting && ahead_settled < ticket && ahead_waiting)
        ahead_waiting->skip = 1;  /* the thread is behind (running this one): the next job is the caller's too */
    while (!waiting && ahead_settled < ticket) pthread_cond_wait(&ahead_cv, &ahead_mu);
    finished = ahead_take_finished(&found);
    pthread_mutex_unlock(&ahead_mu);
    Py_END_ALLOW_THREADS
    ahead_release(finished);
    return PyLong_FromLongLong(found);
}
