//! The coordinator's rules with fake workers: a full queue blocks `schedule`, the first error
//! is returned once, queued closures are cancelled, a closure lost with its worker runs again,
//! and the staleness bound holds a fast worker back.

use super::*;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

type Script = Box<dyn FnMut(&Closure) -> Result<(), ClosureFailure> + Send>;

/// A worker that can be held at the start of each closure, reports what it starts, follows a
/// script for each closure and records the closures it completed.
struct Fake {
    gate: Option<Receiver<()>>,
    started: Option<Sender<u64>>,
    script: Script,
    rejoins: bool,
    /// Waits for a restart that never comes.
    waits: bool,
    completed: Arc<Mutex<Vec<u64>>>,
}

impl Fake {
    fn new(completed: &Arc<Mutex<Vec<u64>>>) -> Self {
        Self {
            gate: None,
            started: None,
            script: Box::new(|_| Ok(())),
            rejoins: true,
            waits: false,
            completed: Arc::clone(completed),
        }
    }

    /// Held before each closure until the returned sender gives a permit.
    fn gated(mut self) -> (Self, Sender<()>) {
        let (tx, rx) = channel();
        self.gate = Some(rx);
        (self, tx)
    }

    fn reporting(mut self) -> (Self, Receiver<u64>) {
        let (tx, rx) = channel();
        self.started = Some(tx);
        (self, rx)
    }

    fn scripted(mut self, script: impl FnMut(&Closure) -> Result<(), ClosureFailure> + Send + 'static) -> Self {
        self.script = Box::new(script);
        self
    }
}

impl Worker for Fake {
    fn run(&mut self, closure: &Closure) -> Result<(), ClosureFailure> {
        if let Some(s) = &self.started {
            let _ = s.send(closure.id);
        }
        if let Some(g) = &self.gate {
            g.recv().map_err(|_| ClosureFailure::WorkerLost("gate closed".into()))?;
        }
        (self.script)(closure)?;
        self.completed.lock().unwrap().push(closure.id);
        Ok(())
    }

    fn rejoin(&mut self, give_up: &dyn Fn() -> bool) -> bool {
        // A worker that is never restarted: the coordinator's wait for it ends with the job.
        while self.waits && !give_up() {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.rejoins && !self.waits
    }
}

fn queue(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

const WAIT: Duration = Duration::from_millis(300);

#[test]
fn a_full_queue_blocks_schedule() {
    let done = Arc::new(Mutex::new(Vec::new()));
    let (fake, permits) = Fake::new(&done).gated();
    let (fake, started) = fake.reporting();
    let c = Arc::new(Coordinator::new(vec![fake], queue(2), None));
    c.schedule(0, 1).unwrap();
    assert_eq!(started.recv_timeout(WAIT), Ok(0), "the worker takes the first closure");
    c.schedule(1, 1).unwrap();
    c.schedule(2, 1).unwrap();
    // The queue holds two: the fourth `schedule` waits for room.
    let (tx, returned) = channel();
    let c2 = Arc::clone(&c);
    let t = std::thread::spawn(move || tx.send(c2.schedule(3, 1)).unwrap());
    assert_eq!(returned.recv_timeout(WAIT), Err(RecvTimeoutError::Timeout), "schedule returned with a full queue");
    permits.send(()).unwrap();
    assert_eq!(returned.recv_timeout(WAIT * 5), Ok(Ok(3)), "schedule did not return once there was room");
    t.join().unwrap();
    for _ in 0..3 {
        permits.send(()).unwrap();
    }
    c.join().unwrap();
    assert_eq!(*done.lock().unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(c.stats().steps_applied(), 4);
}

#[test]
fn the_first_error_is_returned_once_and_queued_closures_are_cancelled() {
    let done = Arc::new(Mutex::new(Vec::new()));
    let (fake, permits) = Fake::new(&done).gated();
    let (fake, started) = fake.reporting();
    let fake = fake.scripted(|c| if c.id == 0 { Err(ClosureFailure::Failed("ps:0 is gone".into())) } else { Ok(()) });
    let c = Coordinator::new(vec![fake], queue(8), None);
    for step in 0..4 {
        c.schedule(step, 1).unwrap();
    }
    assert_eq!(started.recv_timeout(WAIT), Ok(0));
    permits.send(()).unwrap();
    let e = c.join().unwrap_err();
    assert_eq!(e, CoordinatorError::Closure { closure: 0, first_step: 0, worker: 0, message: "ps:0 is gone".into() });
    assert!(e.to_string().contains("ps:0 is gone"), "{e}");
    // Returned once: the next join finds nothing left, and the three queued closures never ran.
    assert_eq!(c.join(), Ok(()));
    let stats = c.stats();
    assert_eq!((stats.scheduled, stats.cancelled, stats.steps_applied()), (4, 3, 0));
    assert!(done.lock().unwrap().is_empty());
    // Scheduling goes on after the error was returned.
    c.schedule(4, 1).unwrap();
    permits.send(()).unwrap();
    assert_eq!(c.join(), Ok(()));
    assert_eq!(*done.lock().unwrap(), vec![4]);
}

#[test]
fn only_the_first_of_several_failures_is_returned() {
    let done = Arc::new(Mutex::new(Vec::new()));
    // Two workers fail their closures together; one error comes back, then nothing.
    let workers: Vec<(Fake, Sender<()>)> = (0..2)
        .map(|_| Fake::new(&done).scripted(|c| Err(ClosureFailure::Failed(format!("closure {} failed", c.id)))).gated())
        .collect();
    let (workers, permits): (Vec<Fake>, Vec<Sender<()>>) = workers.into_iter().unzip();
    let c = Coordinator::new(workers, queue(8), None);
    c.schedule(0, 1).unwrap();
    c.schedule(1, 1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    for p in &permits {
        p.send(()).unwrap();
    }
    assert!(c.join().is_err());
    assert_eq!(c.join(), Ok(()), "a second error of the same batch was returned");
}

/// Waits (at most 10 s) until a closure has been rescheduled.
fn wait_for_rescheduled(c: &Coordinator) {
    let t0 = std::time::Instant::now();
    while c.stats().rescheduled == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no closure was rescheduled");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_closure_lost_with_its_worker_runs_again() {
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut lost_once = false;
    let flaky = Fake::new(&done).scripted(move |_| {
        if lost_once {
            Ok(())
        } else {
            lost_once = true;
            Err(ClosureFailure::WorkerLost("worker:0 was killed".into()))
        }
    });
    // The steady worker is held at its first closure, so the flaky one surely gets work.
    let (steady, permits) = Fake::new(&done).gated();
    let c = Coordinator::new(vec![flaky, steady], queue(4), None);
    for i in 0..20 {
        c.schedule(i * 2, 2).unwrap();
    }
    wait_for_rescheduled(&c);
    for _ in 0..20 {
        permits.send(()).unwrap();
    }
    c.join().unwrap();
    let mut ran = done.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, (0..20).collect::<Vec<u64>>(), "every closure completes exactly once");
    let stats = c.stats();
    assert_eq!(stats.rescheduled, 1);
    assert_eq!(stats.steps_applied(), 40, "scheduled steps equal applied steps");
    // The flaky worker came back and did work after it did: every one of its steps.
    assert_eq!(stats.rejoins_per_worker, vec![1, 0]);
    assert!(stats.steps_since_rejoin[0] > 0, "{stats:?}");
    assert_eq!(stats.steps_since_rejoin, stats.steps_per_worker);
}

#[test]
fn a_worker_that_never_comes_back_leaves_its_work_to_the_others() {
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut gone = Fake::new(&done).scripted(|_| Err(ClosureFailure::WorkerLost("worker:0 was killed".into())));
    gone.rejoins = false;
    // The steady worker is held at its first closure, so the other one takes the next.
    let (steady, permits) = Fake::new(&done).gated();
    let c = Coordinator::new(vec![gone, steady], queue(8), None);
    for i in 0..6 {
        c.schedule(i, 1).unwrap();
    }
    wait_for_rescheduled(&c);
    for _ in 0..6 {
        permits.send(()).unwrap();
    }
    c.join().unwrap();
    let stats = c.stats();
    assert_eq!(stats.steps_per_worker, vec![0, 6]);
    assert_eq!(stats.rescheduled, 1);

    // With no worker left the job fails instead of waiting for ever.
    let mut alone = Fake::new(&done).scripted(|_| Err(ClosureFailure::WorkerLost("worker:0 was killed".into())));
    alone.rejoins = false;
    let c = Coordinator::new(vec![alone], queue(4), None);
    c.schedule(0, 1).unwrap();
    c.schedule(1, 1).unwrap();
    assert!(matches!(c.join(), Err(CoordinatorError::NoWorkers(n)) if n >= 1));
}

#[test]
fn a_worker_awaited_for_ever_holds_up_neither_join_nor_the_end() {
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut lost = Fake::new(&done).scripted(|_| Err(ClosureFailure::WorkerLost("worker:0 was killed".into())));
    lost.waits = true;
    let (steady, permits) = Fake::new(&done).gated();
    let c = Coordinator::new(vec![lost, steady], queue(8), None);
    for i in 0..4 {
        c.schedule(i, 1).unwrap();
    }
    wait_for_rescheduled(&c);
    for _ in 0..4 {
        permits.send(()).unwrap();
    }
    c.join().unwrap();
    assert_eq!(c.stats().steps_per_worker, vec![0, 4]);
    // The lost worker's thread is still waiting for its restart; the end stops the wait.
    let t0 = std::time::Instant::now();
    drop(c);
    assert!(t0.elapsed() < WAIT, "{:?}", t0.elapsed());
}

/// Held at its first closure until released; then fast. Says which worker started first.
struct HeldOnce {
    tag: usize,
    first: Arc<Mutex<Option<usize>>>,
    release: Arc<(Mutex<bool>, Condvar)>,
}

impl Worker for HeldOnce {
    fn run(&mut self, _: &Closure) -> Result<(), ClosureFailure> {
        let held = {
            let mut first = self.first.lock().unwrap();
            first.get_or_insert(self.tag) == &self.tag
        };
        if held {
            let (released, cv) = &*self.release;
            let mut r = released.lock().unwrap();
            while !*r {
                r = cv.wait(r).unwrap();
            }
        }
        Ok(())
    }

    fn rejoin(&mut self, _: &dyn Fn() -> bool) -> bool {
        true
    }
}

/// Two workers; whichever takes closure 0 is held there while 9 more are queued. Returns the
/// held worker and the steps per worker after a pause, then releases it and joins.
fn staleness_run(max_staleness: Option<u64>) -> (usize, Vec<u64>, Stats) {
    let first = Arc::new(Mutex::new(None));
    let release = Arc::new((Mutex::new(false), Condvar::new()));
    let workers: Vec<HeldOnce> =
        (0..2).map(|tag| HeldOnce { tag, first: Arc::clone(&first), release: Arc::clone(&release) }).collect();
    let c = Coordinator::new(workers, queue(16), max_staleness);
    c.schedule(0, 1).unwrap();
    let t0 = std::time::Instant::now();
    let held = loop {
        if let Some(h) = *first.lock().unwrap() {
            break h;
        }
        assert!(t0.elapsed() < WAIT, "no worker took the first closure");
        std::thread::sleep(Duration::from_millis(1));
    };
    for i in 1..10 {
        c.schedule(i, 1).unwrap();
    }
    std::thread::sleep(WAIT);
    let during = c.stats().steps_per_worker;
    *release.0.lock().unwrap() = true;
    release.1.notify_all();
    c.join().unwrap();
    (held, during, c.stats())
}

#[test]
fn max_staleness_holds_a_fast_worker_back() {
    // The free worker stops once it is more than 2 steps ahead of the held one's 0.
    let (held, during, after) = staleness_run(Some(2));
    assert_eq!(during[held], 0);
    assert_eq!(during[1 - held], 3, "{during:?}");
    assert_eq!(after.steps_applied(), 10);
    // Unbounded: the free worker runs everything the held one does not hold.
    let (held, during, after) = staleness_run(None);
    assert_eq!(during[1 - held], 9, "{during:?}");
    assert_eq!(after.steps_applied(), 10);
}
