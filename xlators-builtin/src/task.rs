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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use parking_lot::Mutex;
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
    let waker = Waker::from(parked.clone());
    let mut task: Task = Box::pin(fut);
    let pending = {
        let _in = rt.enter();
        task.as_mut().poll(&mut Context::from_waker(&waker)).is_pending()
    };
    if !pending {
        return false;
    }
    let mut slot = parked.slot.lock();
    match std::mem::replace(&mut *slot, Slot::Spawned) {
        Slot::Woken => {
            drop(slot);
            rt.spawn(task);
        }
        _ => *slot = Slot::Waiting(task),
    }
    true
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

    #[tokio::test]
    async fn a_current_thread_runtime_never_blocks_in_place() {
        let inside = tokio::spawn(async { can_block_in_task(&Handle::current()) });
        assert!(!inside.await.expect("task"));
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
