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
