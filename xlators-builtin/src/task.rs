//! Running a fop where it arrived: [`run_here`] polls a future on the
//! calling thread (the FUSE reader, a brick connection's reader task) and
//! makes it a runtime task only if it has to wait, and only when it is woken.
//!
//! Most fops finish on their first poll (a stat in a cache, a write that
//! write-behind acknowledges): they are answered with no task and no
//! wake-up. One that waits (for a brick's reply, for the blocking pool) used
//! to be spawned at once, so a worker thread woke up only to poll it a second
//! time, find it still waiting and park again: on a 2-core machine that
//! wake-up is a context switch per fop on the commit path of a database.
//! Here the future is kept aside with a waker of its own; the first wake
//! spawns it (from the thread that woke it: a runtime worker finishing the
//! reply's read, so the task runs next on that worker).
//!
//! A fop so kept aside that must block (an fdatasync, a create on a brick)
//! hands its syscalls to a sync thread with [`offload`]: that thread runs
//! them and then polls the fop itself, so the rest of it (the translators
//! above, the reply's write to the socket) runs there too. The fop costs
//! the sync thread's wake-up and its wait for the disk and nothing else: no
//! runtime task, no worker handing its core to another thread
//! ([`block_in_task`], which a fop already spawned still uses).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::runtime::Handle;

type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A future waiting for its first wake-up, and where to spawn it then.
struct Parked {
    rt: Handle,
    slot: Mutex<Slot>,
}

enum Slot {
    /// Still being polled by [`run_here`].
    Polling,
    /// Woken while (or just after) [`run_here`] polled it.
    Woken,
    /// Set aside, waiting for a wake.
    Waiting(Task),
    /// Spawned: later wakes go to its task's own waker.
    Spawned,
}

impl Wake for Parked {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut slot = self.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Spawned) {
            Slot::Waiting(task) => {
                drop(slot);
                self.rt.spawn(task);
            }
            Slot::Polling | Slot::Woken => *slot = Slot::Woken,
            Slot::Spawned => {}
        }
    }
}

/// Polls `fut` once here (inside `rt`); if it is not done, it is spawned on
/// `rt` when it is first woken (at once if it was woken meanwhile), and
/// `true` is returned. The future must be one that registers the waker of
/// each poll, as every tokio and std future does.
pub fn run_here(rt: &Handle, fut: impl Future<Output = ()> + Send + 'static) -> bool {
    let parked = Arc::new(Parked { rt: rt.clone(), slot: Mutex::new(Slot::Polling) });
    parked.poll_here(Box::pin(fut))
}

thread_local! {
    /// The kept-aside fop this thread is polling, if any ([`offload`]'s home).
    static CURRENT: RefCell<Option<Arc<Parked>>> = const { RefCell::new(None) };
}

/// Restores the previous [`CURRENT`] when a poll ends (or unwinds).
struct Polling(Option<Arc<Parked>>);

impl Drop for Polling {
    fn drop(&mut self) {
        let prev = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

impl Parked {
    /// Polls `task` (its slot says `Polling`) on this thread, then keeps it
    /// aside or spawns it as [`run_here`] says. True if it is not done.
    fn poll_here(self: &Arc<Self>, mut task: Task) -> bool {
        let waker = Waker::from(self.clone());
        let pending = {
            let _in = self.rt.enter();
            let _current = Polling(CURRENT.with(|c| c.borrow_mut().replace(self.clone())));
            // A fop that panics here is dropped (its reply object answers
            // EIO), as a runtime task's would be; the thread goes on.
            std::panic::catch_unwind(AssertUnwindSafe(|| task.as_mut().poll(&mut Context::from_waker(&waker))))
                .map(|p| p.is_pending())
        };
        let pending = match pending {
            Ok(pending) => pending,
            Err(_) => {
                tracing::error!("a fop panicked where it arrived; it is dropped");
                false
            }
        };
        if !pending {
            return false;
        }
        let mut slot = self.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Spawned) {
            Slot::Woken => {
                drop(slot);
                self.rt.spawn(task);
            }
            _ => *slot = Slot::Waiting(task),
        }
        true
    }

    /// Polls the task here if it is kept aside waiting (for a sync thread's
    /// job that just ended); false, with nothing done, if it is not.
    fn resume_here(self: &Arc<Self>) -> bool {
        let mut slot = self.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Polling) {
            Slot::Waiting(task) => {
                drop(slot);
                self.poll_here(task);
                true
            }
            other => {
                *slot = other;
                false
            }
        }
    }
}

/// A job's outcome (`Err` if it panicked) and the waker of whoever waits.
type Outcome<R> = Mutex<(Option<std::thread::Result<R>>, Option<Waker>)>;

/// Runs `f` (a fop's blocking syscalls) on a sync thread, if this thread is
/// polling a fop [`run_here`] kept aside (else `f` is given back: block
/// some other way, as [`block_in_task`]). The future returned is ready with `f`'s
/// value, or `Err` if it panicked. Once `f` is done, the sync thread polls
/// the fop itself (if it is still kept aside, as it is unless something
/// else woke it meanwhile), so the fop goes on there; otherwise it wakes it.
/// At most [`SYNC_THREADS`] run at once; more jobs queue. The bound on jobs
/// is the caller's (performance/io-threads, a connection's in-flight calls).
pub fn offload<R: Send + 'static, F: FnOnce() -> R + Send + 'static>(
    f: F,
) -> Result<impl Future<Output = std::thread::Result<R>>, F> {
    let Some(home) = CURRENT.with(|c| c.borrow().clone()) else { return Err(f) };
    let outcome: Arc<Outcome<R>> = Arc::new(Mutex::new((None, None)));
    let done = outcome.clone();
    pool().submit(Box::new(move || {
        let r = std::panic::catch_unwind(AssertUnwindSafe(f));
        let waker = {
            let mut o = done.lock();
            o.0 = Some(r);
            o.1.take()
        };
        if !home.resume_here()
            && let Some(w) = waker
        {
            w.wake();
        }
    }));
    Ok(std::future::poll_fn(move |cx| {
        let mut o = outcome.lock();
        match o.0.take() {
            Some(r) => Poll::Ready(r),
            None => {
                o.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }))
}

/// Most sync threads at once (each idle one ends after [`SYNC_IDLE`]).
pub const SYNC_THREADS: usize = 64;
/// How long a sync thread waits for a job before it ends.
pub const SYNC_IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// The sync threads of the process and their queue.
struct Pool {
    st: Mutex<PoolState>,
    cv: Condvar,
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Threads waiting for a job.
    idle: usize,
    /// Of those, how many a submit has woken and not yet run.
    woken: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool { st: Mutex::new(PoolState::default()), cv: Condvar::new() })
}

impl Pool {
    fn submit(&'static self, job: Job) {
        let mut st = self.st.lock();
        st.jobs.push_back(job);
        if st.idle > st.woken {
            st.woken += 1;
            drop(st);
            self.cv.notify_one();
            return;
        }
        if st.threads >= SYNC_THREADS {
            return; // a busy thread takes it when it is done
        }
        st.threads += 1;
        drop(st);
        let spawned = std::thread::Builder::new().name("xlfs-sync".into()).spawn(move || self.work());
        if let Err(e) = spawned {
            let mut st = self.st.lock();
            st.threads -= 1;
            let orphan = if st.threads == 0 { st.jobs.pop_front() } else { None };
            drop(st);
            tracing::warn!(error = %e, "no sync thread: a blocking fop runs on its caller's thread");
            if let Some(job) = orphan {
                job();
            }
        }
    }

    fn work(&self) {
        let mut st = self.st.lock();
        loop {
            if let Some(job) = st.jobs.pop_front() {
                drop(st);
                // A fop that panics as it goes on here is dropped, as a
                // runtime task's would be; the thread stays.
                if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
                    tracing::error!("a fop panicked on a sync thread; it is dropped");
                }
                st = self.st.lock();
                continue;
            }
            st.idle += 1;
            let timed_out = self.cv.wait_for(&mut st, SYNC_IDLE).timed_out();
            st.idle -= 1;
            // parking_lot's waits never wake spuriously: a wait that did not
            // time out is one a submit notified.
            if !timed_out {
                st.woken = st.woken.saturating_sub(1);
            }
            if timed_out && st.jobs.is_empty() {
                st.threads -= 1;
                return;
            }
        }
    }
}

/// Runs `f`, blocking syscalls of a fop (or of a translator's work for
/// one), where it cannot hold up other work: on a sync thread that then
/// carries the fop on to its reply when the fop is being run where it
/// arrived ([`offload`]), in place in the fop's own task on a
/// multi-thread runtime ([`block_in_task`]), else on the blocking pool
/// (inline when there is no tokio runtime). None if `f` panicked.
pub async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let f = match offload(f) {
        Ok(job) => return job.await.ok(),
        Err(f) => f,
    };
    match Handle::try_current() {
        Ok(rt) if can_block_in_task(&rt) => {
            block_in_task(move || std::panic::catch_unwind(AssertUnwindSafe(f)).ok()).await
        }
        Ok(rt) => rt.spawn_blocking(f).await.ok(),
        Err(_) => std::panic::catch_unwind(AssertUnwindSafe(f)).ok(),
    }
}

/// Whether a future polled here may block its thread in
/// [`block_in_task`]: inside a task of a multi-thread runtime (a current-thread
/// runtime has no other thread to take its work, and a `block_on` is not a
/// task).
pub fn can_block_in_task(rt: &Handle) -> bool {
    rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread && tokio::task::try_id().is_some()
}

/// Runs `f`, a fop's blocking syscalls (an fdatasync, a create), on the
/// thread that polls the fop, once the fop is a task of its own; check
/// [`can_block_in_task`] first.
///
/// It yields once first, so that whoever polls it inline ([`run_here`] in a
/// brick connection's reader) makes it a task and goes on reading; the task
/// runs next on the same worker, and there `f` runs in place
/// (`tokio::task::block_in_place`: the worker's other tasks and its I/O
/// driver move to another thread while `f` blocks). Against handing `f` to
/// the blocking pool this takes two thread wake-ups off the fop's path (the
/// pool thread's, then the worker's to send the reply): on a 2-core machine
/// an 8 KiB O_DSYNC write on three local bricks took 30 % less time and the
/// bricks 35 % less CPU. The bound on such calls in flight is the same as the
/// pool's (performance/io-threads, the runtime's blocking threads).
pub async fn block_in_task<R>(f: impl FnOnce() -> R) -> R {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
    tokio::task::block_in_place(f)
}

/// Polls `fut` in its caller's task, so the caller pays no spawn and no
/// task hand-off; if the caller stops waiting before it is done, the rest
/// of it runs to its end as a task of `rt` (its output dropped). For work
/// that must not stop halfway (a replicated transaction holding brick
/// locks) but whose caller almost always waits for it.
pub fn run_to_end<F>(rt: Option<Handle>, fut: F) -> RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    RunToEnd { fut: Some(Box::pin(fut)), rt }
}

/// The future of [`run_to_end`].
pub struct RunToEnd<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    fut: Option<Pin<Box<F>>>,
    rt: Option<Handle>,
}

impl<F: Future + Send + 'static> Future for RunToEnd<F>
where
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else { panic!("RunToEnd polled after it was done") };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        this.fut = None;
        Poll::Ready(out)
    }
}

impl<F: Future + Send + 'static> Drop for RunToEnd<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            match &self.rt {
                Some(rt) => {
                    rt.spawn(async move {
                        fut.await;
                    });
                }
                None => tracing::warn!("work that must run to its end was dropped with no runtime to finish it"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ready_future_runs_here_a_waiting_one_runs_once_woken() {
        // A ready future is done before run_here returns, on the thread
        // that called it (here a plain thread, as the FUSE readers are).
        let rt = Handle::current();
        let polls = Arc::new(AtomicUsize::new(0));
        let p = polls.clone();
        let waits = std::thread::spawn(move || {
            run_here(&rt, async move {
                p.fetch_add(1, Ordering::SeqCst);
            })
        })
        .join()
        .expect("thread");
        assert!(!waits, "done on its first poll");
        assert_eq!(polls.load(Ordering::SeqCst), 1);

        // A waiting future is polled once here, not again until its wake.
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (out_tx, out_rx) = tokio::sync::oneshot::channel::<u32>();
        let p = polls.clone();
        let counted = async move {
            struct Count<F>(F, Arc<AtomicUsize>);
            impl<F: Future + Unpin> Future for Count<F> {
                type Output = F::Output;
                fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> std::task::Poll<F::Output> {
                    self.1.fetch_add(1, Ordering::SeqCst);
                    Pin::new(&mut self.0).poll(cx)
                }
            }
            let v = Count(rx, p).await.expect("sent");
            let _ = out_tx.send(v + 1);
        };
        polls.store(0, Ordering::SeqCst);
        assert!(run_here(&Handle::current(), counted), "it waits");
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once where it arrived");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(polls.load(Ordering::SeqCst), 1, "no worker polls it before it is woken");
        tx.send(41).expect("receiver alive");
        assert_eq!(out_rx.await.expect("the task ran"), 42);
        assert_eq!(polls.load(Ordering::SeqCst), 2, "one more poll: the one its wake asked for");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wake_during_the_first_poll_spawns_it_at_once() {
        let (out_tx, out_rx) = tokio::sync::oneshot::channel::<()>();
        let mut first = true;
        run_here(
            &Handle::current(),
            std::future::poll_fn(move |cx| {
                if first {
                    first = false;
                    cx.waker().wake_by_ref();
                    return std::task::Poll::Pending;
                }
                std::task::Poll::Ready(())
            })
            .then_send(out_tx),
        );
        out_rx.await.expect("spawned and finished");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocking_call_leaves_the_reader_first_then_blocks_its_own_task() {
        let rt = Handle::current();
        // The test's body is not a task: the reader is.
        assert!(!can_block_in_task(&rt), "a block_on is not a task");
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (out_tx, out_rx) = tokio::sync::oneshot::channel::<(bool, bool)>();
        let reader = tokio::spawn(async move {
            let rt = Handle::current();
            let may = can_block_in_task(&rt);
            let call = async move {
                // Blocks until the reader has gone on: had run_here run it
                // inline, the reader would still be here and this would time out.
                let got = block_in_task(move || go_rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok()).await;
                let _ = out_tx.send((may, got));
            };
            let spawned = run_here(&rt, call);
            go_tx.send(()).expect("the call waits for it");
            spawned
        });
        assert!(reader.await.expect("reader"), "the call became a task of its own");
        let (may, got) = out_rx.await.expect("the call ran");
        assert!(may, "a task of a multi-thread runtime may block in place");
        assert!(got, "the reader went on before the call blocked");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_offloaded_call_goes_on_to_its_end_on_the_sync_thread() {
        // Outside a fop kept aside by run_here, nothing is offloaded.
        assert!(offload(|| ()).is_err(), "not polled by run_here");

        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (out_tx, out_rx) = tokio::sync::oneshot::channel::<(bool, String, String)>();
        let rt = Handle::current();
        let reader = std::thread::spawn(move || {
            let call = async move {
                let job = offload(move || {
                    // Blocks until the reader has gone on.
                    let got = go_rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok();
                    (got, std::thread::current().name().unwrap_or_default().to_string())
                });
                let Ok(job) = job else { panic!("run_here's poll offloads") };
                let (got, ran_on) = job.await.expect("no panic");
                // What follows the syscalls (a reply's write) runs here.
                let then_on = std::thread::current().name().unwrap_or_default().to_string();
                let _ = out_tx.send((got, ran_on, then_on));
            };
            let waits = run_here(&rt, call);
            go_tx.send(()).expect("the call waits for it");
            waits
        });
        assert!(reader.join().expect("reader"), "the call waits for its sync thread");
        let (got, ran_on, then_on) = out_rx.await.expect("the call ended");
        assert!(got, "the reader went on before the call blocked");
        assert_eq!(ran_on, "xlfs-sync");
        assert_eq!(then_on, "xlfs-sync", "the call went on where its syscalls ran, not in a runtime task");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_on_a_sync_thread_is_the_callers_error_and_the_pool_goes_on() {
        let rt = Handle::current();
        for _ in 0..2 {
            let (out_tx, out_rx) = tokio::sync::oneshot::channel::<bool>();
            let rt2 = rt.clone();
            std::thread::spawn(move || {
                run_here(&rt2, async move {
                    let Ok(job) = offload(|| -> u32 { panic!("a fop's syscalls panicked") }) else {
                        panic!("offloaded")
                    };
                    let _ = out_tx.send(job.await.is_err());
                })
            })
            .join()
            .expect("reader");
            assert!(out_rx.await.expect("answered"), "the panic is the caller's Err");
        }
    }

    #[tokio::test]
    async fn a_current_thread_runtime_never_blocks_in_place() {
        let inside = tokio::spawn(async { can_block_in_task(&Handle::current()) });
        assert!(!inside.await.expect("task"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_to_end_runs_in_its_caller_and_finishes_what_a_dropped_caller_left() {
        // Waited for: polled in the caller's task, no task of its own.
        let caller = tokio::task::try_id();
        let here = run_to_end(Some(Handle::current()), async move { tokio::task::try_id() }).await;
        assert_eq!(here, caller, "polled by its caller");

        // Dropped halfway: the rest runs to its end on the runtime.
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<&str>();
        let steps = Arc::new(AtomicUsize::new(0));
        let s = steps.clone();
        let mut fut = Box::pin(run_to_end(Some(Handle::current()), async move {
            s.fetch_add(1, Ordering::SeqCst);
            let _ = go_rx.await;
            let _ = done_tx.send("finished");
        }));
        assert!(xlfs_sdk::testing::poll(fut.as_mut()).is_pending());
        assert_eq!(steps.load(Ordering::SeqCst), 1, "started in the caller");
        drop(fut);
        go_tx.send(()).expect("the rest is still alive");
        let done = tokio::time::timeout(Duration::from_secs(10), done_rx).await;
        assert_eq!(done.expect("in time").expect("sent"), "finished");
        assert_eq!(steps.load(Ordering::SeqCst), 1, "not started again");
    }

    #[test]
    fn a_fop_that_panics_on_its_first_poll_is_dropped_and_the_thread_goes_on() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("runtime");
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        struct Answer(Option<std::sync::mpsc::Sender<u32>>);
        impl Drop for Answer {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(5); // EIO, as an unanswered FUSE reply
                }
            }
        }
        let answer = Answer(Some(tx.clone()));
        let waits = run_here(rt.handle(), async move {
            let _a = answer;
            panic!("a translator's bug");
        });
        assert!(!waits, "nothing left to run");
        assert_eq!(rx.recv().expect("its reply was dropped"), 5);
        // The same thread serves the next fop.
        assert!(!run_here(rt.handle(), async move {
            let _ = tx.send(0);
        }));
        assert_eq!(rx.recv().expect("next fop"), 0);
    }

    trait ThenSend: Future<Output = ()> + Sized {
        fn then_send(self, tx: tokio::sync::oneshot::Sender<()>) -> impl Future<Output = ()> {
            async move {
                self.await;
                let _ = tx.send(());
            }
        }
    }
    impl<F: Future<Output = ()>> ThenSend for F {}
}
